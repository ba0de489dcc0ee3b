"""Rotary tables transformers computes from constants (``ROPE_INIT_FUNCTIONS``): each rope variant
of a small random-config model imports to the ``rope`` step with the ``rope_scaling`` of its
config, checks clean under ``--strict`` and runs equal to the module on its weights; so does a
half-precision model, whose table is float32's cos and sin rounded to the model's dtype."""

import pytest
import torch
import yaml

from tracer.importing import difference, from_module

transformers = pytest.importorskip("transformers")

SIZES = {"hidden_size": 16, "intermediate_size": 40, "num_hidden_layers": 1, "num_attention_heads": 2, "vocab_size": 32}
THETA = 10000.0
# rope_parameters (the config's), the rope_scaling the file must write
VARIANTS = {
    "linear": ({"rope_type": "linear", "factor": 2.0}, {"type": "linear", "factor": 2.0}),
    # positions 0..6 pass max_position_embeddings (4): transformers recomputes inv_freq at that length
    "dynamic": ({"rope_type": "dynamic", "factor": 2.0}, {"type": "dynamic", "factor": 2.0, "max_position_embeddings": 4}),
    "llama3": (
        {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 4},
        {"type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 4},
    ),
    "yarn": (  # attention_factor 0.1 ln(4) + 1 multiplies cos and sin
        {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 4},
        {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 4},
    ),
    "longrope": (  # Phi-3: the long factors, as positions pass original_max_position_embeddings
        {
            "rope_type": "longrope",
            "short_factor": [1.0, 1.5, 2.0, 2.5],
            "long_factor": [2.0, 3.0, 4.0, 5.0],
            "original_max_position_embeddings": 4,
        },
        {
            "type": "longrope",
            "short_factor": [1.0, 1.5, 2.0, 2.5],
            "long_factor": [2.0, 3.0, 4.0, 5.0],
            "original_max_position_embeddings": 4,
        }
        | {"factor": 4.0},  # max_position_embeddings / original_max_position_embeddings, as transformers reads it
    ),
}


def model(variant: str, dtype: torch.dtype = torch.float32):
    torch.manual_seed(0)
    parameters = {**VARIANTS[variant][0], "rope_theta": THETA}
    context = 4 if variant == "dynamic" else 16
    if variant == "longrope":
        config = transformers.Phi3Config(
            **SIZES,
            num_key_value_heads=1,
            max_position_embeddings=context,
            original_max_position_embeddings=4,
            rope_parameters=parameters,
            pad_token_id=0,
        )
        model_class = transformers.Phi3Model
    else:
        config = transformers.LlamaConfig(**SIZES, num_key_value_heads=1, max_position_embeddings=context, rope_parameters=parameters)
        model_class = transformers.LlamaModel
    config._attn_implementation = "eager"
    return model_class(config).eval().to(dtype), torch.randint(0, 32, (2, 7))


def ropes(pipeline) -> list[dict]:
    return [step for text in pipeline.files.values() for step in yaml.safe_load(text)["steps"] if step["op"] == "rope"]


def assert_clean_and_equal(pipeline, module, ids, tolerance=1e-5):
    assert [str(d) for d in pipeline.check().diagnostics if d.severity in ("error", "warning")] == []
    assert difference(pipeline, module, ids) <= tolerance


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_a_computed_rotary_table_imports_as_rope_with_its_scaling(variant):
    module, ids = model(variant)
    rotary = module.rotary_emb
    before = (rotary.inv_freq.clone(), set(vars(rotary)))
    pipeline = from_module(module, ids, name=variant)
    # the capture leaves the rotary embedding as it was (dynamic's settled buffer, LongRoPE's cached frequencies)
    assert torch.equal(rotary.inv_freq, before[0]) and set(vars(rotary)) == before[1]
    assert_clean_and_equal(pipeline, module, ids)
    steps = ropes(pipeline)
    assert len(steps) == 2 and all(s["theta"] == THETA and s["rope_scaling"] == VARIANTS[variant][1] for s in steps)


def test_gemma3_reads_the_rope_of_each_layer_type():
    """Gemma 3: rope_parameters per layer type, linear scaling on the global layers only."""
    torch.manual_seed(0)
    rope = {
        "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1e6},
        "sliding_attention": {"rope_type": "default", "rope_theta": THETA},
    }
    config = transformers.Gemma3TextConfig(
        **{**SIZES, "num_hidden_layers": 2}, num_key_value_heads=1, head_dim=8, sliding_window=4,
        layer_types=["sliding_attention", "full_attention"], rope_parameters=rope,
    )  # fmt: skip
    config._attn_implementation = "eager"
    module, ids = transformers.Gemma3TextModel(config).eval(), torch.randint(0, 32, (2, 7))
    pipeline = from_module(module, ids, name="gemma3")
    assert_clean_and_equal(pipeline, module, ids)
    written = {(s["theta"], str(s.get("rope_scaling"))) for s in ropes(pipeline)}
    assert written == {(THETA, "None"), (1e6, str({"type": "linear", "factor": 8.0}))}


def test_longrope_imports_twice_and_leaves_no_frequencies_of_the_capture_on_the_module():
    """LongRoPE caches its long frequencies on the module during forward; made under the capture's
    fake tensors, they broke every later capture of the same module."""
    module, ids = model("longrope")
    for _ in range(2):
        pipeline = from_module(module, ids)
        assert "long_inv_freq" not in vars(module.rotary_emb)
    assert difference(pipeline, module, ids) <= 1e-5


@pytest.mark.parametrize(("variant", "dtype"), [("llama3", torch.float16), ("yarn", torch.bfloat16)])
def test_a_half_precision_model_imports_its_rounded_rotary_table(variant, dtype):
    module, ids = model(variant, dtype)
    pipeline = from_module(module, ids, name=variant)
    assert_clean_and_equal(pipeline, module, ids)
    assert pipeline.spec.params["layers.0.self_attn.q_proj.weight"].dtype == str(dtype).removeprefix("torch.")
    assert all(s["rope_scaling"] == VARIANTS[variant][1] for s in ropes(pipeline))


class _DecodeStep(torch.nn.Module):
    """A KV-cache decode step as LlamaAttention computes its rotation: the new tokens' positions
    start at the cache's length (transformers' ``cache_position``), transformers'
    ``LlamaRotaryEmbedding`` makes cos and sin at those positions and ``apply_rotary_pos_emb``
    rotates q and k; the keys join the cache."""

    def __init__(self, heads: int = 4, kv_heads: int = 2, width: int = 32):
        super().__init__()
        from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

        config = transformers.LlamaConfig(hidden_size=width, num_attention_heads=heads, num_key_value_heads=kv_heads)
        self.rotary_emb, self.head_dim = LlamaRotaryEmbedding(config), width // heads
        self.q_proj = torch.nn.Linear(width, width, bias=False)
        self.k_proj = torch.nn.Linear(width, self.head_dim * kv_heads, bias=False)

    def forward(self, x, k_cache):
        from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

        past = k_cache.shape[2]
        position_ids = torch.arange(past, past + x.shape[1]).unsqueeze(0)
        cos, sin = self.rotary_emb(x, position_ids)
        q = self.q_proj(x).view(*x.shape[:2], -1, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(*x.shape[:2], -1, self.head_dim).transpose(1, 2)
        q, k = apply_rotary_pos_emb(q, k, cos, sin)
        return q, torch.cat([k_cache, k], dim=2)


@pytest.mark.parametrize("new_tokens", [1, 3])
def test_a_decode_steps_rotary_table_imports_as_rope_at_offset_past(new_tokens):
    """One new token (T = 1) makes a table of one row, position past: its angles and the
    ``inv_freq`` buffer say theta, and the cache's length is the offset; a prefill of 3 more tokens
    likewise. Written ``rope offset: past``, not a table of values: it runs at other cache lengths."""
    torch.manual_seed(0)
    module = _DecodeStep()
    args = (torch.randn(2, new_tokens, 32), torch.randn(2, 2, 5, 8))  # a batch of 2 beside 2 kv heads
    pipeline = from_module(module, *args)
    assert difference(pipeline, module, *args) <= 1e-5
    assert not pipeline.check().diagnostics
    ropes = [s for s in pipeline.spec.steps if s.op == "rope"]
    assert [(s.offset, s.theta) for s in ropes] == [("past", THETA)] * 2
    assert not [name for name, decl in pipeline.spec.params.items() if decl.values is not None]  # no table of values
    # the cache's heads axis is joined to the new keys' 2 heads: H_kv, not the batch of the same size
    assert pipeline.spec.inputs["k_cache"].shape == ["B", "H_kv", "past", "Dh"]
    longer = {"x": torch.randn(2, new_tokens, 32), "k_cache": torch.randn(2, 2, 9, 8)}  # 9 cached tokens
    trace = pipeline.run(params=module.state_dict(), inputs=longer, dims={"past": 9}, keep_values=True)
    with torch.no_grad():
        expected = module(*longer.values())
    torch.testing.assert_close(trace[pipeline.spec.outputs[0]].tensor, expected[0], atol=1e-5, rtol=0)
