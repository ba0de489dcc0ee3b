"""The families the issue names as failing their own ``--strict`` or needing padded and windowed
masks, each as transformers builds it from a tiny random config with its defaults (``use_cache``
on): Granite (multipliers), Gemma 2 (softcapped scores, ``query_pre_attn_scalar``), Cohere, Phi,
and Qwen2 (eager) and Mistral (sdpa) with sliding-window layers on a padded batch. One layer
each: every one imports into a file that checks clean under ``--strict``, has the step its idiom
is, and runs equal to the model."""

import pytest
import torch
import yaml

from benchmarks.import_sweep import SIZES, B, T, build
from tracer.importing import difference, from_module

CASES = {
    "granite": [{"op": "scale", "multiply": 0.0078125}, {"op": "scale", "multiply": 0.22}],  # attention and residual multipliers
    "gemma2": [{"op": "softcap"}, {"op": "rmsnorm", "unit_offset": True}],
    "cohere": [{"op": "rope", "style": "interleaved"}],
    "phi": [{"op": "rope"}, {"op": "gelu", "approximate": "tanh"}],
}


def _clean_and_equal(module, args, kwargs, name):
    pipeline = from_module(module, *args, name=name, **kwargs)
    assert difference(pipeline, module, *args, **kwargs) <= 1e-5
    assert [str(d) for d in pipeline.check().diagnostics if d.severity in ("error", "warning")] == []
    assert module.config.use_cache is True  # the default, off for the capture only
    return [step for text in pipeline.files.values() for step in yaml.safe_load(text)["steps"]]


@pytest.mark.parametrize("family", list(CASES))
def test_family_imports_clean_under_strict_and_runs_equal(family):
    pytest.importorskip("transformers")
    module, args, kwargs = build(family, "eager", layers=1)
    steps = _clean_and_equal(module, args, kwargs, family)
    for expected in CASES[family]:
        assert any(expected.items() <= step.items() for step in steps), (expected, [s["op"] for s in steps])


WINDOWED = {  # a sliding window of 4 < T on a padded batch, eager and sdpa: the pattern and the padding in one step
    ("Qwen2", "eager"): {"op": "mask", "causal": True, "window": "W", "mask": "padding_mask", "polarity": "keep", "fill": "min"},
    ("Mistral", "sdpa"): {"op": "sdpa", "causal": True, "window": "W", "mask": "padding_mask", "polarity": "keep"},
}


@pytest.mark.parametrize(("family", "attention"), list(WINDOWED))
def test_sliding_window_layers_on_a_padded_batch_are_causal_window_and_padding(family, attention):
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    window = {"use_sliding_window": True, "max_window_layers": 0} if family == "Qwen2" else {}
    config = getattr(transformers, f"{family}Config")(num_hidden_layers=1, num_key_value_heads=2, sliding_window=4, **window, **SIZES)
    config._attn_implementation = attention
    config.layer_types = ["sliding_attention"]
    model = getattr(transformers, f"{family}Model")(config).eval()
    mask = (torch.arange(T) < torch.tensor([[T], [4]])).long()  # the second sequence ends after 4 tokens
    steps = _clean_and_equal(model, (torch.randint(1, 64, (B, T)),), {"attention_mask": mask}, family.lower())
    expected = WINDOWED[family, attention]
    assert any(expected.items() <= step.items() for step in steps), [s for s in steps if s["op"] in ("mask", "sdpa")]
