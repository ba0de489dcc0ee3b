"""Helpers shared by shape rules: dim normalisation, broadcasting, shape formatting, errors."""

from __future__ import annotations

from typing import NamedTuple

from ..core.fields import FLOAT_DTYPES
from ..core.layout import Meta
from ..core.symbolic import Dim


class StepError(Exception):
    """A shape rule's complaint; the checker adds file, line, column, step and bindings."""

    def __init__(self, code: str, message: str, field: str | None = None, hint: str | None = None):
        super().__init__(message)
        self.code, self.message, self.field, self.hint = code, message, field, hint


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


def broadcast(a: Meta, b: Meta, what: str, field: str | None = None):
    """The broadcast shape of two tensors (numpy rules), keeping ``a``'s dim names."""
    shape = broadcast_dims(a.shape, b.shape)
    if isinstance(shape, Mismatch):
        da, db = shape
        raise StepError("broadcast", f"{what}: {show(a)} and {show(b)} do not broadcast ({da}={da.value} vs {db}={db.value})", field)
    return shape


def require_float(meta: Meta, name: str, what: str) -> None:
    if meta.dtype not in FLOAT_DTYPES:
        raise StepError("dtype", f"{what} needs a floating-point tensor, '{name}' is {meta.dtype}")


# ---------------------------------------------------------------- dtypes and layouts as torch computes them

_CATEGORY = {"bool": 0, "int32": 1, "int64": 1, "float16": 2, "bfloat16": 2, "float32": 2, "float64": 2}
_WIDTH = {"bool": 0, "int32": 1, "int64": 2, "float16": 1, "bfloat16": 1, "float32": 2, "float64": 3}


def _promote_pair(a: str, b: str) -> str:
    if a == b:
        return a
    if _CATEGORY[a] != _CATEGORY[b]:
        return a if _CATEGORY[a] > _CATEGORY[b] else b
    if {a, b} == {"float16", "bfloat16"}:
        return "float32"
    return a if _WIDTH[a] > _WIDTH[b] else b


def promote(metas: list[Meta]) -> str:
    """``torch.result_type`` of tensors: dimensioned operands decide, unless a 0-d one is of a higher
    category (bool < integer < floating), as torch's type promotion says."""
    tiers = []
    for zero_dim in (False, True):
        dtypes = [m.dtype for m in metas if (len(m.shape) == 0) == zero_dim]
        if dtypes:
            result = dtypes[0]
            for d in dtypes[1:]:
                result = _promote_pair(result, d)
            tiers.append(result)
    if len(tiers) == 2 and _CATEGORY[tiers[1]] > _CATEGORY[tiers[0]]:
        return tiers[1]
    return tiers[0]


# ---------------------------------------------------------------- source text for emit()


def py_float(value: float) -> str:
    """A float as Python source that reads back bit for bit: ``0.2``, ``-1000000000.0``, ``-math.inf``."""
    value = float(value)
    if value != value:
        return "math.nan"
    if value in (float("inf"), float("-inf")):
        return "math.inf" if value > 0 else "-math.inf"
    return repr(value)


def py_tuple(items: list[str]) -> str:
    """``(a, b)``, and ``(a,)`` for one item."""
    return "(" + ", ".join(items) + ("," if len(items) == 1 else "") + ")"


def py_shape(ctx, texts) -> str:
    """A list of dim texts (``-1`` kept) as the arguments of ``view``/``reshape``/``expand``."""
    return ", ".join("-1" if t == -1 else ctx.dim(t) for t in texts) or "()"  # x.view(()) for a 0-d result


def atom(text: str) -> str:
    """Source text safe as an operand: a name or an int as is, anything else in parentheses."""
    return text if text.isidentifier() or text.lstrip("-").isdigit() else f"({text})"
