"""Every file tracer writes from a trace, in one registry: a format is one ``@writer`` function that
turns a trace into bytes. ``tracer render -o`` and ``tracer run -o`` pick one by the file's suffix
(or ``--json``), the gallery and the API by name, and :func:`write` puts the bytes on disk
atomically.

=========  ==================  ===============================================================
format     suffixes            what it writes
=========  ==================  ===============================================================
svg        .svg                the diagram, drawn by Graphviz
png        .png                the diagram, drawn by Graphviz
pdf        .pdf                the diagram, drawn by Graphviz (not by graphviz-pure)
dot        .dot, .gv           the diagram's DOT text (needs no Graphviz)
html       .html, .htm         the interactive report: one self-contained page
json       .json               every record (``--values``: with the tensors' values)
text       .txt                the table ``tracer run`` prints
=========  ==================  ===============================================================
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from ..core.errors import Diagnostic, TracerError
from .diagram import dot_source
from .files import Writes
from .graphviz import DOT_TIMEOUT, render_bytes
from .report import report_html

if TYPE_CHECKING:
    from .trace import Trace


@dataclass(frozen=True)
class Options:
    """What a writer may be asked for; each reads the options that apply to it."""

    collapse: tuple[str, ...] = ()  # groups drawn as one node
    expand: bool = False  # every copy of a repeated block, not the first and a ×N marker
    timeout: float = DOT_TIMEOUT  # seconds Graphviz may take
    values: bool = False  # tensor values in JSON
    width: int | None = None  # the table's columns
    depth: int | None = None  # the table's nesting
    peak: str = ""  # the table's last line: the estimated peak
    rankdir: str = "TB"  # the diagram's direction: "LR" flows left to right
    legend: bool = True  # the diagram's legend
    tokens: tuple[str, ...] = ()  # the report's labels for the attention weights' positions
    rank: int | None = None  # a parallel: pipeline's rank whose local shapes and collectives diagrams draw


@dataclass(frozen=True)
class Writer:
    name: str
    suffixes: tuple[str, ...]
    about: str
    write: Callable[[Trace, Options], bytes] = field(repr=False)


WRITERS: dict[str, Writer] = {}


def writer(name: str, *suffixes: str, about: str):
    """Register a format: ``fn(trace, options) -> bytes``."""

    def register(fn: Callable[[Trace, Options], bytes]) -> Callable[[Trace, Options], bytes]:
        WRITERS[name] = Writer(name, suffixes, about, fn)
        return fn

    return register


def _picture(fmt: str):
    def draw(trace: Trace, options: Options) -> bytes:
        return render_bytes(_dot_text(trace, options), fmt, trace.analysis.source.file, options.timeout)

    return draw


for _fmt in ("svg", "png", "pdf"):
    writer(_fmt, f".{_fmt}", about=f"the diagram as {_fmt.upper()}, drawn by Graphviz")(_picture(_fmt))


@writer("dot", ".dot", ".gv", about="the diagram's DOT text")
def _dot(trace: Trace, options: Options) -> bytes:
    return _dot_text(trace, options).encode()


def _dot_text(trace: Trace, options: Options) -> str:
    return dot_source(trace, options.collapse, options.expand, options.rankdir, options.legend, options.rank)


@writer("html", ".html", ".htm", about="the interactive report, one self-contained page")
def _html(trace: Trace, options: Options) -> bytes:
    return report_html(trace, options.collapse, options.tokens).encode()


@writer("json", ".json", about="every record as JSON")
def _json(trace: Trace, options: Options) -> bytes:
    return (trace.to_json(values=options.values) + "\n").encode()


@writer("text", ".txt", about="the table tracer run prints")
def _text(trace: Trace, options: Options) -> bytes:
    return (trace.table(width=options.width, depth=options.depth, expand=options.expand) + "\n" + options.peak + "\n").encode()


def by_suffix(path: str | Path, allowed: tuple[str, ...], default: str) -> tuple[Path, Writer]:
    """The file to write and its format: the writer whose suffix it has, among ``allowed`` formats;
    a name without a suffix gets the default's. A directory is refused (never written into)."""
    path = Path(path)

    def fail(message: str):
        raise TracerError(Diagnostic(str(path), None, "output-format", message))

    if path.is_dir():
        fail(f"is a directory; name the file to write, e.g. -o DIR/diagram{WRITERS[default].suffixes[0]}")
    if not path.suffix:
        path = path.with_name(path.name + WRITERS[default].suffixes[0])
    suffix = path.suffix.lower()
    for name in allowed:
        if suffix in WRITERS[name].suffixes:
            return path, WRITERS[name]
    known = ", ".join(s for name in allowed for s in WRITERS[name].suffixes)
    fail(f"cannot write '{path.suffix}': use one of {known}")


def write(trace: Trace, path: str | Path, fmt: Writer, options: Options = Options(), writes: Writes | None = None) -> Path:
    """Write ``trace`` in format ``fmt`` to ``path``, atomically: a failure leaves every existing
    file as it was. Returns the path. A command passes its ``writes`` (what it may replace); the
    API's caller named the file, and may replace anything but the files the trace was made from."""
    analysis = trace.analysis
    writes = writes or Writes(read_files(analysis), force=True, error_file=analysis.source.file)
    writes.check(path, fmt.name)  # before the work of drawing
    return writes.write(path, fmt.write(trace, options), fmt.name)


def read_files(analysis) -> list[str]:
    """The files a trace was made from: its pipeline and every block file it includes."""
    return [analysis.source.file, *sorted({info.path for info in analysis.blocks.values()})]
