"""The step kinds of modern attention (Llama, Mistral, GPT-2, BERT) against plain torch.

Every trace is also checked to be as predicted: the static shapes, strides and storage sharing
equal what torch produced (``Trace.as_predicted``)."""

import math

import pytest
import torch
import torch.nn.functional as F

import tracer
import tracer.verify as verify
from tests.conftest import PIPELINES, assert_flops_as_counted, covers, pipeline_text, run_text
from tests.test_export import check_export


def trace_of(steps, inputs, params="", dims=""):
    text = pipeline_text(steps, dims=dims, inputs=inputs, params=params)
    t = run_text(text)
    assert t.as_predicted, "static layout differs from torch's"
    check_export(t.pipeline, t)  # the steps' emitted PyTorch source computes the same
    assert_flops_as_counted(text)
    return t


def close(a, b, atol=1e-6):
    return a.shape == b.shape and a.dtype == b.dtype and torch.allclose(a, b, atol=atol, equal_nan=True)


@covers("mul", "sub", "div")
def test_binary_ops_broadcast_and_promote_like_torch():
    t = trace_of(
        """
        - {id: xt, op: transpose, input: x, dims: [1, 2]}
        - {id: m, op: mul, inputs: [xt, w]}
        - {id: s, op: sub, inputs: [one, x]}
        - {id: d, op: div, inputs: [x, col]}
        - {id: ints, op: div, inputs: [i, i]}
        - {id: mixed, op: mul, inputs: [i, half]}
        """,
        inputs="""
        x: {shape: [2, 3, 4], init: randn}
        w: {shape: [3], init: randn}
        col: {shape: [2, 3, 1], init: rand}
        one: {shape: [], init: full, value: 1.0}
        i: {shape: [3], init: arange, dtype: int64}
        half: {shape: [], init: full, value: 0.5, dtype: float64}
        """,
    )
    x, w, col, i = (t[n].tensor for n in ("x", "w", "col", "i"))
    assert close(t["m"].tensor, x.transpose(1, 2) * w) and t["m"].stride == (x.transpose(1, 2) * w).stride()
    assert close(t["s"].tensor, 1.0 - x) and close(t["d"].tensor, x / col)
    assert close(t["ints"].tensor, i / i) and t["ints"].dtype == "float32"
    assert t["mixed"].dtype == "float64" and close(t["mixed"].tensor, i * torch.tensor(0.5, dtype=torch.float64))


@covers("silu", "sigmoid", "tanh", "exp", "neg", "cast")
def test_unary_ops_and_cast():
    t = trace_of(
        """
        - {id: xt, op: transpose, input: x, dims: [0, 1]}
        - {id: a, op: silu}
        - {id: s, op: sigmoid, input: x}
        - {id: h, op: tanh, input: x}
        - {id: e, op: exp, input: xt}
        - {id: n, op: neg, input: x}
        - {id: c, op: cast, input: xt, dtype: float64}
        - {id: same, op: cast, input: x, dtype: float32}
        """,
        inputs="x: {shape: [3, 4], init: randn}",
    )
    x = t["x"].tensor
    assert close(t["a"].tensor, F.silu(x.T)) and close(t["s"].tensor, torch.sigmoid(x)) and close(t["h"].tensor, torch.tanh(x))
    assert close(t["e"].tensor, torch.exp(x.T)) and t["e"].stride == (1, 4) and close(t["n"].tensor, -x)
    assert close(t["c"].tensor, x.T.double()) and t["c"].stride == x.T.double().stride()
    assert t["same"].view_of == "x"  # x.to(its own dtype) is x itself


def test_type_errors_are_located():
    with pytest.raises(tracer.TracerError) as info:
        tracer.loads(pipeline_text("- {id: n, op: neg, input: b}", inputs="b: {shape: [2], init: ones, dtype: bool}"), "t.yaml")
    assert info.value.code == "dtype" and "t.yaml:" in str(info.value)
    with pytest.raises(tracer.TracerError) as info:
        tracer.loads(
            pipeline_text("- {id: m, op: mul, inputs: [a, b]}", inputs="a: {shape: [2, 3], init: randn}\nb: {shape: [2], init: randn}"),
            "t.yaml",
        )
    assert info.value.code == "broadcast"


