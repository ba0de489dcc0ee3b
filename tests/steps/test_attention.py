"""Kinds of the attention core (scale, mask, softmax, dropout, sdpa) against plain torch."""

from __future__ import annotations

import math

import pytest
import torch

import tracer
from tests.conftest import covers, pipeline_text, refused
from tests.kinds import SDPA_CASES, SDPA_INPUTS, agrees, close, sdpa_step, trace_of, unfused
from tracer.core.errors import TracerError


@covers("scale")
def test_scale_by_number_and_sqrt_of_dim():
    t = trace_of(
        """
        - {id: d, op: scale, divide: {sqrt: D}}
        - {id: m, op: scale, input: x, multiply: 0.5}
    """,
        dims="D: 4",
    )
    x = t["x"].tensor
    assert close(t["d"].tensor, x / math.sqrt(4)) and close(t["m"].tensor, x * 0.5)


@covers("mask")
def test_mask_causal_and_both_polarities():
    t = trace_of(
        """
        - {id: causal, op: mask, input: s, causal: true}
        - {id: kept, op: mask, input: s, mask: keep, polarity: keep, fill: -1e9}
        - {id: blocked, op: mask, input: s, mask: future, polarity: block}
    """,
        inputs="""
        s: {shape: [2, 3, 3], init: randn}
        keep: {shape: [3, 3], values: [[true, false, true], [true, true, false], [false, true, true]]}
        future: {shape: [3, 3], init: triu}
    """,
    )
    s, keep = t["s"].tensor, t["keep"].tensor
    future = torch.triu(torch.ones(3, 3), diagonal=1)
    assert close(t["causal"].tensor, s.masked_fill(future.bool(), float("-inf")))
    assert close(t["blocked"].tensor, s.masked_fill(future.bool(), float("-inf")))
    assert close(t["kept"].tensor, s.masked_fill(keep == False, -1e9))  # noqa: E712 (tutorial 003's spelling)


@covers("softmax", "dropout")
def test_softmax_dropout_eval_and_training():
    t = trace_of("""
        - {id: w, op: softmax, dim: -1}
        - {id: eval, op: dropout, p: 0.5}
        - {id: train, op: dropout, input: w, p: 0.5, training: true}
    """)
    w = torch.softmax(t["x"].tensor, -1)
    assert close(t["w"].tensor, w)
    assert close(t["eval"].tensor, w) and t["eval"].view_of == "w"  # eval dropout returns its input
    kept = t["train"].tensor != 0  # softmax outputs are never 0, so a 0 was dropped
    assert kept.any() and not kept.all(), kept  # p=0.5: some of each (a fixed seed, so no flakiness)
    assert torch.allclose(t["train"].tensor[kept], w[kept] * 2)


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


@covers("sdpa")
@pytest.mark.parametrize("fields", SDPA_CASES)
def test_sdpa_equals_the_unfused_computation(fields):
    t = trace_of(sdpa_step(fields), inputs=SDPA_INPUTS)
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


X234 = "x: {shape: [2, 3, 4], init: randn}"


Q = "q: {shape: [2, 2, 3, 4], init: randn}"


def test_training_dropout_with_p_zero_or_nothing_to_drop_returns_its_input():
    trace = agrees(
        "- {id: d, op: dropout, input: x, p: 0.0, training: true}\n- {id: e, op: dropout, input: empty, p: 0.5, training: true}",
        "x: {shape: [2, 3], init: randn}\nempty: {shape: [2, 0], init: randn}",
    )
    assert trace["d"].view_of == "x" and trace["e"].view_of == "empty"


def test_an_empty_result_of_a_scaled_tensor_has_torchs_strides():
    trace = agrees("- {id: y, op: scale, input: x, divide: -1.5}", "x: {shape: [3, 1, 0, 1, 2], init: randn}")
    assert trace["y"].stride == (0, 0, 2, 0, 1)


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


def test_sdpa_whose_scores_torch_cannot_describe_is_a_located_error():
    text = pipeline_text("- {id: y, op: sdpa, inputs: [q, q, q]}", dims="T: 4294967296", inputs="q: {shape: [1, T, 2], init: randn}")
    with pytest.raises(TracerError) as info:
        tracer.loads(text, "t.yaml").run(device="meta")  # was torch's RuntimeError from inside the kernel
    assert info.value.code == "tensor-too-large" and str(info.value).startswith("t.yaml:")


