"""Lints about padding masks followed through layout and arithmetic: a polarity that hides the
tokens and keeps the padding, a 0/1 mask multiplied into the scores, and a mask an input declares
that no attention ever receives.

A padding mask is judged where the file fixes its content (``values:``, fixed inits), followed from
where attention applies it back to that declaration through unsqueeze, view, expand, cast and
negations (``mask == 0``, ``logical_not``): tracer.analysis.lints.sources.key_rows.
"""

from __future__ import annotations

from ..positions import is_mask_input
from ..roles import POSITIONS
from .masks import binary_origin
from .registry import Lint, register, show, warning
from .sources import reversed_padding

#: tensors walked forward from a declared mask looking for the attention that applies it
MAX_REACH = 4096


@register
class PaddingPolarity(Lint):
    """**What.** A padding mask — broadcast along the queries, `(B, 1, 1, T)` — applied with the
    polarity that hides the tokens and keeps the padding: some batch row then hides *every* key
    (a sequence without padding is all 1s), while the other polarity would leave every row a key.
    Judged through the steps between the declaration and the attention: unsqueeze, view, expand,
    cast, and negations (`compare` `eq 0`, `logical not`), so `mask == 0` with `polarity: block` is
    the same mask as `mask` with `polarity: keep`. Only masks whose content the file fixes are
    judged; triangular masks are `mask-polarity`'s.

    **Why it matters.** transformers' `attention_mask` is 1 at real tokens. Read as 1 = hide, the
    real tokens are hidden from every query and the padding is all they attend to; a row without
    padding hides everything (uniform weights with `fill: min`, NaN with `-inf`). It runs.

    **Fix.** Flip `polarity` (or remove the negation before it): with a 1 = token mask,
    `polarity: keep`; with `mask == 0` (1 = padding), `polarity: block`.
    """

    code, example, origin = "padding-polarity", "padding_polarity", "padding masks (public issue trackers)"

    def check(self, analysis):
        for site in analysis.attention:
            for step, masking in site.masks:
                found = reversed_padding(analysis, site, masking)
                if found is not None:
                    yield self._warning(analysis, analysis.node(step), masking, found)

    def _warning(self, analysis, node, masking, found):
        rows = found.visible(masking.polarity)
        blind = [r for r, row in enumerate(rows) if not any(row)]
        other = "block" if masking.polarity == "keep" else "keep"
        negated = f" (negated by '{found.negated_by[0]}')" if found.negated_by else ""
        meaning = "True attends" if masking.polarity == "keep" else "True is hidden"
        message = (
            f"padding mask '{masking.tensor}' {show(analysis, masking.tensor)}, from '{found.declared}'{negated}, is applied with "
            f"polarity: {masking.polarity} ({meaning}): it hides every key of {len(blind)} of {len(rows)} rows (first: row {blind[0]}) "
            f"and keeps the padding — use polarity: {other}"
        )
        return warning(analysis, node, self.code, message, "polarity")


@register
class MaskMultiplied(Lint):
    """**What.** A 0/1 mask *multiplied* into the attention scores before the softmax: a `mul` of
    the scores (on their way from q·kᵀ to the softmax) by a bool or integer tensor, a cast of one,
    or a declared 0/1 tensor, reached through layout steps.

    **Why it matters.** Multiplying sets a hidden score to 0, and softmax gives a score of 0 the
    weight e^0 — as much as any real score near 0. The padding (or the future) keeps its share of
    the weights; shapes are right and it runs. Multiplying the *weights* after the softmax zeroes
    them but leaves the rows unnormalised, a different design, not judged here.

    **Fix.** Hide the keys with a `mask` step before the softmax (`mask: attention_mask, polarity:
    keep, fill: min`), or add `(1 - mask) * finfo.min`.
    """

    code, example, origin = "mask-multiplied", "mask_multiplied", "ports of scores * mask (public issue trackers)"

    def check(self, analysis):
        for node in analysis.nodes.values():
            if node.step.normalises() is None or not node.outs or not node.inputs:
                continue
            for step in self._multiplications(analysis, node):
                mask = self._mask_operand(analysis, step)
                if mask is not None:
                    yield self._warning(analysis, step, *mask)

    @staticmethod
    def _multiplications(analysis, softmax):
        """The products (``multiplies``) that feed the softmax through steps that pass scores."""
        current = analysis.producer(softmax.inputs[0])
        for _ in range(64):
            if current is None or not current.outs:
                return
            if current.step.multiplies:
                yield current
                return
            if not current.step.passes_scores or not current.inputs:
                return
            current = analysis.producer(current.inputs[0])

    @staticmethod
    def _mask_operand(analysis, step):
        """(operand, its 0/1 origin) when one operand is scores made by a product of q and k and the other a 0/1 mask."""
        for scores, mask in (step.inputs, reversed(step.inputs)):
            if not _from_product(analysis, scores):
                continue
            origin = binary_origin(analysis, mask)
            if origin is not None:
                return mask, origin
        return None

    def _warning(self, analysis, node, tensor: str, origin: str):
        cast = "" if analysis.record_of(tensor) == origin else f" ({analysis.meta(origin).dtype} '{origin}', moved and cast)"
        message = (
            f"it multiplies the scores by '{tensor}' {show(analysis, tensor)}, a 0/1 mask{cast}: a hidden score becomes 0, which "
            f"softmax weighs e^0, as much as a real score near 0 — hide keys with op: mask (mask: {origin}, polarity: keep, "
            f"fill: min) before the softmax, or add (1 - mask) * finfo.min"
        )
        return warning(analysis, node, self.code, message, "inputs")


