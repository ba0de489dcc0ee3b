"""``tracer diff A B``: what changed between two pipelines — steps by id and kind, the shapes of the
steps both have, params, dims, block depths, FLOPs and peak memory side by side, and (with values)
every tensor whose values differ when both run from the same seed, with the size of the difference.

Both pipelines are compared expanded: a ``use:`` block is its steps, copy by copy
(``layers/1/self_attn.scale``), so a change inside a block file is found and named; a block
repeated a different number of times is one line, ``layers: repeat 2 -> 3``, and a change that
every copy shares is one line, ``layers/{0..47}/...``.

Steps are paired by id where both files use one, and by structure where they do not (the same
kind reading the partners of the same tensors, see :class:`Matching`): an imported module and
the hand-written pipeline it should be differ in names only, and the diff says which. Pairing is
linear in the steps (dict lookups along the graph), so a 20,000-step expansion diffs in seconds.
"""

from __future__ import annotations

import itertools
import json
import re
from collections import defaultdict, deque
from dataclasses import asdict, dataclass, field

from .analysis.graph import Node
from .api import Pipeline
from .core import dimexpr
from .core.formatting import human_bytes
from .core.symbolic import Dim, Poly, substitute
from .presentation.diff_report import Row, Side, diff_html

RTOL = 1e-5  # of the values' magnitude: float32 kernels that sum in another order differ by ~1e-6 of it
ATOL = 1e-6  # the floor, for tensors of zeros


@dataclass
class Diff:
    a: str
    b: str
    added: list[str] = field(default_factory=list)  # steps only B has ('id: op')
    removed: list[str] = field(default_factory=list)
    renamed: list[str] = field(default_factory=list)  # 'step a -> b: op', 'param a -> b', 'input a -> b', 'dim a -> b'
    changed_op: list[str] = field(default_factory=list)  # 'id: op_a -> op_b', or 'id: field a -> b'
    blocks: list[str] = field(default_factory=list)  # 'layers: repeat 2 -> 3 (...)'
    shapes: list[list[str]] = field(default_factory=list)  # [id, A's shape, B's shape] where they differ
    params: list[list[str]] = field(default_factory=list)  # [param, A's shape or '-', B's]
    dims: list[list[str]] = field(default_factory=list)  # [dim, A's value or '-', B's] where they differ
    totals: dict[str, list[int]] = field(default_factory=dict)  # name -> [A, B]
    diverges: str | None = None  # the first tensor both runs make whose values differ
    values: list[dict] = field(default_factory=list)  # each such tensor: its name, max abs and relative difference, tolerance
    unseeded: list[str] = field(default_factory=list)  # A's steps that draw from the RNG: their values and what follows are not compared
    outputs: list[str] = field(default_factory=list)  # the pipelines' paired outputs, in A's order ('a -> b' where renamed)
    compared_values: bool = False

    @property
    def same(self) -> bool:
        """Nothing but names differs (renames are listed, and are not a change of computation).
        A dim is a name for a size: a size that changed shows where it is used (a shape, a field)."""
        return not (self.added or self.removed or self.changed_op or self.blocks or self.shapes or self.params or self.diverges)


def diff(
    a: Pipeline, b: Pipeline, values: bool = False, atol: float = ATOL, rtol: float = RTOL, max_memory: int | str | None = None
) -> Diff:
    """The differences between two loaded pipelines (each checked at its own dims, blocks expanded).

    With ``values``, both run from seed 0 (B on A's inputs and params, passed to their partners)
    and every paired tensor whose values differ by more than ``atol + rtol * magnitude`` is
    listed (``magnitude``: the largest finite value of either, a mask's fill aside); each run is
    held to ``max_memory`` (as ``Pipeline.run``), every kept tensor counted."""
    left, right = a.check(), b.check()
    left.raise_errors()
    right.raise_errors()
    matching = Matching(left, right)
    pairs, nodes_a, nodes_b = matching.pairs, matching.nodes_a, matching.nodes_b
    result = Diff(a.path, b.path)
    depth = _Depths(left, right, pairs)
    paired_b = set(pairs.values())
    result.blocks = depth.lines
    result.removed = [f"{i}: {n.op}" for i, n in nodes_a.items() if i not in pairs and not depth.extra_a(n.copy)]
    result.added = [f"{i}: {n.op}" for i, n in nodes_b.items() if i not in paired_b and not depth.extra_b(n.copy)]
    result.renamed = _renames(left, pairs, nodes_a, depth)
    _compare_pairs(matching, depth, result)
    result.changed_op += _output_change(left, right, pairs, depth)
    result.params = _param_changes(left, right, pairs, depth)
    result.dims = _dim_changes(left, right)
    result.changed_op, result.renamed, result.added, result.removed = (
        fold(lines, left, right) for lines in (result.changed_op, result.renamed, result.added, result.removed)
    )
    result.shapes = _fold_rows(result.shapes, left, right)
    result.params = _fold_rows(result.params, left, right)
    result.outputs = [_pair_name(name, pairs[name]) for name in left.outputs if name in pairs]
    result.totals = {
        "steps": [_steps(nodes_a), _steps(nodes_b)],
        "params": [_count(left), _count(right)],
        "flops": [left.total_flops, right.total_flops],
        "peak bytes": [left.memory.peak_bytes, right.memory.peak_bytes],
    }
    if values:
        result.compared_values = True
        result.values = _value_differences(a, b, pairs, atol, rtol, max_memory)
        result.unseeded = [
            n.id for n in nodes_a.values() if n.step.is_random() or (n.id in pairs and nodes_b[pairs[n.id]].step.is_random())
        ]
        result.diverges = result.values[0]["tensor"] if result.values else None
    return result


