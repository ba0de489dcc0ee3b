"""Atomic output files: written under a temporary name beside the target, then renamed over it.

A run that fails or is interrupted half-way leaves no partial file, and never replaces a good
file with a bad one: the target changes only through ``os.replace``, which is atomic on POSIX and
Windows when both names are on the same filesystem (hence the temporary file in the same folder).

>>> import tempfile, pathlib
>>> folder = pathlib.Path(tempfile.mkdtemp())
>>> write_atomic(folder / "trace.json", '{"ok": true}\\n').read_text()
'{"ok": true}\\n'
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

from ..core.errors import Diagnostic, TracerError


def write_atomic(path: str | Path, data: bytes | str, *, error_file: str | None = None) -> Path:
    """Write ``data`` to ``path`` atomically and return the path.

    An ``OSError`` (no such folder, no permission, disk full) becomes a ``TracerError`` naming
    ``error_file`` (default: ``path``), and leaves ``path`` as it was.
    """
    path = Path(path)
    payload = data.encode("utf-8") if isinstance(data, str) else data
    try:
        with temporary_beside(path) as tmp:
            with open(tmp, "wb") as handle:
                handle.write(payload)
                handle.flush()
                os.fsync(handle.fileno())
            os.replace(tmp, path)
    except OSError as exc:
        reason = exc.strerror or str(exc)
        raise TracerError(Diagnostic(error_file or str(path), None, "output-failed", f"cannot write {path}: {reason}")) from None
    return path


@contextlib.contextmanager
def temporary_beside(path: str | Path) -> Iterator[Path]:
    """A fresh temporary file name in ``path``'s folder, removed again unless it was renamed away."""
    path = Path(path)
    folder = path.parent
    fd, name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=folder)
    try:
        os.fchmod(fd, 0o666 & ~_umask()) if hasattr(os, "fchmod") else None  # mkstemp makes 0600
    finally:
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
