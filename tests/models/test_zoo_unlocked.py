"""The bundled pipelines of the architectures the importer learnt with them (issue 31): a Llama 3.1
layer (llama3-scaled RoPE), a BLOOM block (ALiBi) and a StableLM layer (per-head q/k LayerNorms)
equal transformers' own modules on shared random weights, and a nudged weight changes the result."""

import torch
from transformers import BloomConfig, LlamaConfig, StableLmConfig
from transformers.masking_utils import create_causal_mask
from transformers.models.bloom.modeling_bloom import BloomBlock, build_alibi_tensor
from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaRotaryEmbedding
from transformers.models.stablelm.modeling_stablelm import StableLmDecoderLayer, StableLmRotaryEmbedding

from tests.models.test_zoo import compare, randomized

B, T = 2, 6
LLAMA31_ROPE = {
    "rope_type": "llama3",
    "rope_theta": 500000.0,
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 8192,
}


def positions():
    return torch.arange(T)[None].expand(B, -1)


def llama_layer_output(config, layer, x):
    mask = create_causal_mask(config, x, None, None, position_ids=positions())
    return layer(x, attention_mask=mask, position_ids=positions(), position_embeddings=LlamaRotaryEmbedding(config)(x, positions()))


@torch.no_grad()
def test_llama31_decoder_layer_equals_llamadecoderlayer_with_llama3_rope():
    torch.manual_seed(0)
    kwargs = dict(hidden_size=32, num_attention_heads=4, num_key_value_heads=2, intermediate_size=48, rms_norm_eps=1e-6)
    config = LlamaConfig(**kwargs, rope_parameters=LLAMA31_ROPE, attn_implementation="eager")
    layer = randomized(LlamaDecoderLayer(config, layer_idx=0))
    x = torch.randn(B, T, 32)
    expected = llama_layer_output(config, layer, x)
    # the scaling shows: the same layer with plain RoPE of the same theta computes something else
    plain = LlamaConfig(**kwargs, rope_parameters={"rope_type": "default", "rope_theta": 500000.0}, attn_implementation="eager")
    assert (llama_layer_output(plain, layer, x) - expected).abs().max() > 1e-4
    a, m = layer.self_attn, layer.mlp
    weights = {
        "ln_1": layer.input_layernorm.weight, "W_q": a.q_proj.weight, "W_k": a.k_proj.weight, "W_v": a.v_proj.weight,
        "W_o": a.o_proj.weight, "ln_2": layer.post_attention_layernorm.weight, "W_gate": m.gate_proj.weight,
        "W_up": m.up_proj.weight, "W_down": m.down_proj.weight,
    }  # fmt: skip
    compare("llama31_decoder_layer.yaml", expected, {"x": x, **weights}, "W_k")


@torch.no_grad()
def test_bloom_block_equals_bloomblock_with_its_alibi():
    torch.manual_seed(0)
    config = BloomConfig(hidden_size=32, n_head=4, n_layer=1, vocab_size=32, attn_implementation="eager")
    block = randomized(BloomBlock(config, layer_idx=0))
    x = torch.randn(B, T, 32)
    alibi = build_alibi_tensor(torch.ones(B, T, dtype=torch.long), 4, torch.float32)  # BloomModel's, no padding
    causal = torch.full((T, T), torch.finfo(torch.float32).min).triu(1)[None, None]
    expected, _ = block(x, alibi, causal)  # (output, attention weights)
    a, m = block.self_attention, block.mlp
    weights = {
        "ln_in": block.input_layernorm.weight, "ln_in_b": block.input_layernorm.bias,
        "W_qkv": a.query_key_value.weight, "b_qkv": a.query_key_value.bias, "W_o": a.dense.weight, "b_o": a.dense.bias,
        "ln_post": block.post_attention_layernorm.weight, "ln_post_b": block.post_attention_layernorm.bias,
        "W_up": m.dense_h_to_4h.weight, "b_up": m.dense_h_to_4h.bias, "W_down": m.dense_4h_to_h.weight, "b_down": m.dense_4h_to_h.bias,
    }  # fmt: skip
    compare("bloom_block.yaml", expected, {"x": x, **weights}, "W_qkv")


@torch.no_grad()
def test_stablelm_decoder_layer_equals_stablelmdecoderlayer_with_per_head_norms():
    torch.manual_seed(0)
    config = StableLmConfig(
        hidden_size=32, num_attention_heads=4, num_key_value_heads=2, intermediate_size=48, qk_layernorm=True,
        attn_implementation="eager",
    )  # fmt: skip
    layer = randomized(StableLmDecoderLayer(config, layer_idx=0))
    a, m = layer.self_attn, layer.mlp
    assert a.rotary_ndims == 2 and len(a.q_layernorm.norms) == 4  # R = Dh // 4, one LayerNorm per head
    x = torch.randn(B, T, 32)
    mask = create_causal_mask(config, x, None, None, position_ids=positions())
    expected = layer(x, attention_mask=mask, position_ids=positions(), position_embeddings=StableLmRotaryEmbedding(config)(x, positions()))
    per_head = {f"ln_q_{h}": a.q_layernorm.norms[h].weight for h in range(4)} | {
        f"ln_k_{h}": a.k_layernorm.norms[h].weight for h in range(2)
    }
    weights = {
        "ln_in": layer.input_layernorm.weight, "ln_in_b": layer.input_layernorm.bias, "W_q": a.q_proj.weight,
        "W_k": a.k_proj.weight, "W_v": a.v_proj.weight, "W_o": a.o_proj.weight, **per_head,
        "ln_post": layer.post_attention_layernorm.weight, "ln_post_b": layer.post_attention_layernorm.bias,
        "W_gate": m.gate_proj.weight, "W_up": m.up_proj.weight, "W_down": m.down_proj.weight,
    }  # fmt: skip
    compare("stablelm_decoder_layer.yaml", expected, {"x": x, **weights}, "ln_k_1")
