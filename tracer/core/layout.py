"""Static tensor metadata and the memory-layout rules torch follows.

``Meta`` is what a shape rule produces for one tensor before any tensor exists: symbolic+concrete
shape, concrete strides and storage offset, dtype, and ``root`` — the id of the tensor whose
storage it shares (``None`` while a rule builds it; the checker fills in the owner's id).
``view_strides`` is torch's own ``computeStride``: a view is legal exactly when it returns strides.
"""

from __future__ import annotations

from .dtypes import DTYPE_BYTES
from .frozen import frozen
from .symbolic import Dim


class computed_once:
    """``functools.cached_property`` without its lock: Python 3.11's takes a class-wide lock on
    every first access (a check of a 48-layer stack makes ~3,000 of them; 3.12 dropped the lock).
    The value goes into the instance's ``__dict__``, which a frozen dataclass allows, and is read
    from there ever after."""

    def __init__(self, func):
        self.func, self.name, self.__doc__ = func, func.__name__, func.__doc__

    def __get__(self, instance, owner=None):
        if instance is None:
            return self
        value = instance.__dict__[self.name] = self.func(instance)
        return value


@frozen
class Meta:
    shape: tuple[Dim, ...]
    stride: tuple[int, ...]
    dtype: str
    offset: int = 0
    root: str | None = None

    # Computed once per Meta: a plan over 1,000 layers asks for them tens of thousands of times.
    @computed_once
    def sizes(self) -> tuple[int, ...]:
        return tuple([d.value for d in self.shape])  # a list first: ~2x a generator's speed at these lengths

    @computed_once
    def contiguous(self) -> bool:
        return is_contiguous(self.sizes, self.stride)

    @computed_once
    def numel(self) -> int:
        n = 1
        for s in self.sizes:
            n *= s
        return n

    @computed_once
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
    sizes = tuple([d.value for d in shape])
    meta = Meta(tuple(shape), contiguous_strides(sizes), dtype)
    meta.__dict__["sizes"] = sizes  # what ``Meta.sizes`` would compute (``computed_once`` keeps it there)
    return meta


def view(source: Meta, shape: tuple[Dim, ...], stride: tuple[int, ...], offset: int | None = None) -> Meta:
    """A tensor sharing ``source``'s storage."""
    return Meta(tuple(shape), tuple(stride), source.dtype, source.offset if offset is None else offset, source.root)


def same_layout(source: Meta, shape: tuple[Dim, ...] | None = None, dtype: str | None = None) -> Meta:
    """A new tensor laid out like ``source`` (what torch's elementwise ops allocate): :func:`pointwise`."""
    return pointwise([source], source.shape if shape is None else tuple(shape), dtype or source.dtype)


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


# ---------------------------------------------------------------- TensorIterator's output layout


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
    sizes = tuple([d.value for d in shape])
    if all(m.sizes == sizes for m in metas):
        if all(m.contiguous for m in metas):
            return fresh(shape, dtype)
        if len(sizes) in (4, 5) and all(_channels_last(m.sizes, m.stride) for m in metas):
            return Meta(tuple(shape), channels_last_strides(sizes), dtype)
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
    if size_one_steps and perm == list(reversed(range(ndim))):
        return contiguous_strides(sizes)  # TensorIterator allocates row-major then (an empty dim multiplies by 1)
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


def suggests_channels_last(sizes: tuple[int, ...], strides: tuple[int, ...]) -> bool:
    """torch's ``suggest_memory_format()`` is ``channels_last`` (4-d) or ``channels_last_3d``
    (5-d): a port of ``is_channels_last_strides_2d_s4`` and ``_3d_s5`` (what convolutions and
    ``cat`` read to pick their output's layout)."""
    if len(sizes) not in _CHANNELS_LAST_ORDER or strides[1] == 0:
        return False
    smallest = 0
    for d in _CHANNELS_LAST_ORDER[len(sizes)]:
        if sizes[d] == 0 or strides[d] < smallest or (d == 0 and smallest == strides[1]):
            return False
        smallest = strides[d] * (sizes[d] if sizes[d] > 1 else 1)
    return True


def cat_layout(metas: list[Meta], shape, dtype: str) -> Meta:
    """``torch.cat``'s output: channels_last(_3d) when every input suggests it (ATen's
    ``cat_compute_output_memory_format``, which skips 1-d empty inputs), else row-major."""
    sizes = tuple([d.value for d in shape])
    considered = [m for m in metas if m.sizes != (0,)]
    if considered and len(sizes) in _CHANNELS_LAST_ORDER and all(suggests_channels_last(m.sizes, m.stride) for m in considered):
        return Meta(tuple(shape), channels_last_strides(sizes), dtype)
    return fresh(shape, dtype)


def channels_last_strides(sizes: tuple[int, ...]) -> tuple[int, ...]:
    """The strides of ``torch.channels_last`` (4-d) or ``channels_last_3d`` (5-d)."""
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