def _compare_pairs(matching: Matching, depth: _Depths, result: Diff) -> None:
    """Each pair of steps: its changes, its shape where sizes or dtype differ, and the dims its
    axes are named by where only the names differ (``dim T -> seq``, once, at the first step)."""
    left, right = matching.left, matching.right
    labels: dict[tuple[str, str], tuple[Dim, Dim, str]] = {}  # (A's label, B's) -> the dims, the first step with them
    for step_id, node_a in matching.nodes_a.items():
        if step_id not in matching.pairs:
            continue
        node_b = matching.nodes_b[matching.pairs[step_id]]
        result.changed_op += _changes(matching, depth, node_a, node_b)
        meta_a, meta_b = left.meta(step_id), right.meta(node_b.id)
        if _differ(meta_a, meta_b):
            result.shapes.append([_pair_name(step_id, node_b.id), *_shapes(meta_a, meta_b)])
        elif meta_a is not None:
            for x, y in zip(meta_a.shape, meta_b.shape, strict=True):
                if x.label != y.label:
                    labels.setdefault((x.label, y.label), (x, y, step_id))
    declared = _declared_labels(matching)
    renamed = {x.label: y.poly for x, y, _ in [*labels.values(), *declared.values()] if _is_base(x)}  # A's dim -> B's size
    kept, implied = [], []
    for entry in labels.values():
        (implied if _spelled_out(entry[0], entry[1], renamed) else kept).append(entry)
    used = {name for x, _, _ in implied for name in _names(x.poly)} - {x.label for x, _, _ in kept}
    kept += [entry for entry in declared.values() if _is_base(entry[0]) and entry[0].label in used]  # what a sum follows from
    result.renamed += [f"dim {x} -> {y} (as at {where})" for x, y, where in kept]


def _declared_labels(matching: Matching) -> dict[tuple[str, str], tuple[Dim, Dim, str]]:
    """(A's label, B's) -> the dims and the first input or param declared with them, of paired declarations."""
    found: dict[tuple[str, str], tuple[Dim, Dim, str]] = {}
    for name, declared in matching.left.declared.items():
        other = matching.right.declared.get(matching.pairs.get(name, ""))
        if other is not None and not _differ(declared.meta, other.meta):
            for x, y in zip(declared.meta.shape, other.meta.shape, strict=True):
                if x.label != y.label:
                    found.setdefault((x.label, y.label), (x, y, name))
    return found


def _names(poly: Poly) -> set[str]:
    return {name for mono, _ in poly.terms for name, _ in mono}


def _is_base(dim: Dim) -> bool:
    return dim.poly == Poly.symbol(dim.label)


def _spelled_out(x: Dim, y: Dim, renamed: dict[str, Poly]) -> bool:
    """A dim one side defines as an expression and the other writes out, the dims it is made of
    renamed as their own lines say: ``N: B * T`` beside ``B * T`` is no rename, nor is ``T_kv: past +
    T`` beside ``past + 1`` where ``T -> 1`` is listed."""
    return not (_is_base(x) and _is_base(y)) and substitute(x.poly, {} if _is_base(x) else renamed) == y.poly


def _steps(nodes: dict[str, Node]) -> int:
    """The steps that compute something (a block's inputs are names for tensors of the file including it)."""
    return sum(1 for node in nodes.values() if node.op != "block_input")


