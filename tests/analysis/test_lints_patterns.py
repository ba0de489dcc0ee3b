"""Hand-built masks and biases, folded before running (tracer.analysis.values), equal what torch
computes; held-out wrong variants of each pattern lint are caught at the line to edit, and correct
designs stay clean."""

import pytest
import torch

import tracer
from tests.analysis.lintcheck import codes, one_warning
from tests.conftest import PIPELINES
from tracer.analysis.values import static_value

EXAMPLES = PIPELINES / "lint_examples"
WINDOW = (EXAMPLES / "fixed" / "window_band.yaml").read_text()
ALIBI = (EXAMPLES / "fixed" / "alibi_slopes.yaml").read_text()


@pytest.mark.parametrize("text, tensor", [(WINDOW, "keep"), (ALIBI, "bias")])
def test_folded_values_equal_the_run(text, tensor):
    pipeline = tracer.loads(text, "t.yaml")
    folded = static_value(pipeline.check(), tensor)
    ran = pipeline.run(keep_values=True)[tensor].tensor
    assert folded.sizes == tuple(ran.shape)
    torch.testing.assert_close(torch.tensor(folded.flat, dtype=ran.dtype).view(ran.shape), ran)


def test_window_band_held_out():
    # one key too narrow: distance < W - 1
    narrow = WINDOW.replace("cmp: lt, value: 3}", "cmp: lt, value: 2}")
    assert "one key fewer" in one_warning(narrow, "window-band", "id: near").message
    # the band drawn from the keys' side, j - i > -W (correct) and j - i >= -W (one too many)
    keys_side = WINDOW.replace("inputs: [query_positions, positions]}", "inputs: [positions, query_positions]}")
    keys_side = keys_side.replace("cmp: ge, value: 0}", "cmp: le, value: 0}").replace("cmp: lt, value: 3}", "cmp: gt, value: -3}")
    assert codes(keys_side) == set()
    one_warning(keys_side.replace("cmp: gt, value: -3}", "cmp: ge, value: -3}"), "window-band", "id: near")
    # the causal half given by the mask step instead
    causal = WINDOW.replace("  - {id: keep, op: logical, fn: and, inputs: [past, near]}\n", "")
    causal = causal.replace("  - {id: past, op: compare, input: distance, cmp: ge, value: 0}\n", "").replace(
        "mask: keep, polarity: keep}", "mask: near, polarity: keep, causal: true}"
    )
    assert codes(causal) == set()
    one_warning(causal.replace("cmp: lt, value: 3}", "cmp: le, value: 3}"), "window-band", "id: near")
    # the window declared under another name, bound by the checkpoint: a dim the file no longer calls W
    renamed = WINDOW.replace("W: 3}", "S_w: 3}").replace("cmp: lt, value: 3}", "cmp: le, value: 3}")
    assert codes(renamed) == set()  # nothing declares a window: nothing to hold the band against
    bound = renamed + (
        "checkpoint:\n  dims: {sliding_window: S_w}\n  prefix: model.layers.{layer}.self_attn.\n  params: {q_proj.weight: null}\n"
    )
    assert "S_w = 3" in one_warning(bound, "window-band", "id: near").message


SYMMETRIC = """
name: modernbert_local_band
dims: {B: 1, H: 2, T: 9, Dh: 4, local_attention: 4}
inputs:
  q: {shape: [B, H, T, Dh], init: randn}
  k: {shape: [B, H, T, Dh], init: randn}
steps:
  - {id: positions, op: arange, stop: T}
  - {id: rows, op: unsqueeze, input: positions, dim: 1}
  - {id: distance, op: sub, inputs: [rows, positions]}
  - {id: far, op: abs, input: distance}
  - {id: window_mask, op: compare, input: far, cmp: le, value: HALF}   # |i - j| <= local_attention // 2
  - {id: k_t, op: transpose, input: k, dims: [-2, -1]}
  - {id: scores, op: matmul, inputs: [q, k_t]}
  - {id: scaled, op: scale, divide: {sqrt: Dh}}
  - {id: masked, op: mask, mask: window_mask, polarity: keep}
  - {id: weights, op: softmax, dim: -1}
"""


