"""``expect:``: shapes and contiguity pinned in the file, checked statically and against a run."""

import pytest

import tracer
from tests.conftest import PIPELINES, pipeline_text


@pytest.mark.parametrize("dims", [{"T": 1}, {"B": 1, "T": 1}, {"B": 1, "T": 1, "H": 1}])
def test_size_one_dims_do_not_turn_expect_contiguous_into_a_false_alarm(dims):
    """causal_mha pins q_h as non-contiguous; at T=1 torch calls the transposed view contiguous
    (it ignores size-1 dims), which is the same layout, not a broken promise."""
    trace = tracer.load(PIPELINES / "causal_mha.yaml").run(dims=dims)
    assert trace["q_h"].contiguous  # what torch says; the expectation holds all the same


def test_a_truly_row_major_tensor_still_breaks_expect_contiguous_false():
    text = pipeline_text("- {id: y, op: unsqueeze, input: x, dim: 0}", inputs="x: {shape: [2, 3], init: randn}")
    with pytest.raises(tracer.TracerError) as info:
        tracer.loads(text + "expect:\n  y: {contiguous: false}\n", "c.yaml")
    assert info.value.code == "expect" and "ignores size-1 dims" in str(info.value)
