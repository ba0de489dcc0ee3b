"""Helpers of the step kinds' tests: each runs a small pipeline and holds it against torch."""

from __future__ import annotations

import math

import torch

import tracer
from tests.conftest import assert_flops_as_counted, pipeline_text, run_text
from tests.dataflow import dataflow_problems
from tests.exporting import check_export
from tests.fuzz.oracle import check_prediction, layout_into
from tests.measure import PeakStorage

X = "x: {shape: [2, 3, 4], init: randn}"

# sdpa with gqa (4 query heads, 2 kv heads), 3 queries and 6 keys, and each of its mask and scale fields
SDPA_CASES = [
    "causal: true",
    "causal: true, window: 3",
    "causal: true, align: top-left",
    "mask: keep, polarity: keep",
    "mask: add, causal: true",
    "scale: 0.3",
]
SDPA_INPUTS = """
q: {shape: [2, 4, 3, 8], init: randn}
k: {shape: [2, 2, 6, 8], init: randn}
v: {shape: [2, 2, 6, 8], init: randn}
keep: {shape: [2, 1, 1, 6], values: [[[[true, true, false, true, true, true]]], [[[true, true, true, true, true, false]]]]}
add: {shape: [2, 1, 1, 6], init: randn}
"""


def sdpa_step(fields: str) -> str:
    return f"- {{id: o, op: sdpa, inputs: [q, k, v], gqa: true, {fields}}}"


def trace_of(steps: str, inputs: str = X, params: str = "", dims: str = "") -> tracer.Trace:
    """Run the steps; every kernel test is also a static-vs-torch agreement case (the shape rules
    predicted every record's shape, stride, offset, dtype and storage owner exactly), an export case
    (the steps' emitted PyTorch source computes the same), a FLOP-count case and a dataflow case
    (each recorded and drawn input is one the kernel computes from, and each it computes from is)."""
    text = pipeline_text(steps, dims=dims, inputs=inputs, params=params)
    trace = run_text(text)
    assert trace.as_predicted, [r.id for r in trace.records]
    assert not dataflow_problems(trace)
    check_export(trace.pipeline, trace)
    assert_flops_as_counted(text)
    return trace


def close(a, b, atol: float = 1e-6) -> bool:
    return a.shape == b.shape and a.dtype == b.dtype and torch.allclose(a, b, atol=atol, equal_nan=True)


def agrees(steps: str, inputs: str, dims: str = "") -> tracer.Trace:
    """Run on CPU watched op by op: every record and every tensor torch made has the predicted
    shape, stride, offset, dtype, contiguity and storage owner, and the memory estimate bounds the
    measured peak (the fuzz oracle's own checks)."""
    pipeline = tracer.loads(pipeline_text(steps, dims=dims, inputs=inputs), "t.yaml")
    seen: dict[str, tuple] = {}
    with PeakStorage() as mode:
        trace = pipeline.run(observe=layout_into(seen))
    check_prediction(trace, seen)
    assert trace.as_predicted  # on CPU, exactly: strides of size-1 dims too
    assert not dataflow_problems(pipeline.run(keep_values=True))
    assert mode.peak <= trace.analysis.memory.peak_bytes, (mode.peak, trace.analysis.memory)
    return trace


def unfused(q, k, v, hide=None, additive=None, scale=None):
    """Attention written out in torch, the reference for every fused kernel: kv heads shared in
    groups, an additive and a hiding mask, the scale (1/sqrt(head dim) by default)."""
    n_rep = q.shape[-3] // k.shape[-3]
    k, v = k.repeat_interleave(n_rep, -3), v.repeat_interleave(n_rep, -3)
    scores = q @ k.transpose(-2, -1) * (scale or 1 / math.sqrt(q.shape[-1]))
    if additive is not None:
        scores = scores + additive
    if hide is not None:
        scores = scores.masked_fill(hide, float("-inf"))
    return torch.softmax(scores, -1) @ v