def test_symmetric_band_against_half_the_window():
    assert codes(SYMMETRIC.replace("HALF", "2")) == set()  # ModernBERT: 2 keys each side of a window of 4
    assert "local_attention // 2 = 2" in one_warning(SYMMETRIC.replace("HALF", "3"), "window-band", "id: window_mask").message
    assert codes(SYMMETRIC.replace("HALF", "4")) == set()  # the full window each side: another design, not a slip of one


def test_band_polarity_held_out():
    causal = """
name: causal_by_hand
dims: {H: 2, T: 5, Dh: 4}
inputs:
  q: {shape: [H, T, Dh], init: randn}
  k: {shape: [H, T, Dh], init: randn}
steps:
  - {id: positions, op: arange, stop: T}
  - {id: rows, op: unsqueeze, input: positions, dim: 1}
  - {id: future, op: compare, inputs: [positions, rows], cmp: CMP}
  - {id: k_t, op: transpose, input: k, dims: [-2, -1]}
  - {id: scores, op: matmul, inputs: [q, k_t]}
  - {id: masked, op: mask, mask: future, polarity: block}
  - {id: weights, op: softmax, dim: -1}
"""
    assert codes(causal.replace("CMP", "gt")) == set()  # j > i blocked: causal
    assert "use polarity: keep" in one_warning(causal.replace("CMP", "le"), "band-polarity", "id: masked").message


def test_alibi_slopes_held_out():
    # heads numbered H .. 1: the steepest slope on the last head
    reversed_heads = ALIBI.replace(
        "{id: head_numbers, op: arange, start: 1, stop: H + 1, dtype: float32}",
        "{id: counted_down, op: arange, start: -H, stop: 0, dtype: float32}\n  - {id: head_numbers, op: neg}",
    )
    d = one_warning(reversed_heads, "alibi-slopes", "id: bias,")
    assert "reverse their order" in d.message
    # a tensor-parallel shard: heads rank * H .. of H_total, slopes of the global heads
    shard = ALIBI.replace("dims: {B: 1, H: 4, T: 5, Dh: 4}", "dims: {B: 1, H: 2, H_total: 4, tp_rank: 1, T: 5, Dh: 4}")
    first = shard  # exponents -8 ln2 / H_total for heads 1, 2: the first shard's
    d = one_warning(first, "alibi-slopes", "id: bias,")
    assert "offset the head index by tp_rank * 2" in d.message and "heads 2..3" in d.message
    own = shard.replace("start: 1, stop: H + 1", "start: tp_rank * H + 1, stop: tp_rank * H + H + 1")
    assert codes(own) == set()
    assert codes(first, {"tp_rank": 0}) == set()  # the first shard does hold the first heads


# ---------------------------------------------------------------- fused q|k|v: the axis, and the checkpoint's layout

FALCON = """
name: falcon_grouped_qkv
dims: {B: 1, T: 4, d_model: 16, H: 4, H_kv: 2, n_rep: H // H_kv, Dh: d_model // H}
inputs:
  x: {shape: [B, T, d_model], init: randn}
params:
  W_qkv: {shape: [(H + 2 * H_kv) * Dh, d_model], init: linear}
steps:
  - {id: fused, op: linear, input: x, weight: W_qkv}
SPLIT
  - {id: q_h, op: transpose, input: q_heads, dims: [1, 2]}
  - {id: k_h, op: transpose, input: k_heads, dims: [1, 2]}
  - {id: v_h, op: transpose, input: v_heads, dims: [1, 2]}
  - {id: context, op: sdpa, inputs: [q_h, k_h, v_h], causal: true, gqa: true}
checkpoint:
  dims: {num_attention_heads: H, num_kv_heads: H_kv}
  require: {new_decoder_architecture: true}
  prefix: transformer.h.{layer}.self_attention.
  params: {query_key_value.weight: W_qkv, dense.weight: null}
"""
GROUPED = """  - {id: qkv, op: view, input: fused, shape: [B, T, H_kv, n_rep + 2, Dh]}
  - {id: q_g, op: index, input: qkv, dim: 3, start: 0, stop: n_rep}
  - {id: k_1, op: index, input: qkv, dim: 3, start: n_rep, stop: n_rep + 1}
  - {id: v_1, op: index, input: qkv, dim: 3, start: n_rep + 1, stop: n_rep + 2}
  - {id: q_heads, op: reshape, input: q_g, shape: [B, T, H, Dh]}
  - {id: k_heads, op: reshape, input: k_1, shape: [B, T, H_kv, Dh]}
  - {id: v_heads, op: reshape, input: v_1, shape: [B, T, H_kv, Dh]}"""
