"""The zoo pipelines equal transformers' own modules (small random configs, weights copied in), and
a perturbed weight changes the result (the comparison can fail)."""

import torch
from transformers import (
    BartConfig,
    DeepseekV3Config,
    FalconConfig,
    Gemma2Config,
    GPT2Config,
    GPT2LMHeadModel,
    Llama4TextConfig,
    LlamaConfig,
    MixtralConfig,
    ModernBertConfig,
    Phi3Config,
    T5Config,
    ViTConfig,
    WhisperConfig,
)
from transformers.masking_utils import (
    create_bidirectional_mask,
    create_bidirectional_sliding_window_mask,
    create_causal_mask,
    create_chunked_causal_mask,
    create_sliding_window_causal_mask,
    find_packed_sequence_indices,
)
from transformers.models.bart.modeling_bart import BartDecoderLayer
from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3Attention, DeepseekV3RotaryEmbedding
from transformers.models.falcon.modeling_falcon import FalconDecoderLayer, FalconRotaryEmbedding
from transformers.models.gemma2.modeling_gemma2 import Gemma2DecoderLayer, Gemma2RotaryEmbedding
from transformers.models.llama.modeling_llama import LlamaAttention, LlamaRotaryEmbedding
from transformers.models.llama4.modeling_llama4 import Llama4TextAttention, Llama4TextRotaryEmbedding
from transformers.models.mixtral.modeling_mixtral import MixtralSparseMoeBlock
from transformers.models.modernbert.modeling_modernbert import ModernBertEncoderLayer, ModernBertRotaryEmbedding
from transformers.models.phi3.modeling_phi3 import Phi3DecoderLayer, Phi3RotaryEmbedding
from transformers.models.t5.modeling_t5 import T5LayerSelfAttention
from transformers.models.vit.modeling_vit import ViTEmbeddings, ViTLayer
from transformers.models.whisper.modeling_whisper import WhisperEncoder

import tracer
from tests.models.test_models import ATOL, MODELS, run


def compare(name: str, expected, tensors: dict, perturb: str) -> float:
    """The pipeline's ``out`` against ``expected``; then again with one weight nudged, which must differ."""
    out = run(name, **tensors)["out"].tensor
    diff = (out - expected).abs().max().item()
    assert out.shape == expected.shape and diff <= ATOL, diff
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


def gemma2_case(query_pre_attn_scalar: int = 8) -> tuple[torch.Tensor, dict]:
    """A random Gemma2DecoderLayer's output on random tokens, and the pipeline's tensors with its weights."""
    torch.manual_seed(0)
    config = Gemma2Config(
        hidden_size=16, num_attention_heads=2, num_key_value_heads=1, head_dim=8, intermediate_size=32, num_hidden_layers=2,
        query_pre_attn_scalar=query_pre_attn_scalar, attn_logit_softcapping=2.0, sliding_window=3, attn_implementation="eager",
    )  # fmt: skip
    layer = randomized(Gemma2DecoderLayer(config, layer_idx=0), -0.5, 0.5)
    assert layer.self_attn.sliding_window == 3 and layer.self_attn.scaling == query_pre_attn_scalar**-0.5
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
    return expected, {"x": x, **weights}


