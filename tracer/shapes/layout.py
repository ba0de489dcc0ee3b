"""Static tensor metadata and the memory-layout rules torch follows.

``Meta`` is what a shape rule produces for one tensor before any tensor exists: symbolic+concrete
shape, concrete strides and storage offset, dtype, and ``root`` — the id of the tensor whose
storage it shares (``None`` while a rule builds it; the checker fills in the owner's id).
``view_strides`` is torch's own ``computeStride``: a view is legal exactly when it returns strides.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..spec.base import DTYPE_BYTES
from .symbolic import Dim


@dataclass(frozen=True)
class Meta:
    shape: tuple[Dim, ...]
    stride: tuple[int, ...]
    dtype: str
    offset: int = 0
    root: str | None = None

    @property
    def sizes(self) -> tuple[int, ...]:
        return tuple(d.value for d in self.shape)

    @property
    def contiguous(self) -> bool:
        return is_contiguous(self.sizes, self.stride)

    @property
    def numel(self) -> int:
        n = 1
        for s in self.sizes:
            n *= s
        return n

    @property
    def nbytes(self) -> int:
        return self.numel * DTYPE_BYTES[self.dtype]

    @property
    def symbolic(self) -> str:
        """nanoGPT-style: ``(B, H, T, T)``."""
        return "(" + ", ".join(str(d) for d in self.shape) + ")"

    @property
    def concrete(self) -> str:
        return "[" + ", ".join(str(s) for s in self.sizes) + "]"


def fresh(shape: tuple[Dim, ...], dtype: str) -> Meta:
    """A newly allocated, contiguous tensor."""
    return Meta(tuple(shape), contiguous_strides(tuple(d.value for d in shape)), dtype)


def view(source: Meta, shape: tuple[Dim, ...], stride: tuple[int, ...], offset: int | None = None) -> Meta:
    """A tensor sharing ``source``'s storage."""
    return Meta(tuple(shape), tuple(stride), source.dtype, source.offset if offset is None else offset, source.root)


def same_layout(source: Meta, shape: tuple[Dim, ...] | None = None, dtype: str | None = None) -> Meta:
    """A new tensor laid out like ``source`` (what torch's elementwise ops allocate)."""
    shape = source.shape if shape is None else tuple(shape)
    sizes = tuple(d.value for d in shape)
    if sizes != source.sizes:
        return fresh(shape, dtype or source.dtype)
    return Meta(shape, dense_like(sizes, source.stride), dtype or source.dtype)


def contiguous_strides(sizes: tuple[int, ...]) -> tuple[int, ...]:
    strides, step = [], 1
    for size in reversed(sizes):
        strides.append(step)
        step *= max(size, 1)
    return tuple(reversed(strides))


def is_contiguous(sizes: tuple[int, ...], strides: tuple[int, ...]) -> bool:
    """torch's definition: size-1 dims are ignored, an empty tensor is contiguous."""
    if 0 in sizes:
        return True
    expected = 1
    for size, stride in zip(reversed(sizes), reversed(strides)):
        if size == 1:
            continue
        if stride != expected:
            return False
        expected *= size
    return True


def meets_contiguity(sizes: tuple[int, ...], strides: tuple[int, ...], expected: bool) -> bool:
    """Whether a layout meets ``expect: {contiguous: expected}``.

    Contiguity is torch's ``is_contiguous()``, which ignores the strides of size-1 dims. A layout
    that torch calls contiguous only for that reason (its strides differ from row-major at size-1
    dims: a transposed ``(B, H, T, Dh)`` at ``T=1``), or that no layout could make non-contiguous
    (at most one dim larger than 1, or no elements at all), meets ``contiguous: false`` as well:
    it is the non-contiguous layout of the other sizes, so shrinking a dim is never a false alarm.
    """
    actual = is_contiguous(sizes, strides)
    if actual == expected:
        return True
    vacuous = 0 in sizes or sum(size > 1 for size in sizes) < 2
    return actual and (vacuous or tuple(strides) != contiguous_strides(sizes))


CONTIGUITY_RULE = (
    "contiguity is torch's is_contiguous(), which ignores size-1 dims; a layout that is row-major only because of "
    "size-1 dims (or empty) meets both contiguous: true and false"
)


def dense_like(sizes: tuple[int, ...], strides: tuple[int, ...]) -> tuple[int, ...]:
    """Dense strides with the same dim order as ``strides`` (torch's preserve_format)."""
    order = sorted(range(len(sizes)), key=lambda i: (-strides[i], -i))
    result, step = [0] * len(sizes), 1
    for i in reversed(order):
        result[i] = step
        step *= max(sizes[i], 1)
    return tuple(result)


def view_strides(old_sizes: tuple[int, ...], old_strides: tuple[int, ...], new_sizes: tuple[int, ...]) -> tuple[int, ...] | None:
    """Port of ATen's ``computeStride``: the strides of ``view(new_sizes)``, or None if impossible."""
    if not old_sizes or 0 in old_sizes:
        return contiguous_strides(new_sizes)
    new_strides = [0] * len(new_sizes)
    view_d = len(new_sizes) - 1
    chunk_base = old_strides[-1]
    tensor_numel = view_numel = 1
    for tensor_d in range(len(old_sizes) - 1, -1, -1):
        tensor_numel *= old_sizes[tensor_d]
        if tensor_d == 0 or (old_sizes[tensor_d - 1] != 1 and old_strides[tensor_d - 1] != tensor_numel * chunk_base):
            while view_d >= 0 and (view_numel < tensor_numel or new_sizes[view_d] == 1):
                new_strides[view_d] = view_numel * chunk_base
                view_numel *= new_sizes[view_d]
                view_d -= 1
            if view_numel != tensor_numel:
                return None
            if tensor_d > 0:
                chunk_base = old_strides[tensor_d - 1]
                tensor_numel = view_numel = 1
    return tuple(new_strides) if view_d == -1 else None


def with_root(meta: Meta, root: str) -> Meta:
    if meta.root is not None:
        return meta
    return Meta(meta.shape, meta.stride, meta.dtype, meta.offset, root)  # dataclasses.replace is ~4x slower
