"""Layout kinds (view, reshape, transpose, permute, contiguous, index, cat, stack, split, merge,
repeat, expand) against plain torch: values, strides and storage sharing."""

from __future__ import annotations

import pytest
import torch

import tracer
from tests.conftest import covers, pipeline_text, run_text
from tests.kinds import agrees, close, trace_of


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


def test_cat_size_names_the_joined_dim_of_parts_that_add_up_to_it():
    t = trace_of(
        """
        - {id: heads, op: split, dim: 1, sizes: 1, outputs: [h0, h1, h2, h3]}
        - {id: joined, op: cat, inputs: [h3, h2, h1, h0], dim: 1, size: H}
        """,
        inputs="x: {shape: [2, H, 3], init: randn}",
        dims="H: 4",
    )
    x = t["x"].tensor
    assert close(t["joined"].tensor, torch.cat(list(x.split(1, dim=1))[::-1], 1))
    assert t["joined"].symbolic_shape == ("2", "H", "3")  # not 4: the four heads are H again


def test_cat_size_that_the_parts_do_not_add_up_to_is_a_located_error():
    spec = """
name: c
dims: {H: 4}
inputs:
  x: {shape: [2, H, 3], init: randn}
steps:
  - {id: heads, op: split, input: x, dim: 1, sizes: 1, outputs: [h0, h1, h2, h3]}
  - {id: joined, op: cat, inputs: [h0, h1, h2], dim: 1, size: H}
"""
    with pytest.raises(tracer.TracerError) as raised:
        tracer.loads(spec)
    (problem,) = raised.value.diagnostics
    assert problem.code == "cat-shape" and "joins 3 inputs into 3, not size H=4" in problem.message and problem.position.line == 8


@covers("merge")
def test_merge_records_transpose_contiguous_view():
    t = trace_of("- {id: m, op: merge}", inputs="x: {shape: [2, 3, 5, 4], init: randn}")
    x = t["x"].tensor
    assert close(t["m"].tensor, x.transpose(1, 2).contiguous().view(2, 5, 12))
    assert [r.id for r in t.records][-3:] == ["m/transpose", "m/contiguous", "m/view"]
    assert not t["m/transpose"].contiguous and t["m/contiguous"].view_of is None and t["m/view"].view_of == "m/contiguous"


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


@covers("repeat_interleave", "expand")
def test_repeat_interleave_is_repeat_kv_and_expand_is_a_view():
    t = trace_of(
        """
        - {id: k_rep, op: repeat_interleave, input: k, repeats: n_rep, dim: 1}
        - {id: k5, op: unsqueeze, input: k, dim: 2}
        - {id: k_exp, op: expand, shape: [-1, -1, n_rep, -1, -1]}
        - {id: k_kv, op: reshape, shape: [B, H, T, Dh]}
        """,
        inputs="k: {shape: [B, H_kv, T, Dh], init: randn}",
        dims="{B: 2, H_kv: 2, n_rep: 3, H: H_kv * n_rep, T: 4, Dh: 2}",
    )
    k = t["k"].tensor
    repeat_kv = k[:, :, None, :, :].expand(2, 2, 3, 4, 2).reshape(2, 6, 4, 2)
    assert close(t["k_rep"].tensor, repeat_kv) and close(t["k_kv"].tensor, repeat_kv)
    assert t["k_exp"].view_of == "k" and t["k_exp"].stride[2] == 0 and t["k_kv"].view_of is None


X23 = "x: {shape: [2, 3], init: randn}"


def test_a_split_into_one_piece_is_a_tensor_not_a_tuple():
    trace = agrees("- {id: s, op: split, input: x, dim: 0, chunks: 1, outputs: [only]}\n- {id: r, op: relu, input: only}", X23)
    assert trace["only"].view_of == "x" and trace["r"].shape == (2, 3)


def test_a_new_leading_dim_of_size_one_gets_torchs_stride():
    trace = agrees("- {id: e, op: expand, input: x, shape: [1, 4, 2, 3]}\n- {id: f, op: expand, input: x, shape: [1, 2, 3]}", X23)
    assert trace["e"].stride == (0, 0, 3, 1) and trace["f"].stride == (6, 3, 1)


