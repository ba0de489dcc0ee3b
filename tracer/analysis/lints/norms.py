"""Lints about normalisation layers' learned scales."""

from __future__ import annotations

from .registry import Lint, register, warning


@register
class NormWeightZero(Lint):
    """**What.** An `rmsnorm` whose weight starts at zeros (`init: zeros`) without
    `unit_offset: true`.

    **Why it matters.** Gemma stores its RMSNorm weights as offsets from one and applies
    `1 + w` (`GemmaRMSNorm`), so its weights start at zero. Read with Llama's `w * x` they zero the
    whole hidden state: every output is 0, nothing fails.

    **Fix.** `unit_offset: true` (Gemma's `1 + w`), or `init: ones` for Llama's convention.
    """

    code, example, origin = "norm-weight-zero", "norm_weight_zero", "Gemma checkpoints read as Llama's"

    def check(self, analysis):
        for node in analysis.nodes.values():
            norm = node.step.scaled_norm()
            declared = analysis.declared.get(norm.weight) if norm is not None else None
            if declared is None or norm.unit_offset or declared.decl.init != "zeros":
                continue
            message = (
                f"its weight '{norm.weight}' starts at zeros and is applied as w * x, so the output is all zeros — "
                "Gemma's weights are offsets from one: give unit_offset: true (or init: ones for w * x)"
            )
            yield warning(analysis, node, self.code, message, "weight")
