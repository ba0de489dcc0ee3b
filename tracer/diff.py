"""``tracer diff A B``: what changed between two pipelines — steps by id and kind, the shapes of the
steps both have, params, FLOPs and peak memory side by side, and (with values) the first tensor
whose values diverge when both run from the same seed.

Steps are paired by id where both files use one, and by structure where they do not (the same
kind reading the partners of the same tensors, see :class:`Matching`): an imported module and
the hand-written pipeline it should be differ in names only, and the diff says which.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field

from .analysis.graph import Node
from .api import Pipeline
from .core.formatting import human_bytes
from .presentation.diff_report import Row, Side, diff_html


@dataclass
class Diff:
    a: str
    b: str
    added: list[str] = field(default_factory=list)  # steps only B has ('id: op')
    removed: list[str] = field(default_factory=list)
    renamed: list[str] = field(default_factory=list)  # 'step a -> b: op', 'param a -> b', 'input a -> b'
    changed_op: list[str] = field(default_factory=list)  # 'id: op_a -> op_b', or 'id: field a -> b'
    shapes: list[list[str]] = field(default_factory=list)  # [id, A's shape, B's shape] where they differ
    params: list[list[str]] = field(default_factory=list)  # [param, A's shape or '-', B's]
    totals: dict[str, list[int]] = field(default_factory=dict)  # name -> [A, B]
    diverges: str | None = None  # the first tensor both runs make whose values differ
    compared_values: bool = False

    @property
    def same(self) -> bool:
        """Nothing but names differs (renames are listed, and are not a change of computation)."""
        return not (self.added or self.removed or self.changed_op or self.shapes or self.params or self.diverges)


def diff(a: Pipeline, b: Pipeline, values: bool = False, atol: float = 1e-6) -> Diff:
    """The differences between two loaded pipelines (each checked at its own dims)."""
    left, right = a.check(), b.check()
    result = Diff(a.path, b.path)
    pairs = Matching(left, right).pairs
    nodes_a, nodes_b = _top(left), _top(right)
    paired_b = {pairs[i] for i in nodes_a if i in pairs}
    result.removed = [f"{i}: {n.op}" for i, n in nodes_a.items() if i not in pairs]
    result.added = [f"{i}: {n.op}" for i, n in nodes_b.items() if i not in paired_b]
    result.renamed = _renames(left, pairs, nodes_a)
    for step_id in (i for i in nodes_a if i in pairs):
        node_a, node_b = nodes_a[step_id], nodes_b[pairs[step_id]]
        result.changed_op += _changes(left, right, node_a, node_b, pairs)
        shape_a, shape_b = _shape(left, step_id), _shape(right, node_b.id)
        if shape_a != shape_b:
            result.shapes.append([_pair_name(step_id, node_b.id), shape_a, shape_b])
    params_a, params_b = _params(left), _params(right)
    for name, shape in params_a.items():
        other = pairs.get(name)
        if params_b.get(other) != shape:
            result.params.append([_pair_name(name, other or name), shape, params_b.get(other, "-")])
    mapped = {pairs.get(name) for name in params_a}
    result.params += [[name, "-", shape] for name, shape in params_b.items() if name not in mapped]
    result.totals = {
        "steps": [len(nodes_a), len(nodes_b)],
        "params": [_count(left), _count(right)],
        "flops": [left.total_flops, right.total_flops],
        "peak bytes": [left.memory.peak_bytes, right.memory.peak_bytes],
    }
    if values:
        result.compared_values, result.diverges = True, _first_divergence(a, b, pairs, atol)
    return result


def _top(analysis) -> dict[str, Node]:
    """The steps written in the file (a repeated block's copies are its one step)."""
    return {node.id: node for node in analysis.nodes.values() if node.copy is None}


class Matching:
    """Which tensor of B is which tensor of A: ``pairs`` maps A's names (inputs, params, steps,
    named outputs) to B's.

    Same names pair first (an input, a param, a step of the same kind). Then, in A's order, an
    unpaired step pairs with an unpaired step of B of the same kind that reads the partners of
    what it reads, and their params pair in field order: a renamed step is a rename, not one
    removed and one added. Inputs left over pair in order; steps left over pair by kind and
    position among the steps of that kind, and the walk goes on from them.
    """

    def __init__(self, left, right):
        self.nodes_a, self.nodes_b = _top(left), _top(right)
        # a kind as the step computes it: a permute that swaps two axes is a transpose
        self.kind_a = {i: _canonical(left, n)[0] for i, n in self.nodes_a.items()}
        self.kind_b = {i: _canonical(right, n)[0] for i, n in self.nodes_b.items()}
        self.pairs: dict[str, str] = {}
        self.taken: set[str] = set()
        for name, declared in left.declared.items():
            if name in right.declared and right.declared[name].section == declared.section:
                self._pair(name, name)
        for step_id, node in self.nodes_a.items():
            if step_id in self.nodes_b and self.kind_b[step_id] == self.kind_a[step_id]:
                self._pair_steps(node, self.nodes_b[step_id])
        self._pair_leftovers(_declared(left, "inputs"), _declared(right, "inputs"))
        while self._walk() or self._by_position():
            pass

    def _pair(self, a: str, b: str) -> None:
        if a not in self.pairs and b not in self.taken:
            self.pairs[a] = b
            self.taken.add(b)

    def _pair_steps(self, a: Node, b: Node) -> None:
        self._pair(a.id, b.id)
        for x, y in zip(a.step.output_ids(), b.step.output_ids(), strict=False):
            self._pair(x, y)
        if len(a.params) == len(b.params):
            for x, y in zip(a.params, b.params, strict=True):
                self._pair(x, y)

    def _pair_leftovers(self, names_a: list[str], names_b: list[str]) -> None:
        left = [n for n in names_a if n not in self.pairs]
        right = [n for n in names_b if n not in self.taken]
        if len(left) == len(right):
            for a, b in zip(left, right, strict=True):
                self._pair(a, b)

    def _walk(self) -> bool:
        """Pair every step whose inputs are all paired with the step of B that reads their partners."""
        found = False
        for node in self.nodes_a.values():
            if node.id in self.pairs or not all(i in self.pairs for i in node.inputs):
                continue
            wanted = tuple(self.pairs[i] for i in node.inputs)
            partner = next((b for b in self._free(self.kind_a[node.id]) if b.inputs == wanted), None)
            if partner is not None:
                self._pair_steps(node, partner)
                found = True
        return found

    def _by_position(self) -> bool:
        """Pair the first unpaired step of A with B's unpaired step of its kind at the same rank."""
        for node in self.nodes_a.values():
            if node.id in self.pairs:
                continue
            kind = self.kind_a[node.id]
            rank = [n for n in self.nodes_a.values() if self.kind_a[n.id] == kind and n.id not in self.pairs].index(node)
            free = self._free(kind)
            if rank < len(free):
                self._pair_steps(node, free[rank])
                return True
        return False

    def _free(self, kind: str) -> list[Node]:
        return [b for b in self.nodes_b.values() if self.kind_b[b.id] == kind and b.id not in self.taken]


def _declared(analysis, section: str) -> list[str]:
    return [name for name, declared in analysis.declared.items() if declared.section == section]


def _pair_name(a: str, b: str) -> str:
    return a if a == b else f"{a} -> {b}"


def _renames(left, pairs: dict[str, str], nodes_a: dict[str, Node]) -> list[str]:
    renamed = []
    for name, other in pairs.items():
        if name == other:
            continue
        if name in nodes_a:
            renamed.append(f"step {name} -> {other}: {nodes_a[name].op}")
        elif name in left.declared:
            renamed.append(f"{left.declared[name].section.removesuffix('s')} {name} -> {other}")
    return renamed


def _changes(left, right, a: Node, b: Node, pairs: dict[str, str]) -> list[str]:
    """``weights: dim -1 -> -2``: the op, or the fields a step of the same kind changed (notes,
    groups and tensor names aside), and what it reads where that is not the partner of A's.
    Equivalent spellings are no change (:func:`_canonical`)."""
    name = _pair_name(a.id, b.id)
    (op_a, x), (op_b, y) = _canonical(left, a), _canonical(right, b)
    if op_a != op_b:
        return [f"{name}: {a.op} -> {b.op}"]
    changed = [f"{k} {_written(a, k)} -> {_written(b, k)}" for k in dict.fromkeys([*x, *y]) if x.get(k) != y.get(k)]
    read = [pairs.get(r, r) for r in a.refs]
    if read != list(b.refs):
        changed.append(f"reads {', '.join(a.refs)} -> {', '.join(b.refs)}")
    return [f"{name}: {', '.join(changed)}"] if changed else []


def _canonical(analysis, node: Node) -> tuple[str, dict]:
    """The step's kind and fields as every spelling of its computation gives them (its kind says how)."""

    def rank(name: str) -> int | None:
        meta = analysis.meta(name)
        return None if meta is None else len(meta.shape)

    return node.step.canonical(rank(node.refs[0]) if node.refs else None, rank(node.id))


def _written(node: Node, key: str):
    """A field as the file writes it."""
    return getattr(node.step, key, None)


def _shape(analysis, step_id: str) -> str:
    meta = analysis.meta(step_id)
    return "-" if meta is None else f"{meta.symbolic} {meta.concrete}"


def _params(analysis) -> dict[str, str]:
    return {n: f"{d.meta.symbolic} {d.meta.concrete}" for n, d in analysis.declared.items() if d.section == "params"}


def _count(analysis) -> int:
    return sum(d.meta.numel for d in analysis.declared.values() if d.section == "params")


def _first_divergence(a: Pipeline, b: Pipeline, pairs: dict[str, str], atol: float) -> str | None:
    """The first paired tensor (in A's run order) whose values differ beyond ``atol``, B run on
    A's inputs and params (seed 0) passed to their partners."""
    import torch

    run_a = a.run(keep_values=True, seed=0)
    declared_b = b.check().declared
    given = {
        pairs[r.id]: r.tensor
        for r in run_a.records
        if r.op in ("input", "param") and r.id in pairs and tuple(r.tensor.shape) == declared_b[pairs[r.id]].meta.sizes
    }  # a param stored transposed (layout: in_out) is B's own: its values then differ, as they would
    inputs = {n: t for n, t in given.items() if declared_b[n].section == "inputs"}
    params = {n: t for n, t in given.items() if declared_b[n].section == "params"}
    run_b = b.run(keep_values=True, seed=0, inputs=inputs, params=params)
    for name in (n for n in a.check().nodes if n in pairs):
        for x_id, y_id in _tensors(a.check().nodes[name], b.check().nodes[pairs[name]]):
            if x_id not in run_a or y_id not in run_b:
                continue
            x, y = run_a[x_id].tensor, run_b[y_id].tensor
            if x.shape != y.shape or not torch.allclose(x.double(), y.double(), atol=atol, rtol=0, equal_nan=True):
                return _pair_name(x_id, y_id)
    return None


def _tensors(a: Node, b: Node) -> list[tuple[str, str]]:
    """The tensors two paired steps make, pairwise: their results, or their named outputs."""
    return list(zip(a.step.output_ids(), b.step.output_ids(), strict=False))


def format_diff(d: Diff) -> str:
    """The diff as aligned text, one section per kind of change."""
    lines = [f"--- {d.a}", f"+++ {d.b}"]
    lines += [f"- step {s}" for s in d.removed] + [f"+ step {s}" for s in d.added] + [f"~ step {s}" for s in d.changed_op]
    lines += [f"= {s}" for s in d.renamed]
    lines += _columns("shape", d.shapes) + _columns("param", d.params)
    width = max(len(name) for name in d.totals)
    for name, (x, y) in d.totals.items():
        shown = (human_bytes(x), human_bytes(y)) if name == "peak bytes" else (f"{x:,}", f"{y:,}")
        lines.append(f"  {name:<{width}}  {shown[0]:>14}  {shown[1]:>14}" + ("" if x == y else f"  ({y - x:+,})"))
    if d.compared_values:
        lines.append(f"values: the first tensor that differs is '{d.diverges}'" if d.diverges else "values: every shared tensor agrees")
    lines.append(_verdict(d) if d.same else "")
    return "\n".join(line for line in lines if line)


def _verdict(d: Diff) -> str:
    if d.same:
        return "the same pipeline" if not d.renamed else "the same pipeline but for names"
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
    """The side-by-side HTML page of a diff (``tracer diff --html``): a row per pair of steps."""
    left, right = a.check(), b.check()
    pairs = Matching(left, right).pairs
    nodes_a, nodes_b = _top(left), _top(right)
    partner = {pairs[i]: i for i in nodes_a if i in pairs}
    order, shown, rows = list(nodes_a), set(), []
    for b_id, node_b in nodes_b.items():
        a_id = partner.get(b_id)
        if a_id is None:
            rows.append(Row(None, _side(right, node_b), "added"))
            continue
        before = [i for i in order[: order.index(a_id)] if i not in pairs and i not in shown]
        rows += [Row(_side(left, nodes_a[i]), None, "removed") for i in before]
        shown.update([*before, a_id])
        rows.append(_paired_row(left, right, nodes_a[a_id], node_b, pairs))
    rows += [Row(_side(left, nodes_a[i]), None, "removed") for i in order if i not in pairs and i not in shown]
    notes = [r for r in d.renamed if not r.startswith("step ")]
    notes += [f"param {name}: {x} -> {y}" for name, x, y in d.params]
    if d.compared_values:
        notes.append(f"values: the first tensor that differs is '{d.diverges}'" if d.diverges else "values: every shared tensor agrees")
    return diff_html(d.a, d.b, rows, d.totals, notes, _verdict(d))


def _side(analysis, node: Node) -> Side:
    return Side(node.id, node.op, _shape(analysis, node.id))


def _paired_row(left, right, a: Node, b: Node, pairs: dict[str, str]) -> Row:
    change = ", ".join(text.split(": ", 1)[1] for text in _changes(left, right, a, b, pairs))
    side_a, side_b = _side(left, a), _side(right, b)
    if change or side_a.shape != side_b.shape:
        return Row(side_a, side_b, "changed", change or "shape")
    return Row(side_a, side_b, "renamed" if a.id != b.id else "same")
