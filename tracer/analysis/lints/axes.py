"""Lints about what axes mean (tracer.analysis.roles): a step that reads one axis as another —
attention along the heads, rope turning the heads, a softmax over heads, a head split laid out
(head dim, heads), rotary positions written into the values."""

from __future__ import annotations

from ..roles import HEAD_DIM, HEADS, POSITIONS
from .registry import Lint, register, show, warning

MAX_WALK = 64  # steps followed back from a tensor to the step that made its layout


def _named(analysis, tensor_id: str, axis: int) -> str:
    """``H (heads)``: an axis of a tensor as messages name it."""
    meta = analysis.meta(tensor_id)
    role = analysis.axis_roles(tensor_id)[axis]
    return f"{meta.shape[axis]} ({role})" if role else str(meta.shape[axis])


@register
class AttentionAxis(Lint):
    """**What.** Attention that runs along an axis whose dim is not token positions: `sdpa` given
    (B, T, H, Dh) tensors where it reads (B, H, T, Dh) (its positions axis is then the heads), scores
    whose key or query axis is a head count or a head dim, or `rope` whose `seq_dim` is not the
    positions axis. Roles come from the dims' names and expressions (docs/lints.md: axis roles).

    **Why it matters.** Every shape still works: with H heads and T tokens, sdpa computes an H × H
    attention per token instead of T × T per head, and rope rotates each head by its head index.
    The output has the right shape and is wrong; nothing fails until the model does not learn.

    **Fix.** Move the positions where the step reads them: `transpose` q, k and v with
    `dims: [1, 2]` to (B, H, T, Dh) before the attention, or give rope the positions axis
    (`seq_dim: -3` for (B, T, H, Dh)).
    """

    code, example, origin = "attention-axis", "attention_axis", "flash-attention layouts (B, T, H, Dh) fed to SDPA"

    def check(self, analysis):
        for site in analysis.attention:
            yield from self._site(analysis, site)
        for node in analysis.nodes.values():
            rotation = node.step.rotation()
            if rotation is None or not node.outs or not node.reads:
                continue
            tensor = node.reads[0]
            ndim = len(analysis.metas[tensor].shape)
            axis = rotation.seq_dim % ndim
            role = analysis.axis_roles(tensor)[axis]
            if role not in (None, POSITIONS):
                positions = analysis.axis_roles(tensor).index(POSITIONS) - ndim if POSITIONS in analysis.axis_roles(tensor) else None
                fix = f"give seq_dim: {positions}" if positions is not None else "move the positions to the axis rope turns"
                message = f"rope turns '{tensor}' {show(analysis, tensor)} along axis {rotation.seq_dim}, {_named(analysis, tensor, axis)}, not token positions — {fix}"
                yield warning(analysis, node, self.code, message, "seq_dim")

    def _site(self, analysis, site):
        if site.query_axis is None:
            return
        node = analysis.node(site.product)
        if site.fused:
            tensor, axes = site.query, {"positions": site.query_axis}
        else:
            tensor, axes = site.scores, {"query": site.query_axis, "key": site.key_axis}
        roles = analysis.axis_roles(tensor)
        for what, axis in axes.items():
            if axis is None or roles[axis] in (None, POSITIONS):
                continue
            if site.fused:
                heads = roles.index(POSITIONS) if POSITIONS in roles else None
                swap = f"transpose q, k and v with dims: [{heads}, {axis}] first" if heads is not None else "put the positions at axis -2"
                message = (
                    f"'{site.product}' reads q '{tensor}' {show(analysis, tensor)} with its positions at axis {axis - len(roles)}, "
                    f"which is {_named(analysis, tensor, axis)}: it attends across that axis, not across tokens — {swap}"
                )
            else:
                message = (
                    f"scores '{tensor}' {show(analysis, tensor)} have {_named(analysis, tensor, axis)} as their {what} axis: "
                    "the product attends across that axis, not across tokens — transpose q and k to (…, H, T, Dh) before it"
                )
            yield warning(analysis, node, self.code, message)
            return


