"""``tracer check``'s cache: a file checked before, unchanged, with the same options, is not
checked again; what its check printed is printed again, exactly.

As ruff's and mypy's caches, it lives in the current folder, in ``.tracer_cache/`` (which ignores
itself in git: it holds a ``.gitignore`` of ``*``); ``$TRACER_CACHE_DIR`` puts it elsewhere, and
``--no-cache`` or ``TRACER_NO_CACHE=1`` turns it off. An entry is found by what the output depends
on besides the files: the file as named on the command line, the current folder (block files are
named relative to it), the options, and tracer itself (its version, every one of its source
files' size and modification time, Python's version and those of pydantic and PyYAML). It is used
only while every file the check read (the pipeline and each block file it includes, through the
same symlinks) still holds the same bytes: content is compared, never a modification time.

Entries are written to a temporary name and renamed into place, so a reader sees a whole entry or
none. An entry that cannot be read, is not JSON of the expected form, or was written for another
key is a miss; a cache folder that cannot be written is no error (the check runs, uncached). A
check whose result depends on a file being absent or unreadable (a missing block file, say) is
not stored: only files that were read are compared.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import stat
import sys
import threading
from dataclasses import dataclass
from pathlib import Path

from . import __version__

DIR_ENV = "TRACER_CACHE_DIR"
OFF_ENV = "TRACER_NO_CACHE"
DEFAULT_DIR = ".tracer_cache"
FORMAT = 1  # of an entry: a change of layout changes every key
MAX_READ = 4 * 1024 * 1024  # spec.source.MAX_BYTES: a file bigger than a pipeline may be is no hit
MAX_ENTRY = 64 * 1024 * 1024  # an entry bigger than this was not written by tracer: a miss
# codes of results that depend on a file being absent, unreadable or of another kind: never stored
UNSTORED_CODES = frozenset({"file-missing", "file-unreadable", "file-too-large", "block-missing", "block-use"})
_ENTRIES = re.compile(r"check-[0-9a-f]{16}")  # a folder of entries (the fingerprint's first 16 hex digits)
_LIBRARIES = ("pydantic", "pydantic_core", "pyyaml")  # distributions whose versions change what a check says


@dataclass(frozen=True)
class Checked:
    """What checking one file printed, in order (``("out" | "err", line)``), whether it failed, and
    the files it read (the path each was opened by, its bytes) and the codes of its diagnostics."""

    printed: tuple[tuple[str, str], ...]
    failed: bool
    reads: tuple[tuple[str, bytes], ...] = ()
    codes: frozenset[str] = frozenset()  # of the diagnostics

    def replay(self) -> None:
        for stream, text in self.printed:
            print(text, file=sys.stdout if stream == "out" else sys.stderr)


def enabled(no_cache: bool) -> bool:
    return not no_cache and os.environ.get(OFF_ENV, "") in ("", "0")


def folder() -> Path:
    return Path(os.environ.get(DIR_ENV) or DEFAULT_DIR)


class CheckCache:
    """The entries of one set of options, in ``folder()/check-FINGERPRINT/``."""

    def __init__(self, options: dict, root: Path | None = None):
        self.root = root or folder()
        tool = _fingerprint()
        self.entries = self.root / f"check-{tool[:16]}"
        self.base = [FORMAT, tool, os.getcwd(), options]

    def _key(self, name: str) -> tuple[str, Path]:
        key = json.dumps([*self.base, name])
        return key, self.entries / (hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest()[:32] + ".json")

    def get(self, name: str) -> Checked | None:
        """The stored result for the file ``name``, when every file it read is unchanged; else None."""
        key, path = self._key(name)
        data = _read_regular(str(path), MAX_ENTRY)
        try:
            entry = json.loads(data) if data is not None else None
        except (ValueError, RecursionError):
            return None
        return _valid(entry, key)

    def put(self, name: str, checked: Checked) -> None:
        """Store ``checked`` for ``name`` (quietly nothing when the folder cannot be written)."""
        if not checked.reads or checked.codes & UNSTORED_CODES:
            return
        key, path = self._key(name)
        entry = {
            "key": key,
            "reads": [[file, os.path.realpath(file), _digest(data)] for file, data in checked.reads],
            "printed": [list(item) for item in checked.printed],
            "failed": checked.failed,
        }
        with contextlib.suppress(OSError, UnicodeEncodeError):
            self._prepare()
            _write_atomic(path, json.dumps(entry).encode("utf-8"))

    def _prepare(self) -> None:
        """The entries' folder; a new one replaces those of other versions of tracer."""
        if self.entries.is_dir():
            return
        new_root = not self.root.is_dir()
        self.entries.mkdir(parents=True, exist_ok=True)
        if new_root:  # as ruff, mypy and pytest mark theirs: never committed, never backed up
            (self.root / ".gitignore").write_text("# Automatically created by tracer.\n*\n")
            (self.root / "CACHEDIR.TAG").write_text("Signature: 8a477f597d28d172789f06886806bc55\n# tracer check's cache\n")
        for old in self.root.iterdir():
            if old != self.entries and _ENTRIES.fullmatch(old.name) and old.is_dir():
                _remove_tree(old)


