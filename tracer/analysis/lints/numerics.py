"""Lints about numerics: attention scores in half precision that overflow.

A softmax in float16 or bfloat16 is not flagged: torch accumulates it in float32, and its weights
match ``softmax(x.float()).to(x.dtype)`` bit for bit, so "upcast before the softmax" changes
nothing that a lint could point at."""

from __future__ import annotations

import math

from ..attention import prescales
from .registry import Lint, register, show, warning

FLOAT16_MAX = 65504.0
#: head dims from which scaling q first buys a real margin (1/√Dh ≥ 5.6x); every model today uses 64 to 256
MIN_HEAD_DIM = 32


@register
class HalfScoresOverflow(Lint):
    """**What.** Attention scores formed as `q @ kᵀ` in float16 before any scale: no `scale` step
    on q or k between their projection and the product, at a head dim of 32 or more. Scores in
    float32 (q and k cast first), a fused `sdpa` (its kernels scale inside) and bfloat16 (whose
    range is float32's) are not flagged.

    **Why it matters.** Each score sums Dh products of q and k elements; float16's largest value is
    65504, so at Dh = 128 an average |q_i·k_i| of 512 (activations of about 23, common in the outlier
    features of large models) overflows to inf, and the softmax turns the row into NaN. Scaling the
    scores afterwards is too late: the product already overflowed.

    **Fix.** Scale q by 1/√Dh before the product (`op: scale` on q; many models fold it into the
    query projection), or compute the scores in float32 (`op: cast` of q and k).
    """

    code, example, origin = "half-scores-overflow", "half_scores_overflow", "float16 inference of eager attention"

    def check(self, analysis):
        for site in analysis.attention:
            if site.fused or site.head_dim is None or site.head_dim.value < MIN_HEAD_DIM:
                continue
            if analysis.meta(site.scores).dtype != "float16":
                continue
            shrink = math.prod(f.multiplier for f in prescales(analysis, site.query) + prescales(analysis, site.keys))
            if abs(shrink) < 1:
                continue  # q or k scaled down first: the product is formed at the softmax's scale
            dh = site.head_dim
            average = FLOAT16_MAX / dh.value
            message = (
                f"it forms float16 scores '{site.scores}' {show(analysis, site.scores)} as q·kᵀ before any scale: each sums "
                f"{dh}={dh.value} products, so an average |q_i·k_i| above {average:.0f} overflows float16's 65504 to inf "
                f"(NaN after the softmax) — scale q by 1/√{dh} before this product, or cast q and k to float32"
            )
            yield warning(analysis, analysis.node(site.product), self.code, message)
