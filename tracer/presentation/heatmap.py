"""Attention weights as pictures: which tensors are (…, T_q, T_kv) weights, and their per-head maps.

Shared by the static diagrams (a small map per head inside the softmax node) and the HTML report
(every head, downsampled to a cap). Colours are scaled to each map's own largest weight, so a
long row of small weights still shows its pattern.
"""

from __future__ import annotations

import html
from typing import Any

NODE_MAX_SIDE = 32  # diagrams draw maps inside a node only up to T_q, T_kv <= 32
NODE_MAX_HEADS = 8  # ... for at most this many heads of the first batch element
NODE_HEADS_PER_ROW = 4
LOW, HIGH, NAN = (255, 255, 255), (8, 81, 156), "#f4a6a6"  # white -> dark blue; NaN rows stand out in red


def is_attention_weights(step: Any, record: Any) -> bool:
    """A softmax over the last dim of a tensor with at least two dims, whose values were kept and
    hold at least one map (a dim of 0 anywhere leaves nothing to draw, and no side to divide by)."""
    rank, dim = len(record.shape), step.normalises()
    if dim is None or rank < 2 or dim not in (-1, rank - 1) or record.tensor is None:
        return False
    return record.tensor.device.type != "meta" and record.tensor.numel() > 0


def leading_maps(tensor: Any) -> Any:
    """The tensor as (maps, T_q, T_kv): every leading index (batch, head) flattened, row-major."""
    return tensor.detach().float().cpu().reshape(-1, *tensor.shape[-2:])


def colour(value: float, top: float) -> str:
    """``value`` on the white-to-blue scale whose darkest end is ``top`` (NaN is red)."""
    if value != value:  # NaN
        return NAN
    share = min(max(value / top, 0.0), 1.0) if top > 0 else 0.0
    return "#" + "".join(f"{round(lo + (hi - lo) * share):02x}" for lo, hi in zip(LOW, HIGH))


def node_rows(step: Any, record: Any) -> list[str]:
    """Graphviz HTML label rows: one small map per head of the first batch element, or none when
    the tensor is not attention weights or a side exceeds ``NODE_MAX_SIDE``."""
    if not is_attention_weights(step, record) or max(record.shape[-2:]) > NODE_MAX_SIDE:
        return []
    heads = record.shape[-3] if len(record.shape) >= 3 else 1
    maps = leading_maps(record.tensor)[: min(heads, NODE_MAX_HEADS)]
    cell = min(8, max(2, 96 // max(record.shape[-2:])))
    # a fixed-size cell around each map: a wider label line would otherwise stretch its columns apart
    box = f'WIDTH="{cell * record.shape[-1] + 2}" HEIGHT="{cell * record.shape[-2] + 2}" FIXEDSIZE="TRUE"'
    tables = [f"<TD {box}>{_map_table(m, cell)}</TD>" for m in maps]
    lines = "".join("<TR>" + "".join(tables[i : i + NODE_HEADS_PER_ROW]) + "</TR>" for i in range(0, len(tables), NODE_HEADS_PER_ROW))
    caption = f'<FONT POINT-SIZE="8" COLOR="#666666">{html.escape(_caption(record))}</FONT>'
    return [f'<TABLE BORDER="0" CELLSPACING="3" CELLPADDING="0">{lines}</TABLE>', caption]


def _caption(record: Any) -> str:
    names = record.symbolic_shape
    text = "weights" + (f" per {names[-3]}" if len(names) >= 3 else "")
    return text + (f", first {', '.join(names[:-3])}" if len(names) >= 4 else "") + " (rows: queries)"


def _map_table(weights: Any, cell: int) -> str:
    finite = weights[weights.isfinite()]
    top = float(finite.max()) if finite.numel() else 0.0
    rows = "".join(
        "<TR>" + "".join(f'<TD BGCOLOR="{colour(v, top)}" WIDTH="{cell}" HEIGHT="{cell}" FIXEDSIZE="TRUE"></TD>' for v in row) + "</TR>"
        for row in weights.tolist()
    )
    return f'<TABLE BORDER="1" COLOR="#bbbbbb" CELLBORDER="0" CELLSPACING="0" CELLPADDING="0">{rows}</TABLE>'
