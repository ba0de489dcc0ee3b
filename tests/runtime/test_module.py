"""``tracer.to_module``: the pipeline as a trainable nn.Module."""

import pytest
import torch

import tracer
from tests.conftest import PIPELINES
from tests.exporting import exported, small_stack


@pytest.fixture(scope="module")
def causal():
    return tracer.load(PIPELINES / "causal_mha.yaml")


def test_the_module_computes_the_run_and_its_params_are_the_pipelines(causal):
    module = tracer.to_module(causal).eval()
    trace = causal.run(keep_values=True)
    assert dict(module.named_parameters()).keys() == {"W_q", "W_k", "W_v", "W_o", "b_o"}
    for name, param in module.named_parameters():
        assert torch.equal(param, trace[name].tensor)  # same seed, same tensors
    assert torch.allclose(module(trace["x"].tensor), trace["out"].tensor, atol=1e-6)


def test_gradients_reach_every_param_of_a_block_stack():
    module = tracer.to_module(PIPELINES / "encoder_block.yaml").train()
    out = module(torch.randn(1, 8, 2))
    out.square().sum().backward()
    names = [name for name, _ in module.named_parameters()]
    assert len(names) == 16 and "encoder.W_Q" in names
    missing = [name for name, p in module.named_parameters() if p.grad is None or not p.grad.abs().sum() > 0]
    assert missing == []


def test_a_training_step_changes_the_loss(causal):
    module = tracer.to_module(causal).eval()
    x, target = torch.randn(2, 6, 4), torch.randn(2, 6, 4)
    losses = []
    for _ in range(3):  # plain gradient descent
        module.zero_grad()
        loss = torch.nn.functional.mse_loss(module(x), target)
        loss.backward()
        with torch.no_grad():
            for param in module.parameters():
                param -= 0.5 * param.grad
        losses.append(loss.item())
    assert losses[-1] < losses[0]


def test_dropout_follows_train_and_eval_and_the_last_trace_is_kept(causal):
    module = tracer.to_module(causal, keep_trace=True)
    x = torch.randn(2, 6, 4)
    with torch.no_grad():
        assert torch.equal(module.eval()(x), module(x))
        assert not torch.equal(module.train()(x), module.eval()(x))
    module.train()(x)
    trace = module.last_trace
    weights, dropped = trace["weights"].tensor, trace["weights_d"].tensor
    assert ((dropped == 0) | torch.isclose(dropped, weights / 0.8)).all() and (dropped == 0).any()
    assert trace["scores"].symbolic == "(B, H, T, T)"
    dot = trace.diagram().source  # a module's trace draws like any other: no renderer is attached to traces
    assert "scores" in dot and "(B, H, T, T)" in dot


def test_state_dict_keys_are_the_exported_modules(tmp_path):
    """One naming: an exported module's weights load into to_module's (a block repeated: layers.1.W_Q)."""
    pipeline = small_stack(tmp_path, 2)
    exported_module = exported(pipeline)[1]()
    module = tracer.to_module(pipeline)
    assert "layers.1.W_Q" in module.state_dict()
    module.load_state_dict(exported_module.state_dict())
    x = torch.randn(2, 8, 4)
    with torch.no_grad():
        assert torch.allclose(module.eval()(x), exported_module.eval()(x), atol=1e-5)


def test_inputs_are_checked_against_the_declaration(causal):
    with pytest.raises(tracer.TracerError, match=r"forward\['x'\] has shape \[2, 6, 5\]"):
        tracer.to_module(causal)(torch.randn(2, 6, 5))
