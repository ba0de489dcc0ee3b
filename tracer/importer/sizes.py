"""The batch and sequence sizes followed through a static capture, as a symbolic capture would name them.

``torch.export`` with dynamic shapes names every size computed from an input's batch or sequence
length, at 2-3.5x the cost of a capture at the example sizes (sympy runs on every size the
module's Python computes). The graph captured at the example sizes says the same once its sizes
are followed from the inputs: the first two axes of each input are ``B`` and ``T`` (another
input's other batch or length ``B2``, ``T2``), and each op's output axes are expressions over them
(:class:`Poly`), found from the op's inputs by the op's rule (a view regroups its input's axes, a
``cat`` adds them, a slice shortens one) or, for the ops that keep their inputs' axes
(elementwise, reductions, attention), from the input axis it lines up with (a ``matmul``'s
rows from its first input, its columns from its second). Because the
sizes follow the dataflow and not the values, a batch of 3 beside a fused ``3``, ``T == H`` or
``B == T`` keep their names. As torch.export would, an input dim that an elementwise op holds
equal to a fixed size becomes that number, and so does an input's axis that a ``cat`` joins to an
axis of fixed size (a cache's heads, ``[B, H_kv, past, Dh]``, beside a batch of the same size); an input axis that a ``cat`` joins to new tokens is a
KV cache length, ``past``; the rows of a table looked up at constant positions are ``P``.

Sizes written as numbers in the graph (``arange(7)``, ``full((7, 7))``, ``expand(2, -1)``, a
buffer sliced at ``:7``) carry no provenance; one equal to an input's batch or length is read as
that size (a sliced table's at a length only, an expanded axis's only if no model dim has it).
"""

from __future__ import annotations

import functools
import math
import operator
from dataclasses import dataclass

import torch

from .idioms import Graph, aten


class Poly:
    """A size over the input dims: a sum of products of dims (``B * T``, ``past + T``, ``T - 1``),
    its terms in the order the graph made them, with its value at the example sizes."""

    __slots__ = ("terms", "value")

    def __init__(self, terms: dict[tuple[str, ...], int], value: int):
        self.terms, self.value = terms, value

    @staticmethod
    def symbol(name: str, value: int) -> Poly:
        return Poly({(name,): 1}, value)

    def names(self) -> tuple[str, ...] | None:
        """The dims of a product of dims (``B * T``: B, T), else None."""
        if len(self.terms) != 1:
            return None
        ((names, coefficient),) = self.terms.items()
        return names if coefficient == 1 else None

    def __str__(self) -> str:
        terms = sorted(self.terms.items(), key=lambda term: not term[0])  # the number last: T - 1
        parts = [("-" if c < 0 else "+", " * ".join(n) if abs(c) == 1 and n else " * ".join((str(abs(c)), *n))) for n, c in terms]
        return ("-" if parts[0][0] == "-" else "") + parts[0][1] + "".join(f" {sign} {body}" for sign, body in parts[1:])

    def __eq__(self, other) -> bool:
        return isinstance(other, Poly) and self.terms == other.terms

    def __hash__(self) -> int:
        return hash(tuple(sorted(self.terms.items())))


class Guess(Poly):
    """An input dim read from a number the graph writes (``arange(8)`` where T is 8): the same size,
    but no op that lines it up with another dim holds the two equal or fixes them."""

    __slots__ = ()


class Loose(int):
    """A size the graph writes as a number (``torch.zeros(1, 2, 8, 8)``, ``expand(2, 1, 8, 8)`` in a mask
    the module builds) that is both an input's batch or length and a model dim (B == H == 2): nothing
    says which, so it names neither, and an op holding it equal to an input dim does not fix that dim."""

    __slots__ = ()


Size = int | Poly
Shape = tuple[Size, ...]


def size_value(size: Size) -> int:
    return size if isinstance(size, int) else size.value


def _terms(size: Size) -> dict[tuple[str, ...], int]:
    return dict(size.terms) if isinstance(size, Poly) else ({(): size} if size else {})


