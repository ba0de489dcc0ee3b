"""The run as text: the tensors (repeated blocks folded), the parameters, totals; rows that the
notebook view shows as HTML too. Works on any trace-like object (``tracer.presentation.trace.Trace``)."""

from __future__ import annotations

import math
import textwrap
from dataclasses import dataclass
from typing import Any

from ..core.formatting import human_bytes, human_count
from .folding import collapse_keys, depth_keys, repeat_folds, within

ACTIVATIONS = ("tensor", "op", "shape", "concrete", "stride", "contig", "view_of", "size", "FLOPs")
PARAMETERS = ("parameter", "shape", "concrete", "dtype", "count", "size")
VALUES = ("tensor", "rows", "NaN", "inf", "all masked")  # rows: slices along the last dim (a softmax's own)
# when a table is wider than the terminal, these columns give way first (their text elided in the
# middle); a shape never does: '(B, T, H_kv*d_mode…)' hides the very dim a reader looks for
_SHRINK = (("view_of", 7), ("tensor", 14), ("parameter", 14), ("op", 8), ("tensor", 12), ("parameter", 12))
_IDS = ("tensor", "parameter", "view_of")
# ... and when that is not enough, these columns go, the least read first (a stride cut in the
# middle means nothing; the concrete shape is the last to go)
_DROP = ("contig", "stride", "view_of", "dtype", "FLOPs", "concrete")


@dataclass
class _Folded:
    """Several records shown as one row: the copies of a repeated block, or a group ``depth`` levels deep."""

    label: str
    what: str
    records: list


def format_table(
    trace: Any, width: int | None = None, depth: int | None = None, expand: bool = False, collapse: tuple[str, ...] = ()
) -> str:
    """The run as text: the tensors, the parameters in their own section, totals.

    Copies 1..N-1 of a repeated block are one "×N" row unless ``expand``; with ``depth``, each
    group that many levels deep is one row, what is nested in it included (1: every top-level
    group); each group ``collapse`` names (as ``render --collapse`` does) is one row; ``width``
    elides long ids to fit a terminal.
    """
    tensors, params = table_rows(trace, depth, expand, collapse)
    title = f"{trace.name}  dims: " + ", ".join(f"{k}={v}" for k, v in trace.dims.items())
    lines = textwrap.wrap(title, width, subsequent_indent="  ") if width else [title]
    lines += _columns([ACTIVATIONS, *tensors], width)
    if params:
        lines += ["", "parameters"] + _columns([PARAMETERS, *params], width)
    found = value_rows(trace)
    if found:
        lines += ["", "values"] + _columns([VALUES, *found], width)
    lines += [""] + (textwrap.wrap(totals_line(trace), width, subsequent_indent="  ") if width else [totals_line(trace)])
    return "\n".join(lines)


def value_rows(trace: Any) -> list[tuple[str, ...]]:
    """Tensors whose rows the run found holding NaN or inf, or hiding every key (check_values)."""
    return [(rid, str(r.rows), _count(r.nan), _count(r.inf), _count(r.masked)) for rid, r in trace.value_rows.items() if r]


def _count(n: int) -> str:
    return str(n) if n else "-"


def table_rows(
    trace: Any, depth: int | None = None, expand: bool = False, collapse: tuple[str, ...] = ()
) -> tuple[list[tuple[str, ...]], list[tuple[str, ...]]]:
    """The cells of the tensors' rows and of the parameters' rows (headers: ACTIVATIONS, PARAMETERS)."""
    tensors, params = _grouped(trace, depth, expand, collapse)
    return [_tensor_row(item) for item in tensors], [_param_row(item) for item in params]


def totals_line(trace: Any) -> str:
    count, size = trace.param_count, trace.param_bytes
    flops = trace.total_flops
    return (
        f"total: {count:,} parameter{'s' if count != 1 else ''} ({human_bytes(size)}) · "
        f"{human_count(flops)} FLOPs{f' ({flops:,})' if flops >= 1000 else ''} · {len(trace.records):,} tensors"
    )


def _grouped(trace: Any, depth: int | None, expand: bool, collapse: tuple[str, ...] = ()) -> tuple[list, list]:
    """Records in order, split into tensors and parameters, folds replacing what they hide."""
    analysis = trace.analysis
    folds = {} if expand else repeat_folds(analysis)
    group_of = _groups(analysis) if depth is not None or collapse else {}
    groups = list(dict.fromkeys(group_of.values()))
    collapsed = collapse_keys(groups, collapse, analysis.source.file) if collapse else []
    levels = depth_keys(groups, depth) if depth is not None else []
    tensors, params, shown = [], [], {}
    for record in trace.records:
        fold = folds.get(record.id)
        group = group_of.get(record.id)
        key = label = None
        named = [k for k in collapsed if group is not None and within(group, k)]
        level = next((k for k in levels if group is not None and within(group, k)), None)
        if named:  # the outermost group named holds the record
            key = label = min(named, key=len)
            what = "collapsed"
        elif level is not None:  # a group row holds every copy inside it
            key = label = level
            what = "group"
        elif fold is not None:
            key, label, what = fold.key, fold.key, f"×{len(fold.hidden)}"
        target = params if record.op == "param" else tensors
        if key is None:
            target.append(record)
        elif (key, record.op == "param") in shown:
            shown[key, record.op == "param"].records.append(record)
        else:
            shown[key, record.op == "param"] = folded = _Folded(label, what, [record])
            target.append(folded)
    return tensors, params


