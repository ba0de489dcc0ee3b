"""``tracer diff A B --html PAGE``: the two pipelines side by side, one row per pair of steps.

Rows follow B's order with A's unpaired steps placed before the partner of the next step they
precede, so both files read top to bottom. Each row is marked as the text diff marks it: the same,
renamed (``=``), changed (``~``), only in A (``-``) or only in B (``+``).

The page is one file with no script at all: its Content Security Policy allows inline styles and
nothing else (no script, no fetch), and every text taken from a pipeline (ids, ops, shapes, fields,
paths) is written through ``html.escape``, so nothing in a file can become markup.
"""

from __future__ import annotations

import html
from dataclasses import dataclass

from ..core.formatting import human_bytes

CSP = "default-src 'none'; style-src 'unsafe-inline'"
MARKS = {"same": "", "renamed": "=", "changed": "~", "removed": "-", "added": "+"}

STYLE = """
body { font: 14px/1.4 system-ui, sans-serif; margin: 1.5em; color: #222; }
h1 { font-size: 1.2em; } code, td { font-family: ui-monospace, monospace; font-size: 13px; }
table { border-collapse: collapse; margin: 1em 0; } th, td { border: 1px solid #ddd; padding: 2px 8px; text-align: left; vertical-align: top; }
th { background: #f4f4f4; } td.mark { text-align: center; font-weight: bold; }
tr.renamed { background: #eef5ff; } tr.changed { background: #fff6dd; } tr.removed { background: #fde8e8; } tr.added { background: #e6f6e6; }
td.num { text-align: right; } .verdict { font-weight: bold; }
"""


@dataclass(frozen=True)
class Side:
    """One step as a row shows it: id, kind and shape (symbolic and concrete)."""

    id: str
    op: str
    shape: str


@dataclass(frozen=True)
class Row:
    a: Side | None
    b: Side | None
    status: str  # a key of MARKS
    change: str = ""  # what changed, as the text diff says it


def diff_html(a: str, b: str, rows: list[Row], totals: dict[str, list[int]], notes: list[str], verdict: str) -> str:
    """The page: the step table, the params and values notes, and the totals side by side."""
    e = html.escape
    body = [f"<h1>tracer diff</h1><p><code>--- {e(a)}</code><br><code>+++ {e(b)}</code></p>"]
    body.append(f'<p class="verdict">{e(verdict)}</p>')
    head = "<tr><th></th><th>A step</th><th>op</th><th>shape</th><th>B step</th><th>op</th><th>shape</th><th>what changed</th></tr>"
    body.append(f"<table>{head}{''.join(_row(row) for row in rows)}</table>")
    if notes:
        body.append("<ul>" + "".join(f"<li><code>{e(note)}</code></li>" for note in notes) + "</ul>")
    body.append(
        "<table><tr><th></th><th>A</th><th>B</th><th>B - A</th></tr>" + "".join(_total(k, v) for k, v in totals.items()) + "</table>"
    )
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f'<meta http-equiv="Content-Security-Policy" content="{CSP}">'
        f"<title>{e(a)} vs {e(b)} · tracer diff</title><style>{STYLE}</style></head>"
        f"<body>{''.join(body)}</body></html>\n"
    )


def _row(row: Row) -> str:
    cells = [f'<td class="mark">{MARKS[row.status]}</td>']
    for side in (row.a, row.b):
        values = ("", "", "") if side is None else (side.id, side.op, side.shape)
        cells += [f"<td>{html.escape(v)}</td>" for v in values]
    cells.append(f"<td>{html.escape(row.change)}</td>")
    return f'<tr class="{row.status}">{"".join(cells)}</tr>'


def _total(name: str, values: list[int]) -> str:
    x, y = values
    shown = [human_bytes(x), human_bytes(y)] if name == "peak bytes" else [f"{x:,}", f"{y:,}"]
    delta = "" if x == y else f"{y - x:+,}"
    return (
        f'<tr><th>{html.escape(name)}</th><td class="num">{shown[0]}</td><td class="num">{shown[1]}</td><td class="num">{delta}</td></tr>'
    )
