"""transformers' Mixtral imports: its experts' forward loops over the experts the tokens chose, a
branch on the data torch.export cannot capture, so the experts are captured whole
(``tracer/importer/leaves.py``) and written as a ``moe`` step; the router's ``topk`` with its
in-place renormalisation is a ``topk`` step with ``normalize: true``."""

import pytest
import torch
import yaml

from tracer.importing import difference, from_module

transformers = pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def mixtral():
    torch.manual_seed(0)
    config = transformers.MixtralConfig(
        hidden_size=16, intermediate_size=24, num_attention_heads=4, num_key_value_heads=2, num_hidden_layers=2, vocab_size=32,
        num_local_experts=4, num_experts_per_tok=2,
    )  # fmt: skip
    config._attn_implementation = "eager"
    model = transformers.MixtralModel(config).eval()
    ids = torch.randint(0, 32, (2, 5))
    return model, ids, from_module(model, ids)


def test_mixtral_imports_clean_folded_and_equal_with_a_moe_step(mixtral):
    model, ids, pipeline = mixtral
    assert difference(pipeline, model, ids) <= 1e-5
    assert not pipeline.check().diagnostics
    assert [(s.id, s.repeat) for s in pipeline.spec.steps if s.op == "block"] == [("layers", 2)]
    layer = yaml.safe_load(pipeline.files["MixtralModel_layers.yaml"])
    (route,) = [s for s in layer["steps"] if s["op"] == "topk"]
    (experts,) = [s for s in layer["steps"] if s["op"] == "moe"]
    assert route["k"] == "K" and route["normalize"] is True
    assert experts["inputs"] == ["mlp.hidden_states", *route["outputs"]] and experts["activation"] == "silu"
    assert (experts["gate_up"], experts["down"]) == ("mlp.experts.gate_up_proj", "mlp.experts.down_proj")
    # E = H = 4 and 2 * d_ff = 3 * d_model = 48: named as the config names them, not by value
    params = layer["params"]
    assert params["mlp.experts.gate_up_proj"]["shape"] == ["E", "2 * d_ff", "d_model"]
    assert params["mlp.experts.down_proj"]["shape"] == ["E", "d_model", "d_ff"]
    assert params["mlp.gate.weight"]["shape"] == ["E", "d_model"]


def test_the_experts_forward_is_the_modules_own_again_after_the_import(mixtral):
    model, ids, _ = mixtral
    experts = model.layers[0].mlp.experts
    assert "forward" not in vars(experts)
    with torch.no_grad():
        out = model(ids).last_hidden_state  # the module still runs its own experts
    assert out.shape == (2, 5, 16) and torch.isfinite(out).all()
