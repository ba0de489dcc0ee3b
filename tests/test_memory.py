"""Memory estimates, the memory guard, meta-device runs, and what a repeated run pays for."""

import re
from pathlib import Path

import pytest
import torch

import tracer
import tracer.analysis.memory as memory
from tests.conftest import PIPELINES, bundled_pipelines, shared_pipeline
from tracer.analysis.memory import estimate_peak, parse_bytes
from tracer.cli import main
from tracer.core.errors import TracerError

MHA = PIPELINES / "causal_mha.yaml"
HUGE = {"B": 64, "T": 131072, "d_model": 8192, "H": 64}


def test_estimate_of_causal_mha_by_hand():
    analysis = tracer.load(MHA).check()
    B, T, d, H = 2, 6, 4, 2
    f32 = 4
    persistent = f32 * (B * T * d + 4 * d * d + d)  # x, W_q, W_k, W_v, W_o, b_o
    # q and k die at 'scores' (their transposed views are last read there); v lives until 'context'.
    # While 'scores' runs, torch.matmul copies both head-transposed operands to fold (B, H) into one
    # batch dim for bmm: q_h and k_t, (B, H, T, Dh) each, on top of q, k, v and scores.
    copies = 2 * f32 * B * T * d
    peak = persistent + f32 * (3 * B * T * d + B * H * T * T) + copies
    estimate = analysis.memory
    assert persistent == estimate.persistent_bytes == 464
    assert estimate.peak_bytes == analysis.peak_bytes == peak == 2000
    assert estimate.peak_step == "scores"
    # While 'masked' runs: v, scores and masked, and the causal mask (bool) with the two int64 ranges it is compared from.
    assert estimate.live["masked"] == persistent + f32 * (B * T * d + 2 * B * H * T * T) + 8 * (T + T) + T * T
    assert estimate.storages["merged/contiguous"] == f32 * B * T * d and "merged/view" not in estimate.storages
    assert "weights_d" not in estimate.storages  # eval dropout returns its input: no new storage
    assert estimate_peak(analysis) == estimate


def test_every_record_carries_its_bytes_and_traces_their_peak():
    trace = tracer.load(MHA).run()
    for record in trace.records:
        numel = 1
        for size in record.shape:
            numel *= size
        assert record.nbytes == numel * 4
    assert trace.peak_bytes == trace.analysis.peak_bytes


def test_cli_prints_sizes_and_the_estimated_peak(capsys):
    assert main(["run", str(MHA), "--device", "meta", *[f"--dim={k}={v}" for k, v in HUGE.items()]]) == 0
    out = capsys.readouterr().out
    scores = next(line for line in out.splitlines() if line.startswith("scores "))
    assert " 256.0 TiB " in scores  # the size column (FLOPs follow)
    assert "estimated peak: 512.5 TiB" in out and "allocated none of it" in out


@pytest.mark.parametrize(
    "text, value", [("8GiB", 8 << 30), ("500MB", 500_000_000), ("1.5G", 3 << 29), ("1024", 1024), ("2 kib", 2048), (4096, 4096)]
)
def test_parse_bytes(text, value):
    assert parse_bytes(text) == value


@pytest.mark.parametrize("text", ["", "lots", "5 XB", "-3GB", True])
def test_parse_bytes_rejects(text):
    with pytest.raises(ValueError):
        parse_bytes(text)


