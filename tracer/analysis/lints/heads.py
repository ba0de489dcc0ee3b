"""Lints about attention heads: how kv heads are shared among query heads."""

from __future__ import annotations

from ..roles import BATCH, FEATURES, HEAD_DIM, POSITIONS
from .registry import Lint, register, show, warning

REACH = 8  # steps followed from a repeat towards attention


@register
class GqaHeadOrder(Lint):
    """**What.** A `repeat` that tiles an existing dim of size > 1 (the kv heads) on its way to a
    query-key product or an `sdpa` step. Grouped-query attention gives query head `h` the kv head
    `h // n_rep` (transformers' `repeat_kv`, SDPA's `enable_gqa`): heads `0, 1` become
    `0, 0, 1, 1`. `repeat(1, n_rep, 1, 1)` makes `0, 1, 0, 1`, and so does `repeat_kv` written
    with the copies outside the heads: `unsqueeze(1).expand(B, n_rep, H_kv, T, Dh).reshape(B, H, T, Dh)`
    (a `view`/`reshape` merging a broadcast dim with the real dim after it).

    **Why it matters.** Shapes are identical either way, so nothing fails; on a Llama layer the
    tiled order is off by up to 0.23.

    **Fix.** `{op: repeat_interleave, repeats: n_rep, dim: 1}` (or `expand` + `reshape`, as
    `repeat_kv` does; or `sdpa` with `gqa: true`).
    """

    code, example, origin = "gqa-head-order", "gqa_head_order", "grouped-query attention (Llama, Mistral, Qwen)"

    def check(self, analysis):
        yield from self._repeats(analysis)
        yield from self._expanded_outside(analysis)

    def _repeats(self, analysis):
        for node in analysis.nodes.values():
            repeats = node.step.tiling()
            if repeats is None or not node.outs:
                continue
            source = node.reads[0]
            meta = analysis.metas[source]
            written = repeats[len(repeats) - len(meta.shape) :]
            reps = [node.dims.dim(r).value for r in written]
            tiled = [d for d, (r, size) in enumerate(zip(reps, meta.sizes)) if r > 1 and size > 1]
            if not tiled or _not_heads(analysis, source, tiled[0]) or not reaches_attention(analysis, node.id):
                continue
            d, r = tiled[0], reps[tiled[0]]
            heads = meta.shape[d]
            order = ", ".join(str(h % heads.value) for h in range(min(heads.value * r, 8)))
            wanted = ", ".join(str(h // r) for h in range(min(heads.value * r, 8)))
            message = (
                f"repeat tiles the {heads}={heads.value} heads of '{source}' {show(analysis, source)} along dim {d} as {order}…; "
                f"grouped-query attention gives query head h the kv head h // n_rep ({wanted}…, transformers' repeat_kv) — "
                f"use {{op: repeat_interleave, repeats: {written[d]}, dim: {d}}}"
            )
            yield warning(analysis, node, self.code, message, "repeats")

    def _expanded_outside(self, analysis):
        """``unsqueeze(1).expand(B, n_rep, H_kv, …).reshape(B, H, …)``: the copies merged outside
        the heads they copy, which tiles them as ``repeat`` does."""
        for node in analysis.nodes.values():
            if not node.step.regroups or not node.outs:
                continue
            source = analysis.metas[node.reads[0]]
            merged = _merged_copies(source, node.outs[-1].meta)
            if merged is None or _not_heads(analysis, node.reads[0], merged + 1) or not reaches_attention(analysis, node.id):
                continue
            copies, heads = source.shape[merged], source.shape[merged + 1]
            order = ", ".join(str(h % heads.value) for h in range(min(heads.value * copies.value, 8)))
            message = (
                f"{node.op} merges the {copies}={copies.value} expanded copies of '{node.reads[0]}' {show(analysis, node.reads[0])} "
                f"outside its {heads}={heads.value} heads, so the heads come out tiled ({order}…); grouped-query attention gives "
                f"query head h the kv head h // n_rep — expand the copies after the heads: unsqueeze at {merged + 1} (not {merged}), "
                f"expand to (…, {heads}, {copies}, …), as transformers' repeat_kv does, or use repeat_interleave"
            )
            yield warning(analysis, node, self.code, message, "shape")


def _merged_copies(source, out) -> int | None:
    """The dim d of ``source`` that is a broadcast copy (stride 0, size > 1) merged by ``out``
    with the real dim d + 1 after it, or None."""
    for d in range(len(source.sizes) - 1):
        size, inner = source.sizes[d : d + 2]
        copied = source.stride[d] == 0 and size > 1 and source.stride[d + 1] != 0 and inner > 1
        if copied and out.sizes[:d] == source.sizes[:d] and len(out.sizes) > d and out.sizes[d] == size * inner:
            return d
    return None


def reaches_attention(analysis, start: str) -> bool:
    """Whether ``start`` becomes a query, key or value of an attention product within a few steps.
    A tensor that joins the scores (Swin's shifted-window mask tiled over the batch of windows, a
    bias) is no operand: the walk stops at the steps between a product and its softmax."""
    on_scores = {step for site in analysis.attention for step in (*site.chain, site.softmax) if step is not None}
    frontier = [start]
    for _ in range(REACH):
        reached = [(t, user) for t in frontier for user in analysis.users(t)]
        for tensor, user in reached:
            fused = user.step.fused_attention() is not None
            if fused and tensor in user.inputs[:3] or user.step.makes_scores and not fused:
                return True
        frontier = [user.id for _, user in reached if user.id not in on_scores]
    return False


def _not_heads(analysis, tensor: str, axis: int) -> bool:
    """An axis whose dim says it is not heads (batch, positions, features): tiling it is not GQA."""
    roles = analysis.axis_roles(tensor)
    return axis < len(roles) and roles[axis] in (BATCH, POSITIONS, HEAD_DIM, FEATURES)