class Matching:
    """Which tensor of B is which tensor of A: ``pairs`` maps A's names (inputs, params, steps,
    named outputs) to B's, over the expanded steps (a block's copies included).

    Same names pair first (an input, a param, a step of the same kind), then inputs each file
    has one of with the same sizes and dtype. Then, along A's graph, an
    unpaired step pairs with an unpaired step of B of the same kind that reads the partners of
    what it reads, and their params (and the inputs and params they read as data) pair in field
    order: a renamed step is a rename, not one removed and one added. When the walk stops, the first
    unpaired step of A whose kind B still has pairs with B's first unpaired step of that kind,
    and the walk goes on from it. Steps left over with one id pair though their kinds differ (a
    changed op); inputs and params left over pair by sizes and dtype, then inputs in order. Every step is looked up by (kind, inputs) and visited a bounded number of times:
    linear in the steps.
    """

    def __init__(self, left, right):
        self.left, self.right = left, right
        self.nodes_a, self.nodes_b = dict(left.nodes), dict(right.nodes)
        # kind and fields as the step computes them: a permute that swaps two axes is a transpose
        self.canonical_a = {i: _canonical(left, n) for i, n in self.nodes_a.items()}
        self.canonical_b = {i: _canonical(right, n) for i, n in self.nodes_b.items()}
        self.kind_a = {i: c[0] for i, c in self.canonical_a.items()}
        self.kind_b = {i: c[0] for i, c in self.canonical_b.items()}
        self.pairs: dict[str, str] = {}
        self.taken: set[str] = set()
        self.readers = defaultdict(list)  # A's tensor -> A's steps that read it
        for node in self.nodes_a.values():
            for name in dict.fromkeys(node.inputs):
                self.readers[name].append(node)
        self.by_inputs = defaultdict(deque)  # (kind, inputs) -> B's steps, in order
        self.by_kind = defaultdict(deque)  # kind -> B's steps, in order
        for node in self.nodes_b.values():
            self.by_inputs[(self.kind_b[node.id], node.inputs)].append(node)
            self.by_kind[self.kind_b[node.id]].append(node)
        self.ready: deque[Node] = deque()  # A's steps whose inputs may all be paired now
        self.waiting: deque[Node] = deque()  # A's steps left for pairing by position until the walk is done
        self._pair_everything()

    def _pair_everything(self) -> None:
        """The passes of the class docstring, in its order."""
        left, right = self.left, self.right
        for name, declared in left.declared.items():
            if name in right.declared and right.declared[name].section == declared.section:
                self._pair(name, name)
        for step_id, node in self.nodes_a.items():
            if step_id in self.nodes_b and self.kind_b[step_id] == self.kind_a[step_id]:
                self._pair_steps(node, self.nodes_b[step_id])
        self._pair_alike(("inputs",), only_one=True)
        self.ready.extend(self.nodes_a.values())
        order = iter(self.nodes_a.values())
        while True:
            self._walk()
            if not self._by_position(order):
                break
        for step_id, node in self.nodes_a.items():  # one id, another kind: 'hidden_act: relu -> gelu'
            if step_id not in self.pairs and step_id in self.nodes_b and step_id not in self.taken:
                self._pair_steps(node, self.nodes_b[step_id])
        self._pair_alike(("inputs", "params"), only_one=False)
        self._pair_leftovers(_declared(left, "inputs"), _declared(right, "inputs"))

    def _pair(self, a: str, b: str) -> None:
        if a not in self.pairs and b not in self.taken:
            self.pairs[a] = b
            self.taken.add(b)
            self.ready.extend(self.readers.get(a, ()))

    def _pair_steps(self, a: Node, b: Node) -> None:
        self._pair(a.id, b.id)
        for x, y in zip(a.inputs, b.inputs, strict=False):  # an input or a param read as data, renamed
            if _signature(self.left, x) is not None and _signature(self.left, x) == _signature(self.right, y):
                self._pair(x, y)
        for x, y in zip(a.step.output_ids(), b.step.output_ids(), strict=False):
            self._pair(x, y)
        if len(a.params) == len(b.params):
            for x, y in zip(a.params, b.params, strict=True):
                self._pair(x, y)

    def _pair_alike(self, sections: tuple[str, ...], only_one: bool) -> None:
        """Pair unpaired inputs (or params) by section, sizes and dtype, in file order where both
        files have as many of a kind (``only_one``: where each has one, before the walk, so that
        it can start from renamed inputs in any order)."""
        alike_a, alike_b = defaultdict(list), defaultdict(list)
        for name, declared in self.left.declared.items():
            if name not in self.pairs and declared.section in sections:
                alike_a[_signature(self.left, name)].append(name)
        for name, declared in self.right.declared.items():
            if name not in self.taken and declared.section in sections:
                alike_b[_signature(self.right, name)].append(name)
        for key, names in alike_a.items():
            theirs = alike_b.get(key, [])
            if len(names) == len(theirs) and (len(names) == 1 or not only_one):
                for a, b in zip(names, theirs, strict=True):
                    self._pair(a, b)

    def _pair_leftovers(self, names_a: list[str], names_b: list[str]) -> None:
        left = [n for n in names_a if n not in self.pairs]
        right = [n for n in names_b if n not in self.taken]
        if len(left) == len(right):
            for a, b in zip(left, right, strict=True):
                self._pair(a, b)

    def _walk(self) -> None:
        """Pair every step whose inputs are all paired with the step of B that reads their partners."""
        while self.ready:
            node = self.ready.popleft()
            if node.id in self.pairs or not all(i in self.pairs for i in node.inputs):
                continue
            candidates = self.by_inputs.get((self.kind_a[node.id], tuple(self.pairs[i] for i in node.inputs)))
            partner = _first_free(candidates, self.taken)
            if partner is not None:
                self._pair_steps(node, partner)

    def _by_position(self, order) -> bool:
        """Pair the first unpaired step of A whose kind B still has free with a free step of that
        kind: one named alike (``q_heads`` with ``q_view``, not ``k_view``: a file may compute k
        before q) among B's next few, else B's first. A step whose inputs are all paired already
        found no step of B reading their partners: it waits until the walk has paired what it can
        (nanoGPT's one fused projection leaves causal_mha's ``k`` for ``out``'s partner, not
        ``c_proj``), unless a step named alike is free. ``order`` walks A's steps once over all
        calls, and each waits at most once: a step paired stays paired."""
        for node in order:
            if node.id in self.pairs:
                continue
            partner = self._named_alike(node)
            if partner is None and node.inputs and all(i in self.pairs for i in node.inputs):
                self.waiting.append(node)
                continue
            if self._pair_with(node, partner):
                return True
        while self.waiting:
            node = self.waiting.popleft()
            if node.id not in self.pairs and self._pair_with(node, self._named_alike(node)):
                return True
        return False

    def _pair_with(self, node: Node, partner: Node | None) -> bool:
        partner = partner or _first_free(self.by_kind.get(self.kind_a[node.id]), self.taken)
        if partner is not None:
            self._pair_steps(node, partner)
        return partner is not None

    def _named_alike(self, node: Node) -> Node | None:
        """A free step of B of the node's kind, among the next few, whose last name shares a word with the node's."""
        words = _words(node.id)
        scanned = itertools.islice((c for c in self.by_kind.get(self.kind_a[node.id], ()) if c.id not in self.taken), NAME_SCAN)
        return next((c for c in scanned if words & _words(c.id)), None) if words else None