def keep_where(t_q, t_k, rule):
    """A (T_q, T_k) bool pattern from a predicate on (query position, key), bottom-right aligned."""
    shift = t_k - t_q
    return torch.tensor([[rule(i + shift, j) for j in range(t_k)] for i in range(t_q)])


@covers("mask")
def test_mask_band_chunk_segments_and_min_fill():
    """transformers' masking_utils predicates: sliding_window_bidirectional_overlay (|q - kv| <= W - 1
    here), chunked_overlay and causal, packed_sequence_mask_function; fill: min as eager masks add."""
    t = trace_of(
        """
        - {id: band, op: mask, input: s, window: 2}
        - {id: chunked, op: mask, input: s, causal: true, chunk: 3}
        - {id: chunk_only, op: mask, input: r, chunk: 2}
        - {id: docs, op: mask, input: s, causal: true, segments: seg, fill: min}
        - {id: flat_docs, op: mask, input: s, segments: one, window: 3}
        - {id: narrow, op: mask, input: r, window: 2, fill: min}
        """,
        inputs="s: {shape: [2, 3, 7, 7], init: randn}\nr: {shape: [2, 3, 3, 7], init: randn}\n"
        "seg: {shape: [2, 7], dtype: int64, values: [[0, 0, 0, 1, 1, 2, 2], [0, 0, 0, 0, 0, 0, 0]]}\n"
        "one: {shape: [7], dtype: int32, values: [0, 0, 1, 1, 1, 1, 5]}",
    )
    s, r, seg, one = (t[n].tensor for n in ("s", "r", "seg", "one"))
    inf = float("-inf")
    assert close(t["band"].tensor, s.masked_fill(~keep_where(7, 7, lambda i, j: abs(i - j) < 2), inf))
    assert close(t["chunked"].tensor, s.masked_fill(~keep_where(7, 7, lambda i, j: j <= i and j // 3 == i // 3), inf))
    assert close(t["chunk_only"].tensor, r.masked_fill(~keep_where(3, 7, lambda i, j: j // 2 == i // 2), inf))
    same = seg[:, :, None] == seg[:, None, :]
    causal = keep_where(7, 7, lambda i, j: j <= i)
    assert close(t["docs"].tensor, s.masked_fill(~(same & causal)[:, None], torch.finfo(s.dtype).min))
    band = keep_where(7, 7, lambda i, j: abs(i - j) < 3)
    assert close(t["flat_docs"].tensor, s.masked_fill(~((one[:, None] == one[None, :]) & band), inf))
    # bottom-right: query 0 is key 4, it sees keys 3..5; a fully hidden row would stay finite
    assert close(t["narrow"].tensor, r.masked_fill(~keep_where(3, 7, lambda i, j: abs(i - j) < 2), torch.finfo(r.dtype).min))


@pytest.mark.parametrize(
    ("fields", "code", "says"),
    [
        ("fill: -inf", "invalid-value", "give what to hide"),
        ("align: top-left, mask: m, polarity: keep", "invalid-value", "'align' places the queries"),
        ("segments: m", "mask-segments", "integer document ids"),
        ("chunk: 0", "mask-chunk", "at least 1"),
    ],
)
def test_mask_refusals_say_what_each_field_needs(fields, code, says, tmp_path):
    text = pipeline_text(
        f"- {{id: y, op: mask, input: s, {fields}}}", inputs="s: {shape: [2, 5, 5], init: randn}\nm: {shape: [5], init: randn}"
    )
    assert says in str(refused(text, tmp_path, code))


@covers("softcap")
def test_softcap_is_gemma2s_op_order():
    """Gemma2's eager_attention_forward: attn_weights / softcap, tanh, * softcap."""
    t = trace_of(
        """
        - {id: y, op: softcap, input: s, cap: 2.0}
        - {id: st, op: transpose, input: s, dims: [0, 2]}
        - {id: z, op: softcap, input: st, cap: 0.5}
        """,
        inputs="s: {shape: [2, 3, 5, 5], init: randn}",
    )
    s = t["s"].tensor
    assert torch.equal(t["y"].tensor, torch.tanh(s / 2.0) * 2.0)
    assert torch.equal(t["z"].tensor, torch.tanh(s.transpose(0, 2) / 0.5) * 0.5)
    assert t["y"].tensor.abs().max() < 2.0
