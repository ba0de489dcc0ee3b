"""The step graph on its own: nodes, implicit inputs, execution order, cycles and who reads what;
and the one liveness analysis the interpreter and the memory estimate share."""

import pytest

from tests.conftest import pipeline_text
from tracer.analysis.graph import CHAIN, ONE, OUTPUTS, build_graph, execution_order
from tracer.analysis.memory import created_at_steps, last_reads
from tracer.analysis.shapes import analyze
from tracer.core.symbolic import DimAlgebra
from tracer.spec.load import load_spec_text

X = "x: {shape: [2, 3, 4], init: randn}"


def graph_of(steps: str, inputs: str = X, params: str = ""):
    spec, source = load_spec_text(pipeline_text(steps, inputs=inputs, params=params), "g.yaml")
    return build_graph(spec, source, DimAlgebra({}))


def test_a_node_knows_its_step_inputs_params_and_position():
    graph = graph_of(
        """
        - {id: a, op: relu}
        - {id: b, op: linear, input: a, weight: W}
        - {id: c, op: add, inputs: [a, b]}
        """,
        params="W: {shape: [4, 4], init: randn}",
    )
    assert list(graph.nodes) == ["a", "b", "c"]
    a, b, c = graph.nodes.values()
    assert (a.inputs, a.params, a.index) == (("x",), (), 0)  # the first step reads the only input
    assert (b.inputs, b.params, b.refs) == (("a",), ("W",), ("a", "W"))
    assert c.inputs == ("a", "b") and c.outs == () and c.form == ONE  # no records before the shape pass
    assert graph.users == {"x": ("a",), "a": ("b", "c"), "W": ("b",), "b": ("c",)}
    assert graph.declared == {"x": "inputs", "W": "params"} and graph.diagnostics == ()


def test_the_implicit_input_is_the_same_rule_for_every_kind_and_decided_at_load():
    spec, _ = load_spec_text(pipeline_text("- {id: s, op: softmax}\n- {id: t, op: relu}", inputs=X), "g.yaml")
    assert [step.input for step in spec.steps] == ["x", "s"]
    several = pipeline_text("- {id: s, op: softmax}", inputs=X + "\ny: {shape: [1], init: randn}")
    graph = build_graph(*load_spec_text(several, "g.yaml"), DimAlgebra({}))
    assert [d.code for d in graph.diagnostics] == ["missing-input"]


def test_a_file_out_of_order_runs_producers_first_and_keeps_the_file_order_otherwise():
    graph = graph_of(
        """
        - {id: late, op: add, inputs: [a, b]}
        - {id: a, op: relu, input: x}
        - {id: b, op: gelu, input: x}
        """
    )
    assert list(graph.nodes) == ["a", "b", "late"] and graph.diagnostics == ()


def test_a_cycle_is_one_located_error_naming_its_steps():
    graph = graph_of("- {id: a, op: add, inputs: [x, b]}\n- {id: b, op: relu, input: a}")
    (problem,) = graph.diagnostics
    assert problem.code == "cycle" and "a -> b -> a" in problem.message and problem.position.line == 5


def test_names_unknown_taken_or_with_several_outputs_are_located():
    graph = graph_of(
        """
        - {id: sp, op: split, dim: -1, sizes: 2, outputs: [p, q]}
        - {id: r, op: relu, input: sp}
        - {id: p, op: relu, input: q}
        - {id: u, op: relu, input: nowhere}
        """
    )
    codes = [d.code for d in graph.diagnostics]
    assert codes == ["duplicate-id", "several-outputs", "unknown-ref"]
    assert graph.parts == {"p": "sp", "q": "sp"} and graph.producer("q") == "sp" and graph.producer("x") is None


@pytest.mark.parametrize(
    "steps, edges, order",
    [
        (["a", "b", "c"], [("a", "b"), ("b", "c")], ["a", "b", "c"]),
        (["c", "a", "b"], [("a", "b"), ("b", "c")], ["a", "b", "c"]),
        (["b", "a", "c"], [("a", "c")], ["b", "a", "c"]),  # ties keep the given order
        (["a", "b"], [("a", "b"), ("b", "a")], None),
    ],
)
def test_execution_order(steps, edges, order):
    assert execution_order(steps, edges) == order


def test_the_shape_pass_gives_each_node_its_records_and_what_each_read():
    analysis = analyze(
        *load_spec_text(
            pipeline_text(
                """
                - {id: h, op: view, shape: [2, 3, 2, 2]}
                - {id: m, op: merge}
                - {id: sp, op: split, dim: -1, sizes: 3, outputs: [p, q]}
                - {id: y, op: add, inputs: [p, q]}
                """,
                inputs=X,
            ),
            "g.yaml",
        )
    )
    m, sp = analysis.node("m"), analysis.node("sp")
    assert m.form == CHAIN and [o.id for o in m.outs] == ["m/transpose", "m/contiguous", "m/view"]
    assert [o.reads for o in m.outs] == [("h",), ("m/transpose",), ("m/contiguous",)]
    assert sp.form == OUTPUTS and sp.reads == ("m/view",) and sp.value is None  # a composite's id reads its last record
    assert analysis.record_of("m") == "m/view" and analysis.producer("q") is sp and analysis.producer("m/contiguous") is m
    assert [n.id for n in analysis.users("p")] == ["y"]


def test_liveness_each_record_lives_until_its_last_reader():
    analysis = analyze(
        *load_spec_text(
            pipeline_text(
                """
                - {id: a, op: relu}
                - {id: b, op: gelu, input: x}
                - {id: c, op: add, inputs: [a, b]}
                - {id: d, op: relu, input: a}
                """,
                inputs=X,
            ),
            "g.yaml",
        )
    )
    assert created_at_steps(analysis) == {"a": 0, "b": 1, "c": 2, "d": 3}
    assert last_reads(analysis) == {"a": 3, "b": 2, "c": 2, "d": 3}  # c is read by nobody: its own step


def test_a_node_made_by_the_shape_pass_keeps_every_other_field():
    """``Node.made`` builds the node field by field (it is on the path of every step): a field
    added to Node and left out there would be lost; ``dataclasses.replace`` is the reference."""
    from dataclasses import fields, replace

    from tracer.analysis.graph import Node, Out
    from tracer.core.layout import fresh

    step = graph_of("- {id: y, op: softmax, dim: -1}").nodes["y"].step
    alg = DimAlgebra({"n": 3})
    distinct = {"step": step, "index": 7, "inputs": ("a",), "params": ("w",), "dims": alg, "copy": "layers/2"}
    node = Node(**{f.name: distinct[f.name] for f in fields(Node) if f.name in distinct})
    assert set(distinct) | {"reads", "outs", "form", "flops"} == {f.name for f in fields(Node)}
    out = Out("y", "softmax", fresh((alg.dim("n"),), "float32"), ("a",))
    assert node.made(("a", "w"), (out,), CHAIN, 12) == replace(node, reads=("a", "w"), outs=(out,), form=CHAIN, flops=12)
