"""Bugs the fuzzer's well-typed pipelines found (issue 12): each case, reduced, with torch as the judge.

``agrees`` runs a pipeline on CPU watched op by op and fails unless every record and every tensor
torch made has the predicted shape, stride, offset, dtype, contiguity and storage owner, and the
memory estimate bounds the measured peak: the fuzz oracle's own checks.
"""

from __future__ import annotations

import pytest
import torch

import tracer
from tests.conftest import pipeline_text
from tests.fuzz.oracle import check_prediction, layout_into
from tests.measure import PeakStorage
from tracer.core.errors import TracerError

X23 = "x: {shape: [2, 3], init: randn}"
X234 = "x: {shape: [2, 3, 4], init: randn}"
Q = "q: {shape: [2, 2, 3, 4], init: randn}"
LINEAR = "\nW: {shape: [5, 4], init: randn}\nb: {shape: [5], init: randn}"


def agrees(steps: str, inputs: str, dims: str = "") -> tracer.Trace:
    pipeline = tracer.loads(pipeline_text(steps, dims=dims, inputs=inputs), "t.yaml")
    seen: dict[str, tuple] = {}
    with PeakStorage() as mode:
        trace = pipeline.run(observe=layout_into(seen))
    check_prediction(trace, seen)
    assert trace.as_predicted  # on CPU, exactly: strides of size-1 dims too
    assert mode.peak <= trace.analysis.memory.peak_bytes, (mode.peak, trace.analysis.memory)
    return trace


# (1, 3, 1) with stride (3, 1, 3): contiguous by torch's rule, which ignores size-1 dims, yet not row-major
ODD = "- {id: t, op: transpose, input: x, dims: [0, 1]}\n- {id: u, op: unsqueeze, dim: 0}\n"


@pytest.mark.parametrize(
    "step",
    [
        "{id: y, op: scale, input: u, divide: 8.0}",  # x / 8.0: a 0-d operand, strides follow u's order
        "{id: y, op: relu, input: u}",
        "{id: y, op: gelu, input: u}",
        "{id: y, op: add, inputs: [u, u]}",
        "{id: y, op: dropout, input: u, p: 0.5, training: true}",
        "{id: y, op: dropout, input: u, p: 1.0, training: true}",
    ],
)
def test_elementwise_results_have_torchs_strides_on_size_one_dims(step):
    trace = agrees(ODD + f"- {step}", "x: {shape: [1, 3], init: randn}")
    assert trace["u"].stride == (3, 1, 3)


def test_training_dropout_with_p_zero_or_nothing_to_drop_returns_its_input():
    trace = agrees(
        "- {id: d, op: dropout, input: x, p: 0.0, training: true}\n- {id: e, op: dropout, input: empty, p: 0.5, training: true}",
        "x: {shape: [2, 3], init: randn}\nempty: {shape: [2, 0], init: randn}",
    )
    assert trace["d"].view_of == "x" and trace["e"].view_of == "empty"


def test_a_split_into_one_piece_is_a_tensor_not_a_tuple():
    trace = agrees("- {id: s, op: split, input: x, dim: 0, chunks: 1, outputs: [only]}\n- {id: r, op: relu, input: only}", X23)
    assert trace["only"].view_of == "x" and trace["r"].shape == (2, 3)


def test_a_new_leading_dim_of_size_one_gets_torchs_stride():
    trace = agrees("- {id: e, op: expand, input: x, shape: [1, 4, 2, 3]}\n- {id: f, op: expand, input: x, shape: [1, 2, 3]}", X23)
    assert trace["e"].stride == (0, 0, 3, 1) and trace["f"].stride == (6, 3, 1)


@pytest.mark.parametrize("equation", ["ij->ij", "ij->ji", "ij", "ij->i"])
def test_einsum_is_always_a_fresh_contiguous_tensor(equation):
    trace = agrees(f"- {{id: e, op: einsum, inputs: [x], equation: '{equation}'}}", X23)
    assert trace["e"].view_of is None and trace["e"].contiguous


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


@pytest.mark.parametrize(
    "steps, inputs",
    [
        ("- {id: y, op: layernorm, input: x}", X234),
        ("- {id: y, op: rmsnorm, input: x}", "x: {shape: [2, 3, 4], init: randn, dtype: bfloat16}"),
        ("- {id: y, op: rope, input: x, rotary_dim: 2, style: interleaved}", X234),
        ("- {id: y, op: alibi, input: x, relative: true}", X234),
        ("- {id: y, op: sdpa, inputs: [x, x, x], causal: true, window: 2}", X234),
        ("- {id: y, op: sdpa, inputs: [x, k, k]}", X234 + "\nk: {shape: [2, 0, 4], init: randn}"),
        ("- {id: t, op: transpose, input: x, dims: [0, 1]}\n- {id: y, op: linear, weight: W, bias: b}", X234 + LINEAR),
        ("- {id: y, op: einsum, inputs: [x, x], equation: 'bqd,bkd->bqk'}", X234),
        ("- {id: y, op: mask, input: x, mask: m, polarity: keep, causal: true}", X234 + "\nm: {shape: [3, 4], init: ones, dtype: int64}"),
        ("- {id: y, op: dropout, input: x, p: 0.5, training: true}", X234),
        ("- {id: y, op: relu, input: x}", "x: {shape: [64], init: arange}\nt: {shape: [8, 8], init: tril}"),
        ("- {id: y, op: mask, input: x, causal: true}", "x: {shape: [12, 1], init: randn}"),  # many queries, one key
        ("- {id: y, op: rmsnorm, input: x, weight: g, unit_offset: true}", X234 + "\ng: {shape: [4], init: ones}"),
        ("- {id: y, op: sdpa, inputs: [q, q, q]}", "q: {shape: [1, 2, 3, 4], init: randn, dtype: float64}"),
        ("- {id: y, op: layernorm, input: x}", "x: {shape: [2, 3, 0], init: randn}"),
        ("- {id: y, op: alibi, input: x}", "x: {shape: [4, 0, 0], init: randn}"),
    ],
)
def test_the_estimate_bounds_what_each_kernel_allocates(steps, inputs):
    """Kernels' temporaries (float32 chains, tables, masks, scores of the math path, folded copies),
    a mask tensor that is a param of its step, and the int64 range an arange init casts."""
    agrees(steps, inputs)


