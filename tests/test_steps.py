"""Every step kind against the same computation written in plain torch."""

import math

import pytest
import torch
import torch.nn.functional as F

import tracer
from tests.conftest import assert_flops_as_counted, covers, pipeline_text, run_text
from tests.test_export import check_export

X = "x: {shape: [2, 3, 4], init: randn}"


def trace_of(steps, inputs=X, params="", dims=""):
    text = pipeline_text(steps, dims=dims, inputs=inputs, params=params)
    trace = run_text(text)
    # every kernel test is also a static-vs-torch agreement case: the shape rules predicted every
    # record's shape, stride, offset, dtype and storage owner exactly
    assert trace.as_predicted, [r.id for r in trace.records]
    check_export(trace.pipeline, trace)  # and the step's emitted PyTorch source computes the same
    assert_flops_as_counted(text)  # and a FLOP-count agreement case
    return trace


def close(a, b):
    return a.shape == b.shape and torch.allclose(a, b, atol=1e-6, equal_nan=True)


@covers("embed")
def test_embed_looks_up_rows():
    t = trace_of(
        "- {id: e, op: embed, input: ids, weight: E}",
        inputs="ids: {shape: [5], values: [0, 3, 1, 3, 2], dtype: int64}",
        params="E: {shape: [4, 2], init: embedding}",
    )
    assert close(t["e"].tensor, t["E"].tensor[torch.tensor([0, 3, 1, 3, 2])])
    assert t["e"].symbolic_shape == ("5", "2")


@covers("linear")
@pytest.mark.parametrize("layout", ["out_in", "in_out"])
def test_linear_both_weight_layouts_with_bias(layout):
    shape = "[5, 4]" if layout == "out_in" else "[4, 5]"
    t = trace_of(
        f"- {{id: y, op: linear, weight: W, bias: b, layout: {layout}}}",
        inputs=X,
        params=f"W: {{shape: {shape}, init: randn}}\nb: {{shape: [5], init: randn}}",
    )
    x, w, b = t["x"].tensor, t["W"].tensor, t["b"].tensor
    expected = F.linear(x, w, b) if layout == "out_in" else x @ w + b
    assert close(t["y"].tensor, expected)


def test_linear_init_matches_nn_linear_bit_for_bit():
    t = trace_of(
        "- {id: y, op: linear, weight: W, bias: b}",
        inputs="x: {shape: [2, 3], init: randn}",
        params="W: {shape: [5, 3], init: linear, seed: 7}\nb: {shape: [5], init: linear, fan_in: 3}",
    )
    torch.manual_seed(7)
    reference = torch.nn.Linear(3, 5)
    assert torch.equal(t["W"].tensor, reference.weight.detach())
    assert torch.equal(t["b"].tensor, reference.bias.detach())


@covers("matmul")
def test_matmul_broadcasts_like_torch():
    t = trace_of("- {id: y, op: matmul, inputs: [x, w]}", inputs=X + "\nw: {shape: [4, 6], init: randn}")
    assert close(t["y"].tensor, torch.matmul(t["x"].tensor, t["w"].tensor))
    assert t["y"].shape == (2, 3, 6)


def test_matmul_vector_operands():
    t = trace_of("- {id: y, op: matmul, inputs: [m, v]}", inputs="m: {shape: [3, 4], init: randn}\nv: {shape: [4], init: randn}")
    assert close(t["y"].tensor, t["m"].tensor @ t["v"].tensor)


@covers("bmm")
def test_bmm():
    t = trace_of("- {id: y, op: bmm, inputs: [a, b]}", inputs="a: {shape: [3, 2, 4], init: randn}\nb: {shape: [3, 4, 5], init: randn}")
    assert close(t["y"].tensor, torch.bmm(t["a"].tensor, t["b"].tensor))


