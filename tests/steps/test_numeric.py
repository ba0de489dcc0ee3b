"""Math, comparisons, selection, logic, running sums, reductions and ranges against plain torch,
with torch's result dtypes for integer, bool and mixed operands."""

from __future__ import annotations

import re

import pytest
import torch

import tracer
from tests.conftest import covers, pipeline_text
from tests.kinds import close, trace_of

MIXED = """
x: {shape: [2, 3, 4], init: randn}
i: {shape: [3, 4], values: [[-3, -2, -1, 0], [1, 2, 3, 4], [5, 6, 7, 8]], dtype: int64}
b: {shape: [4], values: [true, false, true, true], dtype: bool}
"""


def equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and a.dtype == b.dtype and torch.equal(a, b)


@covers("abs", "floor", "ceil", "trunc", "square", "log", "log1p", "sqrt", "rsqrt", "sin", "cos", "reciprocal")
@pytest.mark.parametrize("fn", ["abs", "floor", "ceil", "trunc", "square", "log", "log1p", "sqrt", "rsqrt", "sin", "cos", "reciprocal"])
def test_math_on_floats_integers_and_a_transposed_view(fn):
    ops = f"""
        - {{id: xt, op: transpose, input: x, dims: [0, 2]}}
        - {{id: f, op: {fn}, input: xt}}
        - {{id: n, op: {fn}, input: i}}
    """
    t = trace_of(ops, inputs=MIXED)
    x, i = t["x"].tensor, t["i"].tensor
    torch_fn = getattr(torch, fn)
    assert close(t["f"].tensor, torch_fn(x.transpose(0, 2))) and t["f"].stride == torch_fn(x.transpose(0, 2)).stride()
    assert equal(t["n"].tensor, torch_fn(i)) or close(t["n"].tensor, torch_fn(i))  # log of a negative int: nan in both


def test_math_refuses_what_torch_refuses_and_promotes_bool_as_torch():
    t = trace_of("- {id: s, op: square, input: b}\n- {id: l, op: log, input: b}", inputs=MIXED)
    b = t["b"].tensor
    assert equal(t["s"].tensor, torch.square(b)) and t["s"].dtype == "int64" and equal(t["l"].tensor, torch.log(b))
    with pytest.raises(tracer.TracerError) as info:
        tracer.loads(pipeline_text("- {id: a, op: abs, input: b}", inputs=MIXED), "t.yaml")
    assert info.value.code == "dtype" and "t.yaml:" in str(info.value) and "cast" in str(info.value)
    with pytest.raises(RuntimeError):
        torch.abs(b)  # the refusal is torch's own


@covers("clamp", "minimum", "maximum")
def test_clamp_minimum_maximum_promote_like_torch():
    t = trace_of(
        """
        - {id: c, op: clamp, input: i, min: 0, max: 5}
        - {id: cf, op: clamp, input: i, max: 2.5}
        - {id: cx, op: clamp, input: x, min: -0.5}
        - {id: lo, op: minimum, inputs: [i, c]}
        - {id: hi, op: maximum, inputs: [x, i]}
        """,
        inputs=MIXED,
    )
    x, i = t["x"].tensor, t["i"].tensor
    assert equal(t["c"].tensor, torch.clamp(i, 0, 5)) and equal(t["cf"].tensor, torch.clamp(i, max=2.5))
    assert t["cf"].dtype == "float32" and equal(t["cx"].tensor, torch.clamp(x, min=-0.5))
    assert equal(t["lo"].tensor, torch.minimum(i, torch.clamp(i, 0, 5))) and equal(t["hi"].tensor, torch.maximum(x, i))
    with pytest.raises(tracer.TracerError, match="clamp needs 'min', 'max' or both"):
        tracer.loads(pipeline_text("- {id: c, op: clamp, input: x}", inputs=MIXED), "t.yaml")


@covers("compare", "where", "logical")
def test_compare_where_logical():
    t = trace_of(
        """
        - {id: pos, op: compare, input: i, cmp: gt, value: 0}
        - {id: le, op: compare, inputs: [x, i], cmp: le}
        - {id: eqb, op: compare, inputs: [i, b], cmp: eq}
        - {id: pick, op: where, inputs: [pos, i, x]}
        - {id: half, op: where, inputs: [pos, i], otherwise: 0.5}
        - {id: ints, op: where, inputs: [pos], then: 1, otherwise: -1}
        - {id: both, op: logical, fn: and, inputs: [pos, b]}
        - {id: either, op: logical, fn: xor, inputs: [i, b]}
        - {id: neither, op: logical, fn: not, input: pos}
        """,
        inputs=MIXED,
    )
    x, i, b = t["x"].tensor, t["i"].tensor, t["b"].tensor
    pos = i > 0
    assert equal(t["pos"].tensor, pos) and equal(t["le"].tensor, x <= i) and equal(t["eqb"].tensor, i == b)
    assert equal(t["pick"].tensor, torch.where(pos, i, x)) and equal(t["half"].tensor, torch.where(pos, i, 0.5))
    assert t["half"].dtype == "float32" and equal(t["ints"].tensor, torch.where(pos, 1, -1)) and t["ints"].dtype == "int64"
    assert equal(t["both"].tensor, pos & b) and equal(t["either"].tensor, torch.logical_xor(i, b)) and equal(t["neither"].tensor, ~pos)


