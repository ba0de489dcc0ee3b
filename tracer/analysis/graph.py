"""The step graph: one immutable :class:`Node` per step, the order the steps run in, and the
structural errors (unknown or duplicate names, several-output steps read as one, cycles).

A ``Node`` is torch.fx's node for a pipeline: the step, the tensors it reads, and (once the shape
pass has run) every record it makes with its metadata. Every later layer reads nodes; nothing
keeps facts about a step anywhere else.

In the common case every edge runs forward in the file, the file's order is the execution order
and there is no cycle, so networkx (an import of ~60 ms that ``tracer check`` would pay on every
call) is only used when the file's order is not the graph's.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ..core.errors import Diagnostic
from ..core.frozen import frozen
from ..core.layout import Meta, computed_once
from ..core.symbolic import DimAlgebra
from ..spec.pipeline import PipelineSpec
from ..spec.source import SourceMap

ONE, CHAIN, OUTPUTS = "one", "chain", "outputs"  # what a step makes: one tensor, a composite's inner ops, named outputs


@frozen
class Out:
    """One tensor a step makes: its record id, the op that made it, its metadata and what it read."""

    id: str
    op: str
    meta: Meta
    reads: tuple[str, ...]  # record ids it is computed from: a composite's inner op what its Inner names, anything else the step's inputs


@frozen
class Node:
    """One step of the (expanded) pipeline and everything known about it."""

    step: Any  # its StepBase model, ids namespaced and data inputs explicit
    index: int  # its position in the file's step list: its errors are at ("steps", index)
    inputs: tuple[str, ...]  # the data inputs, as written (a step id, a named output, an input)
    params: tuple[str, ...]  # the tensors its param fields name (weights, masks)
    dims: DimAlgebra  # the dims its fields are written in: its block file's, inside a block
    copy: str | None = None  # the block copy it belongs to ('layers/3'), None at the top
    reads: tuple[str, ...] = ()  # the records its kernel reads, in argument order (a composite's id: its last record)
    outs: tuple[Out, ...] = ()  # what it made, once the shape pass has run (empty if its rule failed)
    form: str = ONE  # ONE, CHAIN (a composite's inner ops, each reading what its Inner names) or OUTPUTS
    flops: int = 0  # of its kernel, as FlopCounterMode counts them

    @property
    def id(self) -> str:
        return self.step.id

    @property
    def op(self) -> str:
        return self.step.op

    @computed_once
    def refs(self) -> tuple[str, ...]:
        """Every tensor it reads, in the kernel's argument order: data inputs, then params (asked
        for by the shape pass, the graph and lints, several times per node)."""
        return self.inputs + self.params

    @property
    def value(self) -> str | None:
        """The record holding the step's result (a chain's last tensor); None for named outputs."""
        return None if self.form == OUTPUTS or not self.outs else self.outs[-1].id

    def made(self, reads: tuple[str, ...], outs: tuple[Out, ...], form: str, flops: int) -> Node:
        """This node with what the shape pass found (``dataclasses.replace`` is ~4x slower, once per step)."""
        return Node(self.step, self.index, self.inputs, self.params, self.dims, self.copy, reads, outs, form, flops)


@dataclass(frozen=True)
class StepGraph:
    """The steps in execution order and who reads what."""

    nodes: dict[str, Node]  # step id -> node, in execution order
    declared: dict[str, str]  # input or param name -> "inputs" or "params" (the first declaration wins)
    parts: dict[str, str]  # name of one of several outputs -> the step that makes it
    users: dict[str, tuple[str, ...]]  # tensor id -> the steps that read it, in file order
    diagnostics: tuple[Diagnostic, ...] = field(default=())

    def knows(self, tensor_id: str) -> bool:
        """Whether a tensor of this name exists: an input, a param, a step or one of its outputs."""
        return tensor_id in self.nodes or tensor_id in self.parts or tensor_id in self.declared

    def producer(self, tensor_id: str) -> str | None:
        """The step that makes a tensor (None for inputs and params)."""
        if tensor_id in self.nodes:
            return tensor_id
        return self.parts.get(tensor_id)


def build_graph(
    pipeline: PipelineSpec,
    source: SourceMap,
    dims: DimAlgebra,
    block_dims: Mapping[str, DimAlgebra] | None = None,
    copies: Mapping[str, str] | None = None,
) -> StepGraph:
    """The nodes of a validated pipeline (data inputs already explicit), in execution order.
    ``block_dims`` and ``copies`` say, for the steps of an expanded block, whose dims their fields
    read and which copy they belong to."""
    block_dims, copies = block_dims or {}, copies or {}
    problems: list[Diagnostic] = []
    declared = _declarations(pipeline, source, problems)
    taken = {name: (section, name) for name, section in declared.items()}
    nodes: dict[str, Node] = {}
    parts: dict[str, str] = {}
    for i, step in enumerate(pipeline.steps):
        clash = _clash(step, i, taken, source)
        if clash:
            problems.append(clash)
            continue
        taken[step.id] = ("steps", i)
        if step.output_field is not None:
            for j, name in enumerate(step.output_ids()):
                taken[name] = ("steps", i, step.output_field, j)
                parts[name] = step.id
        nodes[step.id] = Node(
            step, i, tuple(step.data_inputs()), tuple(step.param_refs()), block_dims.get(step.id, dims), copies.get(step.id)
        )
    edges = []
    for node in nodes.values():
        problems += _wiring_problems(node, pipeline, nodes, taken, source)
        edges += [(ref, node.id) for ref in node.refs if ref in taken]
    users: dict[str, list[str]] = {}
    for producer, consumer in dict.fromkeys(edges):  # a step may read one tensor twice
        users.setdefault(producer, []).append(consumer)
    step_edges = [(parts.get(u, u), v) for u, v in edges if parts.get(u, u) in nodes]
    order = execution_order(list(nodes), step_edges)
    if order is None:
        problems += _cycle_errors(nodes, step_edges, source)
    elif not problems:
        nodes = {step_id: nodes[step_id] for step_id in order}
    return StepGraph(nodes, declared, parts, {k: tuple(v) for k, v in users.items()}, tuple(problems))


def execution_order(steps: list[str], edges: Iterable[tuple[str, str]]) -> list[str] | None:
    """The steps in an order that runs every producer before its readers, ties broken by the
    given order so runs are deterministic; None when the edges form a cycle. The one topological
    sort: analysis orders the expanded steps with it, export a file's own steps."""
    rank = {step: n for n, step in enumerate(steps)}
    edges = list(edges)
    if all(rank[u] < rank[v] for u, v in edges):  # the common case: the file's order already is one
        return list(steps)
    import networkx as nx

    graph = nx.DiGraph()
    graph.add_nodes_from(steps)
    graph.add_edges_from(edges)
    if not nx.is_directed_acyclic_graph(graph):
        return None
    return list(nx.lexicographical_topological_sort(graph, key=rank.__getitem__))


