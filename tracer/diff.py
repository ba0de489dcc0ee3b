"""``tracer diff A B``: what changed between two pipelines — steps by id and kind, the shapes of the
steps both have, params, FLOPs and peak memory side by side, and (with values) the first tensor
whose values diverge when both run from the same seed.

Steps are matched by id, as a reviewer reads a diff: a renamed step is one removed and one added.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field

from .api import Pipeline
from .core.formatting import human_bytes


@dataclass
class Diff:
    a: str
    b: str
    added: list[str] = field(default_factory=list)  # step ids only B has ('id: op')
    removed: list[str] = field(default_factory=list)
    changed_op: list[str] = field(default_factory=list)  # 'id: op_a -> op_b', or 'id: field a -> b'
    shapes: list[list[str]] = field(default_factory=list)  # [id, A's shape, B's shape] where they differ
    params: list[list[str]] = field(default_factory=list)  # [param, A's shape or '-', B's]
    totals: dict[str, list[int]] = field(default_factory=dict)  # name -> [A, B]
    diverges: str | None = None  # the first tensor both runs make whose values differ
    compared_values: bool = False

    @property
    def same(self) -> bool:
        return not (self.added or self.removed or self.changed_op or self.shapes or self.params or self.diverges)


def diff(a: Pipeline, b: Pipeline, values: bool = False, atol: float = 1e-6) -> Diff:
    """The differences between two loaded pipelines (each checked at its own dims)."""
    left, right = a.check(), b.check()
    result = Diff(a.path, b.path)
    steps_a = {node.id: node.step for node in left.nodes.values() if node.copy is None}
    steps_b = {node.id: node.step for node in right.nodes.values() if node.copy is None}
    ops_a = {i: step.op for i, step in steps_a.items()}
    ops_b = {i: step.op for i, step in steps_b.items()}
    result.removed = [f"{i}: {op}" for i, op in ops_a.items() if i not in ops_b]
    result.added = [f"{i}: {op}" for i, op in ops_b.items() if i not in ops_a]
    for step_id in (i for i in ops_a if i in ops_b):
        if ops_a[step_id] != ops_b[step_id]:
            result.changed_op.append(f"{step_id}: {ops_a[step_id]} -> {ops_b[step_id]}")
        else:
            result.changed_op += _fields(step_id, steps_a[step_id], steps_b[step_id])
        shape_a, shape_b = _shape(left, step_id), _shape(right, step_id)
        if shape_a != shape_b:
            result.shapes.append([step_id, shape_a, shape_b])
    params_a, params_b = _params(left), _params(right)
    for name in dict.fromkeys([*params_a, *params_b]):
        if params_a.get(name) != params_b.get(name):
            result.params.append([name, params_a.get(name, "-"), params_b.get(name, "-")])
    result.totals = {
        "steps": [len(ops_a), len(ops_b)],
        "params": [_count(left), _count(right)],
        "flops": [left.total_flops, right.total_flops],
        "peak bytes": [left.memory.peak_bytes, right.memory.peak_bytes],
    }
    if values:
        result.compared_values, result.diverges = True, _first_divergence(a, b, atol)
    return result


def _fields(step_id: str, a, b) -> list[str]:
    """``weights: dim -1 -> -2``: the fields a step of the same kind changed (notes and groups aside)."""
    skip = {"note", "group", "allow"}
    x, y = a.model_dump(exclude=skip), b.model_dump(exclude=skip)
    changed = [f"{k} {x.get(k)} -> {y.get(k)}" for k in dict.fromkeys([*x, *y]) if x.get(k) != y.get(k)]
    return [f"{step_id}: {', '.join(changed)}"] if changed else []


def _shape(analysis, step_id: str) -> str:
    meta = analysis.meta(step_id)
    return "-" if meta is None else f"{meta.symbolic} {meta.concrete}"


def _params(analysis) -> dict[str, str]:
    return {n: f"{d.meta.symbolic} {d.meta.concrete}" for n, d in analysis.declared.items() if d.section == "params"}


def _count(analysis) -> int:
    return sum(d.meta.numel for d in analysis.declared.values() if d.section == "params")


def _first_divergence(a: Pipeline, b: Pipeline, atol: float) -> str | None:
    """The first record (in A's run order) both runs make whose values differ beyond ``atol``."""
    import torch

    run_a, run_b = a.run(keep_values=True, seed=0), b.run(keep_values=True, seed=0)
    theirs = {record.id: record for record in run_b.records}
    for record in run_a.records:
        other = theirs.get(record.id)
        if other is None or record.op in ("input", "param"):
            continue
        x, y = record.tensor, other.tensor
        if x.shape != y.shape or not torch.allclose(x.double(), y.double(), atol=atol, rtol=0, equal_nan=True):
            return record.id
    return None


def format_diff(d: Diff) -> str:
    """The diff as aligned text, one section per kind of change."""
    lines = [f"--- {d.a}", f"+++ {d.b}"]
    lines += [f"- step {s}" for s in d.removed] + [f"+ step {s}" for s in d.added] + [f"~ step {s}" for s in d.changed_op]
    lines += _columns("shape", d.shapes) + _columns("param", d.params)
    width = max(len(name) for name in d.totals)
    for name, (x, y) in d.totals.items():
        shown = (human_bytes(x), human_bytes(y)) if name == "peak bytes" else (f"{x:,}", f"{y:,}")
        lines.append(f"  {name:<{width}}  {shown[0]:>14}  {shown[1]:>14}" + ("" if x == y else f"  ({y - x:+,})"))
    if d.compared_values:
        lines.append(f"values: the first tensor that differs is '{d.diverges}'" if d.diverges else "values: every shared tensor agrees")
    lines.append("the same pipeline" if d.same else "")
    return "\n".join(line for line in lines if line)


def _columns(what: str, rows: list[list[str]]) -> list[str]:
    if not rows:
        return []
    width = max(len(r[0]) for r in rows)
    left = max(len(r[1]) for r in rows)
    return [f"~ {what} {r[0]:<{width}}  {r[1]:<{left}}  ->  {r[2]}" for r in rows]


def diff_json(d: Diff) -> str:
    return json.dumps({**asdict(d), "same": d.same}, indent=2)
