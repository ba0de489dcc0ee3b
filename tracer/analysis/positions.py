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