NAME_SCAN = 16  # free steps of a kind looked at for one named alike: pairing stays linear in the steps


def _words(step_id: str) -> set[str]:
    """The words of a step's own name (after its module path and copy), numbers aside: q_heads -> {q, heads}."""
    return {w for w in re.split(r"[_\-]+", re.split(r"[./]", step_id)[-1]) if w and not w.isdigit()}


def _signature(analysis, name: str) -> tuple | None:
    """What an input or param is, names aside: its section, sizes and dtype (None for a step's tensor)."""
    declared = analysis.declared.get(name)
    return None if declared is None else (declared.section, declared.meta.sizes, declared.meta.dtype)


def _first_free(candidates: deque | None, taken: set[str]) -> Node | None:
    """The first step of ``candidates`` not yet paired; the paired ones before it are dropped for good."""
    while candidates:
        if candidates[0].id not in taken:
            return candidates[0]
        candidates.popleft()
    return None


class _Depths:
    """Blocks of A and B paired (by id, or by the partner of their first step), and the copies one
    has beyond the other's depth: ``layers: repeat 2 -> 3`` is one line, and the steps and params
    of ``layers/2`` are not listed one by one."""

    def __init__(self, left, right, pairs: dict[str, str]):
        self.lines: list[str] = []
        self.beyond_a: set[str] = set()  # copy prefixes only A has ('layers/2')
        self.beyond_b: set[str] = set()
        self.block_pairs: dict[str, str] = {}  # A's block id -> B's
        self.outputs_a: dict[str, str] = {}  # a block's output record -> the block (B's name for it)
        first_a = _first_steps(left)
        copy_b = {c: block_id for block_id, info in right.blocks.items() for c in info.copies}
        for block_id, info in left.blocks.items():
            other = block_id if block_id in right.blocks else copy_b.get(_copy_of(right, pairs.get(first_a.get(info.copies[0]))))
            if other is None:
                continue
            self.block_pairs[block_id] = other
            theirs = right.blocks[other]
            if len(info.copies) != len(theirs.copies):
                self._depth_changed(left, right, block_id, other, info.copies, theirs.copies)
        self.outputs_a = _block_outputs(left, self.block_pairs)
        self.outputs_b = _block_outputs(right)

    def _depth_changed(self, left, right, block_id: str, other: str, mine: list[str], theirs: list[str]) -> None:
        n, m = len(mine), len(theirs)
        extra, side = (mine[m:], left) if n > m else (theirs[n:], right)
        (self.beyond_a if n > m else self.beyond_b).update(extra)
        steps = sum(1 for node in side.nodes.values() if _within(node.copy, set(extra)) and node.op != "block_input")
        params = sum(1 for name in side.declared if _within(name, set(extra)))
        sign = "-" if n > m else "+"
        shown = extra[0] if len(extra) == 1 else f"{extra[0]} .. {extra[-1]}"
        self.lines.append(f"{_pair_name(block_id, other)}: repeat {n} -> {m} ({sign} {shown}: {steps} steps, {params} params)")

    def extra_a(self, name: str | None) -> bool:
        return _within(name, self.beyond_a)

    def extra_b(self, name: str | None) -> bool:
        return _within(name, self.beyond_b)


