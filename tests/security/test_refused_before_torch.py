"""Inputs torch refuses at run time (or reads otherwise than the file does) are located errors at
check time, never tracer's internal error (exit 3): each case also holds torch to the refusal, so
tracer refuses no more than torch does."""

from __future__ import annotations

import itertools
import math

import pytest
import torch
import torch.nn.functional as F

import tracer
from tests.conftest import PIPELINES, pipeline_text, tracer_cli

X = "x: {shape: [2, 3], init: randn}"


def located(steps: str, tmp_path, code: str, inputs: str = X, params: str = "", dims: str = "") -> str:
    """The file is refused by ``tracer check`` with ``code`` at a step's line and column; the message."""
    path = tmp_path / "p.yaml"
    path.write_text(pipeline_text(steps, inputs=inputs, params=params, dims=dims))
    done = tracer_cli("check", path)
    assert done.returncode == 1 and f"error[{code}]: step '" in done.stderr, done.stderr
    assert done.stderr.startswith(f"{path}:") and done.stderr.split(":")[1].isdigit(), done.stderr
    return done.stderr


def test_a_reduction_over_an_empty_dim_list_is_refused_as_torch_reduces_everything(tmp_path):
    message = located("- {id: s, op: reduce, fn: sum, input: x, dim: []}", tmp_path, "dim")
    assert "leave 'dim' out" in message
    assert torch.randn(2, 3).sum(dim=[]).shape == ()  # torch: every dim, where the file reads "none"


@pytest.mark.parametrize(
    "steps, inputs, torch_call",
    [
        ("- {id: a, op: arange, stop: 3, dtype: bool}", "", lambda: torch.arange(0, 3, dtype=torch.bool)),
        ("- {id: a, op: cumsum, input: x, dtype: bool}", X, lambda: torch.cumsum(torch.randn(2, 3), -1, dtype=torch.bool)),
        (
            "- {id: a, op: topk, input: b, k: 2, outputs: [v, i]}",
            "b: {shape: [4], dtype: bool, init: zeros}",
            lambda: torch.topk(torch.zeros(4, dtype=torch.bool), 2),
        ),
    ],
    ids=["arange", "cumsum", "topk"],
)
def test_bool_where_torch_has_no_kernel_is_refused(tmp_path, steps, inputs, torch_call):
    assert "bool" in located(steps, tmp_path, "dtype", inputs=inputs)
    with pytest.raises((RuntimeError, NotImplementedError)):
        torch_call()


def test_cumsum_of_a_bool_tensor_without_dtype_still_sums_in_int64():
    trace = tracer.loads(
        pipeline_text("- {id: a, op: cumsum, input: b}", inputs="b: {shape: [3], values: [true, false, true], dtype: bool}"), "t.yaml"
    ).run(keep_values=True)
    assert torch.equal(trace["a"].tensor, torch.tensor([1, 1, 2]))


NUMBERS = [2**40, 2**63, -(2**63) - 1, 2**64, 70000, 1e39, math.inf, 2.5]
DTYPES = ["float32", "float16", "int32", "int64", "bool"]
NUMBER_STEPS = {
    "compare": ("- {{id: a, op: compare, input: x, cmp: gt, value: {n}}}", lambda x, c, n: x > n),
    "where": ("- {{id: a, op: where, inputs: [c, x], otherwise: {n}}}", lambda x, c, n: torch.where(c, x, n)),
    "where-numbers": ("- {{id: a, op: where, inputs: [c], then: {n}, otherwise: 1}}", lambda x, c, n: torch.where(c, n, 1)),
    "clamp": ("- {{id: a, op: clamp, input: x, max: {n}}}", lambda x, c, n: torch.clamp(x, max=n)),
}