def _from_product(analysis, tensor: str) -> bool:
    """Whether ``tensor`` is attention scores: a product of two operands, through steps that pass scores."""
    current = analysis.producer(tensor)
    for _ in range(64):
        if current is None or not current.outs:
            return False
        if current.step.makes_scores and len(current.reads) >= 2:
            return True
        if not current.step.passes_scores or not current.inputs:
            return False
        current = analysis.producer(current.inputs[0])
    return False


@register
class MaskNotApplied(Lint):
    """**What.** An input that is a mask over tokens — bool, or an integer tensor named `*mask*`,
    its last dim token positions (`T`) — that steps
    read (so `unused-tensor` is quiet) but that reaches no attention: no `mask` step, no `sdpa`
    mask, nothing added to the scores is computed from it. Reported at the attention that should
    have received it: the softmax (or `sdpa`) of the first attention in the file.

    **Why it matters.** A padding mask used only to compute positions (`cumsum`) or to pool the
    output leaves every padded key visible to every query: the padding takes a share of the
    weights, and the outputs change with the amount of padding. It runs.

    **Fix.** Give the mask to the attention: a `mask` step before the softmax (`mask: keep,
    polarity: keep, fill: min`, with the mask unsqueezed to `(B, 1, 1, T)`), or `sdpa`'s `mask`.
    """

    code, example, origin = "mask-not-applied", "mask_not_applied", "padding masks (public issue trackers)"

    def check(self, analysis):
        sites = analysis.attention
        if not sites:
            return
        applied = {analysis.record_of(t) for site in sites for t in _mask_tensors(site)}
        for name in analysis.pipeline.inputs:
            if not is_mask_input(analysis, name) or not analysis.users(name) or analysis.axis_roles(name)[-1:] != (POSITIONS,):
                continue
            reached = _reach(analysis, name)
            if reached & applied:
                continue
            yield self._warning(analysis, sites[0], name, reached)

    def _warning(self, analysis, site, name: str, reached: set[str]):
        node = analysis.node(site.softmax or site.product)
        fused = node.step.fused_attention() is not None
        readers = ", ".join(f"'{n.id}'" for n in analysis.users(name))
        where = "give it as mask: (with polarity)" if fused else "add a mask step before this softmax (mask: …, polarity: keep, fill: min)"
        message = (
            f"input '{name}' {show(analysis, name)} is a mask, and step {readers} read{'s' if ',' not in readers else ''} it, but no attention "
            f"receives it: every padded key stays visible to every query here — {where}"
        )
        return warning(analysis, node, self.code, message, "mask" if fused else None)


def _mask_tensors(site):
    for _, masking in site.masks:
        yield from (t for t in (masking.tensor, masking.segments) if t is not None)
    yield from (tensor for _, tensor in site.biases)


def _reach(analysis, name: str) -> set[str]:
    """``name`` and the records computed from it, through every step that reads it (data or param)."""
    found, todo = {name}, [name]
    while todo and len(found) < MAX_REACH:
        current = todo.pop()
        for node in analysis.users(current):
            for out in node.outs:
                if out.id not in found:
                    found.add(out.id)
                    todo.append(out.id)
            if node.id not in found:
                found.add(node.id)
                todo.append(node.id)
    return found
