"""Every path that keeps tensor values holds what it keeps against the memory budget: `run
--values ID` keeps that tensor only, `run --values`, `render --values` and `diff --values` keep
every tensor and count each one to the end of the run, and all of them take `--max-memory`."""

from __future__ import annotations

import pytest

import tracer
from tests.conftest import PIPELINES, tracer_cli
from tracer.analysis.memory import estimate_peak, memory_of

CAUSAL = PIPELINES / "causal_mha.yaml"
T = 256  # scores, masked and scaled: 2 x 2 x 256 x 256 float32 = 1 MiB each


@pytest.fixture(scope="module")
def sizes():
    analysis = tracer.load(CAUSAL).check({"T": T})
    return {
        "none": analysis.memory.peak_bytes,
        "scores": memory_of(analysis, ["scores"]).peak_bytes,
        "all": memory_of(analysis, True).peak_bytes,
    }


def test_a_kept_tensor_is_counted_to_the_end_of_the_run(sizes):
    analysis = tracer.load(CAUSAL).check({"T": T})
    every = sum(size for rid, size in estimate_peak(analysis).storages.items())
    assert sizes["none"] < sizes["scores"] < sizes["all"] and sizes["all"] >= every  # every storage at once, plus a kernel's workspace


def test_values_of_one_tensor_keep_that_tensor_only():
    trace = tracer.load(CAUSAL).run(keep_values=["scores"])
    kept = {record.id for record in trace.records if record.tensor is not None}
    assert kept == {"scores"}
    queries, keys = trace["q_h"], trace["k_h"]
    assert queries.tensor is None and keys.tensor is None
    again = tracer.load(CAUSAL).run(keep_values=True)
    assert trace["scores"].tensor.equal(again["scores"].tensor)  # the same values as a run that keeps them all


def test_an_unknown_tensor_to_keep_is_a_located_error():
    with pytest.raises(tracer.TracerError, match="keep_values names 'nope', which is no tensor of this run"):
        tracer.load(CAUSAL).run(keep_values=["nope"])


def budget_between(low: int, high: int) -> str:
    return str((low + high) // 2)


def test_run_values_of_one_tensor_fits_a_budget_that_every_tensor_does_not(sizes):
    budget = budget_between(sizes["scores"], sizes["all"])
    one = tracer_cli("run", CAUSAL, "--dim", f"T={T}", "--values", "scores", "--max-memory", budget, "-q")
    assert one.returncode == 0, one.stderr
    every = tracer_cli("run", CAUSAL, "--dim", f"T={T}", "--values", "--max-memory", budget, "-q")
    assert every.returncode == 1 and "error[memory-budget]" in every.stderr and "with every tensor's values kept" in every.stderr


@pytest.mark.parametrize("command", ["render", "diff"])
def test_render_and_diff_values_take_max_memory_and_count_every_kept_tensor(tmp_path, sizes, command):
    pipeline = tmp_path / "p.yaml"
    pipeline.write_text(CAUSAL.read_text().replace("T: 6", f"T: {T}"))
    budget = budget_between(sizes["none"], sizes["all"])  # a run that frees its tensors would fit
    target = tmp_path / "out.dot"
    argv = ["render", pipeline, "-o", target, "-q"] if command == "render" else ["diff", pipeline, pipeline]
    done = tracer_cli(*argv, "--values", "--max-memory", budget)
    trouble = 2 if command == "diff" else 1  # diff exits as diff(1) does: 2 is trouble
    assert done.returncode == trouble and "error[memory-budget]" in done.stderr and "with every tensor's values kept" in done.stderr
    assert not target.exists()
    assert tracer_cli(*argv, "--values", "--max-memory", str(sizes["all"])).returncode == 0