def _groups(analysis: Any) -> dict[str, str]:
    """Record id -> the group of the step that made it (inner records included)."""
    return {out.id: node.step.group for node in analysis.nodes.values() if node.step.group for out in node.outs}


def _tensor_row(item: Any) -> tuple[str, ...]:
    if isinstance(item, _Folded):
        last = item.records[-1]
        size, flops = sum(r.nbytes for r in item.records), sum(r.flops for r in item.records)
        return (item.label, item.what, last.symbolic, _concrete(last), "-", "-", "-", human_bytes(size), _flops_cell(flops))
    r = item
    stride = str(tuple(r.stride)) if len(r.stride) != 1 else f"({r.stride[0]},)"
    contiguous = "yes" if r.contiguous else "NO"
    return (r.id, r.op, r.symbolic, _concrete(r), stride, contiguous, r.view_of or "-", human_bytes(r.nbytes), _flops_cell(r.flops))


def _param_row(item: Any) -> tuple[str, ...]:
    if isinstance(item, _Folded):
        count, size = sum(_numel(r) for r in item.records), sum(r.nbytes for r in item.records)
        return (item.label, item.what, f"{len(item.records)} tensors", "-", f"{count:,}", human_bytes(size))
    return (item.id, item.symbolic, _concrete(item), item.dtype, f"{_numel(item):,}", human_bytes(item.nbytes))


def _numel(record: Any) -> int:
    return math.prod(record.shape)


def _concrete(record: Any) -> str:
    return "[" + ", ".join(map(str, record.shape)) + "]"


def _flops_cell(flops: int) -> str:
    return human_count(flops) if flops else "-"


def _columns(rows: list[tuple[str, ...]], width: int | None) -> list[str]:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    gap = 2
    if width is not None and sum(widths) + gap * (len(widths) - 1) > width:
        gap = 1
        _fit(widths, rows[0], width - (len(widths) - 1))
        rows, widths = _dropped(rows, widths, width)
    header = rows[0]
    columns = [_elide_column([row[i] for row in rows[1:]], widths[i], name) for i, name in enumerate(header)]
    lines = [(" " * gap).join(name.ljust(w) for name, w in zip(header, widths)).rstrip(), (" " * gap).join("-" * w for w in widths)]
    for cells in zip(*columns):
        lines.append((" " * gap).join(cell.ljust(w) for cell, w in zip(cells, widths)).rstrip())
    return lines


def _elide_column(cells: list[str], width: int, column: str) -> list[str]:
    """Every cell of a column in ``width`` characters. Ids that would elide to the same text
    ('q_rot/rotated' and 'k_rot/rotated' both '…/rotated') keep their start instead."""
    short = [_elide(cell, width, column) for cell in cells]
    if column not in _IDS:
        return short
    seen: dict[str, set[str]] = {}
    for cell, text in zip(cells, short):
        seen.setdefault(text, set()).add(cell)
    return [text if len(seen[text]) == 1 else _middle(cell, width) for cell, text in zip(cells, short)]


def _dropped(rows: list[tuple[str, ...]], widths: list[int], width: int) -> tuple[list[tuple[str, ...]], list[int]]:
    """The columns that still fit in ``width`` once the narrowed ones are not enough (see _DROP)."""
    keep = list(range(len(widths)))
    for name in _DROP:
        if sum(widths[i] for i in keep) + len(keep) - 1 <= width:
            break
        keep = [i for i in keep if rows[0][i] != name]
    return [tuple(row[i] for i in keep) for row in rows], [widths[i] for i in keep]


def _fit(widths: list[int], header: tuple[str, ...], room: int) -> None:
    """Narrow the elidable columns, in order of what a reader can best spare, until they fit ``room``."""
    for name, least in _SHRINK:
        if name in header:
            i = header.index(name)
            widths[i] -= max(0, min(sum(widths) - room, widths[i] - max(least, len(name))))


def _elide(text: str, width: int, column: str) -> str:
    """``text`` in ``width`` characters. An op keeps its start; an id drops leading path segments
    ('layers/0/attn_weights' -> '…/attn_weights'), then its middle ('masked…_scores')."""
    if len(text) <= width:
        return text
    if column == "op":
        return text[: width - 1] + "…"
    parts = text.split("/")
    while len(parts) > 1 and len("…/" + "/".join(parts)) > width:
        parts.pop(0)
    tail = "…/" + "/".join(parts) if len(parts) < len(text.split("/")) else text
    return tail if len(tail) <= width else _middle(text, width)


def _middle(text: str, width: int) -> str:
    """``text`` without its middle: 'masked_attention_scores' -> 'masked…_scores'."""
    if len(text) <= width:
        return text
    head = width // 2
    return text[:head] + "…" + text[len(text) - (width - 1 - head) :]
