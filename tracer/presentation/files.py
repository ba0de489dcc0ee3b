"""Atomic output files: written under a temporary name beside the target, then renamed over it.

A run that fails or is interrupted half-way leaves no partial file, and never replaces a good
file with a bad one: the target changes only through ``os.replace``, which is atomic on POSIX and
Windows when both names are on the same filesystem (hence the temporary file in the same folder).

An output is a regular file and never one the run reads: a FIFO, a device, a socket or a folder
is refused (``output-not-file``), and so is the pipeline itself, a block file it includes or a
weights file (``output-is-input``, hard links and symlinks included). A symlink is followed: the
file it names is rewritten and the link stays. A rewritten file keeps its permissions (and, for
root, its owner); one with other hard links is rewritten in place, after the new bytes are
complete on disk, so that every name still shows the same file.

A command writes through one :class:`Writes`, which adds the rule for files already there: it
replaces a file only when that file is one tracer writes, of the kind it is about to write
(:data:`KINDS`: recognised by its first or last bytes), or one it wrote itself in this run, or
with ``--force``; it never replaces one of its inputs, even with ``--force``; and it lists every
file it wrote.

>>> import tempfile, pathlib
>>> folder = pathlib.Path(tempfile.mkdtemp())
>>> write_atomic(folder / "trace.json", '{"ok": true}\\n').read_text()
'{"ok": true}\\n'
"""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
import tempfile
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from ..core.errors import Diagnostic, TracerError


def write_atomic(path: str | Path, data: bytes | str, *, error_file: str | None = None, reads: Iterable[str | Path] = ()) -> Path:
    """Write ``data`` to ``path`` atomically and return the path.

    ``reads`` are the files the output was made from (the pipeline, its blocks, weights): ``path``
    may not be one of them. An ``OSError`` (no such folder, no permission, disk full) becomes a
    ``TracerError`` naming ``error_file`` (default: ``path``), and leaves ``path`` as it was.
    """
    path = Path(path)
    payload = data.encode("utf-8") if isinstance(data, str) else data
    target = check_output(path, reads, error_file)
    try:
        existing = _regular_stat(target)
        with temporary_beside(target) as tmp:
            with open(tmp, "wb") as handle:
                handle.write(payload)
                handle.flush()
                _keep_mode(handle.fileno(), existing)
                os.fsync(handle.fileno())
            if existing is not None and existing.st_nlink > 1:
                _rewrite_in_place(target, tmp)
            else:
                os.replace(tmp, target)
    except OSError as exc:
        reason = exc.strerror or str(exc)
        raise TracerError(Diagnostic(error_file or str(path), None, "output-failed", f"cannot write {path}: {reason}")) from None
    return path


def check_output(path: str | Path, reads: Iterable[str | Path] = (), error_file: str | None = None) -> Path:
    """The regular file that writing ``path`` will replace (a symlink's target), or a located error:
    ``path`` names something other than a regular file, or one of the files in ``reads``."""
    path = Path(path)

    def refuse(code: str, message: str) -> TracerError:
        return TracerError(Diagnostic(error_file or str(path), None, code, message))

    if not str(path):
        raise refuse("output-not-file", "the output name is empty: name the file to write")
    target = Path(os.path.realpath(path))
    try:
        mode = os.stat(target).st_mode
    except OSError:
        return target  # nothing there yet (or an unreadable folder: the write reports it)
    if not stat.S_ISREG(mode):
        kind = _kind(mode)
        raise refuse("output-not-file", f"cannot write {path}: it is {kind}, and tracer writes only regular files; name a file")
    for source in reads:
        with contextlib.suppress(OSError):
            if os.path.samefile(target, source):
                also = "" if Path(source) == path else f" (as {source})"
                raise refuse("output-is-input", f"cannot write {path}: this run reads it{also}; choose another name")
    return target


