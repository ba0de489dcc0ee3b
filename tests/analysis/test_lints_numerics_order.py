"""The numerics and order-of-operations lints (issue 30, classes 5 and 6): each flags what really
goes wrong when the pipeline runs (shown here on torch), at the step a person edits, and stays
quiet on the correct variants models use."""

from __future__ import annotations

import pytest
import torch

import tracer
from tests.conftest import PIPELINES, pipeline_text

EXAMPLES = PIPELINES / "lint_examples"
QKV = """
q: {shape: [1, 2, 4, DH], init: randn, dtype: DTYPE}
k: {shape: [1, 2, 4, DH], init: randn, dtype: DTYPE}
v: {shape: [1, 2, 4, DH], init: randn, dtype: DTYPE}
"""


def warnings_of(steps: str, dtype: str = "float32", dh: int = 64) -> list[tuple[str, str]]:
    """(code, step) of every lint warning of the steps over q, k, v."""
    text = pipeline_text(steps, inputs=QKV.replace("DTYPE", dtype).replace("DH", str(dh)))
    return [(d.code, d.step) for d in tracer.loads(text, "t.yaml").check().warnings]


def test_half_scores_overflow_is_real_and_the_fix_keeps_the_scores_finite():
    """q and k elements of 40 at Dh = 64: q·kᵀ is 102400, past float16's 65504."""
    big = {name: torch.full((1, 2, 4, 64), 40.0, dtype=torch.float16) for name in "qkv"}
    assert torch.isinf(big["q"] @ big["k"].transpose(-2, -1)).all()  # torch's own product overflows
    bad = tracer.load(EXAMPLES / "half_scores_overflow.yaml").run(inputs=big, keep_values=True)
    fixed = tracer.load(EXAMPLES / "fixed" / "half_scores_overflow.yaml").run(inputs=big, keep_values=True)
    assert torch.isnan(bad["context"].tensor).all() and torch.isfinite(fixed["context"].tensor).all()
    assert torch.allclose(fixed["context"].tensor.float(), big["v"].float())  # equal keys: the mean of equal values


SCORES = """
- {id: k_t, op: transpose, input: k, dims: [-2, -1]}
- {id: scores, op: matmul, inputs: [Q, k_t]}
- {id: scaled, op: scale, divide: {sqrt: DHNAME}}
- {id: weights, op: softmax, dim: -1}
- {id: context, op: matmul, inputs: [weights, v]}
"""


def scores(query: str = "q", before: str = "") -> str:
    return before + SCORES.replace("Q", query).replace("DHNAME", "64")


@pytest.mark.parametrize(
    "steps, dtype, dh, flagged",
    [
        (scores(), "float16", 64, True),
        (scores(), "float16", 128, True),
        (scores(), "float16", 16, False),  # a tutorial's head dim: prescaling buys nothing
        (scores(), "bfloat16", 64, False),  # float32's range
        (scores(), "float32", 64, False),
        (scores("q_s", "- {id: q_s, op: scale, input: q, divide: {sqrt: 64}}\n"), "float16", 64, False),  # Llama-style
        (scores("q_s", "- {id: q_s, op: scale, input: q, multiply: 2.0}\n"), "float16", 64, True),  # scaled up: no margin
        (
            scores("q_f", "- {id: q_f, op: cast, input: q, dtype: float32}\n")
            .replace("[q_f, k_t]", "[q_f, k_f]")
            .replace("- {id: scores", "- {id: k_f, op: cast, input: k_t, dtype: float32}\n- {id: scores")
            .replace("[weights, v]", "[weights, v_f]")
            + "- {id: v_f, op: cast, input: v, dtype: float32}\n",
            "float16",
            64,
            False,
        ),
        ("- {id: context, op: sdpa, inputs: [q, k, v]}", "float16", 64, False),  # the fused kernels scale inside
    ],
    ids=["fp16", "fp16-128", "small-head", "bf16", "fp32", "q-prescaled", "q-scaled-up", "scores-in-fp32", "sdpa"],
)
def test_half_scores_overflow_flags_only_float16_products_formed_before_a_scale(steps, dtype, dh, flagged):
    steps = steps.replace("sqrt: 64", f"sqrt: {dh}")
    assert (("half-scores-overflow", "scores") in warnings_of(steps, dtype, dh)) == flagged


