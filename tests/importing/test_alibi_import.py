"""Bloom end to end: its ALiBi (``build_alibi_tensor``'s constant slopes times key positions, added
by ``alibi.baddbmm(q, k)`` to (B·H, T, T) scores) imports as ``bmm`` → ``scale`` → the module's
view as (B, H, T, T) → ``alibi``, its (B, H, T, Dh) → (B·H, T, Dh) reshapes keep their dims in
order (``B * H``, not a merge of heads), and the file checks clean and runs equal."""

import pytest
import torch
import yaml

from tracer.importing import difference, from_module

transformers = pytest.importorskip("transformers")


def bloom(layers: int = 1):
    torch.manual_seed(0)
    config = transformers.BloomConfig(hidden_size=24, n_layer=layers, n_head=4, vocab_size=32)  # Dh 6: no size twice
    config._attn_implementation = "eager"  # Bloom has no sdpa path
    return transformers.BloomModel(config).eval(), torch.randint(0, 32, (2, 7))


def test_bloom_alibi_imports_as_the_alibi_step_and_runs_equal():
    module, ids = bloom()
    pipeline = from_module(module, ids, name="bloom")
    assert [str(d) for d in pipeline.check().diagnostics if d.severity in ("error", "warning")] == []
    assert difference(pipeline, module, ids) <= 1e-5
    steps = {s["id"]: s for text in pipeline.files.values() for s in yaml.safe_load(text)["steps"]}
    attention = "h.0.self_attention."
    assert steps[attention + "attention_scores"] == {
        "id": attention + "attention_scores",
        "op": "alibi",
        "input": attention + "attention_scores_heads",
    }
    assert steps[attention + "attention_scores_heads"]["shape"] == ["B", "H", "T", "T"]
    scaled = steps[attention + "attention_scores_scaled"]  # inv_norm_factor = 1 / sqrt(head_dim)
    assert scaled.get("divide") == {"sqrt": "Dh"} or scaled.get("multiply") == {"rsqrt": "Dh"}
    assert steps[attention + "query_layer_2"]["shape"] == ["B * H", "T", "Dh"]  # reshape(batch_size * num_heads, -1, head_dim)
    assert not any(s["op"] == "merge" for s in steps.values())  # (B, H, T, Dh) -> (B·H, T, Dh) merges no heads


def test_a_bias_that_is_not_alibi_stays_an_added_tensor():
    class Biased(torch.nn.Module):  # baddbmm of a learned bias: no slopes to recognise
        def __init__(self):
            super().__init__()
            self.bias = torch.nn.Parameter(torch.randn(8, 1, 5))

        def forward(self, q, k):
            return self.bias.baddbmm(q, k.transpose(1, 2), alpha=0.5).view(2, 4, 5, 5)

    module, q, k = Biased(), torch.randn(8, 5, 4), torch.randn(8, 5, 4)
    pipeline = from_module(module, q, k)
    assert difference(pipeline, module, q, k) <= 1e-6
    assert not any(s.op == "alibi" for s in pipeline.spec.steps)
