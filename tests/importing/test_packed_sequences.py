"""Packed sequences: transformers' Llama given ``position_ids`` that restart at each document (Llama
3.1's packed training batches). masking_utils finds the documents with
``torch.diff(position_ids, prepend=position_ids[:, :1] - 1)``, which imports as the ``cat`` it
differences and a ``diff``; the rotary table of those positions (llama3-scaled frequencies, a
computed constant) is read by the module's own ops."""

import pytest
import torch
import yaml

from tracer.importing import difference, from_module

transformers = pytest.importorskip("transformers")


def test_a_llama_given_packed_position_ids_imports_clean_folded_and_equal():
    torch.manual_seed(0)
    rope = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 4}
    config = transformers.LlamaConfig(
        hidden_size=32, intermediate_size=48, num_attention_heads=4, num_key_value_heads=2, num_hidden_layers=2, vocab_size=64,
        rope_parameters={**rope, "rope_theta": 500000.0},
    )  # fmt: skip
    config._attn_implementation = "eager"
    model = transformers.LlamaModel(config).eval()
    # T = 8 = Dh: the attention's product (B, H, T, T) @ (B, H, T, Dh) keeps T and Dh apart
    ids, positions = torch.randint(0, 64, (2, 8)), torch.tensor([[0, 1, 2, 0, 1, 2, 3, 0], [0, 1, 2, 3, 4, 5, 6, 7]])
    pipeline = from_module(model, ids, position_ids=positions)
    assert difference(pipeline, model, ids, position_ids=positions) <= 1e-5
    assert not [d for d in pipeline.check().diagnostics if d.severity in ("error", "warning")]
    assert [(s.id, s.repeat) for s in pipeline.spec.steps if s.op == "block"] == [("layers", 2)]
    steps = yaml.safe_load(pipeline.files["LlamaModel.yaml"])["steps"]
    (diffed,) = [s for s in steps if s["op"] == "diff"]
    (joined,) = [s for s in steps if s["id"] == diffed["input"]]
    assert diffed["id"] == "position_diff" and diffed["dim"] == -1  # masking_utils' variable
    assert joined["op"] == "cat" and joined["id"] == "position_diff_joined" and joined["inputs"][1] == "position_ids"
