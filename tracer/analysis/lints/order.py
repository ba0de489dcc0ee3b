"""Lints about the order of the steps between the scores and the softmax: softcapping and dropout
where the mask undoes them or they undo the mask. (Scaling after the softmax is
`scale-after-softmax`, with the other scale lints.)"""

from __future__ import annotations

from .registry import Lint, register, warning


def _masks(site, chain_index: int) -> tuple[list[str], list[str]]:
    """The site's mask steps that run before chain step ``chain_index``, and those after it."""
    masks = {step for step, _ in site.masks}
    return [s for s in site.chain[:chain_index] if s in masks], [s for s in site.chain[chain_index + 1 :] if s in masks]


@register
class SoftcapAfterMask(Lint):
    """**What.** A `softcap` between a mask and the softmax: the scores are masked, then squashed
    by `cap * tanh(x / cap)`.

    **Why it matters.** The tanh maps the mask's -inf (or its fill) to -cap, a finite score: the
    hidden keys get a small but nonzero weight, e^(-cap - the row's max), and a query whose keys
    are all hidden gets uniform weights over them instead of being caught as a fully masked row.
    Gemma 2 caps first, then masks.

    **Fix.** Move the `softcap` before the mask (after the scale: scale, softcap, mask, softmax).
    """

    code, example, origin = "softcap-after-mask", "softcap_after_mask", "Gemma 2 ports"

    def check(self, analysis):
        for site in analysis.attention:
            for index, step in enumerate(site.chain):
                node = analysis.node(step)
                masks, _ = _masks(site, index)
                if not node.step.squashes or not masks:
                    continue
                message = (
                    f"it squashes the scores after mask '{masks[-1]}': tanh maps the hidden keys' -inf to a finite score, "
                    f"so softmax '{site.softmax}' gives them weight — move it before the mask"
                )
                yield warning(analysis, node, self.code, message)


@register
class DropoutOnScores(Lint):
    """**What.** A `dropout` on attention scores, between the QK product and the softmax (before
    the mask, or after it).

    **Why it matters.** Attention dropout drops weights: it belongs after the softmax, where a
    dropped weight is 0. On scores a dropped score becomes 0, which the softmax still weights by
    e^0, and the kept scores are multiplied by 1/(1 - p), which changes the softmax's temperature
    (a mask after it hides the same keys, so nothing looks wrong); after a mask, a dropped -inf
    is -inf·0 = NaN. Training and eval then see different attention patterns, not the same
    pattern thinned.

    **Fix.** Move the dropout after the softmax, on the weights.
    """

    code, example, origin = "dropout-on-scores", "dropout_on_scores", "attention ports"

    def check(self, analysis):
        for site in analysis.attention:
            for index, step in enumerate(site.chain):
                node = analysis.node(step)
                if not node.step.drops:
                    continue
                earlier, later = _masks(site, index)
                where = f"before mask '{later[0]}'" if later else "before the softmax"
                nan = f"; a -inf of mask '{earlier[-1]}' that it drops becomes NaN (-inf·0)" if earlier else ""
                message = (
                    f"it drops attention scores {where}: a dropped score becomes 0, which softmax '{site.softmax}' still "
                    f"weights by e^0, and the kept ones are scaled by 1/(1-p){nan} — move the dropout after the softmax, on the weights"
                )
                yield warning(analysis, node, self.code, message)
