"""Lints about where each token sits: rotary offsets against a KV cache, rope applied to cached
keys, causal masks aligned for square attention after a cache grew the keys, and a causal mask
given twice.

A decode step's keys are ``cat(cache, new)``: the new keys sit after the ``past`` cached ones, so
they (and the queries, the same new tokens) must be rotated at positions ``past .. past+T-1``,
which is what rope's ``offset`` says. The cache's length is the cat's first operands' length
along the cat dim: a dim expression, compared symbolically with the offset.
"""

from __future__ import annotations

from dataclasses import dataclass

from ...core.symbolic import Poly
from ..positions import COUNT, VALUES, index_source
from .registry import Lint, register, show, warning
from .sources import cache_after_new, new_tokens, position_lookups

MAX_WALK = 64


@dataclass(frozen=True)
class _Path:
    """How a tensor reached an attention site, walking back through single-input steps."""

    rotations: tuple  # rope nodes passed, nearest first
    join: object | None  # the cat node where a cache joined (None: none passed)
    cached: tuple[str, ...]  # the cat's operands before the last one: the cache
    fresh: str | None  # its last operand: the new tokens


def _walk(analysis, tensor_id: str, site) -> _Path:
    rotations, current = [], tensor_id
    for _ in range(MAX_WALK):
        node = analysis.producer(current)
        if node is None or not node.inputs:
            break
        if node.step.joins() is not None and len(node.inputs) >= 2 and _joins_tokens(analysis, node, site):
            return _Path(tuple(rotations), node, tuple(node.inputs[:-1]), node.inputs[-1])
        if node.step.rotation() is not None:
            rotations.append(node)
        if len(node.inputs) != 1:
            break
        current = node.inputs[0]
    return _Path(tuple(rotations), None, (), None)


def _joins_tokens(analysis, join, site) -> bool:
    """Whether a cat appends tokens (a cache) rather than features or heads: DeepSeek's keys are
    ``cat([k_nope, k_rope], -1)``, as long along the cat dim as the head dim q · k contracts over;
    StableLM's per-head norms ``cat`` the H_kv heads back, as long as the heads, not the keys."""
    meta = analysis.meta(join.id)
    if meta is None:
        return True
    joined = meta.shape[join.step.joins() % len(meta.shape)].poly
    if site.head_dim is not None and joined == site.head_dim.poly:
        return False
    length = _key_length(analysis, site)
    return length is None or joined == length


def _key_length(analysis, site) -> Poly | None:
    """How many keys the site attends over: the scores' key axis, or a fused kernel's (…, T_kv, Dh) keys."""
    if site.scores is not None and site.key_axis is not None:
        meta = analysis.meta(site.scores)
        return None if meta is None else meta.shape[site.key_axis].poly
    meta = analysis.meta(site.keys)
    return None if meta is None or len(meta.shape) < 2 else meta.shape[-2].poly


def _offset(node) -> Poly:
    return node.dims.dim(node.step.rotation().offset).poly


def _cache_length(analysis, join) -> tuple[Poly, str]:
    """The cached operands' total length along the cat dim, and how to write it."""
    total, names = Poly.const(0), []
    for operand in join.inputs[:-1]:
        meta = analysis.meta(operand)
        dim = meta.shape[join.step.joins() % len(meta.shape)]
        total, names = total + dim.poly, names + [str(dim)]
    return total, " + ".join(names)


@register
class RopeOffset(Lint):
    """**What.** In a decode step with a KV cache, new keys or queries rotated at positions that are
    not where the cache puts them: rope without `offset: past` on keys that are then appended to
    `past` cached keys, or queries rotated at a different offset than the new keys.

    **Why it matters.** RoPE makes q · k depend on the distance between two tokens. The new token's
    key rotated at position 0 instead of `past` looks `past` tokens older to every later query,
    and its query measures every distance wrongly. Every shape is right; generation degrades.

    **Fix.** `offset: past` (the cache's length along its positions axis) on the rope of the new
    keys and of the queries; for a batch with different lengths, per-token positions.
    """

    code, example, origin = "rope-offset", "rope_offset", "KV-cache decoding (public issue trackers)"

    def check(self, analysis):
        for site in analysis.attention:
            keys = _walk(analysis, site.keys, site)
            if keys.join is None or keys.rotations or cache_after_new(analysis, keys.join, site):
                continue  # no cache, rope after it (rope-after-cache), or the cat in the wrong order (cache-order)
            fresh = _walk(analysis, keys.fresh, site)
            length, written = _cache_length(analysis, keys.join)
            for rope in fresh.rotations[:1]:
                if rope.step.rotation().positions is None and _offset(rope) != length:
                    yield self._warn(analysis, rope, f"the new keys are appended after {written} cached ones by '{keys.join.id}'", written)
            for rope in _walk(analysis, site.query, site).rotations[:1]:
                if rope.step.rotation().positions is None and _offset(rope) != length:
                    yield self._warn(
                        analysis, rope, f"the queries are the new tokens, after the {written} cached keys of '{keys.join.id}'", written
                    )

    def _warn(self, analysis, rope, why: str, written: str):
        offset = rope.step.rotation().offset
        message = f"it rotates '{rope.inputs[0]}' at positions starting {offset}, but {why} — give offset: {written}"
        return warning(analysis, rope, self.code, message, "offset" if "offset" in rope.step.model_fields_set else None)


