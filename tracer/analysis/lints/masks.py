"""Lints about masks: rows that hide every key (NaN), and triangular masks with the wrong polarity."""

from __future__ import annotations

import math

from .registry import Lint, register, show, warning
from .sources import declared_mask_rows, flatten, padding_rows, reversed_padding, score_dims

#: layout steps followed back from an added tensor to the mask it came from
MAX_WALK = 64


def triangle(analysis, name: str) -> str | None:
    """``'future'`` if every trailing (R, C) slice of the mask is True exactly above the diagonal
    (``triu(ones, 1)``: what a causal mask must hide), ``'past'`` if exactly on and below it
    (``tril(ones)``: what it must keep); ``None`` for any other pattern or for R < 2."""
    meta = analysis.metas[name]
    rows = declared_mask_rows(analysis, name)
    if rows is None or len(meta.sizes) < 2 or meta.sizes[-2] < 2 or meta.sizes[-1] < 2:
        return None
    height = meta.sizes[-2]
    for kind, rule in (("future", lambda i, j: j > i), ("past", lambda i, j: j <= i)):
        if all(row == [rule(r % height, j) for j in range(len(row))] for r, row in enumerate(rows)):
            return kind
    return None


def _maskings(analysis):
    """(node, what it hides) of every step that masks scores."""
    for node in analysis.nodes.values():
        masking = node.step.masking()
        if masking is not None and node.outs:
            yield node, masking


@register
class NanRiskMask(Lint):
    """**What.** A `mask` step with `fill: -inf` whose mask hides *every* key of at least one query
    row. Checked statically on masks whose content the file fixes (`values:` literals and `init:`
    ones, zeros, triu, tril), taking the polarity into account. `causal: true` always keeps key 0,
    so it never triggers — except aligned bottom-right (the default) with more queries than keys:
    then the first `T_q - T_kv` queries see no key, and the lint says so at the step's `causal`.
    Masks only known at run time (random inits, user tensors) are checked while running:
    `tracer run` counts the softmax rows holding NaN through the `SoftmaxNaNs` hook. In Python:

    ```python
    import tracer
    from tracer.runtime.watch import SoftmaxNaNs

    pipeline = tracer.load("pipelines/lint_examples/nan_risk_mask.yaml")
    nans = SoftmaxNaNs(pipeline.check())
    pipeline.run(observe=nans)
    nans.warnings()   # [Diagnostic(... 'softmax produced 2 NaN rows of 12 ...')]
    ```

    `runtime_warnings(trace)` does the same after a run, for the softmax outputs the trace still
    has (its outputs, kept values, or tensors you pass).

    **Why it matters.** softmax of a row that is all −inf is 0/0 = NaN, and the NaN spreads to every
    later step and to the loss. Tutorial 003 says so ("Please do not set this to '-inf'") about its
    random keep-mask, which hides every key of one query in batch 1.

    **Fix.** `fill: -1e9`: a fully masked row then gets uniform weights instead of NaN (what
    tutorial 003 prints: 0.3333 each). Or make sure every query keeps at least one key.
    """

    code, example, origin = "nan-risk-mask", "nan_risk_mask", "tutorial 003"

    def check(self, analysis):
        reversed_steps = {step for site in analysis.attention for step, m in site.masks if reversed_padding(analysis, site, m)}
        for node, masking in _maskings(analysis):
            if masking.fill != float("-inf") or node.step.fused_attention() is not None:
                continue
            if masking.tensor is None:
                yield from self._causal_without_keys(analysis, node, masking)
                continue
            if masking.causal or node.id in reversed_steps:
                continue  # the causal pattern with the tensor is judged per site below; a reversed padding mask is padding-polarity's
            rows = declared_mask_rows(analysis, masking.tensor)
            if rows is None:
                continue
            keep = masking.polarity == "keep"
            empty = [r for r, row in enumerate(rows) if not any(v == keep for v in row)]
            if not empty:
                continue
            where = _row_index(empty[0], analysis.metas[masking.tensor].sizes)
            message = (
                f"fill -inf, and mask '{masking.tensor}' {show(analysis, masking.tensor)} with polarity {masking.polarity} hides every key in "
                f"{len(empty)} of {len(rows)} rows (first: mask{where}); softmax of an all -inf row is NaN and the NaN "
                f"spreads to every later step — use fill: min or -1e9 (such a row then gets uniform weights, as transformers and tutorial 003 do), "
                f"or make every query keep at least one key"
            )
            yield warning(analysis, node, self.code, message, "fill")
        for site in analysis.attention:
            yield from self._causal_with_padding(analysis, site, reversed_steps)

    def _causal_with_padding(self, analysis, site, reversed_steps):
        """Left padding and a causal mask, every hidden score -inf: the first queries of a left-padded row
        see only padding keys, so every key of their row is hidden (transformers' eager masks use finfo.min)."""
        hiding = [(step, m) for step, m in site.masks if m.fill == float("-inf") and step in site.chain]
        causal = [m for _, m in hiding if m.causal and m.window is None and m.chunk is None]
        padding = [(step, m) for step, m in hiding if m.tensor is not None and m.polarity is not None and step not in reversed_steps]
        dims = score_dims(analysis, site)
        if not causal or len(padding) != 1 or dims is None:
            return
        step, masking = padding[0]
        found = padding_rows(analysis, site, masking.tensor)
        if found is None or not found.varies:
            return
        t_q, t_k = dims[0].value, dims[1].value
        shift = t_k - t_q if causal[0].align == "bottom-right" else 0
        blind = [
            (r, min((j for j, v in enumerate(row) if v), default=t_k) - shift) for r, row in enumerate(found.visible(masking.polarity))
        ]
        blind = [(r, min(first, t_q)) for r, first in blind if first > 0]
        if not blind:
            return
        row, count = blind[0]
        message = (
            f"fill -inf, a causal mask and the left-padded mask '{masking.tensor}' {show(analysis, masking.tensor)}: in row {row} the "
            f"first {count} queries see only padding keys, so every key of {sum(n for _, n in blind)} query rows is -inf and softmax "
            f"gives NaN, which spreads to every token through the next layer's attention — use fill: min (torch.finfo(dtype).min, "
            f"as transformers' eager masks do)"
        )
        yield warning(analysis, analysis.node(step), self.code, message, "fill")

    def _causal_without_keys(self, analysis, node, masking):
        t_q, t_k = analysis.metas[node.reads[0]].sizes[-2:]
        if masking.align == "top-left" or t_q <= t_k:
            return
        message = (
            f"causal: true aligns the last query with the last key, and the scores have T_q={t_q} > T_kv={t_k}: the first "
            f"{t_q - t_k} queries see no key, so their -inf rows become NaN — use align: top-left if query i is key i, or fill: min"
        )
        yield warning(analysis, node, self.code, message, "causal")


