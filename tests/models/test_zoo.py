"""The zoo pipelines equal transformers' own modules (small random configs, weights copied in), and
a perturbed weight changes the result (the comparison can fail)."""

import torch
from transformers import Gemma2Config, Llama4TextConfig, LlamaConfig, T5Config
from transformers.masking_utils import (
    create_bidirectional_mask,
    create_causal_mask,
    create_chunked_causal_mask,
    create_sliding_window_causal_mask,
    find_packed_sequence_indices,
)
from transformers.models.gemma2.modeling_gemma2 import Gemma2DecoderLayer, Gemma2RotaryEmbedding
from transformers.models.llama.modeling_llama import LlamaAttention, LlamaRotaryEmbedding
from transformers.models.llama4.modeling_llama4 import Llama4TextAttention, Llama4TextRotaryEmbedding
from transformers.models.t5.modeling_t5 import T5LayerSelfAttention

import tracer
from tests.models.test_models import ATOL, MODELS, run


def compare(name: str, expected, tensors: dict, perturb: str) -> float:
    """The pipeline's ``out`` against ``expected``; then again with one weight nudged, which must differ."""
    diff = (run(name, **tensors)["out"].tensor - expected).abs().max().item()
    assert diff <= ATOL, diff
    print(f"{name}: max abs diff {diff:.3g}")
    nudged = dict(tensors, **{perturb: tensors[perturb] + 0.05})
    assert (run(name, **nudged)["out"].tensor - expected).abs().max().item() > 1e-3
    return diff


def randomized(module, low: float = 0.5, high: float = 1.5):
    torch.manual_seed(1)
    with torch.no_grad():
        for name, p in module.named_parameters():
            if "norm" in name:
                p.uniform_(low, high)  # norms start at 1 (or 0): a swapped one would not show
    return module.eval()


@torch.no_grad()
def test_gemma2_decoder_layer_equals_gemma2decoderlayer():
    torch.manual_seed(0)
    config = Gemma2Config(
        hidden_size=16, num_attention_heads=2, num_key_value_heads=1, head_dim=8, intermediate_size=32, num_hidden_layers=2,
        query_pre_attn_scalar=8, attn_logit_softcapping=2.0, sliding_window=3, attn_implementation="eager",
    )  # fmt: skip
    layer = randomized(Gemma2DecoderLayer(config, layer_idx=0), -0.5, 0.5)
    assert layer.self_attn.sliding_window == 3 and layer.self_attn.scaling == 8**-0.5
    x = torch.randn(2, 6, 16)
    pos = torch.arange(6)[None].expand(2, -1)
    mask = create_sliding_window_causal_mask(config, x, None, None, position_ids=pos)
    expected = layer(x, position_embeddings=Gemma2RotaryEmbedding(config)(x, pos), attention_mask=mask, position_ids=pos)
    a, m = layer.self_attn, layer.mlp
    weights = {
        "ln_in": layer.input_layernorm.weight, "W_q": a.q_proj.weight, "W_k": a.k_proj.weight, "W_v": a.v_proj.weight,
        "W_o": a.o_proj.weight, "ln_post_attn": layer.post_attention_layernorm.weight,
        "ln_pre_ff": layer.pre_feedforward_layernorm.weight, "W_gate": m.gate_proj.weight, "W_up": m.up_proj.weight,
        "W_down": m.down_proj.weight, "ln_post_ff": layer.post_feedforward_layernorm.weight,
    }  # fmt: skip
    compare("gemma2_decoder_layer.yaml", expected, {"x": x, **weights}, "ln_post_attn")


@torch.no_grad()
def test_llama31_packed_attention_equals_llamaattention_on_packed_documents():
    torch.manual_seed(0)
    rope = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0}
    config = LlamaConfig(
        hidden_size=32, num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
        rope_parameters={**rope, "original_max_position_embeddings": 32}, attn_implementation="eager",
    )  # fmt: skip
    attn = LlamaAttention(config, layer_idx=0).eval()
    x = torch.randn(2, 8, 32)
    pos = torch.tensor([[0, 1, 2, 0, 1, 2, 3, 0], [0, 1, 2, 3, 4, 5, 6, 7]])
    mask = create_causal_mask(config, x, None, None, position_ids=pos)  # packed: same-document causal
    documents = find_packed_sequence_indices(pos)
    assert documents.tolist() == [[0, 0, 0, 1, 1, 1, 1, 2], [0, 0, 0, 0, 0, 0, 0, 0]]  # the pipeline's values
    expected, _ = attn(x, position_embeddings=LlamaRotaryEmbedding(config)(x, pos), attention_mask=mask)
    weights = {"W_q": attn.q_proj.weight, "W_k": attn.k_proj.weight, "W_v": attn.v_proj.weight, "W_o": attn.o_proj.weight}
    compare("llama31_packed_attention.yaml", expected, {"x": x, "position_ids": pos, "documents": documents, **weights}, "W_k")
    # one document per row is not the same attention: the segments matter
    whole = run("llama31_packed_attention.yaml", x=x, position_ids=pos, documents=torch.zeros_like(pos), **weights)
    assert (whole["out"].tensor - expected).abs().max().item() > 1e-3