def _valid(entry: object, key: str) -> Checked | None:
    """The entry as a result when it is one of the expected form, for ``key``, whose files are unchanged."""
    if not isinstance(entry, dict) or entry.get("key") != key or not isinstance(entry.get("failed"), bool):
        return None
    reads, printed = entry.get("reads"), entry.get("printed")
    if not isinstance(reads, list) or not isinstance(printed, list):
        return None
    if not all(isinstance(r, list) and len(r) == 3 and all(isinstance(part, str) for part in r) for r in reads):
        return None
    if not all(isinstance(p, list) and len(p) == 2 and p[0] in ("out", "err") and isinstance(p[1], str) for p in printed):
        return None
    if not all(_unchanged(*read) for read in reads):
        return None
    return Checked(tuple((stream, text) for stream, text in printed), entry["failed"])


def _unchanged(file: str, real: str, digest: str) -> bool:
    data = _read_regular(file)
    return data is not None and os.path.realpath(file) == real and _digest(data) == digest


def _read_regular(file: str, limit: int = MAX_READ) -> bytes | None:
    """The bytes of a regular file up to ``limit`` (never waiting on a FIFO), None for anything else
    or a bigger file."""
    try:
        fd = os.open(file, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        with os.fdopen(os.dup(fd), "rb") as handle:
            data = handle.read(limit + 1)
        return data if len(data) <= limit else None
    except OSError:
        return None
    finally:
        os.close(fd)


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _write_atomic(path: Path, payload: bytes) -> None:
    """Write under a name of this thread's own, then rename: concurrent writers each replace the
    entry whole (the last one wins), and a reader never sees half of one."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    try:
        with open(tmp, "wb") as handle:
            handle.write(payload)
        os.replace(tmp, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()


def _remove_tree(path: Path) -> None:
    """Another tracer's entries: only files it writes (a folder of anything else is left alone)."""
    with contextlib.suppress(OSError):
        for entry in path.iterdir():
            if not entry.name.endswith((".json", ".tmp")):
                return
            entry.unlink()
        path.rmdir()


def _fingerprint() -> str:
    """tracer's code and what it runs on: a change to any of its source files, or another
    Python, pydantic or PyYAML, makes every entry stale."""
    parts = [__version__, sys.version, *_library_versions()]
    package = Path(__file__).parent
    for folder_path, folders, files in os.walk(package):
        folders[:] = sorted(f for f in folders if f != "__pycache__")
        for file in sorted(files):
            if file.endswith(".py"):
                info = os.stat(os.path.join(folder_path, file))
                parts.append(f"{os.path.relpath(folder_path, package)}/{file}:{info.st_size}:{info.st_mtime_ns}")
    return hashlib.sha256("\n".join(parts).encode("utf-8", "surrogatepass")).hexdigest()


def _library_versions() -> list[str]:
    """The installed distributions of pydantic, pydantic-core and PyYAML (their dist-info folders
    name the version), found without importing them."""
    found = []
    folders = {str(Path(p).resolve()) for p in sys.path if p and os.path.isdir(p)}
    for place in sorted(folders):
        try:
            names = os.listdir(place)
        except OSError:
            continue
        found += sorted(n for n in names if n.endswith(".dist-info") and n.split("-")[0].lower() in _LIBRARIES)
    return found