def _within(name: str | None, prefixes: set[str]) -> bool:
    """``layers/2/attn/0`` (a copy) or ``layers/2/W_q`` (a param) is within the copy ``layers/2``."""
    if not name or not prefixes:
        return False
    parts = name.split("/")
    return any("/".join(parts[:k]) in prefixes for k in range(1, len(parts) + 1))


def _first_steps(analysis) -> dict[str, str]:
    """Block copy -> its first step (its first input, bound to the including file's tensor)."""
    first: dict[str, str] = {}
    for node in analysis.nodes.values():
        if node.copy is not None:
            first.setdefault(node.copy, node.id)
    return first


def _copy_of(analysis, step_id: str | None) -> str | None:
    node = analysis.nodes.get(step_id) if step_id else None
    return None if node is None else node.copy


def _declared(analysis, section: str) -> list[str]:
    return [name for name, declared in analysis.declared.items() if declared.section == section]


def _pair_name(a: str, b: str) -> str:
    return a if a == b else f"{a} -> {b}"


def _renames(left, pairs: dict[str, str], nodes_a: dict[str, Node], depth: _Depths) -> list[str]:
    """``step a -> b: op``, ``param a -> b``, ``input a -> b``; a block of another id is one line,
    ``block layers -> h``, and the steps and params of its copies that differ only by it are not listed."""
    moved = {a + "/": b + "/" for a, b in depth.block_pairs.items() if a != b and "/" not in a}
    renamed = [f"block {a[:-1]} -> {b[:-1]}" for a, b in moved.items()]
    for name, other in pairs.items():
        if name == other or any(name.startswith(a) and other == b + name[len(a) :] for a, b in moved.items()):
            continue
        if name in nodes_a:
            renamed.append(f"step {name} -> {other}: {nodes_a[name].op}")
        elif name in left.declared:
            renamed.append(f"{left.declared[name].section.removesuffix('s')} {name} -> {other}")
    return renamed


def _changes(matching: Matching, depth: _Depths, a: Node, b: Node) -> list[str]:
    """``weights: dim -1 -> -2``: the op, or the fields a step of the same kind changed (notes,
    groups and tensor names aside), and what it reads where that is not the partner of A's.
    Equivalent spellings are no change (:func:`_canonical`), and neither is a dim spelled by
    another name of the same size (``window: W -> 4`` where W is 4); a size that changed says so
    (``window W -> W (4 -> 8)``). A block's output read after a deeper stack is the same block's output."""
    name = _pair_name(a.id, b.id)
    (op_a, x), (op_b, y) = matching.canonical_a[a.id], matching.canonical_b[b.id]
    if op_a != op_b:
        return [f"{name}: {a.op} -> {b.op}"]
    changed = []
    for key in dict.fromkeys([*x, *y]):
        if _sized(x.get(key), a.dims) != _sized(y.get(key), b.dims):  # 'window: W' is W's size in each file
            changed.append(f"{key} {_shown_sized(_written(a, key), a.dims)} -> {_shown_sized(_written(b, key), b.dims)}")
    read = [depth.outputs_a.get(r) or matching.pairs.get(r, r) for r in a.refs]
    if read != [depth.outputs_b.get(r) or r for r in b.refs]:
        changed.append(f"reads {', '.join(a.refs)} -> {', '.join(b.refs)}")
    return [f"{name}: {', '.join(changed)}"] if changed else []


def _output_change(left, right, pairs: dict[str, str], depth: _Depths) -> list[str]:
    """``outputs: out -> out, weights`` where B returns other tensors than the partners of A's."""
    mine = [depth.outputs_a.get(r) or pairs.get(r, r) for r in left.outputs]
    if mine == [depth.outputs_b.get(r) or r for r in right.outputs]:
        return []
    return [f"outputs: {', '.join(left.outputs)} -> {', '.join(right.outputs)}"]


def _block_outputs(analysis, renamed: dict[str, str] | None = None) -> dict[str, str]:
    """A block's output record -> the block (B's name for it): read after the block, whatever its depth."""
    renamed = renamed or {}
    return {info.output: f"block {renamed.get(block_id, block_id)}" for block_id, info in analysis.blocks.items()}


def _sized(value, alg):
    """A field with its dim expressions evaluated in the step's own dims (a block's, inside one)."""
    if isinstance(value, str):
        try:
            return alg.dim(value).value
        except (dimexpr.DimError, TypeError, ValueError):
            return value
    if isinstance(value, (list, tuple)):
        return [_sized(v, alg) for v in value]
    if isinstance(value, dict):
        return {k: _sized(v, alg) for k, v in value.items()}
    return value


def _shown_sized(written, alg) -> str:
    """``W (4)``: a field as written, with its size where a dim names it."""
    shown, size = _shown(written), _shown(_sized(written, alg))
    return shown if shown == size else f"{shown} ({size})"