@torch.no_grad()
def test_t5_self_attention_equals_t5layerselfattention_on_a_padded_batch():
    torch.manual_seed(0)
    config = T5Config(
        d_model=16, d_kv=4, num_heads=2, relative_attention_num_buckets=8, relative_attention_max_distance=6, dropout_rate=0.0,
        attn_implementation="eager",
    )  # fmt: skip
    layer = randomized(T5LayerSelfAttention(config, has_relative_attention_bias=True, layer_idx=0))
    x = torch.randn(2, 12, 16)
    attention_mask = torch.tensor([[1] * 12, [1] * 9 + [0] * 3])  # the pipeline's values
    mask = create_bidirectional_mask(config, x, attention_mask)
    expected, bias, _ = layer(x, attention_mask=mask)
    a = layer.SelfAttention
    weights = {
        "ln": layer.layer_norm.weight, "W_q": a.q.weight, "W_k": a.k.weight, "W_v": a.v.weight, "W_o": a.o.weight,
        "rel_bias": a.relative_attention_bias.weight,
    }  # fmt: skip
    diff = compare("t5_self_attention.yaml", expected, {"x": x, "attention_mask": attention_mask, **weights}, "W_k")
    trace = run("t5_self_attention.yaml", x=x, attention_mask=attention_mask, **weights)
    assert torch.equal(trace["biased/bias"].tensor, bias) and diff <= 1e-6  # the position bias itself, bit for bit
    # one bucket's bias nudged changes the result (the whole table shifted would not: softmax ignores a constant)
    nudged = weights["rel_bias"].clone()
    nudged[5] += 0.5
    moved = run("t5_self_attention.yaml", x=x, attention_mask=attention_mask, **dict(weights, rel_bias=nudged))
    assert (moved["out"].tensor - expected).abs().max().item() > 1e-3
    # the decoder's one-sided buckets are another attention: bidirectional matters
    text = (MODELS / "t5_self_attention.yaml").read_text().replace("bidirectional: true", "bidirectional: false")
    one_sided = tracer.loads(text, "t5_decoder_buckets.yaml").run(
        tensors={"x": x, "attention_mask": attention_mask, **weights}, keep_values=True
    )
    assert (one_sided["out"].tensor - expected).abs().max().item() > 1e-3


def llama4_config(**extra) -> Llama4TextConfig:
    """Layer 0 uses rope (chunked attention), layer 1 is NoPE (temperature tuning); floor_scale and
    the chunk are below T so both change along the test sequence."""
    return Llama4TextConfig(
        hidden_size=16, num_attention_heads=4, num_key_value_heads=2, head_dim=4, intermediate_size=8, intermediate_size_mlp=24,
        num_hidden_layers=2, vocab_size=32, num_local_experts=4, num_experts_per_tok=1, no_rope_layers=[1, 0],
        floor_scale=2, attn_scale=0.1, pad_token_id=0, bos_token_id=1, eos_token_id=2, attn_implementation="eager", **extra,
    )  # fmt: skip


@torch.no_grad()
def test_llama4_nope_attention_equals_llama4textattention_with_temperature_tuning():
    torch.manual_seed(0)
    config = llama4_config(attention_chunk_size=3)
    attn = Llama4TextAttention(config, layer_idx=1).eval()
    assert not attn.use_rope and attn.attn_temperature_tuning
    x = torch.randn(2, 10, 16)
    pos = torch.arange(10)[None].expand(2, -1)
    mask = create_causal_mask(config, x, None, None, position_ids=pos)  # a NoPE layer attends to the full past
    expected, _ = attn(x, position_embeddings=Llama4TextRotaryEmbedding(config)(x, pos), attention_mask=mask)
    weights = {"W_q": attn.q_proj.weight, "W_k": attn.k_proj.weight, "W_v": attn.v_proj.weight, "W_o": attn.o_proj.weight}
    compare("llama4_nope_attention.yaml", expected, {"x": x, **weights}, "W_q")
    # the temperature matters: the same layer without it (attn_temperature_tuning=False) is far from the pipeline
    untuned = Llama4TextAttention(llama4_config(attention_chunk_size=3, attn_temperature_tuning=False), layer_idx=1).eval()
    untuned.load_state_dict(attn.state_dict())
    plain, _ = untuned(x, position_embeddings=None, attention_mask=mask)
    assert (run("llama4_nope_attention.yaml", x=x, **weights)["out"].tensor - plain).abs().max().item() > 1e-3


@torch.no_grad()
def test_llama4_chunked_attention_equals_llama4textattention_with_rope_and_qk_norm():
    torch.manual_seed(0)
    config = llama4_config(attention_chunk_size=3)
    attn = Llama4TextAttention(config, layer_idx=0).eval()
    assert attn.use_rope and hasattr(attn, "qk_norm")
    x = torch.randn(2, 10, 16)
    pos = torch.arange(10)[None].expand(2, -1)
    mask = create_chunked_causal_mask(config, x, None, None, position_ids=pos)
    expected, _ = attn(x, position_embeddings=Llama4TextRotaryEmbedding(config)(x, pos), attention_mask=mask)
    weights = {"W_q": attn.q_proj.weight, "W_k": attn.k_proj.weight, "W_v": attn.v_proj.weight, "W_o": attn.o_proj.weight}
    compare("llama4_chunked_attention.yaml", expected, {"x": x, **weights}, "W_k")
    # the chunks matter: plain causal attention over the same weights is far from the module
    whole = run("llama4_chunked_attention.yaml", dims={"C": 10}, x=x, **weights)
    assert (whole["out"].tensor - expected).abs().max().item() > 1e-3
