"""Dims of 1 and 0 give correct traces (checked against plain torch); dims that overflow give located
errors."""

from __future__ import annotations

import math
import re

import pytest
import torch
import torch.nn.functional as F

import tracer
from tests.conftest import PIPELINES, tracer_cli
from tracer.core.errors import TracerError

GOOD = (PIPELINES / "causal_mha.yaml").read_text()


NO_EXPECT = GOOD[: GOOD.index("expect:")]  # expect: pins contiguity that changes when a dim is 0 or 1


def causal_mha_in_torch(trace) -> torch.Tensor:
    """nanoGPT's causal self-attention on the trace's own inputs and params."""
    x = trace["x"].tensor
    B, T, d = x.shape
    H = trace.dims["H"]
    Dh = d // H if H else 0

    def heads(t):
        return t.view(B, T, H, Dh).transpose(1, 2)

    q, k, v = (heads(F.linear(x, trace[w].tensor)) for w in ("W_q", "W_k", "W_v"))
    scores = (q @ k.transpose(-2, -1)).masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
    weights = torch.softmax(scores / math.sqrt(Dh), dim=-1)
    merged = (weights @ v).transpose(1, 2).contiguous().view(B, T, d)
    return F.linear(merged, trace["W_o"].tensor, trace["b_o"].tensor)


ZERO_OPS = """\
name: zeros
dims: {N: 0, D: 3}
inputs:
  x: {shape: [2, N, D], init: randn}
  e: {shape: [2, D, N], init: randn}
  ids: {shape: [N], values: [], dtype: int64}
params:
  table: {shape: [5, D], init: embedding}
  w: {shape: [D, D], init: linear}
steps:
  - {id: soft_empty_rows, op: softmax, input: x, dim: -1}
  - {id: soft_over_nothing, op: softmax, input: e, dim: -1}
  - {id: normed, op: layernorm, input: e}
  - {id: contracted, op: matmul, inputs: [e, x]}
  - {id: projected, op: linear, input: x, weight: w}
  - {id: embedded, op: embed, input: ids, weight: table}
  - {id: joined, op: cat, inputs: [x, x], dim: 1}
  - {id: sliced, op: index, input: e, dim: 1, start: 1, stop: 1}
  - {id: tiled, op: repeat, input: e, repeats: [1, 0, 2]}
  - {id: masked, op: mask, input: contracted, causal: true}
  - {id: heads, op: view, input: e, shape: [2, D, N, 1]}
  - {id: merged, op: merge, input: heads}
outputs: [soft_empty_rows, soft_over_nothing, normed, contracted, projected, embedded, joined, sliced, tiled, masked, merged]
"""


@pytest.mark.parametrize(
    "dims",
    [
        {"T": 1},
        {"H": 1},
        {"B": 1},
        {"T": 1, "H": 1, "B": 1},
        {"T": 1, "H": 1, "B": 1, "d_model": 1},
        {"d_model": 2, "H": 2},
    ],
)
def test_ones_give_the_same_numbers_as_torch(dims):
    pipeline = tracer.loads(NO_EXPECT, "c.yaml")
    trace = pipeline.run(dims=dims, keep_values=True)
    want = {"B": 2, "T": 6, "d_model": 4, "H": 2, **dims}
    assert trace["out"].shape == (want["B"], want["T"], want["d_model"])
    assert trace["weights"].shape == (want["B"], want["H"], want["T"], want["T"])
    assert torch.allclose(trace["out"].tensor, causal_mha_in_torch(trace), atol=1e-6)
    rows = trace["weights"].tensor.sum(-1)
    assert torch.allclose(rows, torch.ones_like(rows))  # T=1: the one visible key gets all the weight
    meta = pipeline.run(dims=dims, device="meta")
    assert [(r.id, r.shape, r.stride) for r in meta] == [(r.id, r.shape, r.stride) for r in trace]


def test_declared_dims_of_one_in_the_file():
    text = NO_EXPECT.replace("B: 2 ", "B: 1 ").replace("T: 6 ", "T: 1 ").replace("H: 2 ", "H: 1 ")
    trace = tracer.loads(text, "c.yaml").run(keep_values=True)
    assert trace["scores"].shape == (1, 1, 1, 1)
    assert torch.equal(trace["weights"].tensor, torch.ones(1, 1, 1, 1))


@pytest.mark.parametrize("dims", [{"T": 0}, {"B": 0}, {"T": 0, "B": 0}])
@pytest.mark.parametrize("device", ["cpu", "meta"])
def test_zero_sized_dims_trace_empty_tensors(dims, device):
    trace = tracer.loads(NO_EXPECT, "c.yaml").run(dims=dims, device=device, keep_values=True)
    want = {"B": 2, "T": 6, **dims}
    assert trace["weights"].shape == (want["B"], 2, want["T"], want["T"])
    assert trace["out"].shape == (want["B"], want["T"], 4)
    for record in trace:
        assert record.contiguous or 0 not in record.shape  # torch: an empty tensor is contiguous
        if 0 in record.shape:
            assert record.nbytes == 0
    data = trace.to_dict(values=True)
    if device == "cpu":
        assert all(t["values"] == [] for t in data["tensors"] if 0 in t["shape"])