@covers("view")
def test_view_shares_storage_and_infers_minus_one():
    t = trace_of("- {id: y, op: view, shape: [2, -1, 2]}")
    assert close(t["y"].tensor, t["x"].tensor.view(2, -1, 2))
    assert t["y"].view_of == "x" and t["y"].contiguous


@covers("reshape")
def test_reshape_copies_only_when_it_must():
    t = trace_of("""
        - {id: xt, op: transpose, dims: [1, 2]}
        - {id: copied, op: reshape, shape: [2, 12]}
        - {id: viewed, op: reshape, input: x, shape: [6, 4]}
    """)
    assert close(t["copied"].tensor, t["x"].tensor.transpose(1, 2).reshape(2, 12))
    assert t["copied"].view_of is None and t["viewed"].view_of == "x"


@covers("transpose", "permute", "contiguous")
def test_transpose_permute_contiguous():
    t = trace_of("""
        - {id: xt, op: transpose, dims: [0, 2]}
        - {id: xp, op: permute, input: x, dims: [2, 0, 1]}
        - {id: xc, op: contiguous, input: xp}
        - {id: same, op: contiguous, input: x}
    """)
    x = t["x"].tensor
    assert close(t["xt"].tensor, x.transpose(0, 2)) and not t["xt"].contiguous
    assert close(t["xp"].tensor, x.permute(2, 0, 1)) and t["xp"].view_of == "x"
    assert close(t["xc"].tensor, x.permute(2, 0, 1).contiguous()) and t["xc"].contiguous and t["xc"].view_of is None
    assert t["same"].view_of == "x"  # contiguous() of a contiguous tensor is the tensor itself


@covers("unsqueeze", "repeat")
def test_unsqueeze_and_repeat():
    t = trace_of("""
        - {id: u, op: unsqueeze, dim: 1}
        - {id: r, op: repeat, input: x, repeats: [3, 1, 2, 1]}
    """)
    x = t["x"].tensor
    assert close(t["u"].tensor, x.unsqueeze(1)) and t["u"].stride == x.unsqueeze(1).stride()
    assert close(t["r"].tensor, x.repeat(3, 1, 2, 1))


@covers("index")
def test_index_select_and_slice():
    t = trace_of("""
        - {id: sel, op: index, dim: 1, index: -1}
        - {id: sl, op: index, input: x, dim: 2, start: 1, stop: 4, step: 2}
    """)
    x = t["x"].tensor
    assert close(t["sel"].tensor, x.select(1, -1)) and t["sel"].storage_offset == x.select(1, -1).storage_offset()
    assert close(t["sl"].tensor, x[:, :, 1:4:2]) and t["sl"].view_of == "x"


@covers("cat", "stack")
def test_cat_and_stack():
    t = trace_of("""
        - {id: c, op: cat, inputs: [x, x], dim: -1}
        - {id: s, op: stack, inputs: [x, x, x], dim: 1}
    """)
    x = t["x"].tensor
    assert close(t["c"].tensor, torch.cat([x, x], -1))
    assert close(t["s"].tensor, torch.stack([x, x, x], 1))


@covers("scale")
def test_scale_by_number_and_sqrt_of_dim():
    t = trace_of(
        """
        - {id: d, op: scale, divide: {sqrt: D}}
        - {id: m, op: scale, input: x, multiply: 0.5}
    """,
        dims="D: 4",
    )
    x = t["x"].tensor
    assert close(t["d"].tensor, x / math.sqrt(4)) and close(t["m"].tensor, x * 0.5)


@covers("mask")
def test_mask_causal_and_both_polarities():
    t = trace_of(
        """
        - {id: causal, op: mask, input: s, causal: true}
        - {id: kept, op: mask, input: s, mask: keep, polarity: keep, fill: -1e9}
        - {id: blocked, op: mask, input: s, mask: future, polarity: block}
    """,
        inputs="""
        s: {shape: [2, 3, 3], init: randn}
        keep: {shape: [3, 3], values: [[true, false, true], [true, true, false], [false, true, true]]}
        future: {shape: [3, 3], init: triu}
    """,
    )
    s, keep = t["s"].tensor, t["keep"].tensor
    future = torch.triu(torch.ones(3, 3), diagonal=1)
    assert close(t["causal"].tensor, s.masked_fill(future.bool(), float("-inf")))
    assert close(t["blocked"].tensor, s.masked_fill(future.bool(), float("-inf")))
    assert close(t["kept"].tensor, s.masked_fill(keep == False, -1e9))  # noqa: E712 (tutorial 003's spelling)


