"""Helpers shared by shape rules: dim normalisation, broadcasting, shape formatting, errors."""

from __future__ import annotations

from typing import NamedTuple

from ..core.dtypes import DTYPE_MAX, FLOAT_DTYPES, fits
from ..core.layout import Meta
from ..core.symbolic import Dim


class DimCause(NamedTuple):
    """A derived dim whose value makes a step's shapes fail: with ``needed`` instead they would fit.
    ``written`` is an expression over the dims with that value (``d_model // H``), or ''."""

    name: str
    needed: int
    written: str


class StepError(Exception):
    """A shape rule's complaint; the checker adds file, line, column, step and bindings, and for a
    ``cause`` an error at the line of ``dims:`` that defines it."""

    def __init__(self, code: str, message: str, field: str | None = None, hint: str | None = None, cause: DimCause | None = None):
        super().__init__(message)
        self.code, self.message, self.field, self.hint, self.cause = code, message, field, hint, cause


def show(meta: Meta) -> str:
    """``(B, H, T, Dh) [1, 2, 6, 2]`` — symbolic and concrete together."""
    return f"{meta.symbolic} {meta.concrete}"


def norm_dim(dim: int, ndim: int, field: str = "dim") -> int:
    if not -ndim <= dim < ndim:
        raise StepError("dim-range", f"dim {dim} is out of range for a {ndim}-d tensor (valid: {-ndim}..{ndim - 1})", field)
    return dim % ndim


class Mismatch(NamedTuple):
    """The first pair of dims that do not broadcast."""

    a: Dim
    b: Dim


def broadcast_dims(sa, sb) -> tuple | Mismatch:
    """numpy's broadcasting of two shapes of dims, keeping ``sa``'s names where sizes agree: the one rule."""
    n = max(len(sa), len(sb))
    sa, sb = [None] * (n - len(sa)) + list(sa), [None] * (n - len(sb)) + list(sb)
    out = []
    for da, db in zip(sa, sb):
        if da is None or (db is not None and da.value == 1 and db.value != 1):
            out.append(db)
        elif db is None or db.value == 1 or db.value == da.value:
            out.append(da)
        else:
            return Mismatch(da, db)
    return tuple(out)


def broadcast(a: Meta, b: Meta, what: str, field: str | None = None, ctx=None):
    """The broadcast shape of two tensors (numpy rules), keeping ``a``'s dim names. With ``ctx``,
    dims that line up only because their sizes happen to be equal today are warned about (a (B, T)
    mask against (B, H, T, T) scores broadcasts B onto the queries' T when B == T)."""
    shape = broadcast_dims(a.shape, b.shape)
    if isinstance(shape, Mismatch):
        da, db = shape
        small, large = (b, a) if len(b.shape) <= len(a.shape) else (a, b)
        placed = lined_up(small.shape, large.shape)
        hint = None
        if placed is not None:
            target = ", ".join(str(d) for d in placed)
            hint = (
                f"give the {small.symbolic} operand the axes of {large.symbolic} first, 1 where it has none: "
                f"{small.symbolic} -> ({target}), e.g. a view step with shape: [{target}]"
            )
        message = f"{what}: {show(a)} and {show(b)} do not broadcast ({da}={da.value} vs {db}={db.value})"
        raise StepError("broadcast", message, field, hint)
    pair = _coincidence(a.shape, b.shape) if ctx is not None else None
    if pair is not None:
        ctx.warn_if_different(*pair, f"{what}: {a.symbolic} and {b.symbolic} line up from the right", field or "inputs")
    return shape


def _coincidence(sa, sb) -> tuple[Dim, Dim] | None:
    """The first two dims broadcasting lines up that are different dims of equal size today."""
    for da, db in zip(reversed(sa), reversed(sb)):
        if da.value == db.value != 1 and not da.same_symbol(db) and da.poly.constant is None and db.poly.constant is None:
            return da, db
    return None


def trailing_weight(weight: Meta, x: Meta, name: str, field: str) -> None:
    """A norm's scale covers the input's last dim, or its last dims: (Dh,), or (H, Dh) per head on
    a (B, T, H, Dh) tensor (Cohere's and per-head QK norms)."""
    k = len(weight.sizes)
    if not 1 <= k <= len(x.sizes) or weight.sizes != x.sizes[-k:]:
        trailing = ", ".join(str(d) for d in x.shape[-2:])
        raise StepError(
            "shape",
            f"'{name}' must be ({x.shape[-1]}) [{x.sizes[-1]}] or cover more trailing dims of {show(x)}, got {show(weight)}",
            field,
            f"a per-head weight ({trailing}) needs the heads just before the last dim: normalise before the transpose",
        )


def lined_up(small, large) -> list | None:
    """``small``'s dims placed under the same dims of ``large``, matched from the right (a padding
    mask's T is the keys' axis), with 1 everywhere else: ``(B, T)`` under ``(B, H, T, T)`` is
    ``(B, 1, 1, T)``. None when a dim of ``small`` has no place, or nothing would change."""
    placed: list = [1] * len(large)
    at = len(large)
    for dim in reversed([d for d in small if d.value != 1]):
        at = next((j for j in range(at - 1, -1, -1) if large[j].same_symbol(dim)), None)
        if at is None:
            return None
        placed[at] = dim
    return None if placed == list(small) else placed


INT64_RANGE = range(-(2**63), 2**63)  # the integers torch takes as a number; larger ones overflow its int64 scalars


def require_number_fits(value: int | float, dtype: str | None, what: str, field: str) -> None:
    """A number written in the file that torch can take: an integer within int64 (beyond it torch
    overflows converting it, or reads it as uint64 and compares wrongly), and, with ``dtype``, a
    value the ``dtype`` result holds (torch refuses to write an out-of-range number into it)."""
    if isinstance(value, int) and value not in INT64_RANGE:
        raise StepError(
            "number-range",
            f"{what} {value} is outside int64 (-2**63 .. 2**63 - 1), the widest integer torch takes as a number",
            field,
            "write it as a float (1e30), or bring it within int64",
        )
    if dtype is not None and not fits(value, dtype):
        raise StepError(
            "number-range",
            f"{what} {value} does not fit the {dtype} result (its largest finite value is {DTYPE_MAX[dtype]:.8g}): torch refuses it",
            field,
            "use a number within that range, or cast the tensor to a wider dtype first (op: cast)",
        )


def require_float(meta: Meta, name: str, what: str) -> None:
    if meta.dtype not in FLOAT_DTYPES:
        raise StepError("dtype", f"{what} needs a floating-point tensor, '{name}' is {meta.dtype}")


# ---------------------------------------------------------------- source text for emit()


def py_shape(ctx, texts) -> str:
    """A list of dim texts (``-1`` kept) as the arguments of ``view``/``reshape``/``expand``."""
    return ", ".join("-1" if t == -1 else ctx.dim(t) for t in texts) or "()"  # x.view(()) for a 0-d result