@pytest.mark.parametrize("kind", NUMBER_STEPS)
def test_numbers_outside_the_dtype_range_are_refused_and_the_rest_compute_as_torch(kind):
    """Every number and dtype: a located number-range error, or the value torch computes; never a
    crash. Integers beyond int64 are always refused (torch overflows converting them, or reads them
    as uint64: int32 zeros > 2**64 - 1 is True in torch)."""
    template, compute = NUMBER_STEPS[kind]
    refusals = 0
    for dtype, n in itertools.product(DTYPES, NUMBERS):
        written = ".inf" if n == math.inf else repr(n).replace("e+", ".0e+")  # YAML's float: 1.0e+39, not 1e+39
        inputs = f"x: {{shape: [3], init: zeros, dtype: {dtype}}}\nc: {{shape: [3], values: [true, false, true], dtype: bool}}"
        try:
            trace = tracer.loads(pipeline_text(template.format(n=written), inputs=inputs), "t.yaml").run(keep_values=True)
        except tracer.TracerError as exc:
            assert exc.code == "number-range" and "t.yaml:" in str(exc), str(exc)
            refusals += 1
            continue
        expected = compute(trace["x"].tensor, trace["c"].tensor, n)
        assert trace["a"].tensor.dtype == expected.dtype and torch.equal(trace["a"].tensor, expected), (dtype, n)
    assert refusals >= 3  # 2**63, -(2**63) - 1 and 2**64 at least, for every kind


def test_a_number_beyond_int64_is_what_torch_cannot_take():
    with pytest.raises((OverflowError, RuntimeError)):
        torch.gt(torch.zeros(3, dtype=torch.int32), 10**23)
    assert (torch.zeros(3, dtype=torch.int32) > 2**64 - 1).all()  # read as uint64 and wrapped: the wrong answer
    with pytest.raises(RuntimeError):
        torch.clamp(torch.zeros(3), max=1e39)  # does not fit float32


CONV = """
- {id: y, op: conv1d, input: s, weight: w, PADDING}
"""


@pytest.mark.parametrize(
    "padding",
    ["padding: 4611686018427387904, stride: 4611686018427387904", "padding: 4611686018427387903, stride: 4611686018427387904"],
    ids=["over-2**62-1", "padded-length-overflows"],
)
def test_conv_padding_beyond_torchs_limits_is_refused(tmp_path, padding):
    steps = CONV.replace("PADDING", padding)
    inputs, params = "s: {shape: [1, 2, 8], init: randn}", "w: {shape: [2, 2, 3], init: randn}"
    assert "beyond torch's limits" in located(steps, tmp_path, "conv-field", inputs=inputs, params=params)
    fields = dict(part.split(": ") for part in padding.split(", "))
    with pytest.raises(RuntimeError):
        F.conv1d(torch.randn(1, 2, 8), torch.randn(2, 2, 3), None, int(fields["stride"]), int(fields["padding"]))


def test_conv_padding_within_torchs_limits_still_runs():
    text = pipeline_text(
        "- {id: y, op: conv1d, input: s, weight: w, padding: 2305843009213693952, stride: 4611686018427387904}",
        inputs="s: {shape: [1, 2, 8], init: randn}",
        params="w: {shape: [2, 2, 3], init: randn}",
    )
    trace = tracer.loads(text, "t.yaml").run(keep_values=True)
    assert trace["y"].tensor.shape == F.conv1d(torch.randn(1, 2, 8), torch.randn(2, 2, 3), None, 2**62, 2**61).shape == (1, 2, 2)


SDPA = """
- {id: a, op: sdpa, inputs: [q, q, q], mask: m}
"""


@pytest.mark.parametrize(
    "query, mask, accepted", [("float16", "bfloat16", False), ("float32", "float64", False), ("bfloat16", "float32", True)]
)
def test_an_sdpa_float_mask_of_another_dtype_than_float32_or_the_querys_is_refused(tmp_path, query, mask, accepted):
    inputs = f"q: {{shape: [1, 2, 4, 8], init: randn, dtype: {query}}}\nm: {{shape: [4, 4], init: zeros, dtype: {mask}}}"
    q, m = torch.randn(1, 2, 4, 8, dtype=getattr(torch, query)), torch.zeros(4, 4, dtype=getattr(torch, mask))
    if accepted:
        trace = tracer.loads(pipeline_text(SDPA, inputs=inputs), "t.yaml").run(keep_values=True)
        assert trace["a"].tensor.dtype == F.scaled_dot_product_attention(q, q, q, attn_mask=m).dtype
        return
    message = located(SDPA, tmp_path, "dtype", inputs=inputs)
    assert f"cast the mask to {query}" in message
    with pytest.raises(RuntimeError, match="attn_mask dtype"):
        F.scaled_dot_product_attention(q, q, q, attn_mask=m)