@covers("softmax", "dropout")
def test_softmax_dropout_eval_and_training():
    t = trace_of("""
        - {id: w, op: softmax, dim: -1}
        - {id: eval, op: dropout, p: 0.5}
        - {id: train, op: dropout, input: w, p: 0.5, training: true}
    """)
    w = torch.softmax(t["x"].tensor, -1)
    assert close(t["w"].tensor, w)
    assert close(t["eval"].tensor, w) and t["eval"].view_of == "w"  # eval dropout returns its input
    kept = t["train"].tensor != 0  # softmax outputs are never 0, so a 0 was dropped
    assert kept.any() and not kept.all(), kept  # p=0.5: some of each (a fixed seed, so no flakiness)
    assert torch.allclose(t["train"].tensor[kept], w[kept] * 2)


@covers("merge")
def test_merge_records_transpose_contiguous_view():
    t = trace_of("- {id: m, op: merge}", inputs="x: {shape: [2, 3, 5, 4], init: randn}")
    x = t["x"].tensor
    assert close(t["m"].tensor, x.transpose(1, 2).contiguous().view(2, 5, 12))
    assert [r.id for r in t.records][-3:] == ["m/transpose", "m/contiguous", "m/view"]
    assert not t["m/transpose"].contiguous and t["m/contiguous"].view_of is None and t["m/view"].view_of == "m/contiguous"


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


def test_tokens_build_tutorial_000_dictionary():
    t = trace_of(
        "- {id: ids2, op: index, input: ids, dim: 0, start: 0, stop: 8}",
        inputs="ids: {shape: [8], tokens: {text: 'My shoes are small, my feet are big.', remove: [',']}}",
    )
    assert t["ids"].tensor.tolist() == [0, 6, 2, 7, 5, 4, 2, 3]


@covers("split")
@pytest.mark.parametrize("how", ["sizes: d", "sizes: [d, d, d]", "chunks: 3"])
def test_split_gives_named_views_like_torch_split(how):
    t = trace_of(
        f"- {{id: qkv, op: split, dim: 2, {how}, outputs: [q, k, v]}}\n- {{id: both, op: add, inputs: [q, v]}}",
        inputs="x: {shape: [2, 3, 3 * d], init: randn}",
        dims="d: 4",
    )
    q, k, v = t["x"].tensor.split(4, dim=2)
    for name, piece in zip("qkv", (q, k, v)):
        record = t[name]
        assert close(record.tensor, piece) and record.stride == piece.stride() and record.storage_offset == piece.storage_offset()
        assert record.view_of == "x" and record.symbolic_shape == ("2", "3", "d") and record.op == "split"
    assert close(t["both"].tensor, q + v)


def test_split_outputs_are_ids_for_expect_and_outputs():
    text = (
        pipeline_text(
            "- {id: qkv, op: split, sizes: [1, 3], outputs: [a, b]}",
            inputs="x: {shape: [2, 4], init: randn}",
        )
        + "outputs: [b, a]\nexpect:\n  a: [2, 1]\n  b: {shape: [2, 3], contiguous: false}\n"
    )
    trace = run_text(text)
    assert list(trace.outputs) == ["b", "a"] and trace.outputs["b"].shape == (2, 3)
    wrong = text.replace("a: [2, 1]", "a: [2, 2]")
    with pytest.raises(tracer.TracerError, match=r"expected 'a' to be \(2, 2\)"):
        run_text(wrong)
