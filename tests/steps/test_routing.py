"""Mixture-of-experts routing (topk, moe) against torch and transformers' MixtralExperts."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from transformers import MixtralConfig
from transformers.models.mixtral.modeling_mixtral import MixtralExperts

import tracer
from tests.conftest import covers, pipeline_text
from tests.kinds import agrees, close, trace_of

PROBS = "p: {shape: [N, E], init: rand}"


@covers("topk")
def test_topk_values_indices_and_renormalised_weights():
    t = trace_of(
        """
        - {id: r, op: topk, input: p, k: K, outputs: [v, i]}
        - {id: s, op: topk, input: p, k: K, dim: 0, largest: false, outputs: [v0, i0]}
        - {id: n, op: topk, input: p, k: K, normalize: true, outputs: [w, j]}
        """,
        inputs=PROBS,
        dims="{N: 5, E: 6, K: 2}",
    )
    p = t["p"].tensor
    values, indices = torch.topk(p, 2)
    assert close(t["v"].tensor, values) and torch.equal(t["i"].tensor, indices)
    assert t["v"].symbolic == "(N, K)" and t["i"].dtype == "int64"
    low, where = torch.topk(p, 2, dim=0, largest=False)
    assert close(t["v0"].tensor, low) and torch.equal(t["i0"].tensor, where) and t["v0"].symbolic == "(K, E)"
    assert torch.equal(t["w"].tensor, values / values.sum(-1, keepdim=True))  # Mixtral's own division, bit for bit
    assert torch.allclose(t["w"].tensor.sum(-1), torch.ones(5))


def test_topk_of_a_transposed_input_has_torchs_layout():
    agrees("- {id: t, op: transpose, input: x, dims: [0, 1]}\n- {id: r, op: topk, k: 2, dim: 0, outputs: [v, i]}",
           "x: {shape: [4, 5], init: randn}")  # fmt: skip


def _experts(d: int = 8, f: int = 6, e: int = 4) -> MixtralExperts:
    config = MixtralConfig(hidden_size=d, intermediate_size=f, num_local_experts=e, experts_implementation="eager")
    experts = MixtralExperts(config)
    torch.manual_seed(0)
    with torch.no_grad():  # standalone, the expert weights are torch.empty: garbage
        torch.nn.init.normal_(experts.gate_up_proj, std=0.5)
        torch.nn.init.normal_(experts.down_proj, std=0.5)
    return experts


MOE = "- {id: y, op: moe, inputs: [h, w, i], gate_up: gu, down: dn}"


@covers("moe")
@torch.no_grad()
def test_moe_is_mixtralexperts_bit_for_bit_and_counts_tokens():
    experts = _experts()
    h = torch.randn(2, 5, 8)
    w, i = torch.topk(torch.rand(2, 5, 4).softmax(-1), 2)
    text = pipeline_text(
        MOE,
        inputs="h: {shape: [B, T, d], init: randn}\nw: {shape: [B, T, K], init: rand}\ni: {shape: [B, T, K], dtype: int64, init: zeros}",
        params="gu: {shape: [E, 2 * F, d], init: randn}\ndn: {shape: [E, d, F], init: randn}",
        dims="{B: 2, T: 5, d: 8, K: 2, E: 4, F: 6}",
    )
    tensors = {"h": h, "w": w, "i": i, "gu": experts.gate_up_proj, "dn": experts.down_proj}
    trace = tracer.loads(text, "m.yaml").run(tensors=tensors, keep_values=True)
    expected = experts(h.view(-1, 8), i.view(-1, 2), w.view(-1, 2)).view(2, 5, 8)
    assert torch.equal(trace["y"].tensor, expected)
    assert trace["y"].symbolic == "(B, T, d)"
    assert trace["y/tokens_per_expert"].tensor.tolist() == torch.bincount(i.flatten(), minlength=4).tolist()
    # the same sum written densely in plain torch: every expert on every token, weighted by a scatter
    gate, up = torch.einsum("btd,efd->btef", h, experts.gate_up_proj).chunk(2, -1)
    y = torch.einsum("btef,edf->bted", F.silu(gate) * up, experts.down_proj)
    dense = torch.zeros(2, 5, 4).scatter(-1, i, w)
    assert close(trace["y"].tensor, torch.einsum("bte,bted->btd", dense, y), atol=1e-5)


GPT_OSS_PARAMS = "gu: {shape: [4, 8, 12], init: randn}\ndn: {shape: [4, 6, 8], init: randn}\ngub: {shape: [4, 12], init: randn}\ndnb: {shape: [4, 8], init: randn}"


@torch.no_grad()
def test_moe_with_biases_interleaved_in_out_and_clamped_swiglu_is_gptossexperts_bit_for_bit():
    from transformers import GptOssConfig
    from transformers.models.gpt_oss.modeling_gpt_oss import GptOssExperts

    config = GptOssConfig(hidden_size=8, intermediate_size=6, num_local_experts=4, swiglu_limit=0.8)
    experts = GptOssExperts(config)
    torch.manual_seed(0)
    for p in experts.parameters():  # standalone, the expert weights are torch.empty: garbage
        torch.nn.init.normal_(p, std=0.5)
    h = torch.randn(7, 8)
    w, i = torch.topk(torch.rand(7, 4).softmax(-1), 2)
    step = (
        "- {id: y, op: moe, inputs: [h, w, i], gate_up: gu, down: dn, gate_up_bias: gub, down_bias: dnb, layout: in_out,"
        " interleave: true, activation: clamped_swiglu, alpha: 1.702, limit: 0.8}"
    )
    text = pipeline_text(
        step,
        inputs="h: {shape: [7, 8], init: randn}\nw: {shape: [7, 2], init: rand}\ni: {shape: [7, 2], dtype: int64, init: zeros}",
        params=GPT_OSS_PARAMS,
    )
    tensors = {"h": h, "w": w, "i": i, "gu": experts.gate_up_proj, "dn": experts.down_proj}
    tensors.update(gub=experts.gate_up_proj_bias, dnb=experts.down_proj_bias)
    trace = tracer.loads(text, "m.yaml").run(tensors=tensors, keep_values=True)
    assert torch.equal(trace["y"].tensor, experts(h, i, w))
    routed = "i: {shape: [7, 2], dtype: int64, values: [[0, 1], [1, 2], [2, 3], [3, 0], [0, 2], [1, 3], [2, 0]]}"
    trace_of(step, inputs=f"h: {{shape: [7, 8], init: randn}}\nw: {{shape: [7, 2], init: rand}}\n{routed}", params=GPT_OSS_PARAMS)


def test_ungated_relu2_experts_against_plain_torch():
    t = trace_of(
        "- {id: y, op: moe, inputs: [h, w, i], gate_up: up, down: dn, gated: false, activation: relu2}",
        inputs="h: {shape: [3, 4], init: randn}\nw: {shape: [3, 1], init: rand}\ni: {shape: [3, 1], dtype: int64, values: [[1], [0], [1]]}",
        params="up: {shape: [2, 5, 4], init: randn}\ndn: {shape: [2, 4, 5], init: randn}",
    )
    h, w, i, up, dn = (t[n].tensor for n in ("h", "w", "i", "up", "dn"))
    expected = torch.stack([dn[e] @ torch.relu(up[e] @ h[n]) ** 2 * w[n, 0] for n, e in enumerate(i[:, 0].tolist())])
    assert close(t["y"].tensor, expected, atol=1e-5)


def test_moe_runs_through_trace_of_checks():
    """Shapes, strides, export and FLOPs (6·N·K·d·F, whatever the routing) as the kernel tests check them."""
    trace_of(
        "- {id: r, op: topk, input: p, k: 2, normalize: true, outputs: [w, i]}\n- {id: y, op: moe, inputs: [h, w, i], gate_up: gu, down: dn}",
        inputs="h: {shape: [6, 8], init: randn}\np: {shape: [6, 4], init: rand}",
        params="gu: {shape: [4, 12, 8], init: randn}\ndn: {shape: [4, 8, 6], init: randn}",
    )


@pytest.mark.parametrize(
    "step, code, found",
    [
        ("{id: y, op: moe, inputs: [h, w, i], gate_up: gu, down: gu}", "moe-shape", "down 'gu' must be (E, d, F)"),
        ("{id: y, op: moe, inputs: [h, w, w], gate_up: gu, down: dn}", "dtype", "integer indices"),
        ("{id: y, op: moe, inputs: [h, i, i], gate_up: gu, down: dn}", "dtype", "floating point"),
        ("{id: y, op: moe, inputs: [h, w2, i], gate_up: gu, down: dn}", "moe-shape", "same tokens"),
        ("{id: y, op: topk, input: w, k: 5, outputs: [a, b]}", "topk-range", "do not fit"),
    ],
)
def test_routing_errors_are_located(step, code, found):
    text = pipeline_text(
        f"- {step}",
        inputs="h: {shape: [6, 8], init: randn}\nw: {shape: [6, 2], init: rand}\nw2: {shape: [5, 2], init: rand}\n"
        "i: {shape: [6, 2], dtype: int64, init: zeros}",
        params="gu: {shape: [4, 12, 8], init: randn}\ndn: {shape: [4, 8, 6], init: randn}",
    )
    with pytest.raises(tracer.TracerError) as info:
        tracer.loads(text, "r.yaml")
    assert info.value.code == code and found in str(info.value) and "r.yaml:" in str(info.value), str(info.value)


def test_an_expert_index_outside_the_experts_is_a_located_error():
    text = pipeline_text(
        MOE,
        inputs="h: {shape: [2, 8], init: randn}\nw: {shape: [2, 1], init: rand}\ni: {shape: [2, 1], dtype: int64, values: [[0], [4]]}",
        params="gu: {shape: [4, 12, 8], init: randn}\ndn: {shape: [4, 8, 6], init: randn}",
    )
    with pytest.raises(tracer.TracerError) as info:
        tracer.loads(text, "r.yaml").run()
    assert info.value.code == "moe-range" and "0..3" in str(info.value)


IDX = "x: {shape: [4, 6], init: randn}\ni: {shape: [4, 2], dtype: int64, values: [[5, 0], [1, 1], [3, 2], [0, 4]]}"


@covers("gather")
def test_gather_reads_each_rows_chosen_entries():
    t = trace_of("- {id: g, op: gather, inputs: [x, i], dim: 1}", inputs=IDX)
    assert torch.equal(t["g"].tensor, torch.gather(t["x"].tensor, 1, t["i"].tensor)) and t["g"].shape == (4, 2)
    assert t["g"].tensor[0, 0] == t["x"].tensor[0, 5]  # not a tautology: the index picks column 5 of row 0


@covers("scatter")
def test_scatter_src_value_and_add_leave_the_base_alone():
    t = trace_of(
        """
        - {id: dense, op: scatter, inputs: [zeros, i, w], dim: 1}
        - {id: marked, op: scatter, inputs: [x, i], dim: 1, value: -.inf}
        - {id: summed, op: scatter, inputs: [x, i, w], dim: 1, reduce: add}
        - {id: counted, op: scatter, inputs: [x, i], dim: 1, value: 1.0, reduce: add}
        """,
        inputs=IDX + "\nw: {shape: [4, 2], init: rand}\nzeros: {shape: [4, 6], init: zeros}",
    )
    x, i, w = t["x"].tensor, t["i"].tensor, t["w"].tensor
    assert torch.equal(t["dense"].tensor, torch.zeros(4, 6).scatter(1, i, w))
    assert torch.equal(t["marked"].tensor, x.scatter(1, i, float("-inf")))
    assert torch.equal(t["summed"].tensor, x.scatter_add(1, i, w))
    # row 1 lists column 1 twice: both add, one after the other (x + 2 rounds once: 5% of x differ)
    assert torch.equal(t["counted"].tensor[1, 1], x[1, 1] + 1 + 1)
    assert torch.equal(t["zeros"].tensor, torch.zeros(4, 6))  # a copy: the base is unchanged


def test_gather_and_scatter_of_transposed_inputs_have_torchs_layout():
    agrees(
        "- {id: t, op: transpose, input: x, dims: [0, 1]}\n- {id: g, op: gather, inputs: [t, i], dim: 0}\n"
        "- {id: s, op: scatter, inputs: [t, i], dim: 0, value: 2.0}",
        "x: {shape: [5, 4], init: randn}\ni: {shape: [2, 5], dtype: int64, init: zeros}",
    )


@pytest.mark.parametrize(
    "step, code, found",
    [
        ("{id: g, op: gather, inputs: [x, w], dim: 1}", "dtype", "int64 index"),
        ("{id: g, op: gather, inputs: [x, v], dim: 1}", "shape", "same rank"),
        ("{id: g, op: gather, inputs: [x, big], dim: 1}", "shape", "larger than"),
        ("{id: s, op: scatter, inputs: [x, i], dim: 1}", "arity", "[base, index, src]"),
        ("{id: s, op: scatter, inputs: [x, i, i], dim: 1}", "dtype", "scatter of int64"),
    ],
)
def test_gather_and_scatter_errors_are_located(step, code, found):
    text = pipeline_text(
        f"- {step}",
        inputs=IDX + "\nw: {shape: [4, 2], init: rand}\nv: {shape: [4], dtype: int64, init: zeros}\n"
        "big: {shape: [5, 2], dtype: int64, init: zeros}",
    )
    with pytest.raises(tracer.TracerError) as info:
        tracer.loads(text, "g.yaml")
    assert info.value.code == code and found in str(info.value) and "g.yaml:" in str(info.value), str(info.value)


def test_an_index_outside_the_dim_is_a_located_error_not_a_torch_one():
    text = pipeline_text(
        "- {id: g, op: gather, inputs: [x, i], dim: 1}",
        inputs="x: {shape: [2, 3], init: randn}\ni: {shape: [2, 1], dtype: int64, values: [[0], [3]]}",
    )
    with pytest.raises(tracer.TracerError) as info:
        tracer.loads(text, "g.yaml").run()
    assert info.value.code == "index-range" and "index 3 is outside dim 1 (size 3" in str(info.value)