@pytest.mark.parametrize(
    ("step", "message"),
    [
        ("{id: w, op: where, inputs: [i, x, x]}", "where needs a bool condition"),
        ("{id: w, op: where, inputs: [b, x]}", "where takes cond and 2 tensor branches"),
        ("{id: c, op: compare, inputs: [x, i], cmp: lt, value: 1}", "compare takes a tensor and 'value', got 2"),
        ("{id: l, op: logical, fn: not, inputs: [b, b]}", "logical not takes 1 input, got 2"),
    ],
)
def test_wrong_operands_are_located_errors(step, message):
    with pytest.raises(tracer.TracerError, match=message) as info:
        tracer.loads(pipeline_text(f"- {step}", inputs=MIXED), "t.yaml")
    assert "t.yaml:" in str(info.value)


@covers("cumsum")
def test_cumsum_sums_integers_and_bools_in_int64():
    t = trace_of(
        """
        - {id: cb, op: cumsum, input: b, dim: 0}
        - {id: ci, op: cumsum, input: i, dim: 1}
        - {id: cx, op: cumsum, input: x, dim: 0, dtype: float64}
        """,
        inputs=MIXED,
    )
    x, i, b = t["x"].tensor, t["i"].tensor, t["b"].tensor
    assert equal(t["cb"].tensor, torch.cumsum(b, 0)) and t["cb"].dtype == "int64" and equal(t["ci"].tensor, torch.cumsum(i, 1))
    assert equal(t["cx"].tensor, torch.cumsum(x, 0, dtype=torch.float64))


@covers("reduce")
def test_reduce_over_ints_and_dim_names():
    t = trace_of(
        """
        - {id: xt, op: transpose, input: x, dims: [0, 1]}
        - {id: s, op: reduce, fn: sum, input: xt, dim: [B, D]}
        - {id: m, op: reduce, fn: mean, input: xt, dim: -1, keepdim: true}
        - {id: mx, op: reduce, fn: amax, input: x, dim: T}
        - {id: mn, op: reduce, fn: amin, input: i}
        - {id: p, op: reduce, fn: prod, input: i, dim: 0}
        - {id: si, op: reduce, fn: sum, input: i, dim: 1}
        - {id: an, op: reduce, fn: any, input: b}
        - {id: al, op: reduce, fn: all, input: xt, dim: [0, 2], keepdim: true}
        - {id: ax, op: reduce, fn: argmax, input: x, dim: -1}
        - {id: ai, op: reduce, fn: argmin, input: i, dim: 1, keepdim: true}
        """,
        dims="{B: 2, T: 3, D: 4}",
        inputs=MIXED.replace("[2, 3, 4]", "[B, T, D]"),
    )
    x, i, b = t["x"].tensor, t["i"].tensor, t["b"].tensor
    xt = x.transpose(0, 1)
    assert close(t["s"].tensor, xt.sum((1, 2))) and t["s"].symbolic == "(T)"
    assert close(t["m"].tensor, xt.mean(-1, keepdim=True)) and equal(t["mx"].tensor, x.amax(1)) and equal(t["mn"].tensor, i.amin())
    assert equal(t["p"].tensor, i.prod(0)) and equal(t["si"].tensor, i.sum(1)) and equal(t["an"].tensor, b.any())
    assert equal(t["al"].tensor, xt.all(dim=(0, 2), keepdim=True))
    assert equal(t["ax"].tensor, x.argmax(-1)) and equal(t["ai"].tensor, i.argmin(1, keepdim=True)) and t["ax"].dtype == "int64"


@pytest.mark.parametrize(
    ("step", "message"),
    [
        ("{id: r, op: reduce, fn: sum, input: x, dim: E}", "'x' (B, T, D) has no dim named E"),
        ("{id: r, op: reduce, fn: prod, input: x, dim: [0, 1]}", "torch's prod reduces one dim"),
        ("{id: r, op: reduce, fn: argmax, input: x}", "torch's argmax reduces one dim"),
        ("{id: r, op: reduce, fn: mean, input: i, dim: 0}", "mean needs a floating-point tensor"),
        ("{id: r, op: reduce, fn: sum, input: x, dim: [T, 1]}", "reduce over the same dim twice"),
    ],
)
def test_reduce_errors(step, message):
    with pytest.raises(tracer.TracerError, match=re.escape(message)) as info:
        tracer.loads(pipeline_text(f"- {step}", dims="{B: 2, T: 3, D: 4}", inputs=MIXED.replace("[2, 3, 4]", "[B, T, D]")), "t.yaml")
    assert "t.yaml:" in str(info.value)


