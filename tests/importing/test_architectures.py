"""Architectures beyond Llama and GPT-2, as their public code builds them (benchmarks/import_sweep.py
makes them: transformers models from tiny random configs, torch's TransformerDecoderLayer): each
imports into a pipeline that checks clean under ``--strict`` and runs equal to the module on its
weights. One layer each and the rows the issue asks for, for time (capturing is the slow part); the
sweep over every family (BART, Gemma, GPT-NeoX, Phi-3, Qwen2 too) and both attention
implementations is the table in docs/import.md."""

import pytest
import yaml

from tests.importing.sweep_rows import imported_row
from tracer.importing import difference

CASES = {
    # (family, attention): steps the file must have besides running equal
    ("mistral", "eager"): [{"op": "mask", "causal": True, "window": "W"}],  # config.sliding_window = 4 < T
    ("bert", "eager"): [{"op": "cast", "dtype": "bool"}],  # the padding mask, made bool and broadcast over the queries
    ("decoder_layer", "torch"): [{"op": "sdpa", "causal": True}],  # cross-attention: nn.MultiheadAttention on memory
    # a padded batch, use_cache left on: masking_utils' causal-and-padding mask, named as a person would
    ("llama", "eager"): [
        {"op": "mask", "causal": True, "mask": "padding_mask", "polarity": "keep", "fill": "min"},
        {"id": "layers.0.mlp.down_proj", "op": "linear"},  # not the product before it
        {"id": "layers.0.self_attn.k_embed_repeated", "op": "repeat_interleave"},
        {"op": "scale", "multiply": {"rsqrt": "Dh"}},  # head_dim ** -0.5, bit for bit
    ],
    ("qwen3", "sdpa"): [{"op": "sdpa", "causal": True, "window": "W", "mask": "padding_mask", "polarity": "keep"}],
}
LAYERS = {("qwen3", "sdpa"): 2}  # every layer reads the one padded mask masking_utils makes


@pytest.mark.parametrize(("family", "attention"), list(CASES))
def test_architecture_imports_checks_clean_and_runs_equal(family, attention):
    if family != "decoder_layer":
        pytest.importorskip("transformers")
    module, args, kwargs, pipeline = imported_row(family, attention, LAYERS.get((family, attention), 1))
    assert difference(pipeline, module, *args, **kwargs) <= 1e-5
    assert [str(d) for d in pipeline.check().diagnostics if d.severity in ("error", "warning")] == []
    steps = [step for text in pipeline.files.values() for step in yaml.safe_load(text)["steps"]]
    for expected in CASES[family, attention]:
        assert any(expected.items() <= step.items() for step in steps), expected
    if family != "decoder_layer":  # the config's use_cache (True by default) was off for the capture only
        assert module.config.use_cache is True and "use_cache was off" in next(iter(pipeline.files.values()))
