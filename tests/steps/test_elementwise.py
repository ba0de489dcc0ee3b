"""Elementwise kinds (add, mul, sub, div, activations, layernorm, cast) against plain torch, torch's
dtypes and strides included."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import tracer
from tests.conftest import covers, pipeline_text
from tests.kinds import agrees, close, trace_of


@covers("add", "layernorm", "relu", "gelu")
def test_add_layernorm_relu_gelu():
    t = trace_of(
        """
        - {id: a, op: add, inputs: [x, x]}
        - {id: n, op: layernorm, weight: g, bias: b}
        - {id: r, op: relu}
        - {id: g1, op: gelu, approximate: tanh}
    """,
        params="g: {shape: [4], init: rand}\nb: {shape: [4], init: randn}",
    )
    x, g, b = t["x"].tensor, t["g"].tensor, t["b"].tensor
    n = F.layer_norm(x + x, (4,), g, b)
    assert close(t["a"].tensor, x + x) and close(t["n"].tensor, n)
    assert close(t["r"].tensor, torch.relu(n)) and close(t["g1"].tensor, F.gelu(torch.relu(n), approximate="tanh"))


@covers("mul", "sub", "div")
def test_binary_ops_broadcast_and_promote_like_torch():
    t = trace_of(
        """
        - {id: xt, op: transpose, input: x, dims: [1, 2]}
        - {id: m, op: mul, inputs: [xt, w]}
        - {id: s, op: sub, inputs: [one, x]}
        - {id: d, op: div, inputs: [x, col]}
        - {id: ints, op: div, inputs: [i, i]}
        - {id: mixed, op: mul, inputs: [i, half]}
        """,
        inputs="""
        x: {shape: [2, 3, 4], init: randn}
        w: {shape: [3], init: randn}
        col: {shape: [2, 3, 1], init: rand}
        one: {shape: [], init: full, value: 1.0}
        i: {shape: [3], init: arange, dtype: int64}
        half: {shape: [], init: full, value: 0.5, dtype: float64}
        """,
    )
    x, w, col, i = (t[n].tensor for n in ("x", "w", "col", "i"))
    assert close(t["m"].tensor, x.transpose(1, 2) * w) and t["m"].stride == (x.transpose(1, 2) * w).stride()
    assert close(t["s"].tensor, 1.0 - x) and close(t["d"].tensor, x / col)
    assert close(t["ints"].tensor, i / i) and t["ints"].dtype == "float32"
    assert t["mixed"].dtype == "float64" and close(t["mixed"].tensor, i * torch.tensor(0.5, dtype=torch.float64))


def test_layernorm_unit_offset_is_nemotrons_layernorm1p():
    t = trace_of(
        "- {id: n, op: layernorm, input: x, weight: g, bias: b, unit_offset: true, eps: 1.0e-5}",
        params="g: {shape: [4], init: randn}\nb: {shape: [4], init: randn}",
    )
    from transformers.models.nemotron.modeling_nemotron import NemotronLayerNorm1P

    norm = NemotronLayerNorm1P(4, eps=1e-5)
    norm.load_state_dict({"weight": t["g"].tensor, "bias": t["b"].tensor})
    assert torch.equal(t["n"].tensor, norm(t["x"].tensor))
    with pytest.raises(tracer.TracerError, match="give a weight"):
        tracer.loads(
            pipeline_text("- {id: n, op: layernorm, input: x, unit_offset: true}", inputs="x: {shape: [2], init: randn}"), "t.yaml"
        )


def test_numbers_and_dim_expressions_as_operands_promote_like_python_scalars():
    t = trace_of(
        """
        - {id: shifted, op: add, input: i, value: T - W}
        - {id: mask_f, op: cast, input: mask, dtype: float32}
        - {id: inverted, op: sub, input: mask_f, value: 1.0, value_first: true}
        - {id: halved, op: div, input: i, value: 2}
        - {id: reciprocal, op: div, input: x, value: 2 * W - 1, value_first: true}
        - {id: scaled, op: mul, input: x, value: {rsqrt: T}}
        - {id: rooted, op: mul, input: i, value: {sqrt: W}}
        - {id: promoted, op: add, inputs: [i, x]}
        - {id: near, op: compare, input: i, cmp: ge, value: T - W}
        """,
        dims="T: 5\nW: 2",
        inputs="""
        x: {shape: [2, T], init: randn}
        i: {shape: [T], init: arange, dtype: int64}
        mask: {shape: [2, T], init: ones, dtype: bool}
        """,
    )
    x, i, mask = (t[n].tensor for n in ("x", "i", "mask"))
    assert torch.equal(t["shifted"].tensor, i + 3) and t["shifted"].dtype == "int64"
    assert close(t["inverted"].tensor, 1.0 - mask.float()) and t["inverted"].dtype == "float32"
    assert close(t["halved"].tensor, i / 2) and close(t["reciprocal"].tensor, 3 / x)
    assert torch.equal(t["scaled"].tensor, x * 5**-0.5)  # bit for bit: transformers' head_dim ** -0.5
    assert close(t["rooted"].tensor, i * 2**0.5) and t["rooted"].dtype == "float32"
    assert close(t["promoted"].tensor, i + x) and t["promoted"].dtype == "float32"
    assert torch.equal(t["near"].tensor, i >= 3)


def test_a_number_operand_is_one_input_and_a_bad_expression_is_located():
    x = "x: {shape: [2], init: randn}\nb: {shape: [2], init: ones, dtype: bool}"
    for body, code in (
        ("- {id: y, op: mul, inputs: [x, x], value: 2}", "arity"),
        ("- {id: y, op: add, input: x, value: T + Q}", "unknown-dim"),
        ("- {id: y, op: sub, input: x, value_first: true}", "needs a 'value'"),
        ("- {id: y, op: sub, input: b, value: 1}", "bool"),  # torch refuses a bool tensor in any subtraction
    ):
        with pytest.raises(tracer.TracerError) as info:
            tracer.loads(pipeline_text(body, dims="T: 2", inputs=x), "t.yaml")
        assert "t.yaml:" in str(info.value), body
        assert code in str(info.value) or info.value.code == code, (body, str(info.value))


@covers("silu", "sigmoid", "tanh", "exp", "neg", "cast")
def test_unary_ops_and_cast():
    t = trace_of(
        """
        - {id: xt, op: transpose, input: x, dims: [0, 1]}
        - {id: a, op: silu}
        - {id: s, op: sigmoid, input: x}
        - {id: h, op: tanh, input: x}
        - {id: e, op: exp, input: xt}
        - {id: n, op: neg, input: x}
        - {id: c, op: cast, input: xt, dtype: float64}
        - {id: same, op: cast, input: x, dtype: float32}
        """,
        inputs="x: {shape: [3, 4], init: randn}",
    )
    x = t["x"].tensor
    assert close(t["a"].tensor, F.silu(x.T)) and close(t["s"].tensor, torch.sigmoid(x)) and close(t["h"].tensor, torch.tanh(x))
    assert close(t["e"].tensor, torch.exp(x.T)) and t["e"].stride == (1, 4) and close(t["n"].tensor, -x)
    assert close(t["c"].tensor, x.T.double()) and t["c"].stride == x.T.double().stride()
    assert t["same"].view_of == "x"  # x.to(its own dtype) is x itself


def test_type_errors_are_located():
    with pytest.raises(tracer.TracerError) as info:
        tracer.loads(pipeline_text("- {id: n, op: neg, input: b}", inputs="b: {shape: [2], init: ones, dtype: bool}"), "t.yaml")
    assert info.value.code == "dtype" and "t.yaml:" in str(info.value)
    with pytest.raises(tracer.TracerError) as info:
        tracer.loads(
            pipeline_text("- {id: m, op: mul, inputs: [a, b]}", inputs="a: {shape: [2, 3], init: randn}\nb: {shape: [2], init: randn}"),
            "t.yaml",
        )
    assert info.value.code == "broadcast"


# (1, 3, 1) with stride (3, 1, 3): contiguous by torch's rule, which ignores size-1 dims, yet not row-major
ODD = "- {id: t, op: transpose, input: x, dims: [0, 1]}\n- {id: u, op: unsqueeze, dim: 0}\n"


@pytest.mark.parametrize(
    "step",
    [
        "{id: y, op: scale, input: u, divide: 8.0}",  # x / 8.0: a 0-d operand, strides follow u's order
        "{id: y, op: relu, input: u}",
        "{id: y, op: gelu, input: u}",
        "{id: y, op: add, inputs: [u, u]}",
        "{id: y, op: dropout, input: u, p: 0.5, training: true}",
        "{id: y, op: dropout, input: u, p: 1.0, training: true}",
    ],
)
def test_elementwise_results_have_torchs_strides_on_size_one_dims(step):
    trace = agrees(ODD + f"- {step}", "x: {shape: [1, 3], init: randn}")
    assert trace["u"].stride == (3, 1, 3)
