"""Lints about the direction of attention: which keys each query may see, held against what the
attention is — self-attention of a decoder (only earlier tokens), of an encoder (every token), or
cross-attention from one sequence to another (every key: they are not later tokens of the queries').

A file says what its attention is with ``attention: {kind: decoder|encoder|cross}``; cross-attention
is also recognised without it where that is unambiguous (tracer.analysis.lints.sources.is_cross).
"""

from __future__ import annotations

from .masks import triangle
from .registry import Lint, register, show, warning
from .sources import along_keys_only, cache_join, is_cross, score_dims, token_sources


def _causal(analysis, site) -> tuple[str, str, str] | None:
    """(step, what, field) of the site's first mask that hides later keys: ``causal: true``, or a
    mask tensor whose content is a triangle."""
    for step, masking in site.masks:
        if masking.causal:
            return step, "causal: true", "causal"
        if masking.tensor is not None and masking.polarity is not None and triangle(analysis, masking.tensor) is not None:
            return step, f"the triangular mask '{masking.tensor}' {show(analysis, masking.tensor)}", "mask"
    return None


def _declared_role(analysis, site) -> str | None:
    """What the file that wrote the site's steps declares (``attention: {kind}``): the top file
    for its own steps, a block file for the steps of its copies."""
    copy = analysis.node(site.product).copy
    if copy is None:
        role = analysis.pipeline.attention
        return role.kind if role is not None else None
    return next((info.attention for info in analysis.blocks.values() if copy in info.copies), None)


def _axes(analysis, site) -> str:
    query, keys = score_dims(analysis, site)
    q_from, k_from = (", ".join(sorted(token_sources(analysis, t))) or "steps" for t in (site.query, site.keys))
    return f"the queries ({query} tokens, from {q_from}) and the keys ({keys} tokens, from {k_from})"


@register
class CausalCrossAttention(Lint):
    """**What.** A causal mask (`causal: true`, or a triangular mask tensor) on cross-attention:
    queries and keys computed from different sequences — the decoder's hidden states and the
    encoder's output. Recognised when they come from different inputs and their lengths are
    written with different dims (`T` queries, `S` keys), or when the file declares
    `attention: {kind: cross}`.

    **Why it matters.** Key j of the source is not "later" than query i of the target: the two count
    different sequences. A causal mask hides source tokens by their index — target token 0 sees
    only source token 0 — and with more queries than keys the first queries see none. Shapes
    broadcast, and it runs.

    **Fix.** Drop `causal: true` from the cross-attention; keep only the source's padding mask
    (`mask: encoder_attention_mask, polarity: keep`). The decoder's self-attention is where the
    causal mask belongs.
    """

    code, example, origin = "causal-cross-attention", "causal_cross_attention", "encoder-decoder ports (public issue trackers)"

    def check(self, analysis):
        for site in analysis.attention:
            found = _causal(analysis, site)
            if found is None:
                continue
            declared = _declared_role(analysis, site) == "cross"
            if not declared and not is_cross(analysis, site):
                continue
            step, what, field = found
            why = "the file declares attention: {kind: cross}" if declared else _axes(analysis, site) + " are different sequences"
            message = (
                f"{what} on cross-attention: {why}, so key j is not a later token of query i's sequence — "
                f"drop the causal mask here and keep only the source's padding mask (the decoder's self-attention is the causal one)"
            )
            yield warning(analysis, analysis.node(step), self.code, message, field)


@register
class AttentionRole(Lint):
    """**What.** Masks that contradict what the file declares its attention to be
    (`attention: {kind: ...}` at the top of the file): a causal mask in an `encoder`, or a
    `decoder`'s self-attention that hides no later key — no `causal: true`, no triangular mask, only
    a padding mask (broadcast along the queries) or nothing. Cross-attention sites of a decoder
    file (queries and keys from different sequences) are exempt. A mask tensor computed by steps
    or of unknown content is taken to be causal. Without a declaration, self-attention whose keys
    append several new tokens to a KV cache (a chunked prefill: more than one query) is a decoder's.

    **Why it matters.** A decoder trained without its causal mask reads the tokens it must predict:
    the loss falls fast, and generation, which has no future tokens, fails. An encoder with one
    sees only the left context, and every token's representation loses half of the sentence.

    **Fix.** `causal: true` on the decoder's self-attention mask (with its padding mask: one `mask`
    step can hold both); no causal mask in an encoder.
    """

    code, example, origin = "attention-role", "attention_role", "decoders ported without their causal mask (public issue trackers)"

    def check(self, analysis):
        for site in analysis.attention:
            role = _declared_role(analysis, site)
            cache = cache_join(analysis, site) if role is None else None
            if cache is not None and score_dims(analysis, site)[0].value > 1:
                role = "decoder"  # several new queries over a KV cache: a decoder's prefill, whatever the file says
            if role == "encoder":
                found = _causal(analysis, site)
                if found is not None:
                    step, what, field = found
                    message = f"{what} in an encoder (attention: {{kind: encoder}}): every token must see the whole sequence — drop it"
                    yield warning(analysis, analysis.node(step), self.code, message, field)
            elif role == "decoder" and _causal(analysis, site) is None and not is_cross(analysis, site):
                masks = [_padding_only(analysis, site, step, masking) for step, masking in site.masks]
                if not all(masks) or not all(along_keys_only(analysis, site, tensor) for _, tensor in site.biases):
                    continue  # a pattern, or a tensor that varies along the queries: perhaps causal
                yield self._not_causal(analysis, site, cache)

    def _not_causal(self, analysis, site, cache):
        steps = [step for step, _ in site.masks]
        node = analysis.node(steps[0] if steps else site.softmax or site.product)
        applied = f"only the padding mask of '{node.id}'" if steps else "no mask at all"
        queries = score_dims(analysis, site)[0]
        what = (
            f"this self-attention reads the KV cache of '{cache.id}' with {queries}={queries.value} new queries"
            if cache is not None
            else "this self-attention of a decoder (attention: {kind: decoder})"
        )
        message = (
            f"{what} and has {applied}: every query sees the tokens after it — add causal: true{' to this mask step' if steps else ''}"
            + (" (bottom-right: the last query sees the last key)" if cache is not None else "")
        )
        return warning(analysis, node, self.code, message, "causal" if steps and node.step.masking() is not None else None)


def _padding_only(analysis, site, step: str, masking) -> bool:
    """Whether a mask hides no later key for sure: no pattern, and no tensor or one broadcast
    along the queries (a padding mask)."""
    if masking.causal or masking.window is not None or masking.chunk is not None or masking.segments is not None:
        return False
    return masking.tensor is None or along_keys_only(analysis, site, masking.tensor)