def _shown(value) -> str:
    if value is None:
        return "-"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {_shown(v)}" for k, v in value.items()) + "}"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_shown(v) for v in value) + "]"
    return str(value)


def _canonical(analysis, node: Node) -> tuple[str, dict]:
    """The step's kind and fields as every spelling of its computation gives them (its kind says how)."""

    def rank(name: str) -> int | None:
        meta = analysis.meta(name)
        return None if meta is None else len(meta.shape)

    return node.step.canonical(rank(node.refs[0]) if node.refs else None, rank(node.id))


def _written(node: Node, key: str):
    """A field as the file writes it."""
    value = getattr(node.step, key, None)
    return value.model_dump() if hasattr(value, "model_dump") else value


def _differ(x, y) -> bool:
    """Sizes or dtype differ (the same sizes under other dim names are a rename, listed apart)."""
    if x is None or y is None:
        return (x is None) != (y is None)
    return x.sizes != y.sizes or x.dtype != y.dtype


def _shapes(x, y) -> list[str]:
    with_dtype = x is not None and y is not None and x.dtype != y.dtype
    return [_shape(x, with_dtype), _shape(y, with_dtype)]


def _shape(meta, with_dtype: bool = False) -> str:
    if meta is None:
        return "-"
    return f"{meta.symbolic} {meta.concrete}" + (f" {meta.dtype}" if with_dtype else "")


def _param_changes(left, right, pairs: dict[str, str], depth: _Depths) -> list[list[str]]:
    """[param, A's shape, B's] for params whose partner has other sizes or dtype, or has none, or is
    a buffer where the other is a weight (``buffer: true``, marked after its shape)."""
    params_a, params_b = _declared(left, "params"), set(_declared(right, "params"))
    rows = []
    for name in params_a:
        other = pairs.get(name)
        x, y = left.declared[name], right.declared[other] if other in params_b else None
        if y is None and depth.extra_a(name):
            continue
        if _differ(x.meta, y and y.meta) or y is not None and x.decl.buffer != y.decl.buffer:
            rows.append([_pair_name(name, other or name), *(_held(shape, d) for shape, d in zip(_shapes(x.meta, y and y.meta), (x, y)))])
    mapped = {pairs.get(name) for name in params_a}
    rows += [
        [name, "-", _held(_shape(right.declared[name].meta), right.declared[name])]
        for name in _declared(right, "params")
        if name not in mapped and not depth.extra_b(name)
    ]
    return rows


def _held(shape: str, declared) -> str:
    """A param's shape, ``buffer`` after it for one held but not trained."""
    return f"{shape} buffer" if declared is not None and declared.decl.buffer else shape


def _dim_changes(left, right) -> list[list[str]]:
    """[dim, A's size or '-', B's] for the file's dims (and the block dims with one size everywhere)
    that one has and the other has not, or that have another size. A dim one file derives from
    others (``N: B * T``) and the other has not is a name for what that file writes out: its size
    shows where it is used, as a rename's does."""
    x, y = left.alg.values, right.alg.values

    def derived_on_one_side(name: str) -> bool:
        alg = left.alg if name in x else right.alg
        return (name in x) != (name in y) and name in alg.exprs and not dimexpr.is_number(alg.exprs[name])

    names = dict.fromkeys([*x, *y])
    return [
        [name, str(x.get(name, "-")), str(y.get(name, "-"))]
        for name in names
        if x.get(name) != y.get(name) and not derived_on_one_side(name)
    ]


def _count(analysis) -> int:
    return sum(d.meta.numel for d in analysis.declared.values() if d.section == "params" and not d.decl.buffer)


# ---------------------------------------------------------------- copies folded


def fold(lines: list[str], left, right) -> list[str]:
    """Lines that differ only in the copy number of a repeated block, one line per change:
    ``layers/0/x: window - -> W`` and ``layers/1/x: ...`` are ``layers/{0..1}/x: ...``. A line
    naming several copies (``reads layers/1/y -> layers/2/y``) stays as it is."""
    pattern = _copy_pattern(left, right)
    if pattern is None:
        return lines
    groups: dict[str, list[int]] = {}
    whole: dict[str, str] = {}
    for line in lines:
        numbers = {m.group(2) for m in pattern.finditer(line)}
        if len(numbers) != 1:
            groups.setdefault(line, [])
            continue
        template = pattern.sub(lambda m: f"{m.group(1)}/\0/", line)
        groups.setdefault(template, []).append(int(numbers.pop()))
        whole[template] = line
    return [template if not copies else _with_copies(template, copies, whole[template]) for template, copies in groups.items()]


def _with_copies(template: str, copies: list[int], line: str) -> str:
    return line if len(copies) == 1 else template.replace("\0", _copy_set(copies))