def _declarations(pipeline: PipelineSpec, source: SourceMap, problems: list[Diagnostic]) -> dict[str, str]:
    declared: dict[str, str] = {}
    for section in ("inputs", "params"):
        for name in getattr(pipeline, section):
            if name in declared:
                problems.append(
                    source.error((section, name), "duplicate-id", f"'{name}' is declared twice (also in {declared[name]})", prefer_key=True)
                )
                continue
            declared[name] = section
    return declared


def _clash(step, i: int, taken: dict, source: SourceMap) -> Diagnostic | None:
    """A located error when the step's id, or one of its output names, is already taken."""
    names = [(step.id, ("steps", i, "id"))]
    if step.output_field is not None:
        names += [(name, ("steps", i, step.output_field, j)) for j, name in enumerate(step.output_ids())]
    for name, path in names:
        if name in taken:
            line = source.locate(taken[name], prefer_key=True)
            where = f"line {line.line if line else '?'}"
            return source.error(path, "duplicate-id", f"id '{name}' is already used ({where}); every tensor needs its own name", step.id)
        if name == step.id and path[-1] != "id":
            return source.error(
                path, "duplicate-id", f"output '{name}' has the step's own id; name the split and its pieces apart", step.id
            )
    return None


def _wiring_problems(node: Node, pipeline: PipelineSpec, nodes: dict[str, Node], taken: dict, source: SourceMap) -> list[Diagnostic]:
    step, i = node.step, node.index
    if not node.inputs and step.arity != 0:
        return [
            source.error(
                ("steps", i),
                "missing-input",
                "the first step needs 'input' or 'inputs' (it defaults to the pipeline's input only when there is exactly one)",
                step.id,
                prefer_key=True,
            )
        ]
    problems = []
    for ref, field_path in _ref_fields(step):
        if ref not in taken:
            problems.append(source.error(("steps", i) + field_path, "unknown-ref", _unknown(ref, taken), step.id))
        elif ref in nodes and nodes[ref].step.output_field is not None:
            problems.append(source.error(("steps", i) + field_path, "several-outputs", _several(nodes[ref].step), step.id))
    return problems


def _ref_fields(step):
    """Each tensor a step names, with the path of the field naming it."""
    if step.inputs is not None:
        yield from ((ref, ("inputs", j)) for j, ref in enumerate(step.inputs))
    elif step.input is not None:
        yield step.input, ("input",)
    for name in step.param_fields:
        ref = getattr(step, name)
        if ref is not None:
            yield ref, (name,)


def _several(step) -> str:
    names = ", ".join(step.output_ids())
    return f"'{step.id}' is a {step.op} with several outputs ({names}): read one of them by its name"


def _unknown(ref: str, taken: dict) -> str:
    close = difflib.get_close_matches(ref, taken, n=1)
    return f"unknown tensor '{ref}'" + (f"; did you mean '{close[0]}'?" if close else " (not an input, a param or an earlier step)")


def _cycle_errors(nodes: dict[str, Node], edges: list[tuple[str, str]], source: SourceMap) -> list[Diagnostic]:
    import networkx as nx

    graph = nx.DiGraph(edges)
    problems = []
    for component in nx.strongly_connected_components(graph):
        first = next(iter(component))
        if len(component) == 1 and not graph.has_edge(first, first):
            continue
        cycle = sorted(component, key=lambda s: nodes[s].index)
        path = " -> ".join(cycle + [cycle[0]])
        problems.append(source.error(("steps", nodes[cycle[0]].index), "cycle", f"steps form a cycle: {path}", cycle[0], prefer_key=True))
    return problems