@register
class SoftmaxAxis(Lint):
    """**What.** A softmax over attention scores that runs over neither the keys nor the queries:
    over the heads, or the batch.

    **Why it matters.** Each position's weights should sum to 1 over the keys. A softmax over the
    heads makes the heads compete for each (query, key) pair instead; shapes never betray it.

    **Fix.** `dim: -1` (the keys).
    """

    code, example, origin = "softmax-axis", "softmax_axis", "any attention"

    def check(self, analysis):
        for site in analysis.attention:
            if site.fused or site.query_axis is None or site.key_axis is None:
                continue
            softmax = analysis.node(site.softmax)
            ndim = len(analysis.metas[site.scores].shape)
            dim = softmax.step.normalises()
            if ndim < 3 or dim % ndim in (site.query_axis % ndim, site.key_axis % ndim):
                continue
            message = (
                f"softmax over dim {dim} normalises the scores '{site.product}' {show(analysis, site.scores)} over "
                f"{_named(analysis, site.scores, dim % ndim)}, not over the keys — use dim: {site.key_axis - ndim}"
            )
            yield warning(analysis, softmax, self.code, message, "dim")


@register
class HeadSplitOrder(Lint):
    """**What.** A `view` or `reshape` that splits features into (head dim, heads) — `[B, T, Dh, H]`
    — or merges them back in that order.

    **Why it matters.** Checkpoints and every attention implementation lay the features out heads
    first: feature `h * Dh + i` is element i of head h. Splitting into (Dh, H) gives each "head"
    one feature from every real head. The shapes are right, `scale-mismatch` may fire on the wrong
    dim, and dividing by √H there silences it and keeps the bug.

    **Fix.** `shape: [B, T, H, Dh]` (and merge back from (…, H, Dh)).
    """

    code, example, origin = "head-split-order", "head_split_order", "swapped head split (public issue trackers)"

    def check(self, analysis):
        for node in analysis.nodes.values():
            if not node.step.regroups or not node.outs or not node.reads:
                continue
            for tensor, other in ((node.value, node.reads[0]), (node.reads[0], node.value)):
                roles = analysis.axis_roles(tensor)
                pair = next((i for i in range(len(roles) - 1) if roles[i : i + 2] == (HEAD_DIM, HEADS)), None)
                if pair is None:
                    continue
                meta = analysis.meta(tensor)
                dh, h = meta.shape[pair], meta.shape[pair + 1]
                if {dh.poly, h.poly} <= {d.poly for d in analysis.meta(other).shape}:
                    continue  # both axes exist on the other side: a reordering, view-scrambles-dims' case
                message = (
                    f"'{tensor}' {show(analysis, tensor)} lays the features out as ({dh}, {h}), head dim before heads; "
                    f"features are stored heads first — use ({h}, {dh})"
                )
                yield warning(analysis, node, self.code, message, "shape" if "shape" in type(node.step).model_fields else None)
                break


@register
class RopeOnValues(Lint):
    """**What.** Rotary position embedding (`rope`) on the path of the values.

    **Why it matters.** RoPE encodes positions into q and k so that their dot product depends on
    the distance between tokens. Rotating v mixes each value's features by its position instead:
    the output changes, nothing fails.

    **Fix.** Feed the values from before the rope (the un-rotated projection).
    """

    code, example, origin = "rope-on-values", "rope_on_values", "RoPE ports"

    def check(self, analysis):
        for site in analysis.attention:
            if site.values is None:
                continue
            node = _upstream_rotation(analysis, site.values)
            if node is not None:
                message = f"it rotates positions into the values of '{site.product}'; rope belongs on q and k only — give the attention the values from before it"
                yield warning(analysis, node, self.code, message)


def _upstream_rotation(analysis, tensor_id: str):
    """The rope step a tensor comes from through single-input steps and concatenations (a
    value cache joined with the new values), if any."""
    frontier, seen = [tensor_id], set()
    while frontier and len(seen) < MAX_WALK:
        current = frontier.pop()
        node = analysis.producer(current)
        if current in seen or node is None or not node.inputs:
            continue
        seen.add(current)
        if node.step.rotation() is not None:
            return node
        if node.step.joins() is not None or len(node.inputs) == 1:
            frontier += reversed(node.inputs)
    return None