def _copy_set(copies: list[int]) -> str:
    """``{0..47}``, ``{1,3}``, ``{0..3,7}``: the copies, as shell braces write them."""
    runs: list[list[int]] = []
    for c in sorted(copies):
        if runs and c == runs[-1][1] + 1:
            runs[-1][1] = c
        else:
            runs.append([c, c])
    return "{" + ",".join(str(a) if a == b else f"{a}..{b}" if b > a + 1 else f"{a},{b}" for a, b in runs) + "}"


def _copy_pattern(left, right) -> re.Pattern | None:
    """``(layers)/(3)/`` in a name: the copies of the top-level repeated blocks of either file."""
    names = sorted({b for analysis in (left, right) for b, info in analysis.blocks.items() if info.repeat and "/" not in b}, key=len)
    if not names:
        return None
    alternatives = "|".join(re.escape(n) for n in reversed(names))
    return re.compile(rf"(?<![\w./-])({alternatives})/(\d+)/")


def _fold_rows(rows: list[list[str]], left, right) -> list[list[str]]:
    """Table rows folded as :func:`fold` folds lines (their cells joined by a separator no name holds)."""
    return [line.split("\x1f") for line in fold(["\x1f".join(row) for row in rows], left, right)]


# ---------------------------------------------------------------- values


def _value_differences(a: Pipeline, b: Pipeline, pairs: dict[str, str], atol: float, rtol: float, max_memory) -> list[dict]:
    """Every paired tensor (in A's run order) whose values differ beyond ``atol + rtol x magnitude``,
    B run on A's inputs and params (seed 0) passed to their partners."""
    run_a = a.run(keep_values=True, seed=0, max_memory=max_memory)
    declared_b = b.check().declared
    given = {
        pairs[r.id]: r.tensor
        for r in run_a.records
        if r.op in ("input", "param") and r.id in pairs and tuple(r.tensor.shape) == declared_b[pairs[r.id]].meta.sizes
    }  # a param stored transposed (layout: in_out) is B's own: its values then differ, as they would
    inputs = {n: t for n, t in given.items() if declared_b[n].section == "inputs"}
    params = {n: t for n, t in given.items() if declared_b[n].section == "params"}
    run_b = b.run(keep_values=True, seed=0, inputs=inputs, params=params, max_memory=max_memory)
    found = []
    nodes_b = b.check().nodes
    drawn: set[str] = set()  # tensors that depend on the RNG: B, given its inputs, draws less before them
    for name, node in a.check().nodes.items():
        partner = nodes_b.get(pairs.get(name, ""))
        if node.step.is_random() or (partner is not None and partner.step.is_random()) or drawn.intersection(node.refs):
            drawn.update(node.step.output_ids())
            continue
        if partner is None or node.op == "block_input":  # a block's input is the tensor it is bound to
            continue
        for x_id, y_id in _tensors(node, partner):
            if x_id in run_a and y_id in run_b:
                size = value_difference(run_a[x_id].tensor, run_b[y_id].tensor, atol, rtol)
                if size is not None:
                    found.append({"tensor": _pair_name(x_id, y_id), **size})
    return found


def value_difference(x, y, atol: float = ATOL, rtol: float = RTOL) -> dict | None:
    """None where two tensors agree; else the largest absolute difference, the same relative to
    the values' magnitude, and the tolerance it is over. Equal values (infinities, a mask's fill,
    NaN at the same places) are no difference; the magnitude is the largest finite value of either
    below the dtype's extremes, so a mask's fill (the dtype's min) does not hide what it masks."""
    import torch

    if x.shape != y.shape:
        return {"max_abs": None, "relative": None, "tolerance": None, "shapes": [list(x.shape), list(y.shape)]}
    x, y = x.detach().double(), y.detach().double()
    same = (x == y) | (torch.isnan(x) & torch.isnan(y))
    gap = torch.where(same, torch.zeros_like(x), (x - y).abs().nan_to_num(nan=float("inf")))
    largest = float(gap.max()) if gap.numel() else 0.0
    magnitude = max(_magnitude(x), _magnitude(y))
    tolerance = atol + rtol * magnitude
    if largest <= tolerance:
        return None
    relative = largest / magnitude if magnitude > 0 else float("inf")
    return {"max_abs": largest, "relative": relative, "tolerance": tolerance}


def _magnitude(t) -> float:
    ordinary = t[t.isfinite() & (t.abs() < 1e30)]  # a mask's fill (float32's min is -3.4e38) is no magnitude
    return float(ordinary.abs().max()) if ordinary.numel() else 0.0


def _tensors(a: Node, b: Node) -> list[tuple[str, str]]:
    """The tensors two paired steps make, pairwise: their results, or their named outputs."""
    return list(zip(a.step.output_ids(), b.step.output_ids(), strict=False))


# ---------------------------------------------------------------- text, JSON, page