@register
class RopeAfterCache(Lint):
    """**What.** `rope` applied to keys after they were concatenated with a KV cache.

    **Why it matters.** A cache holds keys as they were attended to: rotated (transformers'
    `DynamicCache`, every decoding loop). Rotating the concatenation rotates the cached keys a
    second time, so each step shifts the whole history; the first step is right, later ones drift.

    **Fix.** Rotate only the new keys, before the `cat`, with `offset: past`. (A cache of
    un-rotated keys is rotated whole on purpose: say so with `allow: {rope-after-cache: REASON}`.)
    """

    code, example, origin = "rope-after-cache", "rope_after_cache", "KV-cache decoding (public issue trackers)"

    def check(self, analysis):
        for site in analysis.attention:
            keys = _walk(analysis, site.keys, site)
            if keys.join is not None and keys.rotations:
                rope = keys.rotations[-1]
                message = (
                    f"it rotates '{keys.join.id}', which already holds the cached keys {', '.join(keys.cached)}: cached keys are "
                    "stored rotated, so they are rotated twice — rotate the new keys before the cat, with offset: the cache's length"
                )
                yield warning(analysis, rope, self.code, message)


@register
class CausalAlign(Lint):
    """**What.** A causal mask with `align: top-left` on scores whose keys include a KV cache.

    **Why it matters.** Top-left alignment lets query i see keys 0..i: right when queries and keys
    are the same tokens. After a cache the queries are the last T of T_kv keys, so query 0 (at
    position `past`) sees only key 0 and the new tokens see almost none of the history.

    **Fix.** `align: bottom-right` (the default: the last query sees the last key).
    """

    code, example, origin = "causal-align", "causal_align", "KV-cache decoding with SDPA's is_causal"

    def check(self, analysis):
        for site in analysis.attention:
            top_left = [(step, m) for step, m in site.masks if m.causal and m.align == "top-left"]
            keys = _walk(analysis, site.keys, site)
            if not top_left or keys.join is None:
                continue
            step = top_left[0][0]
            message = (
                f"a top-left causal mask lets query i see keys 0..i, but '{keys.join.id}' put {', '.join(keys.cached)} before "
                f"the new tokens: the queries are the last keys — use align: bottom-right"
            )
            yield warning(analysis, analysis.node(step), self.code, message, "align")


@register
class DoubleMask(Lint):
    """**What.** Attention given `causal: true` and also a mask tensor that is itself a causal
    pattern (`init: tril` or `init: triu`).

    **Why it matters.** Both hide the same keys, so the result is right until one of them changes:
    with a cache or a window, the two disagree and the intersection hides keys that should be seen.
    torch's math backend refuses `attn_mask` with `is_causal`; the default CPU kernel accepts it.

    **Fix.** Keep one: `causal: true` (and `align`/`window`), or the mask tensor.
    """

    code, example, origin = "double-mask", "double_mask", "SDPA with is_causal and attn_mask"

    def check(self, analysis):
        for site in analysis.attention:
            for step, masking in site.masks:
                declared = analysis.declared.get(masking.tensor) if masking.tensor else None
                if masking.causal and declared is not None and declared.decl.init in ("tril", "triu"):
                    message = (
                        f"it hides the keys after each query twice: causal: true and the mask '{masking.tensor}' "
                        f"{show(analysis, masking.tensor)}, a causal pattern (init: {declared.decl.init}) — keep one"
                    )
                    yield warning(analysis, analysis.node(step), self.code, message, "causal")


def _decodes(analysis, site) -> bool:
    """Whether a site attends as a decoder over a cache: a causal mask, or queries rotated after
    cached tokens (a cat of other keys, such as Flamingo's media before its latents, is neither)."""
    if any(masking.causal for _, masking in site.masks):
        return True
    return any(
        rope.step.rotation().positions is None and _offset(rope).constant != 0 for rope in _walk(analysis, site.query, site).rotations
    )


