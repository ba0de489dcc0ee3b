"""Loading, checking and running run with the cyclic garbage collector paused, and leave it as they found it."""

import gc
import inspect
import sys

import pytest

import tracer
from tests.conftest import PIPELINES
from tracer.runtime.interpreter import Plan


@pytest.fixture
def collections():
    """Every collector pass while the test runs."""
    passes = []

    def count(phase, info):
        if phase == "start":
            passes.append(info["generation"])

    gc.callbacks.append(count)
    try:
        yield passes
    finally:
        gc.callbacks.remove(count)


def test_no_collector_pass_runs_while_a_stack_of_layers_is_loaded_and_checked(collections):
    """Each pass walks every object in the process, so passes during the build made 384 layers cost
    more than twice 192; the 48-layer stack makes enough objects to trigger several of them."""
    from tracer.analysis.shapes import analyze
    from tracer.spec.load import load_spec

    gc.collect()
    collections.clear()
    analysis = analyze(*load_spec(PIPELINES / "encoder_stack.yaml"))
    assert not collections and len(analysis.nodes) > 1000
    assert gc.isenabled()


def test_no_collector_pass_runs_while_a_stack_of_layers_runs():
    """A meta run of the 1,200-step stack makes thousands of tensors, all freed by reference counts:
    a pass finds nothing, and at 1,000 layers a full one (over every object of the process) cost
    more than the meta run itself."""
    pipeline = tracer.load(PIPELINES / "encoder_stack.yaml")
    pipeline.run(device="meta")  # the plan built and the tensors drawn: the next run is the run alone
    plan = next(iter(pipeline._plans.values()))
    tensors = next(iter(pipeline._tensors.values()))[0]
    loop = inspect.unwrap(Plan.run).__code__
    inside = []

    def count(phase, info):
        if phase == "start" and _on_stack(loop):
            inside.append(info["generation"])

    gc.collect()
    gc.callbacks.append(count)
    try:
        records, _, _ = plan.run(tensors, keep_values=False)
    finally:
        gc.callbacks.remove(count)
    assert not inside and len(records) > 1000
    assert gc.isenabled()


def _on_stack(code) -> bool:
    """Whether a frame of ``code`` is on the calling thread's stack."""
    frame = sys._getframe(1)
    while frame is not None and frame.f_code is not code:
        frame = frame.f_back
    return frame is not None


def test_the_collector_is_left_as_the_caller_had_it_also_after_an_error(tmp_path):
    broken = tmp_path / "broken.yaml"
    broken.write_text("name: broken\ninputs:\n  x: {shape: [4], init: randn}\nsteps:\n  - {id: y, op: nope}\n")
    with pytest.raises(tracer.TracerError):
        tracer.load(broken)
    assert gc.isenabled()
    gc.disable()
    try:
        tracer.load(PIPELINES / "causal_mha.yaml")
        assert not gc.isenabled()
    finally:
        gc.enable()