@torch.no_grad()
def test_gemma2_decoder_layer_equals_gemma2decoderlayer():
    expected, tensors = gemma2_case()
    compare("gemma2_decoder_layer.yaml", expected, tensors, "ln_post_attn")


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
def test_gpt2_lm_equals_gpt2lmheadmodel_on_a_padded_batch():
    config = GPT2Config(
        vocab_size=40, n_positions=16, n_embd=32, n_head=2, n_layer=2, bos_token_id=0, eos_token_id=0, attn_implementation="eager"
    )
    model = randomized(GPT2LMHeadModel(config))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias"):
                p.uniform_(-0.1, 0.1)  # they start at zero
    assert model.lm_head.weight is model.transformer.wte.weight  # tied: the pipeline reads wte twice
    t = model.transformer
    ids = torch.tensor([[5, 17, 3, 29, 11, 2], [8, 8, 31, 0, 0, 0]])  # the pipeline's values
    padding = torch.tensor([[1] * 6, [1] * 3 + [0] * 3])
    expected = model(ids, attention_mask=padding).logits
    weights = {"wte": t.wte.weight, "wpe": t.wpe.weight, "ln_f_w": t.ln_f.weight, "ln_f_b": t.ln_f.bias}
    for i, block in enumerate(t.h):
        a, m = block.attn, block.mlp
        weights |= {
            f"h/{i}/ln_1_w": block.ln_1.weight, f"h/{i}/ln_1_b": block.ln_1.bias, f"h/{i}/W_attn": a.c_attn.weight,
            f"h/{i}/b_attn": a.c_attn.bias, f"h/{i}/W_proj": a.c_proj.weight, f"h/{i}/b_proj": a.c_proj.bias,
            f"h/{i}/ln_2_w": block.ln_2.weight, f"h/{i}/ln_2_b": block.ln_2.bias, f"h/{i}/W_fc": m.c_fc.weight,
            f"h/{i}/b_fc": m.c_fc.bias, f"h/{i}/W_mproj": m.c_proj.weight, f"h/{i}/b_mproj": m.c_proj.bias,
        }  # fmt: skip
    keep = padding.bool()[:, None, None, :]
    trace = run("gpt2_lm.yaml", ids=ids, keep=keep, **weights)
    diff = (trace["logits"].tensor - expected).abs().max().item()
    print(f"gpt2_lm.yaml: max abs diff {diff:.3g}")
    assert diff <= ATOL
    nudged = run("gpt2_lm.yaml", ids=ids, keep=keep, **dict(weights, **{"h/1/b_attn": weights["h/1/b_attn"] + 0.05}))
    assert (nudged["logits"].tensor - expected).abs().max().item() > 1e-3
    unpadded = run("gpt2_lm.yaml", ids=ids, keep=torch.ones_like(keep), **weights)  # the padding mask matters
    assert (unpadded["logits"].tensor - expected).abs().max().item() > 1e-3