def test_zero_sized_dims_keep_expectations_true():
    """The bundled file pins q_h as non-contiguous; with T=0 torch calls every tensor contiguous,
    but an empty tensor has no layout to get wrong, so the expectation still holds."""
    trace = tracer.load(PIPELINES / "causal_mha.yaml").run(dims={"T": 0}, device="meta")
    assert trace["q_h"].contiguous and trace["q_h"].shape == (2, 2, 0, 2)


def test_zero_sized_tensors_through_every_kind_of_op():
    trace = tracer.loads(ZERO_OPS, "z.yaml").run(keep_values=True)
    x, e = trace["x"].tensor, trace["e"].tensor
    expected = {
        "soft_empty_rows": torch.softmax(x, -1),
        "soft_over_nothing": torch.softmax(e, -1),
        "normed": F.layer_norm(e, (0,)),
        "contracted": e @ x,
        "projected": F.linear(x, trace["w"].tensor),
        "embedded": torch.empty(0, 3),
        "joined": torch.cat([x, x], 1),
        "sliced": e[:, 1:1],
        "tiled": e.repeat(1, 0, 2),
        "masked": (e @ x).masked_fill(torch.ones(3, 3, dtype=torch.bool).triu(1), float("-inf")),
        "merged": e.view(2, 3, 0, 1).transpose(-3, -2).contiguous().view(2, 0, 3),
    }
    for name, want in expected.items():
        got = trace[name].tensor
        assert got.shape == want.shape, name
        assert torch.equal(got, want), name
    assert torch.equal(trace["contracted"].tensor, torch.zeros(2, 3, 3))  # a sum over nothing is 0
    meta = tracer.loads(ZERO_OPS, "z.yaml").run(device="meta")
    assert [(r.id, r.shape, r.stride) for r in meta] == [(r.id, r.shape, r.stride) for r in trace]


@pytest.mark.parametrize(
    "value, code",
    [
        (2**31, "tensor-too-large"),  # scores (B, H, T, T) = 2**64 elements
        (2**40, "tensor-too-large"),
        (2**62, "tensor-too-large"),  # x itself
        (2**62 + 1, "dim-value"),
        (2**63, "dim-value"),
        (-1, "dim-negative"),
    ],
)
def test_overflowing_dims_are_clear_errors_not_torch_crashes(value, code):
    pipeline = tracer.loads(NO_EXPECT, "c.yaml")
    for device in ("meta", "cpu"):
        with pytest.raises(TracerError) as info:
            pipeline.run(dims={"T": value}, device=device)
        assert info.value.code == code, str(info.value)
        assert str(info.value).startswith("c.yaml:")
        if value < 0:  # the value given, not the file's
            assert "--dim T=-1; dims must not be negative" in str(info.value)


@pytest.mark.parametrize(
    "text, code",
    [
        ("T: 4611686018427387905", "invalid-value"),
        ("T: 2 * 2305843009213693952 * 2", "dim-overflow"),
        ("T: 9223372036854775807", "invalid-value"),
        ("T: 0 - 6", "dim-negative"),
    ],
)
def test_overflowing_dims_in_the_file(text, code):
    with pytest.raises(TracerError) as info:
        tracer.loads(NO_EXPECT.replace("T: 6 ", text + " "), "c.yaml")
    assert info.value.code == code, str(info.value)


def test_a_large_but_valid_dim_checks_statically_and_traces_on_meta():
    """T = 2**20: scores are 16 TiB; check and a meta run need no memory, a real run is refused."""
    pipeline = tracer.loads(NO_EXPECT, "c.yaml")
    trace = pipeline.run(dims={"T": 2**20}, device="meta")
    assert trace["scores"].shape == (2, 2, 2**20, 2**20)
    with pytest.raises(TracerError):
        pipeline.run(dims={"T": 2**20})


@pytest.mark.parametrize(
    "argv, code",
    [
        (["--dim", "T=9223372036854775808"], "dim-value"),
        (["--dim", "T=-5"], "dim-negative"),
        (["--dim", "H=0"], "dim-divide"),
        (["--dim", "T=1099511627776"], "tensor-too-large"),
        (["--dim", "Dh=3"], "derived-dim"),
        (["--dim", "nope=1"], "unknown-dim"),
        (["--dim", "T=x"], None),  # a usage error: exit 2
        (["--seed", "99999999999999999999999"], "seed-range"),
    ],
)
def test_cli_degenerate_dims_are_located_errors(argv, code):
    path = PIPELINES / "causal_mha.yaml"
    done = tracer_cli("run", path, "--device", "meta", *argv)
    if code is None:
        assert done.returncode == 2 and "NAME=VALUE" in done.stderr, done.stderr
        return
    assert done.returncode == 1, done.stderr
    assert re.match(rf"{re.escape(str(path))}(:\d+:\d+)?: error\[{code}\]: ", done.stderr), done.stderr
    assert "internal error" not in done.stderr


@pytest.mark.parametrize("dims", [["--dim", "T=0"], ["--dim", "T=1"], ["--dim", "T=1", "--dim", "B=1"]])
def test_cli_runs_at_zero_and_one_tokens_with_the_files_expectations(dims):
    """The file pins q_h as non-contiguous; at T=0 or 1 torch calls it contiguous, but the layout
    is the same transposed one (tracer.core.layout.meets_contiguity), so this is no error."""
    done = tracer_cli("run", PIPELINES / "causal_mha.yaml", "--device", "meta", *dims)
    assert done.returncode == 0, done.stderr