BLOCKS = """  - {id: blocks, op: split, input: fused, dim: -1, sizes: [H * Dh, H_kv * Dh, H_kv * Dh], outputs: [q, k, v]}
  - {id: q_heads, op: view, input: q, shape: [B, T, H, Dh]}
  - {id: k_heads, op: view, input: k, shape: [B, T, H_kv, Dh]}
  - {id: v_heads, op: view, input: v, shape: [B, T, H_kv, Dh]}"""


def test_fused_qkv_against_the_checkpoint_layout():
    assert codes(FALCON.replace("SPLIT", GROUPED)) == set()
    d = one_warning(FALCON.replace("SPLIT", BLOCKS), "fused-qkv-split", "id: blocks")
    assert "per kv group" in d.message and "query_key_value.weight" in d.message
    # one kv group (Falcon-7B's multi-query): the blocks are its layout
    assert codes(FALCON.replace("SPLIT", BLOCKS), {"H_kv": 1}) == set()
    # contiguous blocks are right for a checkpoint that stores them so (Phi-3's qkv_proj)
    assert (
        codes(
            FALCON.replace("SPLIT", BLOCKS)
            .replace("query_key_value.weight", "qkv_proj.weight")
            .replace("  require: {new_decoder_architecture: true}\n", "")
        )
        == set()
    )
    # GPT-NeoX: q, k, v per head under the same key
    neox = FALCON.replace("SPLIT", BLOCKS.replace("H_kv * Dh", "H * Dh").replace("H_kv, Dh]", "H, Dh]")).replace("2 * H_kv", "2 * H")
    neox = neox.replace("  require: {new_decoder_architecture: true}\n", "").replace(", gqa: true", "")
    assert "per head" in one_warning(neox, "fused-qkv-split", "id: blocks").message


def test_fused_qkv_cut_along_the_tokens_held_out():
    text = (EXAMPLES / "fixed" / "fused_qkv_split.yaml").read_text()
    assert codes(text) == set()
    text = text.replace("dim: -1, chunks: 3", "dim: -2, sizes: [2, 2, 2]")
    assert "(seq_len, positions)" in one_warning(text, "fused-qkv-split", "id: qkv_split").message


# ---------------------------------------------------------------- gate and up against the checkpoint's names

LLAMA = (PIPELINES / "models" / "llama_decoder_layer.yaml").read_text()
PHI3_MLP = """
name: phi3_mlp
dims: {B: 1, T: 3, d_model: 8, d_ff: 16}
inputs:
  x: {shape: [B, T, d_model], init: randn}
params:
  W_gate_up: {shape: [2 * d_ff, d_model], init: linear}
  W_down: {shape: [d_model, d_ff], init: linear}
steps:
  - {id: gate_up, op: linear, input: x, weight: W_gate_up}
  - {id: halves, op: split, input: gate_up, dim: -1, sizes: d_ff, outputs: [gate, up]}
  - {id: act, op: silu, input: ACTIVATED}
  - {id: gated, op: mul, inputs: [act, PLAIN]}
  - {id: down, op: linear, input: gated, weight: W_down}
checkpoint:
  prefix: model.layers.{layer}.
  params: {mlp.gate_up_proj.weight: W_gate_up, mlp.down_proj.weight: W_down}
"""


def test_gate_up_swap_held_out():
    assert codes(LLAMA) == set()
    swapped = (
        LLAMA.replace("mlp.gate_proj.weight: W_gate", "mlp.gate_proj.weight: W_TMP")
        .replace("mlp.up_proj.weight: W_up", "mlp.up_proj.weight: W_gate")
        .replace("W_TMP", "W_up")
    )
    d = one_warning(swapped, "gate-up-swap", "id: gate_act")
    assert "mlp.up_proj.weight" in d.message
    assert codes(PHI3_MLP.replace("ACTIVATED", "gate").replace("PLAIN", "up")) == set()
    d = one_warning(PHI3_MLP.replace("ACTIVATED", "up").replace("PLAIN", "gate"), "gate-up-swap", "id: act")
    assert "first half" in d.message
    # without a checkpoint nothing names the halves: not judged
    bare = PHI3_MLP[: PHI3_MLP.index("checkpoint:")].replace("ACTIVATED", "up").replace("PLAIN", "gate")
    assert codes(bare) == set()
