"""Export helpers for tests: a pipeline's exported module, loaded and checked equal to its run."""

import shutil
import types

import torch

import tracer
from tests.conftest import PIPELINES
from tracer.presentation.export import export_source
from tracer.runtime.interpreter import Plan
from tracer.runtime.tensors import create_tensors


def load_module(source: str, name: str = "exported") -> types.ModuleType:
    """The generated source as a module, as `import` would make it."""
    module = types.ModuleType(name)
    exec(compile(source, f"<{name}>", "exec"), module.__dict__)
    return module


def exported(pipeline: tracer.Pipeline, dims=None):
    """(source, the pipeline's module class)."""
    source = export_source(pipeline, dims)
    module = load_module(source)
    return source, getattr(module, module.__all__[0])


def assert_module_equals_trace(module: torch.nn.Module, trace: tracer.Trace, atol: float = 1e-6, load: bool = True) -> float:
    """Load the trace's params, feed its inputs, compare every output; the largest difference."""
    analysis = trace.analysis
    inputs = [trace[name].tensor for name in trace.pipeline.spec.inputs]
    if load:
        module.load_state_dict({name.replace("/", "."): trace[name].tensor for name in analysis.pipeline.params})
        module.eval()
    with torch.no_grad():
        result = module(*inputs)
    results = result if isinstance(result, tuple) else (result,)
    assert len(results) == len(analysis.outputs)
    worst = 0.0
    for name, got in zip(analysis.outputs, results):
        want = trace.outputs[name]
        assert got.shape == want.shape and got.dtype == want.dtype, name
        assert torch.equal(got.isnan(), want.isnan()), name
        if got.numel() and got.is_floating_point():
            worst = max(
                worst, float((got.detach().double() - want.double()).nan_to_num(0.0).abs().max())
            )  # a param as an output keeps its grad
        else:
            assert torch.equal(got, want), name
    assert worst <= atol
    return worst


def check_export(pipeline: tracer.Pipeline, trace: tracer.Trace) -> float:
    """What the kernel tests add for every kind: the exported module computes the traced run.

    With training dropout, the module in train mode is compared with a run whose every dropout is
    on (``Plan(training=True)``, what ``train()`` means), both drawing from the same RNG state."""
    dims = {k: v for k, v in trace.dims.items() if isinstance(pipeline.spec.dims.get(k), int)}
    _, cls = exported(pipeline, dims)
    if not any(step.is_random() for step in trace.analysis.pipeline.steps):
        return assert_module_equals_trace(cls(), trace)
    tensors = create_tensors(trace.analysis, "cpu", 0)
    rng = torch.get_rng_state()
    outputs = Plan(trace.analysis, "cpu", training=True).run(tensors, keep_values=False).outputs
    module = cls()
    module.load_state_dict({name.replace("/", "."): tensors[name] for name in trace.analysis.pipeline.params})
    torch.set_rng_state(rng)
    with torch.no_grad():
        result = module.train()(*(tensors[name] for name in pipeline.spec.inputs))
    results = result if isinstance(result, tuple) else (result,)
    for name, got in zip(trace.analysis.outputs, results):
        assert torch.allclose(got, outputs[name], atol=1e-6, equal_nan=True), name
    return 0.0


def small_stack(folder, repeat: int) -> tracer.Pipeline:
    """encoder_stack.yaml with ``repeat`` layers of width 4, written in ``folder`` beside its block."""
    (folder / "blocks").mkdir(exist_ok=True)
    shutil.copy(PIPELINES / "blocks" / "encoder_layer.yaml", folder / "blocks")
    stack = (PIPELINES / "encoder_stack.yaml").read_text().replace("repeat: 48", f"repeat: {repeat}")
    (folder / "stack.yaml").write_text(stack.replace("d_model: 16", "d_model: 4").replace("H: 4", "H: 2"))
    return tracer.load(folder / "stack.yaml")