def test_half_softmax_is_not_flagged_because_torch_upcasts_it_already():
    """The reason there is no half-softmax lint: on torch's kernels a half softmax equals the
    float32 softmax cast back, bit for bit, so the upcast a lint would ask for changes nothing."""
    x = (torch.randn(8, 512) * 3).to(torch.bfloat16)
    assert torch.equal(torch.softmax(x, -1), torch.softmax(x.float(), -1).to(torch.bfloat16))
    assert warnings_of(scores(), "bfloat16") == []


def test_softcap_after_the_mask_gives_hidden_keys_weight_and_before_it_none():
    bad = tracer.load(EXAMPLES / "softcap_after_mask.yaml").run(keep_values=True)
    fixed = tracer.load(EXAMPLES / "fixed" / "softcap_after_mask.yaml").run(keep_values=True)
    future = torch.ones(4, 4, dtype=torch.bool).triu(1)
    assert (bad["weights"].tensor[..., future] > 0).all() and (fixed["weights"].tensor[..., future] == 0).all()
    q, k = fixed["q"].tensor, fixed["k"].tensor
    reference = torch.softmax((torch.tanh(q @ k.transpose(-2, -1) / 8**0.5 / 2.0) * 2.0).masked_fill(future, float("-inf")), -1)
    assert torch.allclose(fixed["weights"].tensor, reference, atol=1e-6)


def test_softcap_after_an_additive_or_sdpa_mask_or_with_no_mask_is_judged_by_the_mask_steps():
    capped = scores().replace(
        "- {id: weights", "- {id: masked, op: mask, causal: true}\n- {id: capped, op: softcap, cap: 50.0}\n- {id: weights"
    )
    assert ("softcap-after-mask", "capped") in warnings_of(capped)
    assert warnings_of(scores().replace("- {id: weights", "- {id: capped, op: softcap, cap: 50.0}\n- {id: weights")) == []


def test_dropout_on_scores_drops_nothing_the_softmax_skips_and_after_a_mask_makes_nan():
    torch.manual_seed(0)
    scores_ = torch.randn(64, 64)
    dropped = torch.nn.functional.dropout(scores_, 0.5, training=True)
    weights = torch.softmax(dropped, -1)
    assert (weights[dropped == 0] > 0).all()  # a dropped score still gets weight e^0
    masked = scores_.masked_fill(torch.ones(64, 64, dtype=torch.bool).triu(1), float("-inf"))
    assert torch.isnan(torch.nn.functional.dropout(masked, 0.5, training=True)).any()  # -inf·0


@pytest.mark.parametrize(
    "chain, flagged",
    [
        ("- {id: d, op: dropout, p: 0.1, training: true}\n- {id: m, op: mask, causal: true}\n", "before mask 'm'"),
        ("- {id: m, op: mask, causal: true}\n- {id: d, op: dropout, p: 0.1, training: true}\n", "NaN"),
        ("- {id: d, op: dropout, p: 0.1}\n", "before the softmax"),  # eval mode today, wrong the day it trains
        ("", None),
    ],
    ids=["before-mask", "after-mask", "eval", "none"],
)
def test_dropout_on_scores_names_the_mask_it_precedes_or_follows(chain, flagged):
    steps = scores().replace("- {id: weights", chain + "- {id: weights")
    found = [
        d for d in tracer.loads(pipeline_text(steps, inputs=QKV.replace("DTYPE", "float32").replace("DH", "64")), "t.yaml").check().warnings
    ]
    if flagged is None:
        assert found == []
    else:
        assert [(d.code, d.step) for d in found] == [("dropout-on-scores", "d")] and flagged in found[0].message


def test_dropout_on_the_weights_is_clean():
    dropout = "- {id: dropped, op: dropout, input: weights, p: 0.1, training: true}\n"
    steps = scores().replace(
        "- {id: context, op: matmul, inputs: [weights, v]}", dropout + "- {id: context, op: matmul, inputs: [dropped, v]}"
    )
    assert warnings_of(steps) == []


def test_the_attention_core_follows_scores_through_a_cast_to_float32_and_back():
    """transformers' eager attention: softmax(scores, dtype=torch.float32).to(q.dtype)."""
    (site,) = tracer.load(EXAMPLES / "half_scores_overflow.yaml").check().attention
    assert site.product == "scores" and site.chain == ("scaled", "scores_f") and site.softmax == "weights_f"
    assert site.after == ("weights",) and site.context == "context" and site.values == "v"
