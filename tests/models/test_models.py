"""The bundled model pipelines equal transformers' own modules (small random configs, no download)."""

import pytest
import torch
from transformers import BertConfig, GPT2Config, LlamaConfig, MistralConfig  # noqa: E402
from transformers.cache_utils import DynamicCache  # noqa: E402
from transformers.masking_utils import (  # noqa: E402
    create_bidirectional_mask,
    create_causal_mask,
    create_sliding_window_causal_mask,
)
from transformers.models.bert.modeling_bert import BertSelfAttention, BertSelfOutput  # noqa: E402
from transformers.models.gpt2.modeling_gpt2 import GPT2Attention  # noqa: E402
from transformers.models.llama.modeling_llama import LlamaAttention, LlamaDecoderLayer, LlamaRotaryEmbedding  # noqa: E402
from transformers.models.mistral.modeling_mistral import MistralAttention, MistralRotaryEmbedding  # noqa: E402

import tracer
from tests.conftest import PIPELINES

ATOL = 1e-5


MODELS = PIPELINES / "models"


def run(name, dims=None, **tensors):
    return tracer.load(MODELS / name).run(dims=dims, tensors=tensors, keep_values=True)


def assert_close(actual, expected):
    diff = (actual - expected).abs().max().item()
    assert actual.shape == expected.shape and diff <= ATOL, diff


def eager(config):
    config._attn_implementation = "eager"
    return config


def randomize(module):
    """Random norm weights too (they start at ones), so a mixed-up weight cannot pass."""
    torch.manual_seed(1)
    with torch.no_grad():
        for name, p in module.named_parameters():
            if "norm" in name.lower():
                p.uniform_(0.5, 1.5)
    return module.eval()


def llama_config(**extra):
    common = dict(hidden_size=16, num_attention_heads=4, num_key_value_heads=2, intermediate_size=32, rms_norm_eps=1e-6)
    return eager(LlamaConfig(**common, **extra))


def positions(x, start=0):
    return torch.arange(start, start + x.shape[1])[None].expand(x.shape[0], -1)


def attention_weights(attn):
    return {"W_q": attn.q_proj.weight, "W_k": attn.k_proj.weight, "W_v": attn.v_proj.weight, "W_o": attn.o_proj.weight}


@pytest.fixture(scope="module")
def llama_layer():
    torch.manual_seed(0)
    config = llama_config()
    assert config.rope_parameters["rope_theta"] == 10000.0  # the pipeline's theta
    return config, randomize(LlamaDecoderLayer(config, layer_idx=0)), LlamaRotaryEmbedding(config)


@torch.no_grad()
def test_gpt2_attention_equals_gpt2attention():
    config = eager(GPT2Config(n_embd=8, n_head=2, n_layer=1, attn_pdrop=0.0, resid_pdrop=0.0))
    attn = randomize(GPT2Attention(config, layer_idx=0))
    x = torch.randn(2, 6, 8)
    mask = create_causal_mask(config, x, None, None, position_ids=positions(x), allow_is_causal_skip=False)
    expected, _ = attn(x, attention_mask=mask)
    t = run(
        "gpt2_attention.yaml", x=x, W_attn=attn.c_attn.weight, b_attn=attn.c_attn.bias, W_proj=attn.c_proj.weight, b_proj=attn.c_proj.bias
    )
    assert_close(t["out"].tensor, expected)


@torch.no_grad()
def test_llama_decoder_layer_equals_llamadecoderlayer(llama_layer):
    config, layer, rotary = llama_layer
    x = torch.randn(2, 6, 16)
    position_ids = positions(x)
    mask = create_causal_mask(config, x, None, None, position_ids=position_ids, allow_is_causal_skip=False)
    expected = layer(x, attention_mask=mask, position_ids=position_ids, position_embeddings=rotary(x, position_ids))
    mlp = layer.mlp
    weights = attention_weights(layer.self_attn) | {
        "ln_1": layer.input_layernorm.weight,
        "ln_2": layer.post_attention_layernorm.weight,
        "W_gate": mlp.gate_proj.weight,
        "W_up": mlp.up_proj.weight,
        "W_down": mlp.down_proj.weight,
    }
    t = run("llama_decoder_layer.yaml", x=x, **weights)
    assert_close(t["out"].tensor, expected)