@torch.no_grad()
def test_deepseek_v3_mla_equals_deepseekv3attention_with_yarn():
    rope = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "original_max_position_embeddings": 8}
    config = DeepseekV3Config(
        hidden_size=32, num_attention_heads=2, num_key_value_heads=2, q_lora_rank=8, kv_lora_rank=8, qk_nope_head_dim=6,
        qk_rope_head_dim=4, v_head_dim=5, intermediate_size=32, moe_intermediate_size=8, n_routed_experts=8, num_hidden_layers=1,
        vocab_size=32, max_position_embeddings=32, rope_interleave=True, attn_implementation="eager",
        rope_parameters={**rope, "beta_fast": 32.0, "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 0.8},
    )  # fmt: skip
    attn = randomized(DeepseekV3Attention(config, layer_idx=0))
    assert attn.scaling == 0.3902588031658729  # the pipeline's multiplier: 10 ** -0.5 * mscale ** 2
    x = torch.randn(2, 6, 32)
    pos = torch.arange(6)[None].expand(2, -1)
    rotary = DeepseekV3RotaryEmbedding(config)
    assert rotary.attention_scaling != 1.0  # the yarn attention factor on cos and sin shows
    mask = create_causal_mask(config, x, None, None, position_ids=pos)
    expected, _ = attn(x, position_embeddings=rotary(x, pos), attention_mask=mask)
    weights = {
        "W_qa": attn.q_a_proj.weight, "ln_qa": attn.q_a_layernorm.weight, "W_qb": attn.q_b_proj.weight,
        "W_kva": attn.kv_a_proj_with_mqa.weight, "ln_kva": attn.kv_a_layernorm.weight, "W_kvb": attn.kv_b_proj.weight,
        "W_o": attn.o_proj.weight,
    }  # fmt: skip
    compare("deepseek_v3_mla.yaml", expected, {"x": x, **weights}, "W_kvb")


@torch.no_grad()
def test_phi3_decoder_layer_equals_phi3decoderlayer_with_partial_longrope():
    rope = {
        "rope_type": "longrope",
        "rope_theta": 10000.0,
        "partial_rotary_factor": 0.5,
        "short_factor": [1.0, 1.5],
        "long_factor": [2.0, 5.0],
    }
    config = Phi3Config(
        hidden_size=16, num_attention_heads=2, num_key_value_heads=1, intermediate_size=32, num_hidden_layers=1, vocab_size=32,
        max_position_embeddings=16, original_max_position_embeddings=4, rope_parameters=rope, pad_token_id=0, bos_token_id=1,
        eos_token_id=2, attn_implementation="eager",
    )  # fmt: skip
    layer = randomized(Phi3DecoderLayer(config, layer_idx=0))
    x = torch.randn(2, 6, 16)
    pos = torch.arange(6)[None].expand(2, -1)
    rotary = Phi3RotaryEmbedding(config)
    cos, sin = rotary(x, pos)
    assert cos.shape[-1] == 4 and rotary.attention_scaling == 2**0.5  # partial (R = 4 of Dh = 8), scaled
    mask = create_causal_mask(config, x, None, None, position_ids=pos)
    expected = layer(x, attention_mask=mask, position_ids=pos, position_embeddings=(cos, sin))
    weights = {
        "ln_in": layer.input_layernorm.weight, "W_qkv": layer.self_attn.qkv_proj.weight, "W_o": layer.self_attn.o_proj.weight,
        "ln_post": layer.post_attention_layernorm.weight, "W_gate_up": layer.mlp.gate_up_proj.weight,
        "W_down": layer.mlp.down_proj.weight,
    }  # fmt: skip
    compare("phi3_decoder_layer.yaml", expected, {"x": x, **weights}, "W_qkv")


@torch.no_grad()
def test_falcon_decoder_layer_equals_falcondecoderlayer_new_architecture():
    config = FalconConfig(
        hidden_size=16, num_attention_heads=4, num_kv_heads=2, new_decoder_architecture=True, num_hidden_layers=1, vocab_size=32,
        attn_implementation="eager",
    )  # fmt: skip
    layer = FalconDecoderLayer(config, layer_idx=0)
    assert config.num_ln_in_parallel_attn == 2 and not config.alibi  # two LayerNorms, rotary
    layer = randomized(layer)
    with torch.no_grad():
        for name, p in layer.named_parameters():
            if name.endswith("bias"):
                p.uniform_(-0.5, 0.5)  # the LayerNorm biases start at zero
    x = torch.randn(2, 6, 16)
    pos = torch.arange(6)[None].expand(2, -1)
    mask = create_causal_mask(config, x, None, None, position_ids=pos, allow_is_causal_skip=False)
    rope = FalconRotaryEmbedding(config)(x, pos)
    expected = layer(x, alibi=None, attention_mask=mask, position_ids=pos, position_embeddings=rope)[0]
    a = layer.self_attention
    weights = {
        "ln_attn_w": layer.ln_attn.weight, "ln_attn_b": layer.ln_attn.bias, "ln_mlp_w": layer.ln_mlp.weight,
        "ln_mlp_b": layer.ln_mlp.bias, "W_qkv": a.query_key_value.weight, "W_dense": a.dense.weight,
        "W_4h": layer.mlp.dense_h_to_4h.weight, "W_h": layer.mlp.dense_4h_to_h.weight,
    }  # fmt: skip
    compare("falcon_decoder_layer.yaml", expected, {"x": x, **weights}, "W_qkv")


@torch.no_grad()
def test_bart_cross_attention_equals_bartdecoderlayer_encoder_attn_with_source_padding():
    config = BartConfig(d_model=32, decoder_attention_heads=2, encoder_attention_heads=2, decoder_ffn_dim=32, encoder_ffn_dim=32,
                        vocab_size=40, max_position_embeddings=16, attn_implementation="eager")  # fmt: skip
    layer = randomized(BartDecoderLayer(config, layer_idx=0))
    with torch.no_grad():
        for name, p in layer.named_parameters():
            if name.endswith("bias"):
                p.uniform_(-0.5, 0.5)  # they start at zero
    x, enc = torch.randn(2, 5, 32), torch.randn(2, 7, 32)
    source = torch.tensor([[1] * 7, [1] * 4 + [0] * 3])  # the pipeline's padding
    mask = create_bidirectional_mask(config, x, source, encoder_hidden_states=enc)
    attn, norm = layer.encoder_attn, layer.encoder_attn_layer_norm
    expected = norm(x + attn(x, key_value_states=enc, attention_mask=mask)[0])
    weights = {"ln_w": norm.weight, "ln_b": norm.bias}
    for name, proj in (("q", attn.q_proj), ("k", attn.k_proj), ("v", attn.v_proj), ("o", attn.out_proj)):
        weights |= {f"W_{name}": proj.weight, f"b_{name}": proj.bias}
    compare("bart_cross_attention.yaml", expected, {"x": x, "enc": enc, **weights}, "W_k")  # (a key bias cancels in the softmax)
    keep = source.bool()[:, None, None, :]
    unmasked = run("bart_cross_attention.yaml", x=x, enc=enc, keep=torch.ones_like(keep), **weights)  # the padding matters
    assert (unmasked["out"].tensor - expected).abs().max().item() > 1e-3


@torch.no_grad()
def test_modernbert_local_layer_equals_modernbertencoderlayer_on_a_band_with_padding():
    config = ModernBertConfig(
        hidden_size=16, num_attention_heads=2, intermediate_size=24, num_hidden_layers=2, vocab_size=32, local_attention=4,
        layer_types=["full_attention", "sliding_attention"], pad_token_id=0, bos_token_id=1, eos_token_id=2, cls_token_id=1,
        sep_token_id=2, attn_implementation="eager",
    )  # fmt: skip
    layer = randomized(ModernBertEncoderLayer(config, layer_idx=1))
    x = torch.randn(2, 8, 16)
    padding = torch.tensor([[1] * 8, [1] * 5 + [0] * 3])  # the pipeline's
    mask = create_bidirectional_sliding_window_mask(config, x, padding)
    rope = ModernBertRotaryEmbedding(config)(x, torch.arange(8)[None], "sliding_attention")
    expected = layer(x, attention_mask=mask, position_embeddings=rope)
    weights = {
        "ln_attn": layer.attn_norm.weight, "W_qkv": layer.attn.Wqkv.weight, "W_o": layer.attn.Wo.weight,
        "ln_mlp": layer.mlp_norm.weight, "W_i": layer.mlp.Wi.weight, "W_mo": layer.mlp.Wo.weight,
    }  # fmt: skip
    compare("modernbert_local_layer.yaml", expected, {"x": x, **weights}, "W_qkv")
    keep = padding.bool()[:, None, None, :]
    wide = run("modernbert_local_layer.yaml", dims={"W": 8}, x=x, keep=keep, **weights)  # no band: the window matters
    assert (wide["out"].tensor - expected).abs().max().item() > 1e-3


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


def test_vit_embeddings_layer_equals_vitembeddings_then_vitlayer():
    torch.manual_seed(0)
    config = ViTConfig(
        hidden_size=16, num_attention_heads=2, intermediate_size=32, num_hidden_layers=1, image_size=8, patch_size=4,
        num_channels=3, attn_implementation="eager",
    )  # fmt: skip
    embeddings, layer = ViTEmbeddings(config).eval(), randomized(ViTLayer(config))
    pixels = torch.randn(2, 3, 8, 8)
    expected = layer(embeddings(pixels))
    a, projection = layer.attention, embeddings.patch_embeddings.projection
    weights = {
        "W_patch": projection.weight, "b_patch": projection.bias, "cls_token": embeddings.cls_token,
        "pos_emb": embeddings.position_embeddings,
        "ln1_w": layer.layernorm_before.weight, "ln1_b": layer.layernorm_before.bias,
        "W_q": a.q_proj.weight, "b_q": a.q_proj.bias, "W_k": a.k_proj.weight, "b_k": a.k_proj.bias,
        "W_v": a.v_proj.weight, "b_v": a.v_proj.bias, "W_o": a.o_proj.weight, "b_o": a.o_proj.bias,
        "ln2_w": layer.layernorm_after.weight, "ln2_b": layer.layernorm_after.bias,
        "W_fc1": layer.mlp.fc1.weight, "b_fc1": layer.mlp.fc1.bias, "W_fc2": layer.mlp.fc2.weight, "b_fc2": layer.mlp.fc2.bias,
    }  # fmt: skip
    compare("vit_embeddings_layer.yaml", expected, {"pixels": pixels, **weights}, "W_patch")
    # the patches are tokens in row-major order: a mirrored image is a different sequence
    mirrored = run("vit_embeddings_layer.yaml", pixels=pixels.flip(-1), **weights)
    assert (mirrored["out"].tensor - expected).abs().max().item() > 1e-3


@torch.no_grad()
def test_mixtral_sparse_moe_equals_mixtralsparsemoeblock():
    torch.manual_seed(0)
    config = MixtralConfig(
        hidden_size=16, intermediate_size=12, num_local_experts=4, num_experts_per_tok=2, num_hidden_layers=1,
        attn_implementation="eager", experts_implementation="eager",
    )  # fmt: skip
    block = MixtralSparseMoeBlock(config).eval()
    for weight in (block.gate.weight, block.experts.gate_up_proj, block.experts.down_proj):
        torch.nn.init.normal_(weight, std=0.5)  # standalone, they are torch.empty: garbage
    x = torch.randn(2, 5, 16)
    expected = block(x)
    weights = {"W_router": block.gate.weight, "W_gate_up": block.experts.gate_up_proj, "W_down": block.experts.down_proj}
    trace = run("mixtral_sparse_moe.yaml", x=x, **weights)
    assert torch.equal(trace["out"].tensor, expected)  # the same ops in the same order: bit for bit
    compare("mixtral_sparse_moe.yaml", expected, {"x": x, **weights}, "W_down")
    _, _, chosen = block.gate(x)
    assert trace["top_i"].tensor.tolist() == chosen.tolist()
    assert trace["experts/tokens_per_expert"].tensor.tolist() == torch.bincount(chosen.flatten(), minlength=4).tolist()
    # routing matters: the router nudged sends tokens elsewhere
    nudged = run("mixtral_sparse_moe.yaml", x=x, **dict(weights, W_router=weights["W_router"].flip(0)))
    assert (nudged["out"].tensor - expected).abs().max().item() > 1e-3


@torch.no_grad()
def test_whisper_encoder_equals_whisperencoder_with_one_layer():
    torch.manual_seed(0)
    config = WhisperConfig(
        d_model=16, encoder_attention_heads=2, encoder_ffn_dim=32, encoder_layers=1, num_mel_bins=4, max_source_positions=4,
        decoder_layers=1, decoder_attention_heads=2, decoder_ffn_dim=32, attn_implementation="eager",
    )  # fmt: skip
    encoder = randomized(WhisperEncoder(config))
    features = torch.randn(2, 4, 8)  # max_source_positions * conv1.stride * conv2.stride frames
    expected = encoder(features).last_hidden_state
    a, layer = encoder.layers[0].self_attn, encoder.layers[0]
    weights = {
        "W_conv1": encoder.conv1.weight, "b_conv1": encoder.conv1.bias, "W_conv2": encoder.conv2.weight,
        "b_conv2": encoder.conv2.bias, "pos_table": encoder.embed_positions.weight,
        "ln1_w": layer.self_attn_layer_norm.weight, "ln1_b": layer.self_attn_layer_norm.bias,
        "W_q": a.q_proj.weight, "b_q": a.q_proj.bias, "W_k": a.k_proj.weight, "W_v": a.v_proj.weight, "b_v": a.v_proj.bias,
        "W_o": a.out_proj.weight, "b_o": a.out_proj.bias,
        "ln2_w": layer.final_layer_norm.weight, "ln2_b": layer.final_layer_norm.bias,
        "W_fc1": layer.fc1.weight, "b_fc1": layer.fc1.bias, "W_fc2": layer.fc2.weight, "b_fc2": layer.fc2.bias,
        "lnf_w": encoder.layer_norm.weight, "lnf_b": encoder.layer_norm.bias,
    }  # fmt: skip
    assert a.k_proj.bias is None
    # a weight nudged by a constant: W_fc1, as the final LayerNorm cancels a shift of every channel alike
    compare("whisper_encoder.yaml", expected, {"features": features, **weights}, "W_fc1")
    # the frames' order matters (convolutions and positions): reversed, they are another sequence
    reversed_frames = run("whisper_encoder.yaml", features=features.flip(-1), **weights)
    assert (reversed_frames["out"].tensor - expected).abs().max().item() > 1e-3