def format_diff(d: Diff) -> str:
    """The diff as aligned text, one section per kind of change."""
    lines = [f"--- {d.a}", f"+++ {d.b}"]
    lines += [f"~ block {s}" for s in d.blocks]
    lines += [f"- step {s}" for s in d.removed] + [f"+ step {s}" for s in d.added] + [f"~ step {s}" for s in d.changed_op]
    lines += [f"= {s}" for s in d.renamed]
    lines += _columns("shape", d.shapes) + _columns("param", d.params) + _columns("dim", d.dims)
    width = max(len(name) for name in d.totals)
    for name, (x, y) in d.totals.items():
        shown = (human_bytes(x), human_bytes(y)) if name == "peak bytes" else (f"{x:,}", f"{y:,}")
        lines.append(f"  {name:<{width}}  {shown[0]:>14}  {shown[1]:>14}" + ("" if x == y else f"  ({y - x:+,})"))
    lines += _value_lines(d)
    lines.append(_verdict(d))
    return "\n".join(line for line in lines if line)


def _value_lines(d: Diff) -> list[str]:
    if not d.compared_values:
        return []
    skipped = [f"values: not compared from '{d.unseeded[0]}' on (it draws from the RNG)"] if d.unseeded else []
    if not d.values:
        return ["values: every shared tensor agrees" + (" before it" if d.unseeded else ""), *skipped]
    first, rest = d.values[0], d.values[1:]
    lines = [f"values: the first tensor that differs is '{first['tensor']}' ({_size(first)})"]
    outputs = [v for v in rest if v["tensor"] in d.outputs]
    if len(rest) > len(outputs):
        lines.append(f"values: {len(rest) - len(outputs)} more paired tensors differ after it (--json lists each)")
    lines += [f"values: output '{v['tensor']}' differs ({_size(v)})" for v in outputs]
    return lines + skipped


def _size(v: dict) -> str:
    if v["max_abs"] is None:
        return f"shapes {v['shapes'][0]} and {v['shapes'][1]}"
    return f"max abs {v['max_abs']:.3g}, relative {v['relative']:.3g}, tolerance {v['tolerance']:.3g}"


def _verdict(d: Diff) -> str:
    if d.same:
        return "the same pipeline" if not (d.renamed or d.dims) else "the same pipeline but for names"  # a dim is a name
    return "the pipelines differ" + (f"; the first tensor whose values differ is '{d.diverges}'" if d.diverges else "")


def _columns(what: str, rows: list[list[str]]) -> list[str]:
    if not rows:
        return []
    width = max(len(r[0]) for r in rows)
    left = max(len(r[1]) for r in rows)
    return [f"~ {what} {r[0]:<{width}}  {r[1]:<{left}}  ->  {r[2]}" for r in rows]


def diff_json(d: Diff) -> str:
    return json.dumps({**asdict(d), "same": d.same}, indent=2)


def diff_page(a: Pipeline, b: Pipeline, d: Diff) -> str:
    """The side-by-side HTML page of a diff (``tracer diff --html``): a row per pair of steps, in
    B's order, A's unpaired steps placed before the partner of the next step they precede."""
    left, right = a.check(), b.check()
    matching = Matching(left, right)
    pairs, nodes_a, nodes_b = matching.pairs, matching.nodes_a, matching.nodes_b
    depth = _Depths(left, right, pairs)
    partner = {pairs[i]: i for i in nodes_a if i in pairs}
    order = list(nodes_a)
    position = {step_id: k for k, step_id in enumerate(order)}
    rows, shown = [], 0  # A's steps before order[shown] are placed

    def removed_up_to(end: int) -> list[Row]:
        return [Row(_side(left, nodes_a[i]), None, "removed") for i in order[shown:end] if i not in pairs]

    for b_id, node_b in nodes_b.items():
        a_id = partner.get(b_id)
        if a_id is None:
            rows.append(Row(None, _side(right, node_b), "added"))
            continue
        if position[a_id] >= shown:
            rows += removed_up_to(position[a_id])
            shown = position[a_id] + 1
        rows.append(_paired_row(matching, depth, nodes_a[a_id], node_b))
    rows += removed_up_to(len(order))
    notes = [f"block {line}" for line in d.blocks] + [r for r in d.renamed if not r.startswith("step ")]
    notes += [f"param {name}: {x} -> {y}" for name, x, y in d.params] + [f"dim {name}: {x} -> {y}" for name, x, y in d.dims]
    notes += _value_lines(d)
    return diff_html(d.a, d.b, rows, d.totals, notes, _verdict(d))


def _side(analysis, node: Node) -> Side:
    return Side(node.id, node.op, _shape(analysis.meta(node.id)))


def _paired_row(matching: Matching, depth: _Depths, a: Node, b: Node) -> Row:
    left, right = matching.left, matching.right
    change = ", ".join(text.split(": ", 1)[1] for text in _changes(matching, depth, a, b))
    side_a, side_b = _side(left, a), _side(right, b)
    if change or _differ(left.meta(a.id), right.meta(b.id)):
        return Row(side_a, side_b, "changed", change or "shape")
    return Row(side_a, side_b, "renamed" if a.id != b.id else "same")
