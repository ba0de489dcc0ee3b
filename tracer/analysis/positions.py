"""Token positions: which tokens each positions axis of a tensor holds, as a symbolic interval.

A tensor's positions axis (`T`, `past + T`: tracer.analysis.roles) holds the tokens
``start .. start + length - 1``. Declared tensors start at 0. A rope step says where the tokens it
rotates sit (``offset: past`` puts them at ``past ..``; per-token ``positions`` make the start a
run-time fact, unknown here). A concatenation along the axis keeps its first operand's start (a
KV cache: the cached tokens, then the new ones), a slice moves the start, and every other step
keeps each axis's interval, matched by its dim: as a role belongs to a dim, so do its tokens.

``tracer run --json`` shows the intervals (``positions``), so that where a decode step's tokens
sit is a fact to read, not a guess; the position lints reason about the same facts.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from ..core.symbolic import Dim, Poly
from .roles import POSITIONS


@dataclass(frozen=True)
class Interval:
    """Tokens ``start .. start + length - 1`` on one axis; ``start`` None: known only at run time."""

    start: Poly | None
    length: Dim

    def __str__(self) -> str:
        if self.start is None:
            return f"per-token positions ({self.length})"
        return f"{self.start} .. {self.start + self.length.poly + Poly.const(-1)}"


Positions = tuple[Interval | None, ...]  # one per axis: None where the axis holds no positions


def token_positions(analysis, roles_of) -> dict[str, Positions]:
    """Record id -> the interval of each of its positions axes, in execution order."""
    found: dict[str, Positions] = {}
    for name, declared in analysis.declared.items():
        found[name] = tuple(
            Interval(Poly.const(0), dim) if role == POSITIONS else None for dim, role in zip(declared.meta.shape, roles_of(name))
        )
    for node in analysis.nodes.values():
        for out in node.outs:
            shape, roles = out.meta.shape, roles_of(out.id)
            found[out.id] = tuple(
                _interval(node, out, axis, dim, found, role == POSITIONS) for axis, (dim, role) in enumerate(zip(shape, roles))
            )
    return found


def _interval(node, out, axis: int, dim: Dim, found: dict[str, Positions], positional: bool) -> Interval | None:
    """``axis``'s tokens; ``positional``: its dim's role says it holds positions. A rope, cat or
    slice along an axis that held positions keeps holding them, whatever the new dim is called."""
    ndim = len(out.meta.shape)
    source = _on(found.get(out.reads[0]), axis) if out.reads else None
    rotation = node.step.rotation()
    if rotation is not None and rotation.seq_dim % ndim == axis and (positional or source is not None):
        return Interval(None if rotation.positions is not None else node.dims.dim(rotation.offset).poly, dim)
    joined = node.step.joins()
    if joined is not None and joined % ndim == axis:
        return Interval(source.start, dim) if source is not None else None
    cut = node.step.slicing()
    if cut is not None and cut.dim % ndim == axis and (cut.step is None or node.dims.dim(cut.step).value == 1):
        if source is None or source.start is None:
            return None
        start = node.dims.dim(cut.start).poly if cut.start is not None else Poly.const(0)
        return Interval(source.start + start, dim)
    return _same_dim(out, dim, found)  # a dim that held positions in an input holds them here


def _on(positions: Positions | None, axis: int) -> Interval | None:
    return positions[axis] if positions is not None and axis < len(positions) else None


def _same_dim(out, dim: Dim, found: dict[str, Positions]) -> Interval | None:
    """The interval of an input axis with the same dim (a view, transpose, linear, product…)."""
    for read in out.reads:
        for interval in found.get(read, ()):
            if interval is not None and interval.length.same_symbol(dim):
                return Interval(interval.start, dim)
    return None


# ---------------------------------------------------------------- where a step's positions come from

COUNT, VALUES, MASK, OTHER = "count", "values", "mask", "other"
#: steps walked back from a positions tensor to what made it
MAX_SOURCE_WALK = 256
#: tensors an ancestry walk visits at most
MAX_ANCESTRY = 4096


@dataclass(frozen=True)
class Source:
    """Where the positions a rope (or a learned position lookup) uses come from:

    - ``count``: ``start, start + 1, …``, the same for every row: rope's ``offset``, an ``arange``;
    - ``values``: a declared tensor whose values the file writes (``rows``: its last dim per row);
    - ``mask``: computed from a mask input (``cumsum(attention_mask) - 1``): it follows the padding;
    - ``other``: anything else (a declared tensor without values, other steps).

    ``step`` is what decides them: the rope, the arange step or the declared tensor.
    """

    kind: str
    step: str
    start: Poly | None = None
    rows: tuple[tuple[int, ...], ...] | None = None


def rotation_source(analysis, rope) -> Source:
    """Where a rope node's positions come from."""
    rotation = rope.step.rotation()
    if rotation.positions is None:
        return Source(COUNT, rope.id, rope.dims.dim(rotation.offset).poly)
    return index_source(analysis, rotation.positions)


def index_source(analysis, tensor_id: str) -> Source:
    """Where an integer tensor of positions comes from, through layout steps and casts."""
    current = analysis.record_of(tensor_id)
    for _ in range(MAX_SOURCE_WALK):
        node = analysis.producer(current)
        if node is None:
            return _declared_source(analysis, current)
        start = node.step.counts()
        if start is not None:
            return Source(COUNT, node.id, node.dims.dim(start).poly)
        if not node.step.keeps_values or len(node.inputs) != 1:
            return Source(MASK if _from_mask(analysis, current) else OTHER, node.id)
        current = analysis.record_of(node.inputs[0])
    return Source(OTHER, current)


def _declared_source(analysis, name: str) -> Source:
    declared = analysis.declared.get(name)
    values = declared.decl.values if declared is not None else None
    if values is None or not declared.meta.shape:
        return Source(OTHER, name)
    flat, cols = list(flat_values(values)), declared.meta.sizes[-1]
    rows = tuple(tuple(int(v) for v in flat[r : r + cols]) for r in range(0, len(flat), cols or 1))
    return Source(VALUES, name, rows=rows)


def flat_values(values) -> Iterator:
    """The numbers of a nested list (a ``values:`` literal), in order."""
    if isinstance(values, list):
        for v in values:
            yield from flat_values(v)
    else:
        yield values


def ancestry(analysis, tensor_id: str, through=lambda node: True) -> Iterator[tuple[str, object]]:
    """Every tensor ``tensor_id`` was computed from (itself first), each once, with the node that
    made it (None: a declared tensor); the walk goes on through a node's data inputs where
    ``through(node)``."""
    seen, todo = set(), [tensor_id]
    while todo and len(seen) < MAX_ANCESTRY:
        current = todo.pop()
        if current in seen:
            continue
        seen.add(current)
        node = analysis.producer(current)
        yield current, node
        if node is not None and through(node):
            todo.extend(node.inputs)


def _from_mask(analysis, tensor_id: str) -> bool:
    """Whether a tensor is computed from a declared mask: bool, or integer and named ``*mask*``."""
    return any(node is None and name in analysis.declared and is_mask_input(analysis, name) for name, node in ancestry(analysis, tensor_id))


def is_mask_input(analysis, name: str) -> bool:
    """A declared tensor that is a mask: bool, or integer and named ``*mask*`` (``attention_mask``)."""
    dtype = analysis.declared[name].meta.dtype
    return dtype == "bool" or dtype in ("int64", "int32") and "mask" in name.lower()