@pytest.mark.parametrize("op", ["cat", "stack"])
def test_cat_and_stack_promote_dtypes_as_torch_does(op):
    text = f"""
name: c
dims: {{T: 2, d: 3}}
inputs:
  a: {{shape: [T, d], init: randn}}
  b: {{shape: [T, d], init: randn, dtype: float64}}
  i: {{shape: [T, d], init: zeros, dtype: int64}}
steps:
  - {{id: ab, op: {op}, inputs: [a, b], dim: 0}}
  - {{id: ai, op: {op}, inputs: [i, a], dim: 0}}
"""
    trace = tracer.loads(text, "c.yaml").run(keep_values=True)
    join = getattr(torch, op)
    a, b, i = (trace[n].tensor for n in "abi")
    assert trace["ab"].dtype == str(join([a, b], 0).dtype).removeprefix("torch.") == "float64"
    assert trace["ai"].dtype == str(join([i, a], 0).dtype).removeprefix("torch.") == "float32"


@pytest.mark.parametrize(
    "sizes, perm, op, dim",
    [
        ([1, 1, 1, 6], [0, 3, 1, 2], "stack", 3),  # the fuzz case: (1, 6, 1, 1) suggests channels_last
        ([1, 1, 1, 6], [0, 3, 1, 2], "stack", 4),  # the new dim last: cat of the unsqueezed inputs
        ([2, 3, 2, 2], [0, 2, 3, 1], "cat", 1),  # channels_last inputs, a channels_last result
        ([3, 2, 3, 2, 2], [0, 4, 1, 2, 3], "stack", 2),  # channels_last_3d
        ([3, 2, 3, 2, 2], [0, 4, 1, 2, 3], "cat", 0),
        ([2, 3, 2], [2, 0, 1], "cat", 1),  # 3-d: always row-major
    ],
)
def test_cat_and_stack_lay_out_channels_last_inputs_as_torch(sizes, perm, op, dim):
    """torch.cat keeps the memory format every input suggests (channels_last(_3d)); stack is a cat
    along dim followed by a view, or a cat of the inputs unsqueezed at the end."""
    inputs = f"a: {{shape: {sizes}, init: randn}}\nb: {{shape: {sizes}, init: randn}}"
    steps = f"""
    - {{id: pa, op: permute, input: a, dims: {perm}}}
    - {{id: pb, op: permute, input: b, dims: {perm}}}
    - {{id: y, op: {op}, inputs: [pa, pb], dim: {dim}}}
    """
    t = agrees(steps, inputs)
    expected = getattr(torch, op)([torch.randn(sizes).permute(perm), torch.randn(sizes).permute(perm)], dim)
    assert t["y"].stride == expected.stride()


@covers("roll", "unbind")
def test_roll_copies_and_unbind_makes_views():
    t = trace_of(
        """
        - {id: xt, op: transpose, input: x, dims: [0, 2]}
        - {id: r, op: roll, input: xt, shifts: 1, dims: 0}
        - {id: r2, op: roll, input: x, shifts: [-1, T - 1], dims: [1, -1]}
        - {id: pieces, op: unbind, input: x, dim: 1, outputs: [a, b, c]}
        """,
        dims="T: 4",
    )
    x = t["x"].tensor
    xt = x.transpose(0, 2)
    assert close(t["r"].tensor, torch.roll(xt, 1, 0)) and t["r"].stride == torch.roll(xt, 1, 0).stride()
    assert close(t["r2"].tensor, torch.roll(x, (-1, 3), (1, -1)))
    for name, piece in zip("abc", x.unbind(1)):
        assert close(t[name].tensor, piece) and t[name].view_of == "x" and t[name].stride == piece.stride()
    with pytest.raises(tracer.TracerError, match="names 2"):
        run_text(pipeline_text("- {id: u, op: unbind, input: x, dim: 0, outputs: [p, q]}", inputs="x: {shape: [3], init: randn}"))
