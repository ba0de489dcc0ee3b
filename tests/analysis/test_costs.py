"""FLOPs and kernel workspaces per step kind (tracer.analysis.costs): FLOPs as torch's FlopCounterMode
counts them, workspaces as upper bounds of what the kernels allocate."""

import pytest

import tracer
from tests.conftest import assert_flops_as_counted, pipeline_text
from tests.measure import allocated_peaks
from tracer import TracerError


def _inputs(shapes) -> tuple[str, str]:
    names = [f"t{i}" for i in range(len(shapes))]
    return ", ".join(names), "\n".join(f"{n}: {{shape: {list(s)}, init: randn}}" for n, s in zip(names, shapes))


@pytest.mark.parametrize(
    "equation, shapes",
    [
        ("bij,bjk->bk", ([2, 3, 4], [2, 4, 5])),  # i is summed away before the product
        ("bij,bjk->ijk", ([2, 3, 4], [2, 4, 5])),  # b contracted, j a batch dim
        ("bij,bik->bijk", ([2, 3, 4], [2, 3, 5])),  # nothing to contract: an elementwise product, 0
        ("bij,bij->", ([2, 3, 4], [2, 3, 4])),
        ("bij,bjk,kl->bil", ([2, 3, 4], [2, 4, 5], [5, 6])),  # left to right, pair by pair
        ("...ij,jk->...ik", ([2, 1, 3, 4], [4, 5])),
        ("bij,xjk->bik", ([2, 3, 4], [1, 4, 5])),
        ("ij->ji", ([3, 4],)),
    ],
)
def test_einsum_flops_are_what_flop_counter_mode_counts(equation, shapes):
    names, inputs = _inputs(shapes)
    assert_flops_as_counted(pipeline_text(f"- {{id: e, op: einsum, inputs: [{names}], equation: '{equation}'}}", inputs=inputs))


@pytest.mark.parametrize("a, b", [([4], [4]), ([3, 4], [4]), ([4], [2, 4, 5]), ([3, 4], [2, 4, 5]), ([2, 1, 3, 4], [5, 4, 6])])
def test_matmul_flops_follow_the_kernel_torch_picks(a, b):
    names, inputs = _inputs([a, b])
    assert_flops_as_counted(pipeline_text(f"- {{id: y, op: matmul, inputs: [{names}]}}", inputs=inputs))


def test_sdpa_flops_with_grouped_heads_and_narrower_values():
    _, inputs = _inputs([[1, 4, 3, 8], [1, 2, 5, 8], [1, 2, 5, 4]])
    assert_flops_as_counted(pipeline_text("- {id: o, op: sdpa, inputs: [t0, t1, t2], gqa: true, causal: true}", inputs=inputs))


# ---------------------------------------------------------------- workspaces against what torch allocates