def _row_index(row: int, shape: tuple[int, ...]) -> str:
    lead = shape[:-1]
    index = []
    for size in reversed(lead):
        index.append(row % size if size else 0)
        row //= size if size else 1
    return "[" + ", ".join(map(str, reversed(index))) + (", :]" if lead else ":]")


@register
class MaskPolarity(Lint):
    """**What.** A triangular mask applied with the polarity that keeps the future. tracer makes every
    mask tensor state its polarity (`keep`: True = attend; `block`: True = hide), because the
    tutorials disagree: 002 fills where its `triu(ones, diagonal=1)` buffer is True (block), 003
    fills where its mask is False (keep). A mask that is True exactly above the diagonal marks the
    future and must be `block`; one that is True on and below it marks what a query may see and
    must be `keep`. Non-triangular masks (padding, random) are not judged.

    **Why it matters.** With the polarity flipped every query attends only to later tokens — the
    model reads the answer — and the last query to nothing. Shapes are unchanged and it runs.

    **Fix.** `polarity: block` for a triu(…, 1) mask, `polarity: keep` for a tril mask — or
    `causal: true`, which needs no mask tensor at all.
    """

    code, example, origin = "mask-polarity", "mask_polarity", "tutorials 002 and 003"

    def check(self, analysis):
        for node, masking in _maskings(analysis):
            if masking.tensor is None or masking.polarity is None:
                continue
            kind = triangle(analysis, masking.tensor)
            right = {"future": "block", "past": "keep"}.get(kind)
            if right is None or masking.polarity == right:
                continue
            shown = show(analysis, masking.tensor)
            if kind == "future":
                message = (
                    f"mask '{masking.tensor}' {shown} is True above the diagonal (triu(ones, diagonal=1): the future), but polarity: keep "
                    f"attends only where it is True: every query sees only later tokens and the last query sees none — "
                    f"use polarity: block (tutorial 002's masked_fill(mask.bool(), -inf)), or a tril mask with polarity: keep"
                )
            else:
                message = (
                    f"mask '{masking.tensor}' {shown} is True on and below the diagonal (tril(ones): what each query may see), but "
                    f"polarity: block hides exactly those keys: every query sees only later tokens and the last query sees none — "
                    f"use polarity: keep (tutorial 003's masked_fill(mask == False, -1e9)), or a triu(…, 1) mask with polarity: block"
                )
            yield warning(analysis, node, self.code, message, "polarity")


INTEGER_DTYPES = ("bool", "int64", "int32")