@torch.no_grad()
@pytest.mark.parametrize("new", [1, 3])
def test_kv_cache_decode_equals_llamaattention_with_a_dynamic_cache(llama_layer, new):
    """T=1 is a decode step; T=3 a chunked prefill, where the bottom-right alignment shows."""
    config, layer, rotary = llama_layer
    attn, past = layer.self_attn, 5
    x, k_cache, v_cache = torch.randn(2, new, 16), torch.randn(2, 2, past, 4), torch.randn(2, 2, past, 4)
    cache = DynamicCache(config=config)
    cache.update(k_cache.clone(), v_cache.clone(), 0)
    position_ids = positions(x, past)
    mask = create_causal_mask(config, x, None, cache, position_ids=position_ids, allow_is_causal_skip=False)
    expected, _ = attn(x, position_embeddings=rotary(x, position_ids), attention_mask=mask, past_key_values=cache)
    t = run("kv_cache_decode.yaml", dims={"T": new}, x=x, k_cache=k_cache, v_cache=v_cache, **attention_weights(attn))
    assert_close(t["out"].tensor, expected)
    assert_close(t["k_all"].tensor, cache.layers[0].keys)


@torch.no_grad()
def test_llama_attention_alone_equals_the_layers_attention(llama_layer):
    """LlamaAttention on its own (no norms, no MLP) against the decode pipeline's math at past=0."""
    config, layer, rotary = llama_layer
    attn = LlamaAttention(config, layer_idx=0).eval()
    attn.load_state_dict(layer.self_attn.state_dict())
    x = torch.randn(2, 4, 16)
    position_ids = positions(x)
    mask = create_causal_mask(config, x, None, None, position_ids=position_ids, allow_is_causal_skip=False)
    expected, _ = attn(x, position_embeddings=rotary(x, position_ids), attention_mask=mask)
    empty = torch.zeros(2, 2, 0, 4)
    t = run("kv_cache_decode.yaml", dims={"past": 0, "T": 4}, x=x, k_cache=empty, v_cache=empty, **attention_weights(attn))
    assert_close(t["out"].tensor, expected)


@torch.no_grad()
def test_mistral_sliding_window_equals_mistralattention():
    torch.manual_seed(0)
    common = dict(hidden_size=16, num_attention_heads=4, num_key_value_heads=2, intermediate_size=32, sliding_window=3)
    config = eager(MistralConfig(**common))
    attn = MistralAttention(config, layer_idx=0).eval()
    x = torch.randn(2, 8, 16)
    position_ids = positions(x)
    mask = create_sliding_window_causal_mask(config, x, None, None, position_ids=position_ids, allow_is_causal_skip=False)
    expected, _ = attn(x, position_embeddings=MistralRotaryEmbedding(config)(x, position_ids), attention_mask=mask)
    t = run("mistral_sliding_window.yaml", x=x, **attention_weights(attn))
    assert_close(t["out"].tensor, expected)
    without_window = tracer.loads((MODELS / "mistral_sliding_window.yaml").read_text().replace(", window: W", ""), "m.yaml")
    plain = without_window.run(tensors={"x": x, **attention_weights(attn)}, keep_values=True)
    assert (plain["out"].tensor - expected).abs().max() > 1e-3  # the window changes the result


@torch.no_grad()
def test_bert_self_attention_equals_bertselfattention_and_selfoutput():
    torch.manual_seed(0)
    config = eager(
        BertConfig(hidden_size=8, num_attention_heads=2, intermediate_size=16, attention_probs_dropout_prob=0.0, hidden_dropout_prob=0.0)
    )
    attn, output = BertSelfAttention(config).eval(), randomize(BertSelfOutput(config))
    x = torch.randn(2, 6, 8)
    attention_mask = torch.tensor([[1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 0, 0]])
    mask = create_bidirectional_mask(config, x, attention_mask, allow_is_bidirectional_skip=False)
    context, _ = attn(x, attention_mask=mask)
    expected = output(context, x)
    weights = {}
    for name, layer in (("q", attn.query), ("k", attn.key), ("v", attn.value), ("o", output.dense)):
        weights |= {f"W_{name}": layer.weight, f"b_{name}": layer.bias}
    t = run(
        "bert_self_attention.yaml", x=x, attention_mask=attention_mask, ln_w=output.LayerNorm.weight, ln_b=output.LayerNorm.bias, **weights
    )
    assert_close(t["out"].tensor, expected)
    assert t["weights"].tensor[1, :, :, 4:].abs().max() == 0  # padding keys get no weight
