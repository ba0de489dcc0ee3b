"""Which program draws DOT text: the one named by ``tracer render --dot PATH``, else by the
environment variable ``TRACER_DOT``, else Graphviz's ``dot``, else ``graphviz-pure``.

``graphviz-pure`` (PyPI, a Rust port of Graphviz's ``dot``) installs with pip, without root or a
system library, and draws tracer's diagrams with the same nodes, edges, clusters and text; it writes
SVG and PNG, not PDF. It is looked up on PATH and beside the running Python, where pip puts it in a
virtual environment that is not activated (``.venv/bin/python -m tracer ...``).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sysconfig
from collections.abc import Iterator
from contextvars import ContextVar

from ..core.errors import Diagnostic, TracerError

ENV = "TRACER_DOT"
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
        f"conda: conda install -c conda-forge graphviz), or without root `pip install graphviz-pure` (SVG and PNG), "
        f"or name a renderer with --dot PATH or {ENV}=PATH; `-o NAME.dot` writes DOT text, which needs none"
    )
    return TracerError(Diagnostic(pipeline_file, None, "no-renderer", message))