def _no_allocation(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("allocated before the memory guard")

    monkeypatch.setattr(tracer.api, "create_tensors", refuse)
    monkeypatch.setattr(tracer.api, "Plan", refuse)


def test_guard_refuses_before_any_allocation(monkeypatch):
    pipeline = tracer.load(MHA)
    _no_allocation(monkeypatch)
    with pytest.raises(TracerError) as info:
        pipeline.run(max_memory=1000)
    assert info.value.code == "memory-budget"
    message = str(info.value)
    assert "2.0 KiB" in message and "--device meta" in message and "scores" in message
    assert not pipeline._tensors and not pipeline._plans
    with pytest.raises(TracerError):
        pipeline.run(max_memory="1KB")


def test_guard_default_budget_is_half_the_available_memory(monkeypatch):
    pipeline = tracer.load(MHA)
    _no_allocation(monkeypatch)
    monkeypatch.setattr(memory, "_AVAILABLE", [0.0, -1.0])
    monkeypatch.setattr(memory, "MIN_DEFAULT_BUDGET", 0)  # (by default runs under 64 MiB are never refused)
    monkeypatch.setattr(memory, "available_memory", lambda: 3000)  # half of it, 1500 B, is under the 2000 B peak
    with pytest.raises(TracerError) as info:
        pipeline.run()
    assert "half of the available RAM" in str(info.value)


def test_guard_lets_meta_runs_through_and_cli_reports(capsys):
    pipeline = tracer.load(MHA)
    with pytest.raises(TracerError):
        pipeline.run(dims=HUGE)  # 512 TiB: refused by the default budget
    assert main(["run", str(MHA), "--max-memory", "1KB"]) == 1
    assert "error[memory-budget]" in capsys.readouterr().err
    assert pipeline.run(dims=HUGE, device="meta", max_memory=1)["scores"].device == "meta"


def _peak_rss_kib() -> int:
    status = Path("/proc/self/status").read_text()
    return int(re.search(r"^VmHWM:\s+(\d+) kB", status, re.M)[1])


def test_meta_run_allocates_nothing_at_llm_size():
    """The peak resident memory is reset first (Linux), so a transient allocation during the run counts
    even when an earlier test already took the process higher (the lifetime peak would hide it)."""
    try:
        Path("/proc/self/clear_refs").write_text("5")  # "5": reset VmHWM, the peak resident set size, to the current one
    except OSError:
        pytest.skip("needs Linux's /proc/self/clear_refs to measure this run's own peak memory")
    before = _peak_rss_kib()
    trace = tracer.load(MHA).run(dims=HUGE, device="meta")
    grown_mib = (_peak_rss_kib() - before) / 1024
    assert grown_mib < 200  # a real run would need 512 TiB
    assert trace["scores"].shape == (64, 64, 131072, 131072) and trace["scores"].nbytes == 256 << 40
    assert all(r.device == "meta" for r in trace.records)


@pytest.mark.parametrize("path", [MHA, PIPELINES / "encoder_block.yaml"])
def test_meta_records_equal_cpu_records(path):
    pipeline = shared_pipeline(path)
    cpu, meta = pipeline.run(), pipeline.run(device="meta")
    assert [r.id for r in cpu] == [r.id for r in meta]
    for a, b in zip(cpu, meta):
        assert (a.shape, a.stride, a.storage_offset, a.contiguous, a.view_of, a.nbytes, a.dtype) == (
            b.shape,
            b.stride,
            b.storage_offset,
            b.contiguous,
            b.view_of,
            b.nbytes,
            b.dtype,
        ), a.id


def _observed(trace):
    """Every record recomputed from torch's own tensors (the interpreter reuses static records)."""
    owners, found = {}, []
    for r in trace.records:
        t = r.tensor
        root = t._base if t._base is not None else t
        view_of = owners.setdefault(id(root), (root, r.id))
        found.append(
            (
                tuple(t.shape),
                tuple(t.stride()),
                t.storage_offset(),
                t.is_contiguous(),
                None if view_of[1] == r.id else view_of[1],
                t.numel() * t.element_size(),
            )
        )
    return found


@pytest.mark.parametrize("path", bundled_pipelines(), ids=lambda p: p.name)
def test_records_are_what_torch_did(path):
    pipeline = shared_pipeline(path)
    device = "meta" if pipeline.check().peak_bytes > 64 << 20 else "cpu"  # the big seed files: same layouts, no minutes of matmuls
    fast, kept = pipeline.run(device=device), pipeline.run(device=device, keep_values=True)
    assert _observed(kept) == [(r.shape, r.stride, r.storage_offset, r.contiguous, r.view_of, r.nbytes) for r in fast]


def test_repeated_runs_reuse_params_and_tensors_can_be_given(monkeypatch):
    pipeline = tracer.load(MHA)
    first = pipeline.run()
    calls = []
    original = tracer.api.create_tensors
    monkeypatch.setattr(tracer.api, "create_tensors", lambda *a, **k: calls.append(1) or original(*a, **k))
    second = pipeline.run()
    assert not calls
    assert torch.equal(first.outputs["out"], second.outputs["out"])
    x = torch.ones(2, 6, 4)
    given = pipeline.run(tensors={"x": x})
    assert calls and given["x"].shape == (2, 6, 4) and not torch.equal(given.outputs["out"], first.outputs["out"])


def test_intermediates_are_freed_unless_kept():
    pipeline = tracer.load(MHA)
    assert all(r.tensor is None for r in pipeline.run())
    plan = next(iter(pipeline._plans.values()))
    freed = {name for step in plan.steps for name in step.free}
    assert {"scores", "masked", "merged/transpose", "merged/contiguous"} <= freed and "out" not in freed
