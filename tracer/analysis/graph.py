"""The step graph: tensor ids and the edges between them, their order, and structural errors.

The graph is a networkx DiGraph. Building it costs a networkx import (~60 ms), which
``tracer check`` would pay on every call, so it is built on first use: in the common case every
edge runs forward in the file, the file's order is the topological order and there is no cycle,
and the plain adjacency maps below answer everything the checker, lints and diagrams ask.
networkx finds the cycles and orders the steps when the file's order is not the graph's.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING

from ..core.errors import Diagnostic
from ..spec.pipeline import PipelineSpec
from ..spec.source import SourceMap

if TYPE_CHECKING:
    import networkx as nx


@dataclass
class StepGraph:
    nodes: dict[str, str]  # tensor id -> kind: "input", "param", "step" or "part" (first declaration wins)
    edges: list[tuple[str, str]]  # (producer, consumer), one per reference
    order: list[str]  # step ids in execution order
    refs: dict[str, list[str]]  # step id -> every tensor it reads (data inputs, then params)
    data_inputs: dict[str, list[str]]
    index: dict[str, int]  # step id -> position in the file's step list
    diagnostics: list[Diagnostic]
    parts: dict[str, str] = field(default_factory=dict)  # output name of a multi-output step -> that step
    users: dict[str, list[str]] = field(init=False)  # tensor id -> the steps that read it, in file order

    def __post_init__(self) -> None:
        self.users = {node: [] for node in self.nodes}
        for producer, consumer in dict.fromkeys(self.edges):  # a step may read one tensor twice
            self.users[producer].append(consumer)

    @cached_property
    def graph(self) -> nx.DiGraph:
        """The networkx DiGraph over tensor ids; each node carries its ``kind``."""
        import networkx as nx

        graph = nx.DiGraph()
        graph.add_nodes_from((node, {"kind": kind}) for node, kind in self.nodes.items())
        graph.add_edges_from(self.edges)
        graph.add_edges_from((step, part) for part, step in self.parts.items())
        return graph

    def position(self, tensor_id: str) -> int:
        """The file position of the step that makes a tensor (-1 for inputs and params)."""
        return self.index.get(self.parts.get(tensor_id, tensor_id), -1)


def build_graph(pipeline: PipelineSpec, source: SourceMap) -> StepGraph:
    problems: list[Diagnostic] = []
    declared: dict[str, tuple] = {}
    nodes: dict[str, str] = {}
    for section in ("inputs", "params"):
        for name in getattr(pipeline, section):
            if name in declared:
                problems.append(
                    source.error(
                        (section, name), "duplicate-id", f"'{name}' is declared twice (also in {declared[name][0]})", prefer_key=True
                    )
                )
            declared[name] = (section, name)
            nodes.setdefault(name, section[:-1])
    index, refs, data_inputs, edges = {}, {}, {}, []
    # the first step reads the pipeline's only input unless it says otherwise
    previous = next(iter(pipeline.inputs)) if len(pipeline.inputs) == 1 else None
    parts: dict[str, str] = {}
    for i, step in enumerate(pipeline.steps):
        clash = _clash(step, i, declared, source)
        if clash:
            problems.append(clash)
            previous = step.id
            continue
        declared[step.id] = ("steps", i)
        index[step.id] = i
        data_inputs[step.id] = step.data_inputs(previous)
        refs[step.id] = data_inputs[step.id] + step.param_refs()
        nodes[step.id] = "step"
        if step.output_field is not None:
            for j, name in enumerate(step.output_ids()):
                declared[name] = ("steps", i, step.output_field, j)
                nodes[name], parts[name] = "part", step.id
        previous = step.id
    for step_id, i in index.items():
        step = pipeline.steps[i]
        if not data_inputs[step_id]:
            problems.append(
                source.error(
                    ("steps", i),
                    "missing-input",
                    "the first step needs 'input' or 'inputs' (it defaults to the pipeline's input only when there is exactly one)",
                    step_id,
                    prefer_key=True,
                )
            )
        for ref, field_path in _ref_fields(step, data_inputs[step_id]):
            if ref not in declared:
                problems.append(source.error(("steps", i) + field_path, "unknown-ref", _unknown(ref, declared), step_id))
            elif ref in index and pipeline.steps[index[ref]].output_field is not None:
                problems.append(source.error(("steps", i) + field_path, "several-outputs", _several(pipeline.steps[index[ref]]), step_id))
            else:
                edges.append((ref, step_id))
    result = StepGraph(nodes, edges, [], refs, data_inputs, index, problems, parts)
    # the common case: every edge runs forward in the file, so there is no cycle and the file's
    # order is the topological order (this is what makes 48-layer stacks cheap to check)
    forward = all(result.position(u) < result.position(v) for u, v in edges)
    if not forward:
        problems += _cycle_errors(result.graph, index, source)
    if not problems:
        result.order = sorted(index, key=index.__getitem__) if forward else _order(result.graph, index)
    return result


def _clash(step, i: int, declared: dict, source: SourceMap) -> Diagnostic | None:
    """A located error when the step's id, or one of its output names, is already taken."""
    for name, path in [(step.id, ("steps", i, "id"))] + [
        (name, ("steps", i, step.output_field, j)) for j, name in enumerate(step.output_ids()) if step.output_field is not None
    ]:
        if name in declared:
            line = source.locate(declared[name], prefer_key=True)
            where = f"line {line.line if line else '?'}"
            return source.error(path, "duplicate-id", f"id '{name}' is already used ({where}); every tensor needs its own name", step.id)
        if name == step.id and path[-1] != "id":
            return source.error(
                path, "duplicate-id", f"output '{name}' has the step's own id; name the split and its pieces apart", step.id
            )
    return None


def _several(step) -> str:
    names = ", ".join(step.output_ids())
    return f"'{step.id}' is a {step.op} with several outputs ({names}): read one of them by its name"


def _ref_fields(step, data_inputs: list[str]):
    if step.inputs is not None:
        yield from ((ref, ("inputs", j)) for j, ref in enumerate(step.inputs))
    elif step.input is not None:
        yield step.input, ("input",)
    else:
        yield from ((ref, ()) for ref in data_inputs)  # the previous step, by default
    for name in step.param_fields:
        ref = getattr(step, name)
        if ref is not None:
            yield ref, (name,)


def _unknown(ref: str, declared: dict) -> str:
    import difflib

    close = difflib.get_close_matches(ref, declared, n=1)
    return f"unknown tensor '{ref}'" + (f"; did you mean '{close[0]}'?" if close else " (not an input, a param or an earlier step)")


def _cycle_errors(graph: nx.DiGraph, index: dict, source: SourceMap) -> list[Diagnostic]:
    import networkx as nx

    problems = []
    for component in nx.strongly_connected_components(graph):
        if len(component) == 1 and not graph.has_edge(next(iter(component)), next(iter(component))):
            continue
        cycle = sorted(component, key=lambda s: index.get(s, -1))
        first = cycle[0]
        path = " -> ".join(cycle + [first])
        problems.append(source.error(("steps", index[first]), "cycle", f"steps form a cycle: {path}", first, prefer_key=True))
    return problems


def _order(graph: nx.DiGraph, index: dict) -> list[str]:
    """Topological order, ties broken by the file's order so runs are deterministic."""
    import networkx as nx

    rank = {node: (index.get(node, -1), node) for node in graph}
    return [n for n in nx.lexicographical_topological_sort(graph, key=rank.__getitem__) if n in index]