@covers("arange")
def test_arange_makes_positions_from_dims_with_no_input():
    t = trace_of(
        """
        - {id: queries, op: arange, start: past, stop: past + T}
        - {id: keys, op: arange, stop: past + T, dtype: float32}
        - {id: column, op: unsqueeze, input: queries, dim: 1}
        - {id: relative, op: sub, inputs: [keys, column]}
        """,
        dims="{T: 3, past: 2}",
        inputs="x: {shape: [T], init: randn}",
    )
    assert equal(t["queries"].tensor, torch.arange(2, 5)) and t["queries"].symbolic == "(T)"
    assert equal(t["keys"].tensor, torch.arange(5, dtype=torch.float32))
    assert equal(t["relative"].tensor, torch.arange(5.0)[None, :] - torch.arange(2, 5)[:, None])


def test_arange_that_counts_down_is_a_located_error():
    with pytest.raises(tracer.TracerError, match="counts down") as info:
        tracer.loads(
            pipeline_text("- {id: a, op: arange, start: T, stop: 1}", dims="{T: 3}", inputs="x: {shape: [T], init: randn}"), "t.yaml"
        )
    assert "t.yaml:" in str(info.value)


def test_cumsum_on_meta_takes_a_huge_dim():
    """torch's meta cumsum builds an (n, n) mask along the dim; tracer's meta run only needs the shape."""
    pipeline = tracer.loads(
        pipeline_text("- {id: c, op: cumsum, input: x, dim: 0}", dims="B: 2147483649", inputs="x: {shape: [B, 2], init: randn}"), "t.yaml"
    )
    trace = pipeline.run(device="meta")
    assert trace["c"].shape == (2147483649, 2) and trace["c"].stride == (2, 1) and trace.as_predicted


@pytest.mark.parametrize("fn, refused", [("amax", True), ("amin", True), ("sum", False), ("any", False)])
def test_a_reduce_with_no_identity_over_an_empty_dim_is_a_located_error(fn, refused):
    """torch raises for amax/amin over a dim of size 0 (there is no max of nothing); sum and any have
    an identity and give one. A fuzz case reached torch's RuntimeError."""
    text = f"name: r\ndims: {{N: 0, D: 3}}\ninputs:\n  x: {{shape: [N, D], init: randn}}\nsteps:\n  - {{id: y, op: reduce, input: x, fn: {fn}, dim: 0}}\n"
    if not refused:
        assert tracer.loads(text).run(keep_values=True)["y"].shape == (3,)
        return
    with pytest.raises(tracer.TracerError) as info:
        tracer.loads(text, "r.yaml")
    (problem,) = info.value.diagnostics
    assert problem.code == "reduce-empty" and problem.step == "y" and problem.position.line == 6
    torch.zeros(0, 3).sum(dim=0)  # the reference: sum has an identity
    with pytest.raises((RuntimeError, IndexError)):  # what torch itself says
        getattr(torch.zeros(0, 3), fn)(dim=0)


@covers("sign", "pow", "diff")
def test_sign_pow_diff_with_torchs_dtypes_and_strides():
    t = trace_of(
        """
        - {id: xt, op: transpose, input: x, dims: [0, 2]}
        - {id: s, op: sign, input: i}
        - {id: sb, op: sign, input: b}
        - {id: cube, op: pow, input: xt, exponent: 3}
        - {id: root, op: pow, input: i, exponent: 0.5}
        - {id: squared, op: pow, input: i, exponent: W}
        - {id: dx, op: diff, input: xt, dim: 0}
        - {id: d2, op: diff, input: i, dim: -1, n: 2}
        - {id: changes, op: diff, input: b}
        """,
        inputs=MIXED,
        dims="W: 2",
    )
    x, i, b = t["x"].tensor, t["i"].tensor, t["b"].tensor
    xt = x.transpose(0, 2)
    assert equal(t["s"].tensor, torch.sign(i)) and equal(t["sb"].tensor, torch.sign(b))
    assert close(t["cube"].tensor, xt**3) and t["cube"].stride == (xt**3).stride()
    assert close(t["root"].tensor, i**0.5) and equal(t["squared"].tensor, i**2)
    assert close(t["dx"].tensor, torch.diff(xt, dim=0)) and t["dx"].stride == torch.diff(xt, dim=0).stride()
    assert equal(t["d2"].tensor, torch.diff(i, n=2)) and equal(t["changes"].tensor, torch.diff(b))


def test_pow_refuses_what_torch_refuses():
    with pytest.raises(tracer.TracerError) as info:
        tracer.loads(pipeline_text("- {id: p, op: pow, input: i, exponent: -1}", inputs=MIXED), "t.yaml")
    assert info.value.code == "dtype" and "t.yaml:" in str(info.value)
    with pytest.raises(RuntimeError, match="negative integer powers"):
        torch.arange(3) ** -1
