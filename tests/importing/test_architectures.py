"""Architectures beyond Llama and GPT-2, as their public code builds them (benchmarks/import_sweep.py
makes them: transformers models from tiny random configs, torch's TransformerDecoderLayer): each
imports into a pipeline that checks clean under ``--strict`` and runs equal to the module on its
weights. One layer each and the rows the issue asks for, for time (capturing is the slow part); the
sweep over every family (BART, Gemma, GPT-NeoX, Phi-3, Qwen2 too) and both attention
implementations is the table in docs/import.md."""

import pytest
import yaml

from benchmarks.import_sweep import build
from tracer.importing import difference, from_module

CASES = {
    # (family, attention): a step the file must have besides running equal
    ("mistral", "eager"): {"op": "mask", "causal": True, "window": "W"},  # config.sliding_window = 4 < T
    ("bert", "eager"): {"op": "cast", "dtype": "bool"},  # the padding mask, made bool and broadcast over the queries
    ("decoder_layer", "torch"): {"op": "sdpa", "causal": True},  # cross-attention: nn.MultiheadAttention on memory
}


@pytest.mark.parametrize(("family", "attention"), list(CASES))
def test_architecture_imports_checks_clean_and_runs_equal(family, attention):
    if family != "decoder_layer":
        pytest.importorskip("transformers")
    module, args, kwargs = build(family, attention, layers=1)
    pipeline = from_module(module, *args, name=family, **kwargs)
    assert difference(pipeline, module, *args, **kwargs) <= 1e-5
    assert [str(d) for d in pipeline.check().diagnostics if d.severity in ("error", "warning")] == []
    steps = [step for text in pipeline.files.values() for step in yaml.safe_load(text)["steps"]]
    expected = CASES[family, attention]
    assert any(expected.items() <= step.items() for step in steps), expected