def test_an_empty_result_of_a_scaled_tensor_has_torchs_strides():
    trace = agrees("- {id: y, op: scale, input: x, divide: -1.5}", "x: {shape: [3, 1, 0, 1, 2], init: randn}")
    assert trace["y"].stride == (0, 0, 2, 0, 1)


def test_alibi_on_meta_allocates_nothing_for_many_heads():
    pipeline = tracer.loads(
        pipeline_text("- {id: y, op: alibi, input: x}", dims="H: 67108864", inputs="x: {shape: [H, 1, 1], init: randn}")
    )
    with PeakStorage() as mode:
        pipeline.run(device="meta")
    assert mode.peak == 0  # the slopes were 256 MiB of real memory


@pytest.mark.parametrize(
    "text, code",
    [
        (
            "dtype: float16\ninputs: {x: {shape: [2, 2], init: randn}}\nsteps: [{id: y, op: mask, input: x, causal: true, fill: -1.0e9}]",
            "mask-fill",
        ),
        ("inputs: {x: {shape: [2], init: full, value: 1.0e+9, dtype: float16}}\nsteps: [{id: y, op: relu, input: x}]", "tensor-source"),
    ],
)
def test_a_number_the_dtype_cannot_hold_is_a_located_error(text, code):
    with pytest.raises(TracerError) as info:
        tracer.loads("name: t\n" + text, "t.yaml").run()
    assert (
        info.value.code == code
        and "overflows" in str(info.value)
        and "float16" in str(info.value)
        and str(info.value).startswith("t.yaml:")
    )


@pytest.mark.parametrize(
    "steps, inputs",
    [
        # not 4-d: the math path, whose output is a fresh product, not laid out like q
        ("- {id: t, op: transpose, input: x, dims: [0, 2]}\n- {id: y, op: sdpa, inputs: [t, t, t]}", X234),
        ("- {id: t, op: transpose, input: q, dims: [1, 2]}\n- {id: y, op: sdpa, inputs: [t, t, t], dropout: 0.5, training: true}", Q),
        # a 3-d mask sends torch to the math path too (its scores count)
        ("- {id: y, op: sdpa, inputs: [q, q, q], mask: m}", Q + "\nm: {shape: [2, 3, 1], init: randn}"),
        # the causal pattern of a window is built per call (it was a constant held for the whole run)
        ("- {id: y, op: sdpa, inputs: [q, q, q], causal: true, window: 2}", "q: {shape: [1, 2, 64, 4], init: randn}"),
    ],
)
def test_sdpa_layout_and_memory_follow_the_kernel_torch_picks(steps, inputs):
    agrees(steps, inputs)


def test_a_meta_run_of_sdpa_shows_the_layout_of_a_real_run():
    """torch's meta sdpa is the math path's (row-major); CPU's flash kernel lays out like q."""
    pipeline = tracer.loads(
        pipeline_text("- {id: t, op: transpose, input: q, dims: [1, 2]}\n- {id: y, op: sdpa, inputs: [t, t, t]}", inputs=Q)
    )
    meta, cpu = pipeline.run(device="meta"), pipeline.run()
    assert meta["y"].stride == cpu["y"].stride == (24, 4, 12, 1) and meta.as_predicted and cpu.as_predicted


def test_a_block_that_uses_a_directory_is_a_located_error(tmp_path):
    (tmp_path / "p.yaml").write_text(pipeline_text("- {id: b, op: block, use: ., dims: {}}", inputs=X23))
    with pytest.raises(TracerError) as info:
        tracer.load(tmp_path / "p.yaml")
    assert info.value.code == "block-use" and "is a folder" in str(info.value)
    assert all(line.startswith(f"{tmp_path / 'p.yaml'}:") for line in str(info.value).splitlines())


def test_sdpa_whose_scores_torch_cannot_describe_is_a_located_error():
    text = pipeline_text("- {id: y, op: sdpa, inputs: [q, q, q]}", dims="T: 4294967296", inputs="q: {shape: [1, T, 2], init: randn}")
    with pytest.raises(TracerError) as info:
        tracer.loads(text, "t.yaml").run(device="meta")  # was torch's RuntimeError from inside the kernel
    assert info.value.code == "tensor-too-large" and str(info.value).startswith("t.yaml:")