@register
class BinaryMaskAdded(Lint):
    """**What.** A 0/1 mask *added* to the attention scores: an `add` into the scores (or a float
    `mask` given to `sdpa`, which torch adds) whose operand is a bool or integer tensor cast to
    float, or a declared tensor whose content is 0/1 (`init: ones`, `tril`, `triu`, `values:` of
    0s and 1s), reached through layout steps only (unsqueeze, view, expand, cast…).

    **Why it matters.** An additive mask must hold 0 where a query may attend and a large negative
    number where it may not. Added as it is, a padding mask of 1s and 0s raises every kept score
    by 1 and hides nothing: padded keys keep almost all their weight, shapes are right, and it runs.

    **Fix.** Let a `mask` step hide the keys (`mask: attention_mask, polarity: keep, fill: min`), or
    build the additive form first as BERT's `get_extended_attention_mask` does:
    `(1.0 - mask) * torch.finfo(dtype).min` (a `sub` and a `mul` before the `add`).
    """

    code, example, origin = "binary-mask-added", "binary_mask_added", "padding masks (public issue trackers)"

    def check(self, analysis):
        for site in analysis.attention:
            added = list(site.biases)
            added += [(step, m.tensor) for step, m in site.masks if m.tensor is not None and m.polarity is None]
            for step, tensor in added:
                origin = binary_origin(analysis, tensor)
                if origin is not None:
                    yield self._warning(analysis, analysis.node(step), tensor, origin)

    def _warning(self, analysis, node, tensor: str, origin: str):
        field = "mask" if node.step.fused_attention() is not None else "inputs"
        found = analysis.meta(origin)
        source = "" if analysis.record_of(tensor) == origin else f" ({found.dtype} '{origin}' {show(analysis, origin)}, moved and cast)"
        message = (
            f"'{tensor}' {show(analysis, tensor)} is added to the scores but is a 0/1 mask{source}: adding it raises every kept "
            f"score by 1 and hides no key — hide keys with op: mask (mask: {origin}, polarity: keep, fill: min), or add "
            f"(1 - mask) * finfo.min as BERT's get_extended_attention_mask does (a sub and a mul before the add)"
        )
        return warning(analysis, node, self.code, message, field)


#: a hidden score at or above this (after the scales that follow the mask) keeps real weight: e^-30 ≈ 1e-13
WEAK_FILL = -30.0


@register
class WeakMaskFill(Lint):
    """**What.** A mask between the scores and the softmax whose `fill` is a number a score can
    be: 0, a small negative number, anything above −30 once the scales after the mask apply (a
    fill of −100 divided by √Dh = 16 is −6.25).

    **Why it matters.** softmax gives a hidden score of 0 the weight e^0, as much as a real score
    of 0: `masked_fill(mask == 0, 0)` hides nothing, and the padding or the future keeps its share.
    Masking after the softmax (zeroing weights) is another thing and is not judged.

    **Fix.** `fill: min` (`torch.finfo(dtype).min`, what transformers uses), `-inf`, or a large
    negative number such as `-1.0e9` (tutorial 003).
    """

    code, example, origin = "weak-mask-fill", "weak_mask_fill", "ports of masked_fill(mask == 0, 0) (public issue trackers)"

    def check(self, analysis):
        for site in analysis.attention:
            for step, masking in site.masks:
                if step not in site.chain:
                    continue  # a fused kernel hides with -inf itself
                after = [s.multiplier for s in site.scales if site.chain.index(s.step) > site.chain.index(step)]
                effective = masking.fill * math.prod(after)
                if math.isfinite(effective) and effective > WEAK_FILL:
                    yield self._warning(analysis, analysis.node(step), masking.fill, effective)

    def _warning(self, analysis, node, fill: float, effective: float):
        scaled = "" if effective == fill else f" ({effective:g} after the scales that follow it)"
        message = (
            f"fills hidden scores with {fill:g}{scaled}, a value real scores take: softmax gives each hidden key about "
            f"e^({effective:g} - score) of the weight, so it hides almost nothing — use fill: min (torch.finfo(dtype).min), "
            f"-inf, or -1.0e9"
        )
        return warning(analysis, node, self.code, message, "fill")