# Each case runs at a size where its tensors are megabytes (the meter's resolution is a page),
# for every kind that allocates inside its kernel, and for the layouts that make kernels copy.
# The estimate must bound the peak the allocator saw, to within 3% (pages of small blocks and
# allocator bookkeeping) and 256 KiB; and it must stay a useful bound: at most 4x the peak.
WORKSPACES = {
    "einsum, three operands (an n^4 intermediate)": (
        "- {id: y, op: einsum, equation: 'ab,cd,ac->bd', inputs: [a, b, c]}",
        "a: {shape: [32, 32], init: randn}\nb: {shape: [32, 32], init: randn}\nc: {shape: [32, 32], init: randn}",
        "",
    ),
    "einsum, four operands (an n^6 intermediate)": (
        "- {id: y, op: einsum, equation: 'ab,cd,ef,ace->bdf', inputs: [a, b, c, d]}",
        "a: {shape: [12, 12], init: randn}\nb: {shape: [12, 12], init: randn}\nc: {shape: [12, 12], init: randn}\n"
        "d: {shape: [12, 12, 12], init: randn}",
        "",
    ),
    "einsum, five operands sharing one letter": (
        "- {id: y, op: einsum, equation: 'ab,ac,ad,ae,af->bcdef', inputs: [a, b, c, d, e]}",
        "\n".join(f"{n}: {{shape: [12, 12], init: randn}}" for n in "abcde"),
        "",
    ),
    "einsum, five vectors to their outer product": (
        "- {id: y, op: einsum, equation: 'a,b,c,d,e->abcde', inputs: [a, b, c, d, e]}",
        "\n".join(f"{n}: {{shape: [20], init: randn}}" for n in "abcde"),
        "",
    ),
    "einsum, an expanded operand": (
        "- {id: e, op: expand, input: a, shape: [64, 64, 64]}\n- {id: y, op: einsum, equation: 'abc,cd,de->abe', inputs: [e, b, c]}",
        "a: {shape: [1, 64, 64], init: randn}\nb: {shape: [64, 64], init: randn}\nc: {shape: [64, 64], init: randn}",
        "",
    ),
    "einsum, attention scores": (
        "- {id: y, op: einsum, equation: 'bhqd,bhkd->bhqk', inputs: [q, k]}",
        "q: {shape: [1, 4, 256, 64], init: randn}\nk: {shape: [1, 4, 256, 64], init: randn}",
        "",
    ),
    "softmax of an expanded input": (
        "- {id: e, op: expand, input: x, shape: [1024, 1024]}\n- {id: y, op: softmax, dim: 0}",
        "x: {shape: [1, 1024], init: randn}",
        "",
    ),
    "softmax over the middle dim of an expanded input": (
        "- {id: e, op: expand, input: x, shape: [64, 128, 128]}\n- {id: y, op: softmax, dim: 1}",
        "x: {shape: [1, 128, 1], init: randn}",
        "",
    ),
    "softmax over dim 0 of a transposed input": (
        "- {id: t, op: transpose, input: x, dims: [0, 1]}\n- {id: y, op: softmax, dim: 0}",
        "x: {shape: [1024, 1024], init: randn}",
        "",
    ),
    "softmax of a transposed input": (
        "- {id: t, op: transpose, input: x, dims: [0, 1]}\n- {id: y, op: softmax, dim: -1}",
        "x: {shape: [1024, 1024], init: randn}",
        "",
    ),
    "layernorm of a transposed input": (
        "- {id: t, op: transpose, input: x, dims: [0, 1]}\n- {id: y, op: layernorm}",
        "x: {shape: [1024, 1024], init: randn}",
        "",
    ),
    "layernorm of an expanded input": (
        "- {id: e, op: expand, input: x, shape: [1024, 1024]}\n- {id: y, op: layernorm}",
        "x: {shape: [1, 1024], init: randn}",
        "",
    ),
    "layernorm with Nemotron's unit offset (weight + 1)": (
        "- {id: y, op: layernorm, weight: w, bias: b, unit_offset: true}",
        "x: {shape: [4, 65536], init: randn}",
        "w: {shape: [65536], init: zeros}\nb: {shape: [65536], init: zeros}",
    ),
    "rmsnorm of a transposed input": (
        "- {id: t, op: transpose, input: x, dims: [0, 1]}\n- {id: y, op: rmsnorm}",
        "x: {shape: [1024, 1024], init: randn}",
        "",
    ),
    "rmsnorm of an expanded input": (
        "- {id: e, op: expand, input: x, shape: [1024, 1024]}\n- {id: y, op: rmsnorm}",
        "x: {shape: [1, 1024], init: randn}",
        "",
    ),
    "rmsnorm of float64, with a weight": (
        "- {id: c, op: cast, input: x, dtype: float64}\n- {id: y, op: rmsnorm, weight: w}",
        "x: {shape: [1024, 1024], init: randn}",
        "w: {shape: [1024], init: ones, dtype: float64}",
    ),
    "matmul broadcasting both operands": (
        "- {id: y, op: matmul, inputs: [a, b]}",
        "a: {shape: [4, 1, 256, 64], init: randn}\nb: {shape: [1, 4, 64, 256], init: randn}",
        "",
    ),
    "matmul of an expanded batch by a vector (no fold: a bmm of views)": (
        "- {id: e, op: expand, input: a, shape: [64, 1024, 256]}\n- {id: y, op: matmul, inputs: [e, b]}",
        "a: {shape: [1, 1024, 256], init: randn}\nb: {shape: [256], init: randn}",
        "",
    ),
    "matmul of a matrix by a 4-d batch": (
        "- {id: y, op: matmul, inputs: [a, b]}",
        "a: {shape: [256, 64], init: randn}\nb: {shape: [4, 8, 64, 256], init: randn}",
        "",
    ),
    "matmul of a vector by a 3-d batch": (
        "- {id: y, op: matmul, inputs: [a, b]}",
        "a: {shape: [256], init: randn}\nb: {shape: [16, 256, 1024], init: randn}",
        "",
    ),
    "matmul of an expanded batch by a matrix": (
        "- {id: e, op: expand, input: a, shape: [8, 1024, 64]}\n- {id: y, op: matmul, inputs: [e, b]}",
        "a: {shape: [8, 1, 64], init: randn}\nb: {shape: [64, 256], init: randn}",
        "",
    ),
    "linear of an expanded input": (
        "- {id: e, op: expand, input: x, shape: [64, 256, 256]}\n- {id: y, op: linear, weight: W}",
        "x: {shape: [1, 256, 256], init: randn}",
        "W: {shape: [256, 256], init: randn}",
    ),
    "linear, x @ W + b": (
        "- {id: y, op: linear, input: x, weight: W, bias: b, layout: in_out}",
        "x: {shape: [64, 256, 256], init: randn}",
        "W: {shape: [256, 256], init: randn}\nb: {shape: [256], init: randn}",
    ),
    "linear of a transposed input, with a bias": (
        "- {id: t, op: transpose, input: x, dims: [0, 1]}\n- {id: y, op: linear, weight: W, bias: b}",
        "x: {shape: [256, 32, 128], init: randn}",
        "W: {shape: [128, 128], init: randn}\nb: {shape: [128], init: randn}",
    ),
    "mask, causal with a window": (
        "- {id: y, op: mask, input: s, causal: true, window: 64}",
        "s: {shape: [1, 4, 512, 512], init: randn}",
        "",
    ),
    "mask, a band, chunks and documents": (
        "- {id: y, op: mask, input: s, window: 64, chunk: 100, segments: d}",
        "s: {shape: [2, 4, 512, 512], init: randn}\nd: {shape: [2, 512], dtype: int64, init: zeros}",
        "",
    ),
    "mask, a keep tensor": (
        "- {id: y, op: mask, input: s, mask: m, polarity: keep}",
        "s: {shape: [2, 4, 256, 256], init: randn}\nm: {shape: [2, 1, 256, 256], init: ones}",
        "",
    ),
    "sdpa, the flash kernel": ("- {id: y, op: sdpa, inputs: [q, q, q], causal: true}", "q: {shape: [1, 4, 1024, 64], init: randn}", ""),
    "sdpa, a window (an explicit mask)": (
        "- {id: y, op: sdpa, inputs: [q, q, q], causal: true, window: 128}",
        "q: {shape: [1, 4, 512, 64], init: randn}",
        "",
    ),
    "sdpa, the math path (3-d)": ("- {id: y, op: sdpa, inputs: [q, q, q]}", "q: {shape: [4, 256, 64], init: randn}", ""),
    "sdpa, expanded keys and values": (
        "- {id: kv, op: expand, input: k, shape: [1, 4, 1024, 64]}\n- {id: y, op: sdpa, inputs: [q, kv, kv]}",
        "q: {shape: [1, 4, 1024, 64], init: randn}\nk: {shape: [1, 1, 1024, 64], init: randn}",
        "",
    ),
    "sdpa, grouped keys expanded and reshaped to every head": (
        "- {id: kv, op: expand, input: k, shape: [1, 2, 4, 1024, 64]}\n- {id: r, op: reshape, shape: [1, 8, 1024, 64]}\n"
        "- {id: y, op: sdpa, inputs: [q, r, r]}",
        "q: {shape: [1, 8, 1024, 64], init: randn}\nk: {shape: [1, 2, 1, 1024, 64], init: randn}",
        "",
    ),
    "sdpa, expanded queries, causal": (
        "- {id: qe, op: expand, input: q, shape: [1, 8, 1024, 64]}\n- {id: y, op: sdpa, inputs: [qe, k, k], causal: true}",
        "q: {shape: [1, 1, 1024, 64], init: randn}\nk: {shape: [1, 8, 1024, 64], init: randn}",
        "",
    ),
    "sdpa, gqa of expanded keys": (
        "- {id: kv, op: expand, input: k, shape: [1, 2, 1024, 64]}\n- {id: y, op: sdpa, inputs: [q, kv, kv], gqa: true}",
        "q: {shape: [1, 8, 1024, 64], init: randn}\nk: {shape: [1, 1, 1024, 64], init: randn}",
        "",
    ),
    "cat and stack of expanded views": (
        "- {id: e, op: expand, input: x, shape: [1024, 1024]}\n- {id: c, op: cat, inputs: [e, e], dim: 0}\n"
        "- {id: y, op: stack, inputs: [e, e], dim: 0}",
        "x: {shape: [1, 1024], init: randn}",
        "",
    ),
    "contiguous and reshape of expanded views": (
        "- {id: e, op: expand, input: x, shape: [1024, 1024]}\n- {id: c, op: contiguous}\n- {id: y, op: reshape, input: e, shape: [-1]}",
        "x: {shape: [1, 1024], init: randn}",
        "",
    ),
    "rope, partial": ("- {id: y, op: rope, input: x, rotary_dim: 32}", "x: {shape: [1, 8, 512, 64], init: randn}", ""),
    # a narrow rotary part: the rotation and the rotated part outlive the cat that makes the output
    "rope, narrow partial": ("- {id: y, op: rope, input: x, rotary_dim: 4}", "x: {shape: [4, 8, 1024, 64], init: randn}", ""),
    "rope, llama3 at (B, T) positions": (
        "- {id: y, op: rope, input: x, positions: p, rope_scaling: {type: llama3, factor: 8.0}}",
        "x: {shape: [4, 8, 512, 64], init: randn}\np: {shape: [4, 512], dtype: int64, init: zeros}",
        "",
    ),
    "softcap": ("- {id: y, op: softcap, input: s, cap: 50.0}", "s: {shape: [1, 8, 256, 256], init: randn}", ""),
    "alibi, relative": ("- {id: y, op: alibi, input: s, relative: true}", "s: {shape: [1, 8, 256, 256], init: randn}", ""),
    "rmsnorm of bfloat16": (
        "- {id: c, op: cast, input: x, dtype: bfloat16}\n- {id: y, op: rmsnorm, weight: w}",
        "x: {shape: [32, 256, 128], init: randn}",
        "w: {shape: [128], init: ones, dtype: bfloat16}",
    ),
    "math on integers (a float32 copy first)": ("- {id: y, op: log, input: i}", "i: {shape: [1024, 1024], init: zeros, dtype: int64}", ""),
    "cumsum of bools (an int64 copy first)": (
        "- {id: y, op: cumsum, input: b, dim: 0}",
        "b: {shape: [1024, 1024], init: ones, dtype: bool}",
        "",
    ),
    "reduce: sum of bools, any of floats": (
        "- {id: s, op: reduce, fn: sum, input: b, dim: 0}\n- {id: y, op: reduce, fn: any, input: x}",
        "b: {shape: [1024, 1024], init: ones, dtype: bool}\nx: {shape: [1024, 1024], init: randn}",
        "",
    ),
    "minimum, compare and where of mixed dtypes": (
        "- {id: m, op: minimum, inputs: [i, x]}\n- {id: c, op: compare, inputs: [x, i], cmp: lt}\n- {id: y, op: where, inputs: [c, i, x]}",
        "x: {shape: [1024, 1024], init: randn}\ni: {shape: [1024, 1024], init: zeros, dtype: int64}",
        "",
    ),
    "relative_bias, one head (the bucket arithmetic is the peak)": (
        "- {id: y, op: relative_bias, input: s, table: rel, bidirectional: true}",
        "s: {shape: [1, 1, 512, 512], init: randn}",
        "rel: {shape: [32, 1], init: randn}",
    ),
    "relative_position_bias, one head (the bucket arithmetic is the peak)": (
        "- {id: y, op: relative_position_bias, table: rel, queries: 384, keys: 512, bidirectional: false}",
        "",
        "rel: {shape: [32, 1], init: randn}",
    ),
    "layernorm with per-head weight and bias": (
        "- {id: y, op: layernorm, input: x, weight: w, bias: b}",
        "x: {shape: [8, 256, 16, 64], init: randn}",
        "w: {shape: [16, 64], init: randn}\nb: {shape: [16, 64], init: randn}",
    ),
    "conv2d, a ViT patch embedding (oneDNN)": (
        "- {id: y, op: conv2d, input: x, weight: w, bias: b, stride: 16}",
        "x: {shape: [4, 3, 224, 224], init: randn}",
        "w: {shape: [768, 3, 16, 16], init: randn}\nb: {shape: [768], init: randn}",
    ),
    "conv2d of float64 (columns)": (
        "- {id: c, op: cast, input: x, dtype: float64}\n- {id: y, op: conv2d, weight: w, padding: 1}",
        "x: {shape: [4, 64, 64, 64], init: randn}",
        "w: {shape: [64, 64, 3, 3], init: randn, dtype: float64}",
    ),
    "conv2d of a channels-last input": (
        "- {id: p, op: permute, input: x, dims: [0, 3, 1, 2]}\n- {id: y, op: conv2d, weight: w, padding: 1, groups: 4}",
        "x: {shape: [4, 64, 64, 64], init: randn}",
        "w: {shape: [64, 16, 3, 3], init: randn}",
    ),
    "conv1d, Whisper's strided second layer": (
        "- {id: y, op: conv1d, input: x, weight: w, bias: b, stride: 2, padding: 1}",
        "x: {shape: [2, 384, 3000], init: randn}",
        "w: {shape: [384, 384, 3], init: randn}\nb: {shape: [384], init: randn}",
    ),
    "conv1d, same padding of an even kernel": (
        "- {id: y, op: conv1d, input: x, weight: w, padding: same}",
        "x: {shape: [2, 384, 3000], init: randn}",
        "w: {shape: [384, 384, 4], init: randn}",
    ),
    "conv1d, one small sequence (columns)": (
        "- {id: y, op: conv1d, input: x, weight: w, padding: 2}",
        "x: {shape: [1, 128, 150], init: randn}",
        "w: {shape: [512, 128, 5], init: randn}",
    ),
    "topk along the first dim, renormalised": (
        "- {id: r, op: topk, input: p, k: 2, dim: 0, normalize: true, outputs: [w, i]}",
        "p: {shape: [65536, 64], init: rand}",
        "",
    ),
    # arange probabilities: every token picks the same two experts, the most an expert can take
    "moe, every token to the same experts": (
        "- {id: r, op: topk, input: p, k: 2, outputs: [w, i]}\n- {id: y, op: moe, inputs: [h, w, i], gate_up: gu, down: dn}",
        "h: {shape: [1024, 256], init: randn}\np: {shape: [1024, 8], init: arange}",
        "gu: {shape: [8, 1024, 256], init: randn}\ndn: {shape: [8, 256, 512], init: randn}",
    ),
    "moe, tokens spread over the experts": (
        "- {id: r, op: topk, input: p, k: 2, outputs: [w, i]}\n- {id: y, op: moe, inputs: [h, w, i], gate_up: gu, down: dn}",
        "h: {shape: [1024, 256], init: randn}\np: {shape: [1024, 8], init: rand}",
        "gu: {shape: [8, 1024, 256], init: randn}\ndn: {shape: [8, 256, 512], init: randn}",
    ),
    "moe as GPT-OSS computes it (x @ W + b, interleaved clamped SwiGLU)": (
        "- {id: r, op: topk, input: p, k: 2, outputs: [w, i]}\n- {id: y, op: moe, inputs: [h, w, i], gate_up: gu, down: dn,"
        " gate_up_bias: gub, down_bias: dnb, layout: in_out, interleave: true, activation: clamped_swiglu}",
        "h: {shape: [1024, 256], init: randn}\np: {shape: [1024, 8], init: arange}",
        "gu: {shape: [8, 256, 1024], init: randn}\ndn: {shape: [8, 512, 256], init: randn}\n"
        "gub: {shape: [8, 1024], init: randn}\ndnb: {shape: [8, 256], init: randn}",
    ),
    "dropout in training": ("- {id: y, op: dropout, input: x, p: 0.5, training: true}", "x: {shape: [32, 256, 128], init: randn}", ""),
}


