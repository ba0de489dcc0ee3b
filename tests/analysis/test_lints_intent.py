"""Correct designs that scale, rotate or mask otherwise than the textbook check clean (each equal to
transformers' module or the plain torch it stands for), and held-out wrong variants of each class
of issue 30 are caught at the line to edit."""

import pytest
import torch
from transformers import DebertaV2Config, GraniteConfig, GraniteModel, Qwen2VLConfig
from transformers.masking_utils import create_causal_mask
from transformers.models.deberta_v2.modeling_deberta_v2 import DisentangledSelfAttention
from transformers.models.granite.modeling_granite import GraniteAttention, GraniteRotaryEmbedding
from transformers.models.qwen2_vl.modeling_qwen2_vl import Qwen2VLRotaryEmbedding, apply_rotary_pos_emb

import tracer
from tests.analysis.lintcheck import check, codes, one_warning
from tests.conftest import PIPELINES
from tests.models.test_zoo import gemma2_case

MODELS = PIPELINES / "models"


def run(text: str, **tensors):
    return tracer.loads(text, "t.yaml").run(tensors=tensors, keep_values=True)


# ---------------------------------------------------------------- Granite: scores times config.attention_multiplier

GRANITE = """
name: granite_attention
dims: {B: 2, T: 5, d_model: 16, H: 2, Dh: 8}
inputs:
  x: {shape: [B, T, d_model], init: randn}
params:
  W_q: {shape: [H * Dh, d_model], init: linear}
  W_k: {shape: [H * Dh, d_model], init: linear}
  W_v: {shape: [H * Dh, d_model], init: linear}
  W_o: {shape: [d_model, H * Dh], init: linear}
steps:
  - {id: q, op: linear, input: x, weight: W_q}
  - {id: q_h, op: view, shape: [B, T, H, Dh]}
  - {id: q_t, op: transpose, dims: [1, 2]}
  - {id: k, op: linear, input: x, weight: W_k}
  - {id: k_h, op: view, shape: [B, T, H, Dh]}
  - {id: k_t, op: transpose, dims: [1, 2]}
  - {id: v, op: linear, input: x, weight: W_v}
  - {id: v_h, op: view, shape: [B, T, H, Dh]}
  - {id: v_t, op: transpose, dims: [1, 2]}
  - {id: q_rot, op: rope, input: q_t}
  - {id: k_rot, op: rope, input: k_t}
  - {id: k_tt, op: transpose, input: k_rot, dims: [2, 3]}
  - {id: scores, op: matmul, inputs: [q_rot, k_tt]}
  - {id: scaled, op: scale, multiply: MULT}
  - {id: masked, op: mask, causal: true, fill: min}
  - {id: weights, op: softmax, dim: -1}
  - {id: context, op: matmul, inputs: [weights, v_t]}
  - {id: merged, op: merge, input: context}
  - {id: out, op: linear, input: merged, weight: W_o}
"""
GRANITE_CHECKPOINT = """
checkpoint:
  dims: {hidden_size: d_model, num_attention_heads: H}
  fields: {attention_multiplier: [scaled.multiply]}
  prefix: model.layers.{layer}.self_attn.
  params: {q_proj.weight: W_q, k_proj.weight: W_k, v_proj.weight: W_v, o_proj.weight: W_o}
"""


@torch.no_grad()
@pytest.mark.parametrize("multiplier", [0.3, 1 / 8])  # a small config's, and 1/Dh as Granite 3.0 releases have it
def test_granite_attention_multiplier_is_clean_and_equals_graniteattention(multiplier):
    torch.manual_seed(0)
    config = GraniteConfig(
        hidden_size=16, num_attention_heads=2, num_key_value_heads=2, attention_multiplier=multiplier, attn_implementation="eager"
    )
    attn = GraniteAttention(config, layer_idx=0).eval()
    x, pos = torch.randn(2, 5, 16), torch.arange(5)[None].expand(2, -1)
    mask = create_causal_mask(config, x, None, None, position_ids=pos)
    expected, _ = attn(x, position_embeddings=GraniteRotaryEmbedding(config)(x, pos), attention_mask=mask)
    text = GRANITE.replace("MULT", repr(multiplier))
    assert codes(text) == set() and codes(text + GRANITE_CHECKPOINT) == set()
    weights = {"W_q": attn.q_proj.weight, "W_k": attn.k_proj.weight, "W_v": attn.v_proj.weight, "W_o": attn.o_proj.weight}
    out = run(text, x=x, **weights)["out"].tensor
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)


