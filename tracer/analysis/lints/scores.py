"""Lints about attention scores: how they are scaled, and over which axis they are normalised."""

from __future__ import annotations

import math

from ..attention import prescales
from ..roles import HEADS
from .registry import Lint, register, show, warning


@register
class ScaleMismatch(Lint):
    """**What.** The scores that reach a softmax are scaled by something other than 1/√d_k, where d_k
    is the dim the QK product contracts over (the keys' last dim). Every factor counts: `scale`
    steps between the product and the softmax (through `mask` and `dropout` steps), `scale` steps
    on q or k after their projection (`q_proj(x) * scaling`), and a fused kernel's own scale
    (`sdpa`: 1/√Dh unless `scale:` says otherwise). Splitting the factor over several steps is
    fine. Scores with no scale at all are not flagged (tutorial 001's first, weight-free part
    deliberately uses raw dot products), and a contraction over a head count is left to
    `head-split-order`, whose fix is the real one.

    **Why it matters.** The scale sets the softmax temperature: too small a divisor makes the
    weights peakier than intended (and gradients smaller), too large a divisor flattens them. It is
    also exactly the kind of constant that survives a refactor: tutorial 004's
    `scaled_dot_product_attention(Q, K, V, d_k=4)` divides by √4 while its keys are 3-dim, and a
    query pre-scaled by 1/√Dh before SDPA is scaled twice.

    **Fix.** One factor of 1/√d_k: `divide: {sqrt: D}` with D the keys' last dim as a dim name
    (`Dh`, `d_k`, …) so it follows `--dim` overrides, or SDPA's default with no pre-scaling. An
    architecture that scales otherwise on purpose (Gemma's `query_pre_attn_scalar`) says so where
    it does it: `allow: {scale-mismatch: REASON}`.
    """

    code, example, origin = "scale-mismatch", "scale_mismatch", "tutorial 004"

    def check(self, analysis):
        for site in analysis.attention:
            d_k = site.head_dim
            if d_k is None or analysis.axis_roles(site.query)[-1:] == (HEADS,):
                continue
            factors = prescales(analysis, site.query) + prescales(analysis, site.keys) + list(site.scales)
            if not factors and (not site.fused or analysis.node(site.product).step.fused_attention().scale is None):
                continue  # no scale written anywhere: raw dot products, or the kernel's default
            want = 1.0 / math.sqrt(d_k.value) if d_k.value > 0 else math.inf
            got = math.prod(f.multiplier for f in factors) * (site.implicit_scale if site.fused else 1.0)
            if math.isfinite(want) and math.isclose(got, want, rel_tol=1e-6):
                continue
            yield self._warning(analysis, site, factors, got, want)

    def _warning(self, analysis, site, factors, got: float, want: float):
        d_k = site.head_dim
        written = [f.text for f in factors] + ([f"{site.product}'s own {site.implicit_scale:.4g}"] if site.fused else [])
        key_dim = str(d_k) if str(d_k) == str(d_k.value) else f"{d_k}={d_k.value}"
        if site.fused:
            fix = "drop the extra factor: SDPA already scales by 1/√Dh" if factors else "leave `scale:` out: SDPA's default is 1/√Dh"
        else:
            fix = f"use `divide: {{sqrt: {d_k}}}`"
        message = (
            f"'{site.product}' contracts q·k over the keys' last dim, {key_dim}, so its scores should be scaled by "
            f"1/√{d_k.value} = {want:.4g}; they are scaled by {' * '.join(written)} = {got:.4g} — {fix}"
        )
        if not factors:
            return warning(analysis, analysis.node(site.product), self.code, message, "scale")
        first = analysis.node(factors[0].step)
        return warning(analysis, first, self.code, message, "divide" if first.step.divide is not None else "multiply")


@register
class ScaleAfterSoftmax(Lint):
    """**What.** A `scale` step between the softmax and the product with the values.

    **Why it matters.** The 1/√d_k scale belongs on the scores, where it sets the softmax's
    temperature. Applied to the weights it only shrinks the output (each row no longer sums to
    1), and the softmax runs unscaled: peaky attention, a smaller output, no error.

    **Fix.** Move the scale between the QK product and the softmax.
    """

    code, example, origin = "scale-after-softmax", "scale_after_softmax", "attention ports"

    def check(self, analysis):
        for site in analysis.attention:
            for step in site.after:
                node = analysis.node(step)
                if node.step.scaling(lambda text, node=node: node.dims.dim(text).value) is not None:
                    message = (
                        f"it scales the weights of softmax '{site.softmax}', after the softmax: their rows no longer sum to 1 and "
                        f"the softmax saw unscaled scores — scale the scores '{site.scores}' before the softmax instead"
                    )
                    yield warning(analysis, node, self.code, message)


@register
class SoftmaxOverQueries(Lint):
    """**What.** A softmax over the query axis of attention scores. Scores `q @ k^T` are
    `(…, T_q, T_kv)`: each query's weights over the keys must sum to 1, `dim: -1`. The query axis
    is the first operand's rows; for `einsum` scores it is the last output letter that only the
    first operand has (`'bqd,bkd->bkq'` puts it last).

    **Why it matters.** With `dim: -2` every key's column sums to 1 instead; for square scores no
    shape betrays it.

    **Fix.** `dim: -1` (the keys' axis).
    """

    code, example, origin = "softmax-over-queries", "softmax_over_queries", "any attention"

    def check(self, analysis):
        for site in analysis.attention:
            if site.fused or site.query_axis is None:
                continue
            softmax = analysis.node(site.softmax)
            ndim = len(analysis.metas[site.scores].shape)
            dim = softmax.step.normalises()
            if ndim < 2 or dim % ndim != site.query_axis % ndim:
                continue
            key = site.key_axis - ndim if site.key_axis is not None else -1
            message = (
                f"softmax over dim {dim} normalises the scores '{site.product}' {show(analysis, site.scores)} over the queries: "
                f"each key's column sums to 1, not each query's row — use dim: {key} (the keys)"
            )
            yield warning(analysis, softmax, self.code, message, "dim")