@pytest.fixture(scope="module")
def allocated():
    texts = [pipeline_text(steps, inputs=inputs, params=params) for steps, inputs, params in WORKSPACES.values()]
    return dict(zip(WORKSPACES, allocated_peaks(texts)))


@pytest.mark.long  # first: one worker computes `allocated` (seconds), not both
@pytest.mark.xdist_group("costs-allocated")  # and under `--dist loadgroup`, in one worker for sure
@pytest.mark.parametrize("case", list(WORKSPACES))
def test_the_estimate_bounds_what_the_kernels_allocate(case, allocated):
    estimate, peak = allocated[case]
    assert estimate >= 0.97 * peak - (256 << 10), f"{case}: estimated {estimate:,} B, torch allocated {peak:,} B"
    assert estimate <= 4 * peak + (1 << 20), f"{case}: estimated {estimate:,} B is no useful bound of {peak:,} B"


@pytest.mark.long
@pytest.mark.xdist_group("costs-allocated")
@pytest.mark.parametrize("case", list(WORKSPACES))
def test_a_budget_the_run_would_exceed_is_refused_before_anything_is_allocated(case, allocated, monkeypatch):
    _, peak = allocated[case]
    steps, inputs, params = WORKSPACES[case]
    pipeline = tracer.loads(pipeline_text(steps, inputs=inputs, params=params))
    for allocates in ("create_tensors", "Plan"):
        monkeypatch.setattr(tracer.api, allocates, _refuse)
    with pytest.raises(TracerError) as refused:
        pipeline.run(max_memory=int(0.97 * peak) - (256 << 10) - 1)
    assert refused.value.code == "memory-budget"


def _refuse(*args, **kwargs):
    raise AssertionError("allocated before the memory guard")


@pytest.mark.long
@pytest.mark.xdist_group("costs-allocated")
def test_the_meter_sees_what_a_kernel_allocates_inside_itself(allocated):
    """Without a bound to check, a meter that missed kernel insides would pass everything: the
    three-operand einsum's n^4 intermediate must show (32^4 float32 = 4 MiB)."""
    _, peak = allocated["einsum, three operands (an n^4 intermediate)"]
    assert peak >= 0.9 * 32**4 * 4
