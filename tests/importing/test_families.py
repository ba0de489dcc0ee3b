"""The families the issue names as failing their own ``--strict`` or needing padded and windowed
masks, each as transformers builds it from a tiny random config with its defaults (``use_cache``
on): Granite (multipliers), Gemma 2 (softcapped scores, ``query_pre_attn_scalar``), Cohere, Phi,
and Qwen2 with sliding-window layers on a padded batch. One layer each: every one imports into a
file that checks clean under ``--strict``, has the step its idiom is, and runs equal to the model."""

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


def test_qwen2_sliding_window_layers_on_a_padded_batch_are_causal_window_and_padding():
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.Qwen2Config(
        num_hidden_layers=1, num_key_value_heads=2, use_sliding_window=True, sliding_window=4, max_window_layers=0, **SIZES
    )
    config._attn_implementation = "eager"
    config.layer_types = ["sliding_attention"]
    model = transformers.Qwen2Model(config).eval()
    mask = (torch.arange(T) < torch.tensor([[T], [4]])).long()  # the second sequence ends after 4 tokens
    steps = _clean_and_equal(model, (torch.randint(1, 64, (B, T)),), {"attention_mask": mask}, "qwen2")
    expected = {"op": "mask", "causal": True, "window": "W", "mask": "padding_mask", "polarity": "keep", "fill": "min"}
    assert any(expected.items() <= step.items() for step in steps), [s for s in steps if s["op"] == "mask"]
