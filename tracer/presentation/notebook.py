"""What Jupyter shows for a trace, a record and a pipeline (their ``_repr_html_``).

A trace shows a header (name, dims, totals), its table (repeated blocks folded) and its diagram
(repeated blocks folded too, under a size cap). Any problem drawing (no Graphviz, a diagram too
large) becomes one line under the table, never a traceback.
"""

from __future__ import annotations

import html
import re
from typing import Any

from ..core.errors import TracerError, display
from ..core.formatting import human_bytes, human_count
from ..runtime.records import NOTEBOOK_STYLE as _STYLE
from .diagram import dot_source
from .graphviz import render_bytes
from .table import ACTIVATIONS, PARAMETERS, VALUES, table_rows, value_rows

MAX_NODES = 400  # beyond this a diagram is unreadable inline; `tracer render` still draws it
MAX_SVG_BYTES = 2_000_000
DRAW_TIMEOUT = 30.0  # seconds: a notebook cell should not hang on a layout
NO_RENDERER = (
    "No diagram: drawing needs Graphviz's <code>dot</code> (apt-get install graphviz, brew install graphviz, "
    "conda install graphviz) or <code>pip install graphviz-pure</code>."
)
# one scoped style per output: every cell of the tables is styled by class, not attribute by attribute
_SVG_SIZE = re.compile(r"<svg(?= )")
_NODE = re.compile(r'\s+("(?:[^"\\]|\\.)*"|\w+) \[')  # a node statement in DOT (an edge has '->' after its first name)


def trace_html(trace: Any) -> str:
    tensors, params = table_rows(trace)
    parts = [_header(trace), _scrolling(_table(ACTIVATIONS, tensors), "28em")]
    if params:
        count = sum(1 for r in trace.records if r.op == "param")
        parts.append(f"<details><summary>{count:,} parameter tensors</summary>{_table(PARAMETERS, params)}</details>")
    found = value_rows(trace)
    if found:  # run(check_values=True) found NaN, inf or fully masked rows
        parts.append(_table(VALUES, found) + "".join(_note(str(w)) for w in trace.value_warnings))
    parts.append(_diagram(trace))
    return f'<div class="tracer trace">{_STYLE}{"".join(parts)}</div>'


def pipeline_html(pipeline: Any) -> str:
    spec, analysis = pipeline.spec, pipeline.check()
    dims = ", ".join(f"{k}={v}" for k, v in analysis.dims.items()) or "none"
    expanded = len(analysis.nodes)
    rows = [
        ("file", display(pipeline.path)),  # a file name's undecodable bytes as \xff
        ("dims", dims),
        ("inputs", ", ".join(spec.inputs) or "none"),
        ("params", f"{len(analysis.pipeline.params):,}"),
        ("steps", f"{len(spec.steps)}" + (f" ({expanded:,} once blocks are expanded)" if expanded != len(spec.steps) else "")),
    ]
    about = f"<p>{_esc(spec.description.strip())}</p>" if spec.description else ""
    body = "".join(f"<tr><th>{_esc(k)}</th><td>{_esc(v)}</td></tr>" for k, v in rows)
    hint = '<p class="note">.run() traces it on torch; .run(device="meta") without memory</p>'
    return f'<div class="tracer pipeline">{_STYLE}<b>{_esc(spec.name)}</b>{about}<table>{body}</table>{hint}</div>'


def _header(trace: Any) -> str:
    dims = ", ".join(f"{k}={v}" for k, v in trace.dims.items()) or "no dims"
    flops = trace.total_flops
    totals = [
        f"{trace.param_count:,} parameters ({human_bytes(trace.param_bytes)})",
        f"estimated peak {human_bytes(trace.peak_bytes)}",
        f"{human_count(flops)} FLOPs" + (f" ({flops:,})" if flops >= 1000 else ""),
        f"{len(trace.records):,} tensors",
    ]
    return f"<p><b style='font-size:14px'>{_esc(trace.name)}</b> &#160; {_esc(dims)}<br/>{_esc(' · '.join(totals))}</p>"


def _table(header: tuple[str, ...], rows: list[tuple[str, ...]]) -> str:
    head = "".join(f"<th>{_esc(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{_esc(c)}</td>" for c in row) + "</tr>" for row in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _scrolling(inner: str, height: str) -> str:
    return f'<div style="max-height:{height}; overflow:auto">{inner}</div>'


def _diagram(trace: Any) -> str:
    source = dot_source(trace)
    nodes = sum(1 for m in map(_NODE.match, source.splitlines()) if m and m[1] not in ("graph", "node", "edge"))
    if nodes > MAX_NODES:
        return _note(
            f"No inline diagram: {nodes:,} nodes (the limit here is {MAX_NODES}). Fold groups with "
            "trace.diagram(collapse=[...]), or draw it with `tracer render FILE`."
        )
    try:
        svg = render_bytes(source, "svg", trace.analysis.source.file, DRAW_TIMEOUT).decode("utf-8")
    except TracerError as exc:
        return _note(NO_RENDERER if exc.code == "no-renderer" else _esc(exc.diagnostics[0].message), escaped=True)
    if len(svg) > MAX_SVG_BYTES:
        return _note(f"No inline diagram: {human_bytes(len(svg))} of SVG; draw it with `tracer render FILE`.")
    return _fitted(svg[svg.find("<svg") :])


def _fitted(svg: str) -> str:
    """The drawing scaled down to the cell's width (never up), whole at a glance rather than a
    corner of it in a scroll box: Graphviz's width and height give way to CSS, its viewBox keeps
    the proportions."""
    return '<div class="diagram">' + _SVG_SIZE.sub('<svg style="max-width:100%; height:auto"', svg, count=1) + "</div>"


def _note(text: str, escaped: bool = False) -> str:
    return f'<p class="note">{text if escaped else _esc(text)}</p>'


def _esc(text: Any) -> str:
    return html.escape(str(text), quote=True)