@torch.no_grad()
@pytest.mark.parametrize("implementation", ["eager", "sdpa"])
def test_an_imported_granite_checks_clean(implementation):
    """1/8 is 1/sqrt(64), and 64 is the vocabulary: a multiplier is not held against every dim."""
    config = GraniteConfig(
        vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=2,
        attention_multiplier=0.125, use_cache=False,
    )  # fmt: skip
    config._attn_implementation = implementation
    model = GraniteModel(config).eval()
    pipeline = tracer.from_module(model, torch.randint(0, 64, (1, 5)), name="granite")
    assert not pipeline.check().warnings


def test_granite_against_its_config_held_out():
    # the config's multiplier bound to the step, and 1/sqrt(Dh) added on the query as well
    extra = (
        (GRANITE + GRANITE_CHECKPOINT)
        .replace("MULT", "0.3")
        .replace(
            "  - {id: q_rot, op: rope, input: q_t}",
            "  - {id: q_s, op: scale, input: q_t, divide: {sqrt: Dh}}\n  - {id: q_rot, op: rope, input: q_s}",
        )
    )
    d = one_warning(extra, "scale-mismatch", "id: q_s")
    assert "config.attention_multiplier" in d.message and "keep 'scaled'" in d.message
    # a checkpoint that requires the multiplier, and the textbook scale written instead
    required = GRANITE.replace("multiply: MULT", "divide: {sqrt: Dh}") + GRANITE_CHECKPOINT.replace(
        "  fields: {attention_multiplier: [scaled.multiply]}\n", "  require: {attention_multiplier: 0.3}\n"
    )
    d = one_warning(required, "scale-mismatch", "id: scaled")
    assert "config.attention_multiplier = 0.3" in d.message and "multiply: 0.3" in d.message


def test_numbers_are_judged_only_when_they_read_as_a_slip():
    assert codes(GRANITE.replace("MULT", "0.35355339059327373")) == set()  # 1/sqrt(8), written out
    assert codes(GRANITE.replace("MULT", "0.0078125")) == set()  # Granite 3.0's 1/128: a configured multiplier
    slips = {
        "multiply: 0.25": "1/sqrt(16): d_model's root",
        "multiply: 2.8284271247461903": "sqrt(Dh): multiplied by the root",
        "divide: 8.0": "1/Dh: the root forgotten in a divisor",
    }
    for written in slips:
        one_warning(GRANITE.replace("multiply: MULT", written), "scale-mismatch", "id: scaled")
    # a query pre-scaled by 1/sqrt(Dh) into SDPA, which scales again
    fused = GRANITE.replace("MULT", "0.35355339059327373").replace("  - {id: k_tt, op: transpose, input: k_rot, dims: [2, 3]}\n", "")
    fused = fused[: fused.index("  - {id: scores")] + (
        "  - {id: q_s, op: scale, input: q_rot, multiply: 0.35355339059327373}\n"
        "  - {id: context, op: sdpa, inputs: [q_s, k_rot, v_t], causal: true}\n"
        "  - {id: merged, op: merge, input: context}\n  - {id: out, op: linear, input: merged, weight: W_o}\n"
    )
    assert "SDPA already scales" in one_warning(fused, "scale-mismatch", "id: q_s").message


# ---------------------------------------------------------------- Gemma 2: query_pre_attn_scalar, bound by the checkpoint

GEMMA2 = (MODELS / "gemma2_decoder_layer.yaml").read_text()


@torch.no_grad()
def test_gemma2_query_pre_attn_scalar_other_than_head_dim_is_clean_and_equals_gemma2decoderlayer():
    expected, tensors = gemma2_case(query_pre_attn_scalar=12)
    assert codes(GEMMA2, {"S": 12}) == set()
    out = tracer.loads(GEMMA2, "g.yaml").run(dims={"S": 12}, tensors=tensors, keep_values=True)["out"].tensor
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)


def test_gemma2_scaled_by_head_dim_against_its_config_is_caught():
    wrong = GEMMA2.replace("divide: {sqrt: S}", "divide: {sqrt: Dh}")
    assert codes(wrong) == set()  # S = Dh = 8: the same number, nothing to see yet
    d = one_warning(wrong, "scale-mismatch", "id: scaled", {"S": 12})
    assert "config.query_pre_attn_scalar" in d.message and "divide: {sqrt: S}" in d.message
    # without the checkpoint section the file says nothing about S: a dim named like positions is no declared quantity
    bare = GEMMA2[: GEMMA2.index("checkpoint:")]
    assert codes(bare, {"S": 12}) == {"scale-mismatch"}