@register
class MaskOnQueries(Lint):
    """**What.** A mask tensor that varies along the queries and is broadcast along the keys: its
    dim under the scores' key axis has size 1, its dim under the query axis does not — a padding
    mask written `attention_mask[:, None, :, None]`, (B, 1, T, 1), where `[:, None, None, :]`,
    (B, 1, 1, T), was meant. In `mask` steps, `sdpa`'s `mask`, and tensors added to the scores.
    Reported at the line to edit: the `unsqueeze`, `view` or `reshape` that put the mask's
    positions under the queries (at its `dim` or `shape`), or the mask step when the tensor was
    declared that way.

    **Why it matters.** Such a mask never hides a key from a query: it hides a whole query row or
    nothing. The padded keys keep their weight for every real token, and the padded queries get
    uniform weights (or NaN with `-inf`); added to the scores, it shifts each row by one number,
    which softmax ignores. Shapes broadcast, and it runs.

    **Fix.** Put the mask's positions under the key axis: `(B, 1, 1, T)` (unsqueeze at 1 and 2), or
    a full `(B, 1, T, T)` mask when queries must be masked too.
    """

    code, example, origin = "mask-on-queries", "mask_on_queries", "padding masks (public issue trackers)"

    def check(self, analysis):
        for site in analysis.attention:
            if site.query_axis is None or site.key_axis is None:
                continue
            scores = analysis.meta(site.scores) if site.scores is not None else None
            rank = len(scores.shape) if scores is not None else len(analysis.meta(site.query).shape)
            t_kv = scores.sizes[site.key_axis] if scores is not None else analysis.meta(site.keys).sizes[-2]
            masks = [(step, m.tensor) for step, m in site.masks if m.tensor is not None]
            for step, tensor in [*masks, *site.biases]:
                if t_kv > 1 and self._along_queries_only(analysis, site, tensor, rank):
                    yield self._warning(analysis, site, analysis.node(step), tensor, rank)

    @staticmethod
    def _along_queries_only(analysis, site, tensor: str, rank: int) -> bool:
        sizes = analysis.meta(tensor).sizes
        under = [axis % rank - (rank - len(sizes)) for axis in (site.query_axis, site.key_axis)]  # broadcasting aligns the right
        query, key = (sizes[i] if i >= 0 else 1 for i in under)
        return key == 1 and query > 1

    @classmethod
    def _moved_there(cls, analysis, site, tensor: str, rank: int):
        """The layout step that put the mask's positions under the queries (its input had them
        elsewhere): the line to edit; None when the tensor was declared that way."""
        current = analysis.record_of(tensor)
        for _ in range(MAX_WALK):
            node = analysis.producer(current)
            if node is None or len(node.inputs) != 1 or not (node.step.keeps_values or node.step.on_binary()):
                return None
            before = analysis.record_of(node.inputs[0])
            if not cls._along_queries_only(analysis, site, before, rank):
                return node
            current = before
        return None

    def _warning(self, analysis, site, node, tensor: str, rank: int):
        added = node.step.masking() is None or node.step.masking().polarity is None
        moved = self._moved_there(analysis, site, tensor, rank)
        effect = (
            "it shifts each query's row by one number, which softmax ignores: no key is hidden"
            if added
            else "it hides whole query rows, never a key from a query"
        )
        message = (
            f"{'bias' if added else 'mask'} '{tensor}' {show(analysis, tensor)} varies along the queries (scores dim "
            f"{site.query_axis % rank}) and is broadcast along the keys (dim {site.key_axis % rank}): {effect} — a padding mask "
            f"over the keys is (B, 1, 1, T): attention_mask[:, None, None, :]"
        )
        if moved is not None:
            message = (
                f"it puts the positions of '{moved.inputs[0]}' {show(analysis, moved.inputs[0])} under the queries: "
                f"{message[0].lower()}{message[1:]} (at step '{node.id}')"
            )
            written = [f for f in (*moved.step.axis_fields, "shape") if f in moved.step.model_fields_set]
            return warning(analysis, moved, self.code, message, written[0] if written else None)
        field = "inputs" if node.step.masking() is None else "mask"
        return warning(analysis, node, self.code, message, field)


def binary_origin(analysis, tensor: str) -> str | None:
    """The tensor a 0/1 mask came from, following layout steps and casts back from ``tensor``;
    None when any other step computed it (BERT's (1 - m) * min) or its content is unknown."""
    current = analysis.record_of(tensor)
    for _ in range(MAX_WALK):
        if analysis.metas[current].dtype in INTEGER_DTYPES:
            return current
        node = analysis.producer(current)
        if node is None:
            return current if _holds_ones(analysis, current) else None
        if not node.step.keeps_values or len(node.inputs) != 1:
            return None
        current = analysis.record_of(node.inputs[0])
    return None


def _holds_ones(analysis, name: str) -> bool:
    """A declared 0/1 tensor with at least one 1 (all zeros is a valid additive 'no mask')."""
    declared = analysis.declared.get(name)
    if declared is None:
        return False
    values = declared.decl.values
    if values is not None:
        flat = set(flatten(values))
        return flat <= {0, 1} and 1 in flat
    rows = declared_mask_rows(analysis, name)
    return rows is not None and any(any(row) for row in rows)
