"""A module's buffers are not weights: import declares them ``buffer: true``, and the module
`tracer export` or ``tracer.to_module`` makes from the file registers them as buffers again, so
its ``state_dict`` has the original's keys with the same split into parameters and buffers, and
parameter counts leave them out as ``module.parameters()`` does."""

import pytest
import torch
import yaml
from torch import nn

import tracer
from tests.exporting import exported
from tests.importing.test_from_module import CausalSelfAttention
from tracer.diff import diff
from tracer.importing import difference, from_module

B, T, D = 2, 5, 16


class Gained(nn.Module):
    """A buffer read by a step (a fixed gain), beside a child's weights and buffer and its own weight."""

    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(D, D)
        self.register_buffer("gain", torch.rand(D) + 0.5)
        self.proj.register_buffer("offset", torch.randn(D))
        self.scale = nn.Parameter(torch.randn(D))
        self.register_buffer("cache", torch.zeros(3), persistent=False)  # not in state_dict: not declared

    def forward(self, x):
        return (self.proj(x) + self.proj.offset) * self.gain * self.scale


def _split(module: nn.Module) -> tuple[list[str], list[str], list[str]]:
    """(state_dict keys in order, parameter names, persistent buffer names)."""
    keys = list(module.state_dict())
    return keys, [n for n, _ in module.named_parameters()], [n for n in dict(module.named_buffers()) if n in keys]


def test_buffers_come_back_as_buffers_through_export_and_to_module():
    for module in (Gained(), CausalSelfAttention(n_embd=D, flash=False).eval()):
        torch.manual_seed(0)
        x = torch.randn(B, T, D)
        pipeline = from_module(module, x)
        assert difference(pipeline, module, x) <= 1e-6
        params = yaml.safe_load(pipeline.to_yaml())["params"]
        buffers = [n for n, decl in params.items() if decl.get("buffer")]
        assert buffers == _split(module)[2]
        _, exported_class = exported(pipeline)
        for rebuilt in (tracer.to_module(pipeline), exported_class()):
            assert _split(rebuilt) == _split(module)
            rebuilt.load_state_dict(module.state_dict())  # strict: the same keys, the same shapes
            with torch.no_grad():
                assert torch.allclose(rebuilt.eval()(x), module(x), atol=1e-6)
        trace = pipeline.run(params=module.state_dict(), inputs={"x": x})
        assert trace.param_count == sum(p.numel() for p in module.parameters())


def test_a_buffer_is_a_param_only(tmp_path):
    path = tmp_path / "p.yaml"
    path.write_text("name: p\ninputs:\n  x: {shape: [2], init: randn, buffer: true}\nsteps:\n  - {id: y, op: relu, input: x}\n")
    with pytest.raises(tracer.TracerError) as caught:
        tracer.load(path).check()
    (error,) = caught.value.diagnostics
    assert error.code == "tensor-source" and "buffer: true" in error.message and (error.position.line, error.position.col) == (3, 40)


def test_diff_marks_a_weight_that_is_a_buffer_in_the_other_file(tmp_path):
    text = "name: p\ninputs:\n  x: {shape: [2], init: randn}\nparams:\n  m: {shape: [2], init: ones%s}\nsteps:\n  - {id: y, op: mul, inputs: [x, m]}\n"
    (tmp_path / "a.yaml").write_text(text % "")
    (tmp_path / "b.yaml").write_text(text % ", buffer: true")
    found = diff(tracer.load(tmp_path / "a.yaml"), tracer.load(tmp_path / "b.yaml"))
    assert found.params == [["m", "(2) [2]", "(2) [2] buffer"]] and not found.same