# ---------------------------------------------------------------- DeBERTa: 1/sqrt(scale_factor * Dh)

DEBERTA = """
name: deberta_content_attention
dims: {B: 2, T: 4, d_model: 8, H: 2, Dh: d_model // H, scale_factor: 3}
inputs:
  x: {shape: [B, T, d_model], init: randn}
params:
  W_q: {shape: [d_model, d_model], init: linear}
  b_q: {shape: [d_model], init: zeros}
  W_k: {shape: [d_model, d_model], init: linear}
  b_k: {shape: [d_model], init: zeros}
  W_v: {shape: [d_model, d_model], init: linear}
  b_v: {shape: [d_model], init: zeros}
steps:
  - {id: q, op: linear, input: x, weight: W_q, bias: b_q}
  - {id: q_h, op: view, shape: [B, T, H, Dh]}
  - {id: q_t, op: transpose, dims: [1, 2]}
  - {id: k, op: linear, input: x, weight: W_k, bias: b_k}
  - {id: k_h, op: view, shape: [B, T, H, Dh]}
  - {id: k_t, op: transpose, dims: [1, 2]}
  - {id: v, op: linear, input: x, weight: W_v, bias: b_v}
  - {id: v_h, op: view, shape: [B, T, H, Dh]}
  - {id: v_t, op: transpose, dims: [1, 2]}
  - {id: k_tt, op: transpose, input: k_t, dims: [2, 3]}
  - {id: scores, op: matmul, inputs: [q_t, k_tt]}
  - {id: scaled, op: scale, divide: {sqrt: SCALE}}   # DebertaV2: / sqrt(Dh * scale_factor), 1 + len(pos_att_type)
  - {id: weights, op: softmax, dim: -1}
  - {id: context, op: matmul, inputs: [weights, v_t]}
  - {id: out, op: merge, input: context}
"""


@torch.no_grad()
def test_deberta_scale_is_clean_and_equals_disentangledselfattention():
    torch.manual_seed(0)
    config = DebertaV2Config(hidden_size=8, num_attention_heads=2, relative_attention=False, pos_att_type=["c2p", "p2c"])
    attn = DisentangledSelfAttention(config).eval()
    x = torch.randn(2, 4, 8)
    expected = attn(x, torch.ones(2, 1, 4, 4, dtype=torch.bool))[0]
    weights = {}
    for name in ("query", "key", "value"):
        layer = getattr(attn, f"{name}_proj")
        weights |= {f"W_{name[0]}": layer.weight, f"b_{name[0]}": layer.bias}
    for scale in ("scale_factor * Dh", "Dh * scale_factor", "3 * Dh"):
        text = DEBERTA.replace("SCALE", scale)
        assert codes(text) == set(), scale
        torch.testing.assert_close(run(text, x=x, **weights)["out"].tensor, expected, atol=1e-5, rtol=1e-5)
    # written in an axis, not a declared quantity: the model's width is a slip
    one_warning(DEBERTA.replace("SCALE", "H * Dh"), "scale-mismatch", "id: scaled")
    one_warning(DEBERTA.replace("SCALE", "scale_factor * d_model"), "scale-mismatch", "id: scaled")


# ---------------------------------------------------------------- DeepSeek-V3: qk_head_dim and YaRN's mscale squared

DEEPSEEK = (MODELS / "deepseek_v3_mla.yaml").read_text()


def test_deepseek_mscale_is_clean_without_allow_and_missing_it_is_caught():
    assert "allow:" not in DEEPSEEK and codes(DEEPSEEK) == set()
    d = one_warning(DEEPSEEK.replace("multiply: 0.3902588031658729", "multiply: 0.31622776601683794"), "scale-mismatch", "multiply:")
    assert "mscale" in d.message and "0.3903" in d.message
    d = one_warning(DEEPSEEK.replace("multiply: 0.3902588031658729", "divide: {sqrt: Dq}"), "scale-mismatch", "divide:")
    assert "YaRN rope" in d.message


# ---------------------------------------------------------------- Swin: a shifted-window mask tiled over batch x windows

