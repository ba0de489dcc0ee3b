"""StableLM's per-head q/k LayerNorms (``qk_layernorm=True``): ``StableLmLayerNormPerHead`` splits
the heads into one-head tensors, normalises each with its own LayerNorm and joins them back with
``torch.cat``. The import keeps that computation and names the joined dim (``cat size: H``), so
the file checks clean under ``--strict`` (no ``4 * Dh`` against ``d_model``) and runs equal."""

import pytest
import torch
import yaml

from tracer.importing import difference, from_module

transformers = pytest.importorskip("transformers")


@pytest.mark.parametrize("attention", ["eager", "sdpa"])
def test_stablelm_per_head_norm_imports_clean_and_equal(attention):
    torch.manual_seed(0)
    config = transformers.StableLmConfig(
        hidden_size=32,
        intermediate_size=56,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=32,
        qk_layernorm=True,
    )
    config._attn_implementation = attention
    module, ids = transformers.StableLmModel(config).eval(), torch.randint(0, 32, (2, 7))
    pipeline = from_module(module, ids, name="stablelm")
    assert [str(d) for d in pipeline.check().diagnostics if d.severity in ("error", "warning")] == []
    assert difference(pipeline, module, ids) <= 1e-5
    steps = {s["id"]: s for text in pipeline.files.values() for s in yaml.safe_load(text)["steps"]}
    norms = "layers.0.self_attn.q_layernorm."
    assert [steps[f"{norms}norms.{h}"]["op"] for h in range(4)] == ["layernorm"] * 4  # each head its own weights
    assert steps[f"{norms}cat"]["size"] == "H" and steps["layers.0.self_attn.k_layernorm.cat"]["size"] == "H_kv"


def test_one_wide_pieces_of_different_tensors_are_not_a_dim_joined_back():
    """Two first tokens side by side make 2 = H only by chance: no ``size: H`` on that cat."""

    class FirstTokens(torch.nn.Module):
        def forward(self, x, y):
            return torch.cat([x[:, :1], y[:, :1]], dim=1)

    x, y = torch.randn(3, 5, 8), torch.randn(3, 5, 8)
    pipeline = from_module(FirstTokens(), x, y, dims={"H": 2})
    (cat,) = [s for s in pipeline.spec.steps if s.op == "cat"]
    assert cat.size is None and difference(pipeline, FirstTokens(), x, y) == 0