def test_report_tokens_that_are_not_utf8_are_a_usage_error(tmp_path):
    done = tracer_cli("render", PIPELINES / "causal_mha.yaml", "--values", "-o", tmp_path / "r.html", "--tokens", "a \udcff b c d e")
    assert done.returncode == 2 and "the tokens must be UTF-8 text; \\xff (character 2)" in done.stderr, done.stderr
    assert not (tmp_path / "r.html").exists()


def test_a_scatter_value_the_base_cannot_hold_is_refused(tmp_path):
    inputs = "x: {shape: [2, 3], init: zeros, dtype: float16}\ni: {shape: [2, 2], init: zeros, dtype: int64}"
    assert "does not fit the float16 result" in located(
        "- {id: s, op: scatter, inputs: [x, i], dim: 1, value: 1.0e+23}", tmp_path, "number-range", inputs=inputs
    )
    with pytest.raises(RuntimeError, match="overflow"):
        torch.zeros(2, 3, dtype=torch.float16).scatter(1, torch.zeros(2, 2, dtype=torch.int64), 1e23)


EINSUMS = [
    ("ij->", [[2, 3]]),
    ("ij->i", [[2, 3]]),
    ("ii->i", [[3, 3]]),
    ("ij,ij->i", [[2, 3], [2, 3]]),
    ("ij,kj->ik", [[2, 3], [4, 3]]),
    ("ij,k->ik", [[2, 3], [4]]),
    ("ij,jk->", [[2, 3], [3, 4]]),
    ("ij,jk->k", [[2, 3], [3, 4]]),
    ("ij,ij->ij", [[2, 3], [2, 3]]),
]


@pytest.mark.parametrize("dtype", ["int32", "int64", "bool"])
def test_einsum_of_integers_and_bool_has_torchs_dtype_or_a_located_refusal(dtype):
    """A letter summed out of one operand goes through torch.sum (int64); a contraction through
    bmm, which has no bool kernel and refuses int64 with int32."""
    for equation, shapes in EINSUMS:
        names = "ab"[: len(shapes)]
        inputs = "\n".join(f"{n}: {{shape: {s}, init: zeros, dtype: {dtype}}}" for n, s in zip(names, shapes))
        steps = f"- {{id: e, op: einsum, inputs: [{', '.join(names)}], equation: '{equation}'}}"
        operands = [torch.zeros(s, dtype=getattr(torch, dtype)) for s in shapes]
        try:
            expected = torch.einsum(equation, *operands)
        except (RuntimeError, NotImplementedError):
            with pytest.raises(tracer.TracerError) as info:
                tracer.loads(pipeline_text(steps, inputs=inputs), "t.yaml").check()
            assert info.value.code == "dtype", equation
            continue
        trace = tracer.loads(pipeline_text(steps, inputs=inputs), "t.yaml").run(keep_values=True)
        assert trace["e"].tensor.dtype == expected.dtype and trace.as_predicted, equation


def test_a_yarn_ramp_edge_that_overflows_is_refused(tmp_path):
    """original / (2π·beta_slow) overflows to inf: the ramp's edge ceil(inf) fails in the kernel
    (transformers' _compute_yarn_parameters computes the same and fails the same way)."""
    scaling = "{type: yarn, factor: 2.0, original_max_position_embeddings: 4611686018427387904, beta_slow: 1.0e-300}"
    message = located(
        f"- {{id: r, op: rope, input: q, rope_scaling: {scaling}}}",
        tmp_path,
        "rope-scaling",
        inputs="q: {shape: [1, 2, 5, 8], init: randn}",
    )
    assert "beta_slow=1e-300" in message
    with pytest.raises(OverflowError):
        math.ceil(8 * math.log(2**62 / (1e-300 * 2 * math.pi)) / (2 * math.log(10000.0)))