@register
class CacheOrder(Lint):
    """**What.** A KV-cache concatenation that puts the new tokens first: `cat([k_new, k_cache])`
    along the positions axis, where the new keys (or values) are the ones computed from the
    queries' hidden states, or as long as the queries, and the cache is the rest — in attention
    that decodes (a causal mask, or queries rotated at an offset).

    **Why it matters.** The cache holds the older tokens: appended in front, the new keys sit at
    positions `0 .. T-1` and the whole history moves `T` places later, so a bottom-right causal
    mask lets the new queries see the wrong keys and every RoPE distance is off. A rope offset
    cannot repair it (rope-offset stays quiet here: the line to edit is the `cat`).

    **Fix.** Put the cache first: `inputs: [k_cache, k_new]` (transformers' `DynamicCache.update`:
    `torch.cat([self.keys, key_states], dim=-2)`), for the keys and the values alike.
    """

    code, example, origin = "cache-order", "cache_order", "KV-cache decoding (public issue trackers)"

    def check(self, analysis):
        reported = set()
        for site in analysis.attention:
            for tensor in (site.keys, site.values):
                join = _walk(analysis, tensor, site).join if tensor is not None else None
                if join is None or join.id in reported or not cache_after_new(analysis, join, site) or not _decodes(analysis, site):
                    continue
                reported.add(join.id)
                yield self._warning(analysis, join, new_tokens(analysis, join, site))

    def _warning(self, analysis, join, fresh: tuple[bool, ...]):
        new = [name for name, is_new in zip(join.inputs, fresh) if is_new]
        cached = [name for name, is_new in zip(join.inputs, fresh) if not is_new]
        message = (
            f"it puts the new tokens {', '.join(repr(n) for n in new)} before the cache {', '.join(repr(c) for c in cached)}: "
            f"the cached tokens are the older ones, so the new ones land at positions 0.. and the history moves after them — "
            f"put the cache first: inputs: [{', '.join(cached + new)}]"
        )
        return warning(analysis, join, self.code, message, "inputs")


@register
class LearnedPositionOffset(Lint):
    """**What.** In a decode step with a KV cache, learned absolute position embeddings (GPT-2's
    `wpe`, an `embed` of positions) looked up from position 0: the positions are an `arange`
    starting anywhere but the cache's length, or declared positions whose first value is not it.
    The same mistake rope-offset finds for RoPE, for models that add a position table instead.

    **Why it matters.** The new token gets the embedding of position 0 (the first token of a
    sequence), not of position `past`: every decode step looks like the start of a text to the
    model, and generation degrades after the prompt. Shapes are right and it runs.

    **Fix.** `arange` from the cache's length: `start: past, stop: past + T` (transformers'
    `cache_position`), or declared positions that start there.
    """

    code, example, origin = "learned-position-offset", "learned_position_offset", "GPT-2 style decoding with a KV cache"

    def check(self, analysis):
        reported = set()
        for site in analysis.attention:
            keys = _walk(analysis, site.keys, site)
            if keys.join is None or cache_after_new(analysis, keys.join, site):
                continue
            length, written = _cache_length(analysis, keys.join)
            size = sum(analysis.meta(o).sizes[keys.join.step.joins() % len(analysis.meta(o).sizes)] for o in keys.join.inputs[:-1])
            for lookup in position_lookups(analysis, site.query):
                source = index_source(analysis, lookup.inputs[0])
                first = _first_position(source)
                right = length if source.kind == COUNT else Poly.const(size)  # declared values are numbers: the cache's size
                if first is None or first == right or source.step in reported:
                    continue
                reported.add(source.step)
                yield self._warning(analysis, lookup, source, keys.join, written)

    def _warning(self, analysis, lookup, source, join, written: str):
        counted = source.kind == COUNT
        node = analysis.node(source.step) if counted else lookup
        start = f"start {node.step.counts()}" if counted else f"first value {source.rows[0][0]}"
        message = (
            f"the position embeddings of '{lookup.id}' are looked up at positions from {source.step} ({start}), but '{join.id}' "
            f"puts the new tokens after {written} cached ones: they sit at positions {written}.. — "
            + (
                f"count from the cache's length: start: {written}, stop: {written} + {_length(analysis, node)}"
                if counted
                else f"start the positions at {written}"
            )
        )
        return warning(analysis, node, self.code, message, "start" if counted else "input")


def _length(analysis, node) -> str:
    """How many positions a counting step makes, as a dim (``T``)."""
    return str(analysis.meta(node.id).shape[-1])


def _first_position(source) -> Poly | None:
    """The first position a lookup reads: a count's start, or the first declared value of positions."""
    if source.kind == COUNT:
        return source.start
    if source.kind == VALUES and "pos" in source.step.lower() and source.rows and source.rows[0]:
        return Poly.const(source.rows[0][0])
    return None