def _made(terms: dict[tuple[str, ...], int], at: int) -> Size:
    terms = {names: c for names, c in terms.items() if c}
    return terms.get((), 0) if not any(terms) else Poly(terms, at)


def plus(a: Size, b: Size) -> Size:
    terms = _terms(a)
    for names, coefficient in _terms(b).items():
        terms[names] = terms.get(names, 0) + coefficient
    return _made(terms, size_value(a) + size_value(b))


def times(a: Size, b: Size) -> Size:
    terms: dict[tuple[str, ...], int] = {}
    for names_a, ca in _terms(a).items():
        for names_b, cb in _terms(b).items():
            names = tuple(sorted(names_a + names_b))
            terms[names] = terms.get(names, 0) + ca * cb
    return _made(terms, size_value(a) * size_value(b))


VIEWS = {
    aten.view.default,
    aten.reshape.default,
    aten._unsafe_view.default,
    aten.flatten.using_ints,
    aten.unflatten.int,
    aten.squeeze.dim,
    aten.squeeze.dims,
    aten.squeeze.default,
    aten.unsqueeze.default,
}
FACTORIES = {
    aten.arange.default,
    aten.arange.start,
    aten.arange.start_step,
    aten.full.default,
    aten.zeros.default,
    aten.ones.default,
    aten.empty.memory_format,
    aten.new_zeros.default,
    aten.new_ones.default,
    aten.new_full.default,
    aten.new_empty.default,
    aten.scalar_tensor.default,
    aten.randn.default,
    aten.rand.default,
}
# ops whose inputs' axes must be equal where they line up from the end (broadcasting; all but the
# last two axes of a product or attention)
BROADCASTS = {
    getattr(aten, name).Tensor
    for name in ("add", "sub", "mul", "div", "eq", "ne", "lt", "le", "gt", "ge", "bitwise_and", "bitwise_or", "bitwise_xor")
} | {aten.where.self, aten.masked_fill.Scalar, aten.masked_fill.Tensor, aten.maximum.default, aten.minimum.default}
BATCHED = {aten.matmul.default, aten.bmm.default, aten.scaled_dot_product_attention.default}
SPLITS = {aten.split.Tensor, aten.split_with_sizes.default, aten.chunk.default, aten.unbind.int}


@dataclass(frozen=True)
class InputDim:
    """A batch or sequence size of the inputs: its name and its example size."""

    name: str
    size: int
    symbol: Poly


def input_dims(graph: Graph, model: frozenset[int] = frozenset(), order: str = "BT") -> dict[tuple[str, int], InputDim]:
    """(placeholder, axis) -> dim for the first two axes of each input of 2 or more axes: ``B`` and
    ``T`` for the first input, even of one size; for the others, a dim of the same size where there
    is one (a mask's batch and length are the ids', a square mask is ``[T, T]``), the batch's or
    the length's first as the axis is, else a new one, ``B2``, ``T2``, unless it is the size of a
    model dim (``model``: a cache's heads axis, ``[B, H_kv, past, Dh]``). Other token ids (an
    input an embedding looks up: a decoder's) are a sequence of their own, ``B2`` and ``T2`` as
    long as the first's or not, which :class:`Sizes` merges with the dims an op holds them equal to
    (the cross-attention's batch). ``order`` is ``TB`` for a module whose inputs are (T, B, E)
    (``batch_first=False``)."""
    found: dict[tuple[str, int], InputDim] = {}
    families: dict[str, list[InputDim]] = {"B": [], "T": []}
    for node in graph.fx.nodes:
        value = node.meta.get("val")
        if node.op != "placeholder" or graph.kind(node) != "USER_INPUT" or not isinstance(value, torch.Tensor) or value.ndim < 2:
            continue
        first, own = not found, _token_ids(node)
        for axis, family in enumerate(order):
            size = int(value.shape[axis])
            if size <= 1:  # torch.export keeps sizes 0 and 1 fixed too: an axis of 1 broadcasts
                continue
            other = families["T" if family == "B" else "B"]
            known = None if first or own else next((d for d in (*families[family], *other) if d.size == size), None)
            if known is None and not first and not own and size in model:
                continue
            if known is None:
                name = family + (str(len(families[family]) + 1) if families[family] else "")
                known = InputDim(name, size, Poly.symbol(name, size))
                families[family].append(known)
            found[node.name, axis] = known
    return found


