"""Helpers shared by shape rules: dim normalisation, broadcasting, shape formatting, errors."""

from __future__ import annotations

from typing import NamedTuple

from ..shapes.layout import Meta, fresh
from ..shapes.symbolic import Dim
from ..spec.base import FLOAT_DTYPES


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


def non_overlapping_and_dense(sizes: tuple[int, ...], strides: tuple[int, ...]) -> bool:
    """torch's ``is_non_overlapping_and_dense``: a permutation of a contiguous layout."""
    if len(sizes) == 1:
        return sizes[0] < 2 or strides[0] == 1
    order = sorted(range(len(sizes)), key=lambda i: (sizes[i] < 2, strides[i] if sizes[i] >= 2 else 0))
    required = 1
    for i in order:
        if sizes[i] < 2:
            return True
        if strides[i] != required:
            return False
        required *= sizes[i]
    return True


def preserve_format(meta: Meta, shape=None, dtype: str | None = None) -> Meta:
    """What ``empty_like(x)`` / ``x.to(dtype)`` allocate: x's strides when x is dense, else dense
    strides in x's dim order (torch's ``infer_dense_strides``)."""
    shape = meta.shape if shape is None else tuple(shape)
    dtype = dtype or meta.dtype
    if non_overlapping_and_dense(meta.sizes, meta.stride):
        return Meta(shape, meta.stride, dtype)
    return Meta(shape, _dense_in_order(meta.sizes, [list(meta.stride)], size_one_steps=False), dtype)


def pointwise(metas: list[Meta], shape, dtype: str) -> Meta:
    """The result of an elementwise torch op on ``metas`` (broadcast to ``shape``): a port of
    TensorIterator's output layout (fast set-up, then ``reorder_dimensions``), so strides are exact."""
    sizes = tuple(d.value for d in shape)
    if all(m.sizes == sizes for m in metas):
        if all(m.contiguous for m in metas):
            return fresh(shape, dtype)
        if len(sizes) in (4, 5) and all(_channels_last(m.sizes, m.stride) for m in metas):
            return Meta(tuple(shape), _channels_last_strides(sizes), dtype)
        first = metas[0]
        if all(non_overlapping_and_dense(m.sizes, m.stride) and m.stride == first.stride for m in metas):
            return Meta(tuple(shape), first.stride, dtype)
    return Meta(tuple(shape), _dense_in_order(sizes, [_broadcast_strides(m, sizes) for m in metas]), dtype)


def _dense_in_order(sizes: tuple[int, ...], strides: list[list[int]], size_one_steps: bool = True) -> tuple[int, ...]:
    """Dense strides whose dim order follows the operands' strides: the insertion sort of
    TensorIterator's ``reorder_dimensions`` (and of ``infer_dense_strides`` for one operand)."""
    ndim = len(sizes)

    def should_swap(d0: int, d1: int) -> int:
        for st in strides:
            s0, s1 = st[d0], st[d1]
            if s0 == 0 or s1 == 0:
                continue
            if s0 != s1:
                return -1 if s0 < s1 else 1
            if sizes[d0] > sizes[d1]:
                return 1
        return 0

    perm = list(reversed(range(ndim)))  # perm[0] is the fastest-moving dim
    for i in range(1, ndim):
        d1 = i
        for d0 in range(i - 1, -1, -1):
            comparison = should_swap(perm[d0], perm[d1])
            if comparison > 0:
                perm[d0], perm[d1] = perm[d1], perm[d0]
                d1 = d0
            elif comparison < 0:
                break
    result, step = [0] * ndim, 1
    for d in perm:
        result[d] = step
        if size_one_steps or sizes[d] > 1:
            step *= sizes[d]
    return tuple(result)


_CHANNELS_LAST_ORDER = {4: (1, 3, 2, 0), 5: (1, 4, 3, 2, 0)}


def _channels_last(sizes: tuple[int, ...], strides: tuple[int, ...]) -> bool:
    expected = 1
    for d in _CHANNELS_LAST_ORDER[len(sizes)]:
        if sizes[d] != 1:
            if strides[d] != expected:
                return False
            expected *= sizes[d]
    return True


def _channels_last_strides(sizes: tuple[int, ...]) -> tuple[int, ...]:
    result, step = [0] * len(sizes), 1
    for d in _CHANNELS_LAST_ORDER[len(sizes)]:
        result[d] = step
        step *= sizes[d]
    return tuple(result)


def _broadcast_strides(meta: Meta, sizes: tuple[int, ...]) -> list[int]:
    pad = len(sizes) - len(meta.sizes)
    strides = [0] * pad
    for i, (size, stride) in enumerate(zip(meta.sizes, meta.stride)):
        strides.append(0 if size == 1 and sizes[pad + i] != 1 else stride)
    return strides
