"""Loading and checking run with the cyclic garbage collector paused, and leave it as they found it."""

import gc

import pytest

import tracer
from tests.conftest import PIPELINES


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
