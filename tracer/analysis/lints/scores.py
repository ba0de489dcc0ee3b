"""Lints about attention scores: how they are scaled, and over which axis they are normalised."""

from __future__ import annotations

import math

from .registry import Lint, register, show, warning


@register
class ScaleMismatch(Lint):
    """**What.** The scores that reach a softmax are scaled by something other than 1/√d_k, where d_k
    is the dim the QK matmul contracts over (the keys' last dim). All `scale` steps between the
    matmul and the softmax (through `mask` and `dropout` steps) are multiplied together, so
    splitting the factor over several steps is fine. Scores with no `scale` step at all are not
    flagged (tutorial 001's first, weight-free part deliberately uses raw dot products).

    **Why it matters.** The scale sets the softmax temperature: too small a divisor makes the
    weights peakier than intended (and gradients smaller), too large a divisor flattens them. It is
    also exactly the kind of constant that survives a refactor: tutorial 004's
    `scaled_dot_product_attention(Q, K, V, d_k=4)` divides by √4 while its keys are 3-dim.

    **Fix.** `divide: {sqrt: D}` with D the keys' last dim as a dim name (`Dh`, `d_k`, …), so it
    follows `--dim` overrides. The message names the dim to use.
    """

    code, example, origin = "scale-mismatch", "scale_mismatch", "tutorial 004"

    def check(self, analysis):
        for site in analysis.attention:
            if site.fused or not site.scales or site.head_dim is None:
                continue
            d_k = site.head_dim
            want = 1.0 / math.sqrt(d_k.value) if d_k.value > 0 else math.inf
            got = site.multiplier
            if math.isfinite(want) and math.isclose(got, want, rel_tol=1e-6):
                continue
            first = analysis.node(site.scales[0].step)
            key_dim = str(d_k) if str(d_k) == str(d_k.value) else f"{d_k}={d_k.value}"
            message = (
                f"scores '{site.product}' {show(analysis, site.scores)} contract over the keys' last dim, {key_dim}, so softmax "
                f"'{site.softmax}' should see them scaled by 1/√{d_k.value} = {want:.4g}; they are scaled by "
                f"{' * '.join(s.text for s in site.scales)} = {got:.4g} — use `divide: {{sqrt: {d_k}}}`"
            )
            yield warning(analysis, first, self.code, message, "divide" if first.step.divide is not None else "multiply")


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