def llama_rmsnorm(x, weight, eps):
    h = x.to(torch.float32)
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(x.dtype)


@covers("rmsnorm")
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_rmsnorm_is_llama_rmsnorm(dtype):
    t = trace_of(
        """
        - {id: r, op: rmsnorm, input: x, weight: g, eps: 1.0e-5}
        - {id: xt, op: transpose, input: x, dims: [0, 1]}
        - {id: plain, op: rmsnorm, input: xt}
        - {id: gemma, op: rmsnorm, input: x, weight: g, unit_offset: true}
        """,
        inputs=f"x: {{shape: [3, 4, 8], init: randn, dtype: {dtype}}}",
        params=f"g: {{shape: [8], init: rand, dtype: {dtype}}}",
    )
    x, g = t["x"].tensor, t["g"].tensor
    assert close(t["r"].tensor, llama_rmsnorm(x, g, 1e-5))
    assert close(t["plain"].tensor, llama_rmsnorm(x.transpose(0, 1), torch.ones(8, dtype=x.dtype), 1e-6))
    h = x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-6)
    assert close(t["gemma"].tensor, (h * (1.0 + g.float())).to(x.dtype))


def llama_rope(x, theta, offset, rot=None):
    """transformers' LlamaRotaryEmbedding + apply_rotary_pos_emb (with GPT-NeoX's partial rotary)."""
    rot = rot or x.shape[-1]
    inv_freq = 1.0 / (theta ** (torch.arange(0, rot, 2, dtype=torch.int64).float() / rot))
    position_ids = torch.arange(offset, offset + x.shape[-2])[None]
    freqs = position_ids[..., None].float() * inv_freq
    emb = torch.cat((freqs, freqs), dim=-1)
    cos, sin = emb.cos().unsqueeze(1), emb.sin().unsqueeze(1)
    x_rot, x_pass = x[..., :rot], x[..., rot:]
    x1, x2 = x_rot[..., : rot // 2], x_rot[..., rot // 2 :]
    return torch.cat(((x_rot * cos) + (torch.cat((-x2, x1), dim=-1) * sin), x_pass), dim=-1)


def gptj_rope(x, rot):
    """transformers' GPT-J: create_sinusoional_positions + rotate_every_two on (B, T, H, Dh)."""
    inv_freq = 1.0 / (10000 ** (torch.arange(0, rot, 2, dtype=torch.int64) / rot))
    sinusoid = torch.einsum("i , j -> i j", torch.arange(x.shape[1], dtype=torch.int64).float(), inv_freq).float()
    sin, cos = torch.sin(sinusoid)[None, :, None, :], torch.cos(sinusoid)[None, :, None, :]
    sin, cos = torch.repeat_interleave(sin, 2, 3), torch.repeat_interleave(cos, 2, 3)
    x_rot, x_pass = x[..., :rot], x[..., rot:]
    turned = torch.stack((-x_rot[:, :, :, 1::2], x_rot[:, :, :, ::2]), dim=-1).flatten(-2)
    return torch.cat([x_rot * cos + turned * sin, x_pass], dim=-1)


@covers("rope")
def test_rope_matches_llama_neox_and_gptj():
    t = trace_of(
        """
        - {id: xt, op: transpose, input: x, dims: [1, 2]}
        - {id: full, op: rope, input: xt, theta: 500000.0}
        - {id: decode, op: rope, input: xt, offset: past}
        - {id: partial, op: rope, input: xt, rotary_dim: R}
        - {id: gptj, op: rope, input: x, style: interleaved, rotary_dim: R, seq_dim: -3}
        """,
        inputs="x: {shape: [2, T, 3, 8], init: randn}",
        dims="{T: 5, past: 7, R: 4}",
    )
    x = t["x"].tensor
    xt = x.transpose(1, 2)
    assert close(t["full"].tensor, llama_rope(xt, 500000.0, 0), atol=1e-5)
    assert close(t["decode"].tensor, llama_rope(xt, 10000.0, 7), atol=1e-5)
    assert close(t["partial"].tensor, llama_rope(xt, 10000.0, 0, rot=4), atol=1e-5)
    assert close(t["gptj"].tensor, gptj_rope(x, 4), atol=1e-5)
    assert t["decode/cos"].shape == (5, 8) and t["decode/cos"].view_of is None


@covers("repeat_interleave", "expand")
def test_repeat_interleave_is_repeat_kv_and_expand_is_a_view():
    t = trace_of(
        """
        - {id: k_rep, op: repeat_interleave, input: k, repeats: n_rep, dim: 1}
        - {id: k5, op: unsqueeze, input: k, dim: 2}
        - {id: k_exp, op: expand, shape: [-1, -1, n_rep, -1, -1]}
        - {id: k_kv, op: reshape, shape: [B, H, T, Dh]}
        """,
        inputs="k: {shape: [B, H_kv, T, Dh], init: randn}",
        dims="{B: 2, H_kv: 2, n_rep: 3, H: H_kv * n_rep, T: 4, Dh: 2}",
    )
    k = t["k"].tensor
    repeat_kv = k[:, :, None, :, :].expand(2, 2, 3, 4, 2).reshape(2, 6, 4, 2)
    assert close(t["k_rep"].tensor, repeat_kv) and close(t["k_kv"].tensor, repeat_kv)
    assert t["k_exp"].view_of == "k" and t["k_exp"].stride[2] == 0 and t["k_kv"].view_of is None


def test_mask_causal_alignment_and_sliding_window():
    t = trace_of(
        """
        - {id: square, op: mask, input: s, causal: true}
        - {id: decode, op: mask, input: d, causal: true}
        - {id: top_left, op: mask, input: d, causal: true, align: top-left}
        - {id: window, op: mask, input: s, causal: true, window: 2}
        - {id: both, op: mask, input: s, causal: true, mask: pad, polarity: keep, fill: -1e9}
        """,
        inputs="""
        s: {shape: [1, 4, 4], init: randn}
        d: {shape: [1, 2, 4], init: randn}
        pad: {shape: [1, 1, 4], values: [[[false, true, true, true]]]}
        """,
    )
    s, d = t["s"].tensor, t["d"].tensor
    inf = float("-inf")
    assert close(t["square"].tensor, s.masked_fill(torch.ones(4, 4, dtype=torch.bool).triu(1), inf))
    assert close(t["decode"].tensor, d.masked_fill(torch.ones(2, 4, dtype=torch.bool).triu(3), inf))  # last query = last key
    assert close(t["top_left"].tensor, d.masked_fill(torch.ones(2, 4, dtype=torch.bool).triu(1), inf))
    q, kv = torch.arange(4)[:, None], torch.arange(4)[None]
    assert close(t["window"].tensor, s.masked_fill(~((kv <= q) & (kv > q - 2)), inf))  # transformers' sliding_window_overlay
    hide = torch.ones(4, 4, dtype=torch.bool).triu(1) | ~t["pad"].tensor
    assert close(t["both"].tensor, s.masked_fill(hide, -1e9))


def bloom_alibi(heads, length):
    """transformers' build_alibi_tensor (BLOOM) for an all-ones attention mask, as (H, 1, T)."""
    closest = 2 ** math.floor(math.log2(heads))
    base = torch.tensor(2 ** (-(2 ** -(math.log2(closest) - 3))), dtype=torch.float32)
    slopes = torch.pow(base, torch.arange(1, 1 + closest, dtype=torch.int32))
    if closest != heads:
        extra = torch.tensor(2 ** (-(2 ** -(math.log2(2 * closest) - 3))), dtype=torch.float32)
        n = min(closest, heads - closest)
        slopes = torch.cat([slopes, torch.pow(extra, torch.arange(1, 1 + 2 * n, 2, dtype=torch.int32))], dim=0)
    mask = torch.ones(1, length, dtype=torch.long)
    positions = ((mask.cumsum(dim=-1) - 1) * mask)[:, None, :]
    return (slopes[..., None] * positions).reshape(heads, 1, length)


def paper_slopes(n):
    """The ALiBi paper's reference get_slopes."""

    def power_of_2(n):
        start = 2 ** (-(2 ** -(math.log2(n) - 3)))
        return [start * start**i for i in range(n)]

    if math.log2(n).is_integer():
        return power_of_2(n)
    closest = 2 ** math.floor(math.log2(n))
    return power_of_2(closest) + paper_slopes(2 * closest)[0::2][: n - closest]


@covers("alibi")
@pytest.mark.parametrize("heads", [8, 6, 1, 12])
def test_alibi_slopes_and_bias(heads):
    t = trace_of(
        """
        - {id: b, op: alibi, input: s}
        - {id: rel, op: alibi, input: s, relative: true}
        """,
        inputs=f"s: {{shape: [2, {heads}, 5, 5], init: randn}}",
    )
    s = t["s"].tensor
    assert close(t["b"].tensor, s + bloom_alibi(heads, 5))
    slopes = torch.tensor(paper_slopes(heads))
    assert torch.allclose(t["b/bias"].tensor[:, 0, 1], slopes)
    distance = (torch.arange(5)[None] - torch.arange(5)[:, None]).float()
    assert close(t["rel"].tensor, s + slopes[:, None, None] * distance)


@covers("einsum")
def test_einsum_shapes_values_and_errors():
    t = trace_of(
        """
        - {id: scores, op: einsum, inputs: [q, k], equation: 'bqhd,bkhd->bhqk'}
        - {id: implicit, op: einsum, inputs: [q, k], equation: 'bqhd,bkhd'}
        - {id: batched, op: einsum, inputs: [q, w], equation: '...d,de->...e'}
        """,
        inputs="q: {shape: [B, T, H, Dh], init: randn}\nk: {shape: [B, S, H, Dh], init: randn}\nw: {shape: [Dh, E], init: randn}",
        dims="{B: 2, T: 3, S: 5, H: 2, Dh: 4, E: 6}",
    )
    q, k, w = t["q"].tensor, t["k"].tensor, t["w"].tensor
    assert close(t["scores"].tensor, torch.einsum("bqhd,bkhd->bhqk", q, k), atol=1e-5)
    assert t["scores"].symbolic == "(B, H, T, S)"
    assert close(t["implicit"].tensor, torch.einsum("bqhd,bkhd", q, k), atol=1e-5) and t["implicit"].symbolic == "(S, T)"
    assert close(t["batched"].tensor, torch.einsum("...d,de->...e", q, w), atol=1e-5) and t["batched"].symbolic == "(B, T, H, E)"
    bad = pipeline_text(
        "- {id: s, op: einsum, inputs: [q, k], equation: 'bhqd,bhkd->bhqk'}",
        inputs="q: {shape: [2, 2, 3, 4], init: randn}\nk: {shape: [2, 2, 3, 5], init: randn}",
    )
    with pytest.raises(tracer.TracerError) as info:
        tracer.loads(bad, "e.yaml")
    assert info.value.code == "broadcast" and "einsum letter 'd'" in str(info.value) and "e.yaml:6:51" in str(info.value)


def unfused(q, k, v, hide=None, additive=None, scale=None):
    n_rep = q.shape[-3] // k.shape[-3]
    k, v = k.repeat_interleave(n_rep, -3), v.repeat_interleave(n_rep, -3)
    scores = q @ k.transpose(-2, -1) * (scale or 1 / math.sqrt(q.shape[-1]))
    if additive is not None:
        scores = scores + additive
    if hide is not None:
        scores = scores.masked_fill(hide, float("-inf"))
    return torch.softmax(scores, -1) @ v


@covers("sdpa")
@pytest.mark.parametrize(
    "fields",
    [
        "causal: true",
        "causal: true, window: 3",
        "causal: true, align: top-left",
        "mask: keep, polarity: keep",
        "mask: add, causal: true",
        "scale: 0.3",
    ],
)
def test_sdpa_equals_the_unfused_computation(fields):
    t = trace_of(
        f"- {{id: o, op: sdpa, inputs: [q, k, v], gqa: true, {fields}}}",
        inputs="""
        q: {shape: [2, 4, 3, 8], init: randn}
        k: {shape: [2, 2, 6, 8], init: randn}
        v: {shape: [2, 2, 6, 8], init: randn}
        keep: {shape: [2, 1, 1, 6], values: [[[[true, true, false, true, true, true]]], [[[true, true, true, true, true, false]]]]}
        add: {shape: [2, 1, 1, 6], init: randn}
        """,
    )
    q, k, v = (t[n].tensor for n in "qkv")
    qi, kj = torch.arange(3)[:, None] + 3, torch.arange(6)[None]  # bottom-right: query i is key i + 3
    hide, additive, scale = None, None, None
    if "causal" in fields:
        hide = kj > (qi - 3 if "top-left" in fields else qi)
    if "window" in fields:
        hide = hide | (kj <= qi - 3)
    if "keep" in fields:
        hide = ~t["keep"].tensor
    if "add" in fields:
        additive = t["add"].tensor
    if "scale" in fields:
        scale = 0.3
    assert close(t["o"].tensor, unfused(q, k, v, hide, additive, scale), atol=1e-5)


def test_sdpa_memory_estimate_has_no_scores():
    q = "q: {shape: [1, 2, T, 4], init: randn}\nk: {shape: [1, 2, T, 4], init: randn}\nv: {shape: [1, 2, T, 4], init: randn}"
    fused = tracer.loads(pipeline_text("- {id: o, op: sdpa, inputs: [q, k, v], causal: true}", dims="T: 256", inputs=q), "f.yaml")
    manual = tracer.loads(
        pipeline_text(
            """
            - {id: kt, op: transpose, input: k, dims: [-2, -1]}
            - {id: s, op: matmul, inputs: [q, kt]}
            - {id: m, op: mask, causal: true}
            - {id: w, op: softmax}
            - {id: o, op: matmul, inputs: [w, v]}
            """,
            dims="T: 256",
            inputs=q,
        ),
        "m.yaml",
    )
    inputs = 3 * 2 * 256 * 4 * 4
    assert fused.check().peak_bytes == inputs + 2 * 256 * 4 * 4 + 2 * 256 * 4  # + the kernel's log-sum-exp per query
    assert manual.check().peak_bytes >= inputs + 2 * 2 * 256 * 256 * 4  # scores and weights alive together


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


def bundled_with_t():
    for path in sorted(PIPELINES.rglob("*.yaml")):
        try:
            pipeline = tracer.load(path)
        except tracer.TracerError:
            continue  # an error example
        literal = any(d.values is not None or d.tokens is not None for d in pipeline.spec.inputs.values())
        if "T" in pipeline.spec.dims and isinstance(pipeline.spec.dims["T"], int) and not literal:
            yield path


@pytest.mark.parametrize("path", list(bundled_with_t()), ids=lambda p: str(p.relative_to(PIPELINES)))
def test_every_bundled_pipeline_runs_at_t_equal_one(path):
    """--dim T=1 (one token: a decode step) checks and runs, expectations included."""
    pipeline = tracer.load(path)
    assert not pipeline.check({"T": 1}).errors
    pipeline.run(dims={"T": 1}, device="meta")


def test_verify_shows_one_sdpa_step_equals_the_unfused_mistral_attention():
    unfused = PIPELINES / "models" / "mistral_sliding_window.yaml"
    text = unfused.read_text()
    start, end = text.index("  - {id: k_rep"), text.index("  # merge heads")
    fused = tracer.loads(
        text[:start]
        + "  - {id: context, op: sdpa, inputs: [q_rot, k_rot, v_h], causal: true, window: W, gqa: true}\n\n"
        + text[end:].replace("  scores: [B, H, T, T]\n", ""),
        "fused.yaml",
    )
    assert verify.against_pipeline(fused, unfused) <= 1e-5
    assert verify.against_pipeline(fused, unfused, dims={"T": 1}) <= 1e-5
    scores = 2 * 4 * 128 * 128 * 4  # (B, H, T, T) float32: the fused step never holds them
    assert tracer.load(unfused).check({"T": 128}).peak_bytes - fused.check({"T": 128}).peak_bytes >= scores
