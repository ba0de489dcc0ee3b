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
