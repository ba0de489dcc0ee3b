"""The interpreter: records as torch made them, tensors freed after their last use, devices, meta runs."""

from __future__ import annotations

import inspect
import re

import pytest
import torch

import tracer
from tests.conftest import PIPELINES, bundled_pipelines, pipeline_text, shared_pipeline
from tests.kinds import agrees
from tracer.core.errors import TracerError

X23 = "x: {shape: [2, 3], init: randn}"


Q = "q: {shape: [2, 2, 3, 4], init: randn}"


def test_a_tensor_nobody_reads_is_freed_before_the_next_kernel_runs():
    """The estimate frees an unread result after its own step; the run held it one step longer."""
    agrees("- {id: b, op: cast, input: x, dtype: bool}\n- {id: d, op: cast, input: x, dtype: float64}", X23)


def test_an_unusable_device_is_a_located_error_through_the_api_too():
    pipeline = tracer.loads(pipeline_text("- {id: r, op: relu, input: x}", inputs=X23), "t.yaml")
    with pytest.raises(TracerError) as info:
        pipeline.run(device="bogus")
    assert info.value.code == "device" and str(info.value).startswith("t.yaml: error[device]")
    assert "not a device torch can use here" in str(info.value)
    assert pipeline.run(device=torch.device("meta")).records  # a torch.device is fine


def test_a_meta_run_of_sdpa_shows_the_layout_of_a_real_run():
    """torch's meta sdpa is the math path's (row-major); CPU's flash kernel lays out like q."""
    pipeline = tracer.loads(
        pipeline_text("- {id: t, op: transpose, input: q, dims: [1, 2]}\n- {id: y, op: sdpa, inputs: [t, t, t]}", inputs=Q)
    )
    meta, cpu = pipeline.run(device="meta"), pipeline.run()
    assert meta["y"].stride == cpu["y"].stride == (24, 4, 12, 1) and meta.as_predicted and cpu.as_predicted


def test_observe_on_the_meta_device_sees_the_layout_the_trace_records():
    """sdpa's meta kernel lays its output out row-major, the CPU kernel like q; a meta run gives
    the tensor the CPU layout, and ``observe`` sees it after that (a fuzz case saw it before)."""
    pipeline = tracer.load(PIPELINES / "lint_examples" / "fixed" / "attention_axis.yaml")
    seen = {}
    trace = pipeline.run(device="meta", observe=lambda rid, tensor: seen.__setitem__(rid, tuple(tensor.stride())))
    real = pipeline.run(keep_values=True)
    assert seen["context"] == trace["context"].stride == tuple(real["context"].tensor.stride()) != (24, 12, 3, 1)
    assert all(seen[r.id] == r.stride for r in trace.records if r.id in seen)


def _repeated(path) -> bool:
    """Whether the file repeats a block (``repeat: N`` on an ``op: block`` step)."""
    text = path.read_text(encoding="utf-8")
    return "op: block" in text and re.search(r"\brepeat: \d", text) is not None


@pytest.mark.parametrize("name", [p.relative_to(PIPELINES).as_posix() for p in bundled_pipelines() if _repeated(p)])
def test_predicted_meta_layouts_agree_with_torchs_meta_kernels(name):
    """A repeated block's later copies take the predicted layouts on the meta device; torch's meta
    kernels, run for every step, record the same tensors: ids, shapes, strides, offsets, views."""
    pipeline = shared_pipeline(PIPELINES / name)
    fast, kernels = pipeline.run(device="meta"), pipeline.run(device="meta", meta_kernels=True)
    assert fast.records == kernels.records
    assert fast.as_predicted and kernels.as_predicted
    plan = pipeline._plans[((), "meta", False)]
    assert sum(step.predicted for step in plan.steps) > 0  # the later copies did take the fast path
    layouts = {name: (tuple(t.shape), t.stride(), t.storage_offset(), t.dtype) for name, t in kernels.outputs.items()}
    assert {name: (tuple(t.shape), t.stride(), t.storage_offset(), t.dtype) for name, t in fast.outputs.items()} == layouts
    seen = {}  # observed, every tensor of every copy is made, laid out as its record says
    watched = pipeline.run(device="meta", observe=lambda rid, t: seen.__setitem__(rid, (tuple(t.shape), t.stride(), t.storage_offset())))
    assert watched.records == kernels.records
    made = {r.id: (r.shape, r.stride, r.storage_offset) for r in kernels.records if r.id not in fast.analysis.declared}
    assert seen == made


