"""What tracer shows flowing into a step is what its kernel computes from: every bundled pipeline's
recorded inputs (``run --json``) and drawn edges, held against the kernels themselves
(``tests/dataflow.py``; ``tests/kinds.py`` holds every step kind's kernel test to the same)."""

import json

import pytest

import tracer
from tests.conftest import PIPELINES, bundled_pipelines, shared_pipeline, tracer_cli, two_copies_of_each_block
from tests.dataflow import dataflow_problems, drawn_reads

SMALL_BYTES = 16 << 20


@pytest.mark.parametrize("path", bundled_pipelines(), ids=lambda p: p.relative_to(PIPELINES).as_posix())
def test_every_recorded_and_drawn_input_is_one_the_kernel_reads(path, tmp_path):
    fewer = two_copies_of_each_block(path, tmp_path / "pipelines")  # every copy of a block reads as the others
    pipeline = shared_pipeline(path) if fewer == path else tracer.load(fewer)
    small = {}
    if pipeline.check().peak_bytes > SMALL_BYTES:  # the tutorial-size seeds: the same steps at a few tokens
        small = {name: min(value, 8) for name, value in pipeline.spec.dims.items() if isinstance(value, int)}
    assert dataflow_problems(pipeline.run(dims=small, keep_values=True)) == []


def test_ropes_tables_are_side_inputs_of_the_rotation_not_a_chain_through_it():
    path = PIPELINES / "models/llama31_packed_attention.yaml"
    proc = tracer_cli("run", path, "--json")
    assert proc.returncode == 0, proc.stderr
    inputs = {t["id"]: t["inputs"] for t in json.loads(proc.stdout)["tensors"]}
    assert inputs["q_rot/cos"] == inputs["q_rot/sin"] == ["position_ids"]
    assert inputs["q_rot/rotated"] == ["q_h", "q_rot/cos", "q_rot/sin"]
    drawn = drawn_reads(shared_pipeline(path).run(keep_values=True))
    assert drawn["q_rot/cos"] == drawn["q_rot/sin"] == {"position_ids"}
    assert drawn["q_rot/rotated"] == {"q_h", "q_rot/cos", "q_rot/sin"}
