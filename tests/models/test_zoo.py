"""The zoo pipelines equal transformers' own modules (small random configs, weights copied in), and
a perturbed weight changes the result (the comparison can fail)."""

import torch
from transformers import Gemma2Config, LlamaConfig, MixtralConfig, ViTConfig, WhisperConfig
from transformers.masking_utils import create_causal_mask, create_sliding_window_causal_mask, find_packed_sequence_indices
from transformers.models.gemma2.modeling_gemma2 import Gemma2DecoderLayer, Gemma2RotaryEmbedding
from transformers.models.llama.modeling_llama import LlamaAttention, LlamaRotaryEmbedding
from transformers.models.mixtral.modeling_mixtral import MixtralSparseMoeBlock
from transformers.models.vit.modeling_vit import ViTEmbeddings, ViTLayer
from transformers.models.whisper.modeling_whisper import WhisperEncoder

from tests.models.test_models import ATOL, run


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