def test_a_meta_run_makes_only_the_tensors_something_reads():
    """Unobserved, a repeated block's predicted copies make no tensor nobody reads: the records
    come from their templates; the outputs, and what a kernel reads, are still real meta tensors."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Made(TorchDispatchMode):
        count = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            Made.count += func is torch.ops.aten.empty_strided.default
            return func(*args, **(kwargs or {}))

    pipeline = tracer.load(PIPELINES / "encoder_stack.yaml")
    pipeline.run(device="meta")
    with Made():
        fast = pipeline.run(device="meta")
    quiet, Made.count = Made.count, 0
    with Made():
        watched = pipeline.run(device="meta", observe=lambda rid, tensor: None)
    assert fast.records == watched.records and fast.as_predicted
    assert quiet < Made.count / 10, (quiet, Made.count)
    assert fast.outputs.keys() == watched.outputs.keys() and all(t.is_meta for t in fast.outputs.values())


def test_a_plans_records_are_the_dataclasses_records_and_copies_differ_only_in_names():
    """A plan builds its templates with ``new_record`` (the slots' setters: half the frozen
    dataclass's ``__init__``) and one symbolic-shape tuple for every record printing alike; each
    layer's record still has its own id, inputs and storage owner, and equals the record that
    ``TensorRecord(...)`` builds from the same fields."""
    from dataclasses import astuple, fields, replace

    from tracer.runtime.records import TensorRecord, new_record

    pipeline = shared_pipeline(PIPELINES / "encoder_stack.yaml")
    trace = pipeline.run(device="meta")
    for record in trace.records:
        rebuilt = TensorRecord(*astuple(record)[:-1])
        assert record == rebuilt and astuple(record) == astuple(rebuilt) and record.tensor is None
    assert [f.name for f in fields(TensorRecord)][:-1] == list(inspect.signature(new_record).parameters)
    layer = {r.id.removeprefix("layers/1/"): r for r in trace.records if r.id.startswith("layers/1/") and r.op != "param"}
    assert len(layer) > 20
    for record in trace.records:
        if record.id.startswith("layers/0/") and record.op not in ("param", "block_input"):
            again = layer[record.id.removeprefix("layers/0/")]  # the same step of the next layer: its own names, nothing else differs

            def renamed(name):
                return name.replace("layers/0/", "layers/1/")

            assert again.id != record.id and again.inputs != record.inputs and again.inputs == tuple(map(renamed, record.inputs))
            assert again.view_of == (record.view_of and renamed(record.view_of))
            assert again == replace(record, id=again.id, inputs=again.inputs, view_of=again.view_of)
            assert again.symbolic_shape is record.symbolic_shape  # one tuple for both


def test_a_copy_whose_inputs_are_laid_out_differently_runs_its_own_kernels(tmp_path):
    """A repeated block's copy takes the predicted layouts only after a copy with the same input
    and output layouts ran its kernels: the first copy reads a transposed (non-contiguous) x, the
    later ones the contiguous output of the copy before, so the first two copies run their kernels
    and only the third is predicted; every record is what torch's meta kernels give."""
    (tmp_path / "layer.yaml").write_text(
        "name: layer\ndims: {A: 3, B: 4}\ninputs:\n  x: {shape: [A, B], init: randn}\n"
        "steps:\n  - {id: h, op: relu, input: x}\n  - {id: o, op: contiguous, input: h}\n"
    )
    (tmp_path / "stack.yaml").write_text(
        "name: stack\ndims: {A: 3, B: 4}\ninputs:\n  x: {shape: [B, A], init: randn}\n"
        "steps:\n  - {id: t, op: transpose, input: x, dims: [0, 1]}\n"
        "  - {id: layers, op: block, use: layer.yaml, input: t, repeat: 3}\n"
    )
    pipeline = tracer.load(tmp_path / "stack.yaml")
    fast, kernels = pipeline.run(device="meta"), pipeline.run(device="meta", meta_kernels=True)
    assert fast.records == kernels.records and fast.as_predicted
    assert fast["layers/0/h"].stride == (1, 3) and fast["layers/1/h"].stride == fast["layers/2/h"].stride == (4, 1)
    plan = pipeline._plans[((), "meta", False)]
    predicted = {step.step_id for step in plan.steps if step.predicted}
    assert {"layers/2/h", "layers/2/o"} <= predicted and not predicted & {"layers/0/h", "layers/1/h", "layers/0/o"}
