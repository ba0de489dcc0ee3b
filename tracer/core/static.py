"""Small tensors known before running, as plain Python numbers: the index arithmetic a pipeline
builds its masks and position biases from (``arange``, ``sub``, ``compare``, ``logical``), so that
lints can read a hand-built band or ALiBi bias without torch. Row-major, numpy broadcasting."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass

MAX_ELEMENTS = 1 << 14  # a static value past this is not worth computing in a lint


@dataclass(frozen=True)
class Static:
    sizes: tuple[int, ...]
    flat: tuple

    def __post_init__(self):
        if len(self.flat) > MAX_ELEMENTS:
            raise OverflowError("too large a static value")

    def at(self, index: tuple[int, ...]):
        offset = 0
        for size, i in zip(self.sizes, index):
            offset = offset * size + i
        return self.flat[offset]

    def rows(self) -> list[list]:
        """A 2-d value's rows (after dropping leading size-1 dims); [] for other ranks."""
        sizes = self.sizes
        while len(sizes) > 2 and sizes[0] == 1:
            sizes = sizes[1:]
        if len(sizes) != 2:
            return []
        return [list(self.flat[r * sizes[1] : (r + 1) * sizes[1]]) for r in range(sizes[0])]


def unary(x: Static, fn: Callable) -> Static:
    return Static(x.sizes, tuple(fn(v) for v in x.flat))


def binary(a: Static, b: Static, fn: Callable) -> Static | None:
    """``fn`` over the broadcast of ``a`` and ``b``; None when they do not broadcast."""
    n = max(len(a.sizes), len(b.sizes))
    sa, sb = (1,) * (n - len(a.sizes)) + a.sizes, (1,) * (n - len(b.sizes)) + b.sizes
    if any(x != y and 1 not in (x, y) for x, y in zip(sa, sb)):
        return None
    sizes = tuple(max(x, y) for x, y in zip(sa, sb))
    pa, pb = Static(sa, a.flat), Static(sb, b.flat)
    values = []
    for index in itertools.product(*(range(s) for s in sizes)):
        left = pa.at(tuple(i if s > 1 else 0 for i, s in zip(index, sa)))
        right = pb.at(tuple(i if s > 1 else 0 for i, s in zip(index, sb)))
        values.append(fn(left, right))
    return Static(sizes, tuple(values))


def reshaped(x: Static, sizes: tuple[int, ...]) -> Static:
    return Static(tuple(sizes), x.flat)


def transposed(x: Static, a: int, b: int) -> Static:
    order = list(range(len(x.sizes)))
    order[a], order[b] = order[b], order[a]
    sizes = tuple(x.sizes[d] for d in order)
    values = []
    for index in itertools.product(*(range(s) for s in sizes)):
        source = [0] * len(sizes)
        for d, i in zip(order, index):
            source[d] = i
        values.append(x.at(tuple(source)))
    return Static(sizes, tuple(values))