SWIN = """
name: swin_shifted_window
dims: {B: 2, nW: 4, nH: 2, N: 4, Dh: 4}
inputs:
  q: {shape: [B * nW, nH, N, Dh], init: randn}
  k: {shape: [B * nW, nH, N, Dh], init: randn}
  v: {shape: [B * nW, nH, N, Dh], init: randn}
  attn_mask: {shape: [nW, N, N], init: randn}
steps:
  - {id: k_t, op: transpose, input: k, dims: [-2, -1]}
  - {id: scores, op: matmul, inputs: [q, k_t]}
  - {id: scaled, op: scale, divide: {sqrt: Dh}}
  - {id: mask_b, op: repeat, input: attn_mask, repeats: [B, 1, 1]}
  - {id: mask_h, op: unsqueeze, input: mask_b, dim: 1}
  - {id: biased, op: add, inputs: [scaled, mask_h]}
  - {id: weights, op: softmax, dim: -1}
  - {id: out, op: matmul, inputs: [weights, v]}
"""


def test_swin_mask_tiled_over_the_batch_of_windows_is_clean_and_equals_swin():
    assert codes(SWIN) == set()
    trace = tracer.loads(SWIN, "s.yaml").run(keep_values=True)
    q, k, v, mask = (trace[name].tensor for name in ("q", "k", "v", "attn_mask"))
    scores = (q @ k.transpose(-2, -1) / 2).view(2, 4, 2, 4, 4) + mask.unsqueeze(1).unsqueeze(0)  # SwinAttention's
    expected = scores.view(8, 2, 4, 4).softmax(-1) @ v
    torch.testing.assert_close(trace["out"].tensor, expected)
    # a repeat that tiles the keys' heads is still grouped-query attention in the wrong order
    gqa = (
        SWIN.replace("nH: 2,", "nH: 4, H_kv: 2,")
        .replace("k: {shape: [B * nW, nH, N, Dh]", "k: {shape: [B * nW, H_kv, N, Dh]")
        .replace(
            "  - {id: k_t, op: transpose, input: k, dims: [-2, -1]}",
            "  - {id: k_rep, op: repeat, input: k, repeats: [1, 2, 1, 1]}\n  - {id: k_t, op: transpose, input: k_rep, dims: [-2, -1]}",
        )
    )
    assert "H_kv=2 heads" in one_warning(gqa, "gqa-head-order", "id: k_rep").message


# ---------------------------------------------------------------- Qwen2-VL: M-RoPE sections picked from three position kinds

QWEN2VL = (
    """
name: qwen2vl_mrope
dims: {B: 1, H: 2, T: 5, Dh: 8, half: Dh // 2, s0: 1, s1: 2}
inputs:
  q: {shape: [B, H, T, Dh], init: randn}
  k: {shape: [B, H, T, Dh], init: randn}
  pos: {shape: [3, B, T], init: randn}
  inv_freq: {shape: [half], init: randn}
steps:
  - {id: pos_e, op: unsqueeze, input: pos, dim: -1}
  - {id: freqs, op: mul, inputs: [pos_e, inv_freq]}
  - {id: emb, op: cat, inputs: [freqs, freqs], dim: -1}
"""
    + "".join(
        f"""  - {{id: {f}_all, op: {f}, input: emb}}
  - {{id: {f}_t, op: index, input: {f}_all, dim: 0, index: 0}}
  - {{id: {f}_h, op: index, input: {f}_all, dim: 0, index: 1}}
  - {{id: {f}_w, op: index, input: {f}_all, dim: 0, index: 2}}
  - {{id: {f}0, op: index, input: {f}_t, dim: -1, start: 0, stop: s0}}
  - {{id: {f}1, op: index, input: {f}_h, dim: -1, start: s0, stop: s0 + s1}}
  - {{id: {f}2, op: index, input: {f}_w, dim: -1, start: s0 + s1, stop: half}}
  - {{id: {f}3, op: index, input: {f}_t, dim: -1, start: half, stop: half + s0}}
  - {{id: {f}4, op: index, input: {f}_h, dim: -1, start: half + s0, stop: half + s0 + s1}}
  - {{id: {f}5, op: index, input: {f}_w, dim: -1, start: half + s0 + s1, stop: Dh}}
  - {{id: {f}_sec, op: cat, inputs: [{f}0, {f}1, {f}2, {f}3, {f}4, {f}5], dim: -1}}
  - {{id: {f}_4d, op: unsqueeze, input: {f}_sec, dim: 1}}
"""
        for f in ("cos", "sin")
    )
    + "".join(
        f"""  - {{id: {x}1, op: index, input: {x}, dim: -1, start: 0, stop: half}}
  - {{id: {x}2, op: index, input: {x}, dim: -1, start: half, stop: Dh}}
  - {{id: {x}2n, op: neg, input: {x}2}}
  - {{id: {x}_rh, op: cat, inputs: [{x}2n, {x}1], dim: -1}}
  - {{id: {x}c, op: mul, inputs: [{x}, cos_4d]}}
  - {{id: {x}s, op: mul, inputs: [{x}_rh, sin_4d]}}
  - {{id: {x}_rot, op: add, inputs: [{x}c, {x}s]}}
"""
        for x in ("q", "k")
    )
    + """  - {id: out, op: sdpa, inputs: [q_rot, k_rot, k], causal: true}
outputs: [q_rot, k_rot, out]
"""
)