def _token_ids(node: torch.fx.Node) -> bool:
    """Token ids: an input an embedding looks up (its second argument), a sequence of its own."""
    return any(user.target == aten.embedding.default and user.args[1] is node for user in node.users)


JOINS = {aten.cat.default, aten.stack.default}  # their first argument is a list of tensors


class Sizes:
    """Each node's output shape as sizes over the input dims, followed through the graph once (twice
    where an input holds a KV cache: the axis a ``cat`` joins to the new tokens is a length of its
    own, ``past``)."""

    def __init__(self, graph: Graph, model: frozenset[int] = frozenset(), order: str = "BT"):
        self.graph, self.model = graph, model  # model: the sizes of the model's dims (d_model, H, n_rep ...)
        self._rules = {
            aten.permute.default: self._permuted,
            aten.transpose.int: self._transposed,
            aten.t.default: self._transposed,
            aten.numpy_T.default: lambda node, first, out: first[::-1],
            aten.expand.default: self._expanded,
            aten.cat.default: self._concatenated,
            aten.matmul.default: self._product,
            aten.bmm.default: self._product,
            aten.scaled_dot_product_attention.default: self._attention,
            aten.stack.default: self._stacked,
            aten.slice.Tensor: self._sliced,
            aten.select.int: lambda node, first, out: _without(first, node.args[1]),
            aten.repeat.default: self._repeated,
            aten.embedding.default: lambda node, first, out: (*self._input(node, 1), first[-1]),
            aten.view_as_complex.default: lambda node, first, out: first[:-1],
            aten.view_as_real.default: lambda node, first, out: (*first, 2),
        }
        self.inputs = input_dims(graph, model, order)
        self._follow()
        cached = self._cache_lengths()
        if cached:
            self.inputs.update(cached)
            self._follow()

    def _follow(self) -> None:
        """The shapes of every node; again without the input dims an op holds equal to a fixed size
        (a second input's axis 1 that is really its heads), as torch.export specialises them, and
        with the dims an op holds equal to each other as one (a mask's length is the ids')."""
        while True:
            self.fixed: set[str] = set()
            self.unbound: set[tuple[str, int]] = set()
            self.same: dict[str, str] = {}  # dim -> a dim an op holds it equal to, named before it
            self._follow_once()
            if not self.fixed and not self.unbound and not self.same:
                return
            self.inputs = {key: d for key, d in self.inputs.items() if d.name not in self.fixed and key not in self.unbound}
            kept = {d.name: d for d in self.inputs.values()}
            self.inputs = {key: kept.get(self._merged(d.name), d) for key, d in self.inputs.items()}

    def _merged(self, name: str) -> str:
        while name in self.same:
            name = self.same[name]
        return name

    def _hold_equal(self, sizes: list) -> None:
        """The dims among ``sizes`` (one axis each tensor an op lines up) are one: each merges into the one named first."""
        order = [d.name for d in self.dims]
        names = sorted({self._merged(s.names()[0]) for s in sizes if isinstance(s, Poly) and len(s.names() or ()) == 1}, key=order.index)
        for name in names[1:]:
            if self.values[name] == self.values[names[0]]:
                self.same[name] = names[0]

    @property
    def dims(self) -> list[InputDim]:
        return list(dict.fromkeys(self.inputs.values()))

    def _follow_once(self) -> None:
        self.values = {d.name: d.size for d in self.dims}
        self.shapes: dict[torch.fx.Node, Shape | list[Shape]] = {}
        for node in self.graph.fx.nodes:
            value = node.meta.get("val")
            if node.op == "placeholder" and isinstance(value, torch.Tensor):
                own = {axis: d.symbol for (name, axis), d in self.inputs.items() if name == node.name}
                self.shapes[node] = tuple(own.get(axis, int(s)) for axis, s in enumerate(value.shape))
            elif node.op == "call_function":
                shape = self._infer(node, value)
                if shape is not None:
                    self.shapes[node] = shape

    def _cache_lengths(self) -> dict[tuple[str, int], InputDim]:
        """(input, axis) -> ``past`` for an axis of fixed size that a ``cat`` joins to a sequence axis:
        the keys or values a decoding step appends its new ones to."""
        found: dict[tuple[str, int], InputDim] = {}
        for node in self.graph.calls():
            if node.target != aten.cat.default or not isinstance(self.shapes.get(node), tuple):
                continue
            dim = (node.args[1] if len(node.args) > 1 else 0) % len(self.shapes[node])
            parts = [(self.shapes.get(part), _source_input(self.graph, part)) for part in node.args[0]]
            for shape, source in parts:
                others = {other for _, other in parts} - {source}
                if source is None or not others or not isinstance(shape, tuple) or not isinstance(shape[dim], int) or shape[dim] <= 1:
                    continue
                axes = [a for a, size in enumerate(source.meta["val"].shape) if size == shape[dim] and (source.name, a) not in self.inputs]
                if len(axes) == 1:  # the values' cache is as long as the keys': one dim
                    known = next((d for d in found.values() if d.size == shape[dim]), None)
                    name = known.name if known else "past" + (str(len(found) + 1) if found else "")
                    found[source.name, axes[0]] = known or InputDim(name, shape[dim], Poly.symbol(name, shape[dim]))
        return found

    def roles(self) -> dict[int, dict[int, str]]:
        """id(example tensor) -> {axis: dim}: the rows of a table looked up at constant positions are
        positions (``P``), however many tokens the vocab has, and T5's bias table, looked up at constant
        buckets and laid out as (1, H, T, T), has a row per bucket (``NB``), however wide a head is;
        the rows of one looked up by ids the module is given are its vocab (``V``), whatever model dim
        has as many (T5's ``shared`` of 32 tokens beside a ``d_model`` of 32)."""
        tables: dict[int, str] = {}  # id(the state_dict's tensor) -> the role of its rows
        for node in self.graph.calls():
            if node.target == aten.embedding.default and node.args[0].op == "placeholder":
                tables[id(self._held(node.args[0]))] = self._rows(node)
        placeholders = [n for n in self.graph.fx.nodes if n.op == "placeholder" and isinstance(n.meta.get("val"), torch.Tensor)]
        # a tied table is one tensor under two keys (T5's shared and embed_tokens): the one no op reads has the other's rows
        return {id(n.meta["val"]): {0: tables[id(self._held(n))]} for n in placeholders if id(self._held(n)) in tables}

    def _rows(self, lookup: torch.fx.Node) -> str:
        """What an embedding's rows are: token ids it is given look up a vocab; constant ids positions,
        or T5's buckets when the lookup is laid out as (1, H, T, T)."""
        if lookup.args[1] not in self.graph.constant:
            return "V"
        buckets = any(user.target == aten.permute.default and list(user.args[1]) == [2, 0, 1] for user in lookup.users)
        return "NB" if buckets else "P"

    def _held(self, placeholder: torch.fx.Node):
        """The tensor a param or buffer placeholder stands for (the placeholder itself for an input)."""
        state = self.graph.program.state_dict
        target = self.graph.target(placeholder) if self.graph.kind(placeholder) in ("PARAMETER", "BUFFER") else None
        return state[target] if target in state else placeholder

    def of_value(self) -> dict[int, Shape]:
        """id(example tensor) -> its sizes: what the rules hand the namer is a node's ``meta['val']``."""
        found: dict[int, Shape] = {}
        for node, shape in self.shapes.items():
            value = node.meta.get("val")
            if isinstance(value, torch.Tensor) and isinstance(shape, tuple):
                found[id(value)] = shape
            elif isinstance(value, list | tuple) and isinstance(shape, list):
                found.update((id(v), s) for v, s in zip(value, shape, strict=False) if isinstance(v, torch.Tensor))
        return found

    # ------------------------------------------------------------------ the rules

    def _infer(self, node: torch.fx.Node, value) -> Shape | list[Shape] | None:
        if node.target == operator.getitem:
            source = self.shapes.get(node.args[0])
            return source[node.args[1]] if isinstance(source, list) and node.args[1] < len(source) else None
        if isinstance(value, list | tuple):
            return self._pieces(node, value)
        if not isinstance(value, torch.Tensor):
            return None
        out = tuple(int(s) for s in value.shape)
        first = self._input(node, 0)
        rule = self._rule(node.target)
        shape = None
        if rule is not None and (first is not None or node.target in FACTORIES or node.target in JOINS):
            try:
                shape = rule(node, first, out)
            except (IndexError, TypeError, ValueError, ZeroDivisionError):  # an overload with other arguments: lined up instead
                shape = None
        if shape is None or len(shape) != len(out) or tuple(size_value(s) for s in shape) != out:
            shape = self._aligned(node, out)
        return shape

    def _rule(self, target):
        if target in VIEWS:
            return self._regrouped
        if target in FACTORIES:
            return self._made_of_numbers
        return self._rules.get(target)

    def _made_of_numbers(self, node, first, out: tuple[int, ...]) -> Shape:
        return tuple(self._guess(s) for s in out)

    def _input(self, node: torch.fx.Node, index: int) -> Shape | None:
        arg = node.args[index] if index < len(node.args) else None
        shape = self.shapes.get(arg) if isinstance(arg, torch.fx.Node) else None
        return shape if isinstance(shape, tuple) else None

    def _tensor_inputs(self, node: torch.fx.Node, held: bool = False) -> list[Shape]:
        """The shapes of a node's tensor inputs; ``held``: the sizes each holds (a constant's dims are
        guesses from its numbers, and a loose number is no size: both None)."""
        args = [a for arg in node.args for a in (arg if isinstance(arg, list | tuple) else [arg])]
        nodes = [a for a in [*args, *node.kwargs.values()] if isinstance(a, torch.fx.Node)]
        found = [(self.shapes.get(a), a in self.graph.constant) for a in nodes]
        if held:
            return [
                tuple(None if isinstance(s, Loose | Guess) or (constant and isinstance(s, Poly)) else s for s in shape)
                for shape, constant in found
                if isinstance(shape, tuple)
            ]
        return [shape for shape, _ in found if isinstance(shape, tuple)]

    def _aligned(self, node: torch.fx.Node, out: tuple[int, ...]) -> Shape:
        """An op that keeps its inputs' axes (elementwise with broadcasting, products, reductions,
        attention): each output axis is the input axis of its size that lines up with it, counted
        from the end (broadcasting, ``matmul``, ``linear``), else from the start (a reduction
        that drops the last axes); a size no input axis gives is a number."""
        inputs, holding = self._tensor_inputs(node), self._tensor_inputs(node, held=True)
        shape = []
        for axis, size in enumerate(out):
            from_end, from_start = _from_end(inputs, axis, len(out)), [s[axis] for s in inputs if axis < len(s)]
            held = [s for s in _from_end(holding, axis, len(out)) if s is not None]
            named = [s for s in (*from_end, *from_start) if not isinstance(s, int) and size_value(s) == size]
            named.sort(key=lambda s: (s not in held, isinstance(s, Guess)))  # a dim a computed tensor holds before a guess
            batched = node.target in BATCHED and axis >= len(out) - 2
            if size > 1 and node.target in BROADCASTS | BATCHED and not batched:
                self._hold_equal(held)
                if size in held:
                    # a fixed size the op holds equal to an input dim (a table of values the size of the example's
                    # length); a constant's guessed dim, or a loose number, fixes nothing
                    self.fixed.update(s.names()[0] for s in held if isinstance(s, Poly) and len(s.names() or ()) == 1)
                    named = [s for s in named if s in held]
            numbers = [s for s in (*from_end, *from_start) if isinstance(s, int) and s == size]
            loose = bool(numbers) and all(isinstance(s, Loose) for s in numbers)  # only a loose number has this size
            shape.append(named[0] if named else Loose(size) if loose and size > 1 else size)
        return tuple(shape)

    def _regrouped(self, node, first: Shape, out: tuple[int, ...]) -> Shape | None:
        """A view: runs of input axes whose sizes multiply to runs of output axes (``[B, T, d]`` ->
        ``[B * T, d]`` -> ``[B, T, H, Dh]``); a merged run is the product of its sizes, a split one
        hands its named factors to the output axes of their sizes. Axes of size 1 come and go."""
        inputs = [s for s in first if size_value(s) != 1]
        shape: list[Size] = []
        i = j = 0
        while j < len(out):
            if out[j] == 1:
                shape.append(1)
                j += 1
                continue
            if i >= len(inputs):
                return None
            group_in, group_out = [inputs[i]], [out[j]]
            i, j = i + 1, j + 1
            while (have := math.prod(size_value(s) for s in group_in)) != (want := math.prod(group_out)):
                if have < want and i < len(inputs):
                    group_in.append(inputs[i])
                    i += 1
                elif have > want and j < len(out):
                    group_out.append(out[j])
                    j += 1
                else:
                    return None
            shape += self._split(functools.reduce(times, group_in), group_out)
        return tuple(shape) if i == len(inputs) else None

    def _split(self, product: Size, sizes: list[int]) -> list[Size]:
        """A run of axes cut from one product: each dim of the product goes to the output axis of its
        size, else to the first it divides (``[T, B * d]`` -> ``[T, 4 * B, Dh]``); the rest are numbers."""
        if len(sizes) == 1:
            return [product]
        terms = _terms(product)
        if len(terms) != 1:
            return list(sizes)
        ((names, coefficient),) = terms.items()
        owner: dict[int, list[str]] = {}
        left = list(names)
        for exact in (True, False):
            for name in list(left):
                free = [j for j, size in enumerate(sizes) if size % math.prod(self.values[n] for n in (*owner.get(j, []), name)) == 0]
                j = next((j for j in free if not exact or (sizes[j] == self.values[name] and j not in owner)), None)
                if j is not None:
                    owner.setdefault(j, []).append(name)
                    left.remove(name)
        shape = [
            functools.reduce(
                times,
                [Poly.symbol(n, self.values[n]) for n in owner.get(j, [])],
                size // math.prod(self.values[n] for n in owner.get(j, [])),
            )
            for j, size in enumerate(sizes)
        ]
        constants = math.prod(size_value(s) // math.prod(self.values[n] for n in owner.get(j, [])) for j, s in enumerate(shape))
        return shape if not left and constants == coefficient else list(sizes)

    def _permuted(self, node, first: Shape, out) -> Shape:
        return tuple(first[d % len(first)] for d in node.args[1])

    def _transposed(self, node, first: Shape, out) -> Shape:
        a, b = (node.args[1] % len(first), node.args[2] % len(first)) if len(node.args) > 2 else (0, 1)
        shape = list(first)
        shape[a], shape[b] = shape[b], shape[a]
        return tuple(shape)

    def _expanded(self, node, first: Shape, out: tuple[int, ...]) -> Shape:
        """An axis expand makes keeps a model dim's size (repeat_kv's ``n_rep``), but the first, which
        is a batch (a causal mask's ``expand(batch_size, -1, -1, -1)`` where B = H_kv = 2)."""
        lead = len(out) - len(first)
        return tuple(
            first[axis - lead]
            if axis >= lead and size_value(first[axis - lead]) == size
            else self._guess(size, self.model if axis else frozenset())
            for axis, size in enumerate(out)
        )

    def _product(self, node, first, out) -> Shape | None:
        """``a @ b``: the rows are a's, the columns b's (the batch axes lined up as broadcasting
        lines them up): the weights (B, H, T, T) times the values (B, H, T, Dh) are (B, H, T, Dh)
        even where T and Dh are both 8, whose T lines up with the last axis too."""
        second = self._input(node, 1)
        if second is None or len(first) < 2 or len(second) < 2:
            return None
        held = self._tensor_inputs(node, held=True)
        if len(held) == 2:
            self._hold_equal([held[0][-1], held[1][-2]])  # the axis the product sums over
        return (*self._aligned(node, out)[:-2], first[-2], second[-1])

    def _attention(self, node, first, out) -> Shape:
        """sdpa(q, k, v, mask): the keys' and the values' lengths are one, and a mask's last two axes
        are the queries' and the keys' lengths; its output is the queries' with the values' width."""
        q, k, v, *rest = self._tensor_inputs(node, held=True)
        self._hold_equal([k[-2], v[-2]])
        if rest and len(rest[0]) >= 2:
            self._hold_equal([rest[0][-2], q[-2]])
            self._hold_equal([rest[0][-1], k[-2]])
        queries, _, values = self._tensor_inputs(node)[:3]
        return (*self._aligned(node, out)[:-2], queries[-2], values[-1])

    def _concatenated(self, node, first, out) -> Shape | None:
        shapes = [self.shapes.get(t) for t in node.args[0]]
        if any(not isinstance(s, tuple) or len(s) != len(out) for s in shapes):
            return None
        dim = (node.args[1] if len(node.args) > 1 else node.kwargs.get("dim", 0)) % len(out)
        self._unbind_fixed_axes(node.args[0], shapes, dim)
        for axis in range(len(out)):
            if axis != dim:
                self._hold_equal([s[axis] for s in self._tensor_inputs(node, held=True) if len(s) == len(out)])
        shape = list(shapes[0])
        shape[dim] = functools.reduce(plus, (s[dim] for s in shapes))
        return tuple(shape)

    def _unbind_fixed_axes(self, parts: list, shapes: list[tuple], dim: int) -> None:
        """An input's axis that a ``cat`` joins to an axis of fixed size is that size, not the dim
        of its value it was given: a cache's heads (``[B, H_kv, past, Dh]``, H_kv = 2) beside new
        keys of 2 heads, not the batch of 2 (``input_dims`` names it by value)."""
        for axis in range(len(shapes[0])):
            if axis == dim or not any(isinstance(s[axis], int) and not isinstance(s[axis], Loose) and s[axis] > 1 for s in shapes):
                continue
            for part in parts:
                if isinstance(part, torch.fx.Node) and part.op == "placeholder" and (part.name, axis) in self.inputs:
                    self.unbound.add((part.name, axis))

    def _stacked(self, node, first, out) -> Shape | None:
        shapes = [self.shapes.get(t) for t in node.args[0]]
        if any(not isinstance(s, tuple) for s in shapes):
            return None
        dim = (node.args[1] if len(node.args) > 1 else node.kwargs.get("dim", 0)) % len(out)
        return (*shapes[0][:dim], len(shapes), *shapes[0][dim:])

    def _sliced(self, node, first: Shape, out: tuple[int, ...]) -> Shape:
        """``x[a:b]`` along one axis: the axis less what the slice leaves out, counted from its end
        where the bound is (``x[:, 1:]`` is ``T - 1``); a bound inside an axis of fixed size of a
        constant (a buffer sliced at the length) is read as an input's length of its value."""
        args = [*node.args, None, None, None, None][:5]
        dim, start, end, step = args[1] or 0, args[2] or 0, args[3], args[4] or 1
        dim %= len(first)
        axis, size = first[dim], size_value(first[dim])
        if step != 1 or not isinstance(start, int) or not (end is None or isinstance(end, int)):
            return (*first[:dim], out[dim], *first[dim + 1 :])
        start_at = plus(axis, start) if start < 0 else min(start, size)
        end_at = axis if end is None or end >= size else plus(axis, end) if end < 0 else end
        if isinstance(axis, int) and isinstance(end_at, int) and node.args[0] in self.graph.constant:
            end_at = self._guess(end_at, lengths=True)
        elif isinstance(axis, int) and isinstance(end_at, int) and 0 < start_at < end_at and self._table(node.args[0]):
            length = self._guess(end_at - start_at, lengths=True)  # a learned-position table at an offset: BART's [2:T + 2]
            end_at = end_at if isinstance(length, int) else plus(length, start_at)
        length = plus(end_at, times(start_at, -1))
        return (*first[:dim], length, *first[dim + 1 :])

    def _table(self, node) -> bool:
        """A parameter read as it is (a table of learned positions), not a tensor computed from one."""
        return isinstance(node, torch.fx.Node) and node.op == "placeholder" and self.graph.kind(node) == "PARAMETER"

    def _repeated(self, node, first: Shape, out) -> Shape:
        repeats = list(node.args[1])
        lead = len(repeats) - len(first)
        return tuple(times(first[axis - lead], r) if axis >= lead else self._guess(int(r)) for axis, r in enumerate(repeats))

    def _pieces(self, node: torch.fx.Node, value) -> list[Shape] | None:
        """A split's or unbind's outputs: the input's axes, the cut one a number (or the whole axis)."""
        first = self._input(node, 0)
        if node.target not in SPLITS or first is None:
            return [self._aligned(node, tuple(int(s) for s in v.shape)) for v in value if isinstance(v, torch.Tensor)] or None
        if node.target == aten.unbind.int:
            return [_without(first, node.args[1] if len(node.args) > 1 else 0)] * len(value)
        dim = (node.args[2] if len(node.args) > 2 else node.kwargs.get("dim", 0)) % len(first)
        return [(*first[:dim], first[dim] if len(value) == 1 else int(v.shape[dim]), *first[dim + 1 :]) for v in value]

    # ------------------------------------------------------------------ numbers

    def _guess(self, size: int, besides: frozenset[int] = frozenset(), lengths: bool = False) -> Size:
        """A size written as a number in the graph: an input's batch or length of that size, else the
        number; an axis ``expand`` adds keeps a model dim's size (repeat_kv's ``n_rep``), a table
        sliced at a length is sliced at a length (``lengths``: ``position_ids[:, :T]``)."""
        if size == 1:
            return size
        known = next((d.symbol for d in self.dims if d.size == size and not (lengths and d.name.startswith("B"))), None)
        if known is not None and size in besides:
            return Loose(size)  # the batch or a model dim: nothing says which
        return size if known is None else Guess(known.terms, size)


def _source_input(graph: Graph, node) -> torch.fx.Node | None:
    """The input a tensor is, or is computed from through ops of one tensor input (a cache transposed, cast)."""
    while isinstance(node, torch.fx.Node) and node.op == "call_function":
        tensors = [a for a in node.all_input_nodes if isinstance(a.meta.get("val"), torch.Tensor)]
        node = tensors[0] if len(tensors) == 1 else None
    if isinstance(node, torch.fx.Node) and node.op == "placeholder" and graph.kind(node) == "USER_INPUT":
        return node
    return None


def _from_end(shapes: list[Shape], axis: int, ndim: int) -> list[Size]:
    """The sizes that line up with ``axis`` of an output of ``ndim`` axes, counted from the end (broadcasting)."""
    return [s[len(s) - ndim + axis] for s in shapes if 0 <= len(s) - ndim + axis < len(s)]


def _without(shape: Shape, dim: int) -> Shape:
    dim %= len(shape)
    return (*shape[:dim], *shape[dim + 1 :])
