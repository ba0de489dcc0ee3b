"""Drawing DOT text with a Graphviz program, under a time limit: the one named by ``tracer render
--dot PATH``, else by the environment variable ``TRACER_DOT``, else Graphviz's ``dot``, else
``graphviz-pure``.

``graphviz-pure`` (PyPI, a Rust port of Graphviz's ``dot``) installs with pip, without root or a
system library, and draws tracer's diagrams with the same nodes, edges, clusters and text; it writes
SVG and PNG, not PDF. It is looked up on PATH and beside the running Python, where pip puts it in a
virtual environment that is not activated (``.venv/bin/python -m tracer ...``).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import sysconfig
import tempfile
from collections.abc import Iterator
from contextvars import ContextVar
from pathlib import Path

from ..core.errors import Diagnostic, TracerError

ENV = "TRACER_DOT"
DOT_TIMEOUT = 120.0  # seconds: `dot` lays out a few thousand nodes in seconds; an unfolded 600-copy stack never finishes
PROGRAMS = ("dot", "graphviz-pure")
_CHOSEN: ContextVar[str | None] = ContextVar("tracer_renderer", default=None)


@contextlib.contextmanager
def chosen_renderer(program: str | None) -> Iterator[None]:
    """Every drawing inside uses ``program`` (a path or a name on PATH); None keeps the default."""
    token = _CHOSEN.set(program)
    try:
        yield
    finally:
        _CHOSEN.reset(token)


def find_renderer(pipeline_file: str, fmt: str) -> str:
    """The renderer's executable, or a located ``no-renderer`` error that says how to get one."""
    chosen = (_CHOSEN.get() or os.environ.get(ENV, "")).strip()
    if chosen:
        exe = shutil.which(chosen)
        if exe is None:
            raise no_renderer(pipeline_file, fmt, f"the renderer named by --dot or {ENV}, {chosen!r}, is not an executable program")
        return exe
    for name in PROGRAMS:
        exe = shutil.which(name) or shutil.which(name, path=sysconfig.get_path("scripts"))
        if exe:
            return exe
    raise no_renderer(pipeline_file, fmt, "neither Graphviz's `dot` nor `graphviz-pure` is installed")


def no_renderer(pipeline_file: str, fmt: str, why: str) -> TracerError:
    message = (
        f"cannot render {fmt}: {why}. Install Graphviz (Debian/Ubuntu: apt-get install graphviz; macOS: brew install graphviz; "
        f"conda: conda install -c conda-forge graphviz), or without root tracer's `diagrams` extra, "
        f"`pip install 'attention-tracer[diagrams]'` (it brings graphviz-pure: SVG, PNG and the HTML report), "
        f"or name a renderer with --dot PATH or {ENV}=PATH; `-o NAME.dot` writes DOT text, which needs none"
    )
    return TracerError(Diagnostic(pipeline_file, None, "no-renderer", message))


def render_bytes(source: str, fmt: str, pipeline_file: str, timeout: float = DOT_TIMEOUT) -> bytes:
    """Graphviz's ``dot`` (or the renderer ``find_renderer`` picks) run on DOT text in a private
    temporary folder, under a time limit; returns the picture."""
    exe = find_renderer(pipeline_file, fmt)
    with tempfile.TemporaryDirectory(prefix="tracer-") as folder:
        dot_path, picture = Path(folder) / "diagram.dot", Path(folder) / f"diagram.{fmt}"
        dot_path.write_text(source, encoding="utf-8")
        try:
            done = subprocess.run([exe, f"-T{fmt}", str(dot_path), "-o", str(picture)], capture_output=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            raise TracerError(Diagnostic(pipeline_file, None, "render-timeout", _too_slow(timeout))) from None
        said = done.stderr.decode("utf-8", "backslashreplace").strip()  # a renderer may write any bytes
        if done.returncode != 0 and "not recognized" in said:
            raise no_renderer(pipeline_file, fmt, f"`{Path(exe).name}` cannot write {fmt} ({said.splitlines()[0]})")
        if done.returncode != 0:
            raise _failed(
                pipeline_file,
                exe,
                fmt,
                f"{_ended(done.returncode)}: {said[:2000]}" if said else f"{_ended(done.returncode)} and said nothing",
            )
        for line in dict.fromkeys(said.splitlines()[:20]):  # e.g. a PNG scaled down to fit: say so
            print(Diagnostic(pipeline_file, None, "dot-warning", f"Graphviz: {line.strip()}", severity="warning"), file=sys.stderr)
        drawn = picture.read_bytes() if picture.is_file() else b""
        if not drawn:
            raise _failed(pipeline_file, exe, fmt, "exited with status 0 but wrote no picture")
        return drawn


def _ended(returncode: int) -> str:
    """How the renderer stopped: a negative status is the signal that killed it."""
    if returncode < 0:
        try:
            return f"was killed by {signal.Signals(-returncode).name}"
        except ValueError:
            return f"was killed by signal {-returncode}"
    return f"exited with status {returncode}"


def _failed(pipeline_file: str, exe: str, fmt: str, what: str) -> TracerError:
    message = (
        f"`{Path(exe).name} -T{fmt}` {what}; write the DOT text with -o NAME.dot and draw it yourself, "
        "fold repeated blocks with --collapse 'BLOCK/*', or name another renderer with --dot PATH"
    )
    return TracerError(Diagnostic(pipeline_file, None, "render-failed", message))


def _too_slow(timeout: float) -> str:
    return (
        f"Graphviz's `dot` did not finish drawing within {timeout:g} s: the diagram is too large to lay out. "
        "Draw repeated blocks folded (the default, without --expand), fold groups into one node each with "
        "--collapse GROUP (or 'BLOCK/*'), raise the limit with --timeout, or write the DOT text only with -o NAME.dot"
    )