@torch.no_grad()
def test_qwen2vl_mrope_sections_are_clean_and_equal_qwen2vl():
    assert codes(QWEN2VL) == set()
    config = Qwen2VLConfig(
        hidden_size=16, num_attention_heads=2, rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [1, 2, 1]}
    )
    config = config.get_text_config()
    config.head_dim = 8
    rotary = Qwen2VLRotaryEmbedding(config)
    pos = torch.tensor([[[0, 1, 2, 2, 2]], [[0, 1, 1, 2, 3]], [[0, 1, 2, 3, 3]]])
    q, k = torch.randn(1, 2, 5, 8), torch.randn(1, 2, 5, 8)
    cos, sin = rotary(q, pos)
    want_q, want_k = apply_rotary_pos_emb(q, k, cos, sin)
    trace = run(QWEN2VL, q=q, k=k, pos=pos.float(), inv_freq=rotary.inv_freq)
    torch.testing.assert_close(trace["q_rot"].tensor, want_q)
    torch.testing.assert_close(trace["k_rot"].tensor, want_k)


# ---------------------------------------------------------------- config-mismatch: rope, NoPE and windows against the checkpoint's config

LLAMA = (MODELS / "llama_decoder_layer.yaml").read_text()
MISTRAL = (MODELS / "mistral_sliding_window.yaml").read_text()


def test_rope_against_the_config_held_out():
    scaled = LLAMA.replace(
        "theta: 10000.0, group: self_attn}", "theta: 10000.0, rope_scaling: {type: linear, factor: 2.0}, group: self_attn}", 1
    )
    d = one_warning(scaled, "config-mismatch", "id: q_rot")
    assert "rope type default" in d.message and "drop rope_scaling" in d.message
    interleaved = LLAMA.replace(
        "    rope_parameters.rope_type: default", "    rope_parameters.rope_type: default\n    rope_interleave: true"
    )
    assert {d.step for d in check(interleaved).warnings} == {"q_rot", "k_rot"}
    assert all("style: interleaved" in d.message for d in check(interleaved).warnings)
    one_side = LLAMA.replace("rope_theta: [q_rot.theta, k_rot.theta]", "rope_theta: [q_rot.theta]")
    d = one_warning(one_side, "config-mismatch", "id: k_rot")
    assert "add k_rot.theta to fields" in d.message
    nope = LLAMA.replace("    rope_parameters.rope_type: default", "    rope_parameters.rope_type: default\n    no_rope_layers.{layer}: 0")
    assert "NoPE" in one_warning(nope, "config-mismatch", "id: q_rot").message
    assert codes(nope.replace("no_rope_layers.{layer}: 0", "no_rope_layers.{layer}: 1")) == set()
    local = LLAMA.replace("rope_parameters.rope_theta: [q_rot.theta, k_rot.theta]", "rope_local_base_freq: [q_rot.theta, k_rot.theta]")
    local = local.replace("    rope_parameters.rope_type: default\n", "")
    assert codes(local) == set()
    local_scaled = local.replace(
        "theta: 10000.0, group: self_attn}", "theta: 10000.0, rope_scaling: {type: linear, factor: 8.0}, group: self_attn}"
    )
    assert {(d.code, d.step) for d in check(local_scaled).warnings} == {("config-mismatch", "q_rot"), ("config-mismatch", "k_rot")}


def test_window_against_the_config_held_out():
    full = GEMMA2.replace("layer_types.{layer}: sliding_attention", "layer_types.{layer}: full_attention")
    assert "full_attention" in one_warning(full, "config-mismatch", "id: masked").message
    no_window = GEMMA2.replace("causal: true, window: W, fill: min", "causal: true, fill: min")
    assert "no window" in one_warning(no_window, "config-mismatch", "id: masked").message
    literal = MISTRAL.replace("causal: true, window: W,", "causal: true, window: 3,")
    assert codes(literal) == set()  # W = 3 today: the same window
    d = one_warning(literal, "config-mismatch", "id: masked", {"W": 2})
    assert "use window: W" in d.message


def test_the_bundled_models_agree_with_their_configs():
    for path in sorted(MODELS.glob("*.yaml")):
        assert not tracer.load(path).check().warnings, path.name