def _kind(mode: int) -> str:
    kinds = ((stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a named pipe"), (stat.S_ISCHR, "a character device"))
    kinds += ((stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))
    return next((name for test, name in kinds if test(mode)), "not a regular file")


def _regular_stat(path: Path) -> os.stat_result | None:
    """The file about to be replaced, checked again just before writing (narrowing the window in
    which something else could take its place)."""
    try:
        found = os.stat(path)
    except FileNotFoundError:
        return None
    if not stat.S_ISREG(found.st_mode):
        raise OSError(0, f"it became {_kind(found.st_mode)}")
    return found


def _keep_mode(fd: int, existing: os.stat_result | None) -> None:
    """The new file gets the old one's permissions (and owner, when root may set it); a new name
    gets what the umask allows, as any program's output does."""
    if not hasattr(os, "fchmod"):
        return
    os.fchmod(fd, stat.S_IMODE(existing.st_mode) if existing is not None else 0o666 & ~_umask())
    if existing is not None and hasattr(os, "geteuid") and os.geteuid() == 0:
        os.fchown(fd, existing.st_uid, existing.st_gid)


def _rewrite_in_place(target: Path, complete: Path) -> None:
    """Copy the finished temporary file into ``target`` itself: a rename would leave its other
    hard links showing the old bytes."""
    with open(complete, "rb") as source, open(target, "r+b") as sink:
        shutil.copyfileobj(source, sink)
        sink.truncate()
        sink.flush()
        os.fsync(sink.fileno())


@contextlib.contextmanager
def temporary_beside(path: str | Path) -> Iterator[Path]:
    """A fresh temporary file name in ``path``'s folder, removed again unless it was renamed away."""
    path = Path(path)
    folder = path.parent
    fd, name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=folder)  # 0600 until written
    os.close(fd)
    tmp = Path(name)
    try:
        yield tmp
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


# ---------------------------------------------------------------- what a command may replace

SNIFF = 64 * 1024  # bytes read from each end of an existing file to recognise it


@dataclass(frozen=True)
class Kind:
    """A kind of file tracer writes, and how to recognise one already on disk from its first and
    last bytes (``head``, ``tail``)."""

    name: str
    about: str
    recognises: Callable[[bytes, bytes], bool] = field(repr=False)


def _starts(*prefixes: bytes) -> Callable[[bytes, bytes], bool]:
    return lambda head, tail: head.lstrip().startswith(prefixes)


KINDS = {
    kind.name: kind
    for kind in (
        Kind("svg", "an SVG drawing", lambda head, tail: b"<svg" in head and b"</svg>" in tail),
        Kind("png", "a PNG image", _starts(b"\x89PNG\r\n\x1a\n")),
        Kind("pdf", "a PDF document", _starts(b"%PDF-")),
        Kind("dot", "tracer's DOT text", _starts(b"digraph pipeline {")),
        Kind("html", "tracer's HTML report", lambda head, tail: b" \xc2\xb7 tracer report</title>" in head),
        Kind("json", "tracer's JSON trace", _starts(b'{\n  "pipeline": ')),
        Kind("text", "tracer's table", lambda head, tail: b"\nestimated peak: " in tail),
        Kind("python", "a module tracer exported", _starts(b"# Generated by `tracer export`")),
        Kind("yaml", "a pipeline tracer imported", _starts(b"# Imported by tracer.from_module")),
        Kind("diff", "tracer's diff page", lambda head, tail: b" \xc2\xb7 tracer diff</title>" in head),
    )
}


class Writes:
    """Every file one command writes: each checked before the work that makes it (never an input,
    never a file tracer did not write unless ``force``), written atomically, and listed in
    ``written``."""

    def __init__(self, reads: Iterable[str | Path] = (), *, force: bool = False, error_file: str | None = None):
        self.reads, self.force, self.error_file = list(reads), force, error_file
        self.written: list[Path] = []
        self._made: set[Path] = set()  # what this run created or replaced: it may write them again

    def check(self, path: str | Path, kind: str) -> Path:
        """The file writing ``path`` replaces, or a located error: an input (always), or an
        existing file that is not ``kind`` of tracer's own (without ``force``)."""
        target = check_output(path, self.reads, self.error_file)
        if self.force or target in self._made or not target.exists() or _looks_like(target, KINDS[kind]):
            return target
        raise OutputExists(
            Diagnostic(
                self.error_file or str(path),
                None,
                "output-exists",
                f"cannot write {path}: it exists and is not {KINDS[kind].about}, so this command did not write it; "
                "choose another name, or give --force to replace it",
            )
        )

    def write(self, path: str | Path, data: bytes | str, kind: str) -> Path:
        target = self.check(path, kind)
        written = write_atomic(path, data, error_file=self.error_file, reads=self.reads)
        self._made.add(target)
        self.written.append(written)
        return written


class OutputExists(TracerError):
    """A command would replace a file it did not write: the command line must say so (--force)."""


def _looks_like(path: Path, kind: Kind) -> bool:
    try:
        with open(path, "rb") as file:
            head = file.read(SNIFF)
            file.seek(max(0, os.fstat(file.fileno()).st_size - SNIFF))
            tail = file.read(SNIFF)
    except OSError:
        return False  # unreadable: not recognisably tracer's
    return kind.recognises(head, tail)
