"""Lints about the ``parallel:`` plan: what goes wrong on a rank at the mesh's degrees, though the
single-device reference (every mesh dim 1) is fine. They read the rank's view
(``tracer.analysis.parallel``): its shape errors, and the problems its shape pass found."""

from __future__ import annotations

from ..parallel import Sharding, divided_by, placements_of, shard_axis
from .registry import Lint, register


def _diagnostic(analysis, code: str, message: str, step_id: str | None, target: str | None = None, field: str | None = None):
    """A warning at the plan entry that causes it when there is one, else at the step."""
    if target is not None or step_id not in analysis.nodes:
        path = ("parallel", "plan", target) if target is not None else ("parallel", "mesh")
        return analysis.source.error(path, code, message, step_id or None, prefer_key=True, severity="warning")
    return analysis.error(analysis.nodes[step_id], code, message, field, severity="warning")


def _degrees(view) -> str:
    return ", ".join(f"{name}={degree}" for name, degree in view.degrees.items())


def _rank_errors(analysis):
    """(reference node, the rank's error at it) for every step that fails only on a rank."""
    view = analysis.rank
    if view is None or view.analysis is None:
        return
    for error in view.shape_errors:
        if error.step in analysis.nodes and error.step in view.analysis.nodes:
            yield analysis.nodes[error.step], error


def _sharded_input(view, node) -> tuple[str, str] | None:
    """(record, mesh dim) of the first data input that a rank holds a shard of."""
    local = view.analysis
    for ref in node.inputs:
        meta = local.meta(ref)
        if meta is None:
            continue
        for mesh_dim, placement in zip(view.degrees, placements_of(meta, list(view.degrees))):
            if placement.startswith("Shard"):
                return local.record_of(ref), mesh_dim
    return None


def _explained(analysis) -> bool:
    """Whether a plan problem or a kv-head split already explains the rank's shape errors."""
    view = analysis.rank
    return bool(view.problems) or any(True for _ in _kv_splits(analysis))


def _kv_splits(analysis):
    """(planned node, the view after it, heads dim, degree) for a colwise projection whose output a
    view splits into fewer heads than the degree."""
    view = analysis.rank
    for step_id, entry in view.plan.items():
        if entry.style != "colwise":
            continue
        degree = view.degrees[entry.mesh_dim]
        for user in analysis.users(step_id):
            if not user.step.regroups or not user.outs:
                continue
            shape = user.outs[-1].meta.shape
            if len(shape) >= 2 and shape[-2].value < degree:
                yield analysis.nodes[step_id], entry, shape[-2], degree


@register
class ShardNotDivisible(Lint):
    """**What.** A plan (or `parallel.inputs`) that splits a tensor along a dim the degree does
    not divide: `W_q` of `H * Dh = 24` rows colwise over `tp: 16`, a sequence of `T = 6` over
    `cp: 4`, or a dim such as `H_local: H // tp` that cannot be computed at the mesh's degree.

    **Why it matters.** torch shards unevenly (the last ranks get fewer rows, or none), so the
    ranks' programs no longer agree: a view of `H // tp` heads fails on some ranks, and a row-wise
    projection's partial sums have different widths.

    **Fix.** A degree that divides the heads, kv heads, features and sequence (`--dim tp=2`), or
    a plan that does not shard that step (`replicate`)."""

    code, example, origin = "shard-not-divisible", "shard_not_divisible", "tensor / sequence parallelism (torchtitan)"

    def check(self, analysis):
        view = analysis.rank
        if view is None:
            return
        if view.failure is not None:
            message = f"at the mesh's degrees ({_degrees(view)}), {view.failure.message} — pick a degree that divides it"
            yield analysis.source.error(("parallel", "mesh"), self.code, message, prefer_key=True, severity="warning")
        for problem in view.problems:
            if problem.code == self.code:
                yield _diagnostic(analysis, self.code, problem.message, problem.step or None, problem.target)


@register
class KvHeadsBelowTp(Lint):
    """**What.** A column-parallel projection whose output is split into fewer heads than the
    degree: `k: colwise` with `H_kv: 1` kv heads over `tp: 2`; or several kv heads replicated on
    every rank while the query heads are split (`H_kv: 2`, `k: replicate`).

    **Why it matters.** Column parallelism hands each rank `H_kv // tp` heads; with fewer kv heads
    than ranks a rank gets part of a head (half of its `Dh` features), and its attention is
    computed on a fraction of the key. torchtitan's Llama requires `n_kv_heads % tp == 0`.
    Replicated kv heads are right only when there is one: with two, rank 1's query heads (global
    2 and 3 of 4) attend with kv heads 0 and 1 where grouped-query attention gives both kv head 0.

    **Fix.** `replicate` the k and v projections (every rank computes the whole kv heads, and its
    local query heads share them: write `H // tp` query heads and `H_kv` kv heads), or a smaller
    degree."""

    code, example, origin = "kv-heads-below-tp", "kv_heads_below_tp", "grouped-query attention under tensor parallelism"

    def check(self, analysis):
        if analysis.rank is None or analysis.rank.failure is not None:  # dims that fail at the degree say it first
            return
        yield from self._replicated_groups(analysis)
        for node, entry, heads, degree in _kv_splits(analysis):
            message = (
                f"'{node.id}' is colwise over {entry.mesh_dim}={degree}, but its output is split into {heads}={heads.value} heads, "
                f"fewer than the {degree} ranks: each rank would hold part of a head — plan '{node.id}' replicate "
                f"(every rank computes all the heads, written without // {entry.mesh_dim}), or use a degree that divides them"
            )
            yield _diagnostic(analysis, self.code, message, node.id, entry.target)

    def _replicated_groups(self, analysis):
        """Queries split by heads attending to several kv heads that every rank holds whole: the
        rank's query heads pair with its kv heads 0, 1, … as if they were the first ones."""
        view = analysis.rank
        if view.analysis is None:
            return
        mesh = list(view.degrees)
        for site in analysis.attention:
            q, k = view.analysis.meta(site.query), view.analysis.meta(site.keys)
            if q is None or k is None or len(q.shape) != len(k.shape) or len(q.shape) < 3:
                continue
            for mesh_dim, q_at, k_at in zip(mesh, placements_of(q, mesh), placements_of(k, mesh)):
                axis = shard_axis(q_at, len(q.shape))
                if axis is None or axis >= len(q.shape) - 2 or k_at != "Replicate()" or k.shape[axis].value == 1:
                    continue
                heads = k.shape[axis]
                message = (
                    f"the queries '{site.query}' {q.symbolic} are split by heads over {mesh_dim}={view.degrees[mesh_dim]}, but every "
                    f"rank holds all {heads}={heads.value} kv heads of '{site.keys}': each rank pairs its query heads with kv heads "
                    f"0, 1, … as if they were the first query heads — replicate k and v only for a single kv head; with "
                    f"{heads.value}, plan them colwise over a degree that divides {heads}"
                )
                yield analysis.error(analysis.nodes[site.product], self.code, message, severity="warning")


@register
class ViewGlobalHeads(Lint):
    """**What.** A `view`/`reshape` that writes the global heads (`[B, T, H, Dh]`) on a rank's
    shard, after a column-parallel projection that left each rank `H // tp` heads.

    **Why it matters.** Each rank holds `H * Dh // tp` features: the view fails on every rank at
    `tp > 1` (or, with `-1` elsewhere, scrambles heads into the batch), though the single-device run
    is fine.

    **Fix.** Write the rank's heads: `[B, T, H // tp, Dh]` (a dim `H_local: H // tp`), or `-1`
    for the heads, as torchtitan's model code does."""

    code, example, origin = "view-global-heads", "view_global_heads", "tensor parallelism (Megatron, torchtitan)"

    def check(self, analysis):
        view = analysis.rank
        if view is None or view.analysis is None or _explained(analysis):
            return
        for node, _error in _rank_errors(analysis):
            sharded = _sharded_input(view, node)
            if not node.step.regroups or sharded is None or not node.outs:
                continue
            record, mesh_dim = sharded
            if any(divided_by(dim, mesh_dim) for dim in node.outs[-1].meta.shape):
                continue
            local = view.analysis.meta(record)
            message = (
                f"{node.op} writes {node.outs[-1].meta.symbolic}, the global shape, but each rank holds '{record}' "
                f"{local.symbolic} {list(local.sizes)} over {mesh_dim}={view.degrees[mesh_dim]} — write the rank's sizes "
                f"(heads as H // {mesh_dim}, tokens as T // {mesh_dim}) or -1"
            )
            yield analysis.error(node, self.code, message, "shape", severity="warning")


@register
class MissingReduction(Lint):
    """**What.** Features that a rank holds only a shard of, contracted by a projection that is
    not row-parallel: `o_proj` unplanned or `colwise` after column-parallel heads.

    **Why it matters.** Each rank computes a partial sum over its features; without RowwiseParallel
    nothing all-reduces them (and the weight is not split to match), so the output is wrong on
    every rank, or the shapes do not even meet.

    **Fix.** Plan the projection `rowwise` (weight `Shard(1)`, an all-reduce after it; or
    `output: Shard(1)` for a reduce-scatter into sequence parallelism)."""

    code, example, origin = "missing-reduction", "missing_reduction", "tensor parallelism (Megatron's row-parallel linear)"

    def check(self, analysis):
        view = analysis.rank
        if view is None or view.analysis is None:
            return
        for problem in view.problems:
            if problem.code == self.code:
                yield _diagnostic(analysis, self.code, problem.message, problem.step, problem.target)
        if _explained(analysis):
            return
        for node, _error in _rank_errors(analysis):
            sharded = _sharded_input(view, node)
            if node.step.projection() is None or sharded is None or node.id in view.plan:
                continue
            record, mesh_dim = sharded
            local = view.analysis.meta(record)
            if placements_of(local, list(view.degrees))[list(view.degrees).index(mesh_dim)] != f"Shard({len(local.shape) - 1})":
                continue
            where = f"over {mesh_dim}={view.degrees[mesh_dim]}"
            found = Sharding.missing_reduction(node, record, local, where, f"plan '{node.id}' rowwise")
            yield analysis.error(node, self.code, found.message, severity="warning")


@register
class DoubleReduction(Lint):
    """**What.** A row-parallel step whose input is already whole on every rank: a second
    `rowwise` after one that all-reduced (`o_proj` then `down` without a colwise between them), or
    a `rowwise` on replicated activations.

    **Why it matters.** RowwiseParallel reads its input as a shard of the features. Whole
    activations meet a weight split by columns: the shapes do not meet, or (when the widths happen
    to agree) the all-reduce sums `tp` copies of the result.

    **Fix.** Plan the step that feeds it `colwise` (the pair colwise → rowwise is one reduction),
    or plan this step `colwise` / `replicate`."""

    code, example, origin = "double-reduction", "double_reduction", "tensor parallelism (Megatron's column/row pairs)"

    def check(self, analysis):
        view = analysis.rank
        for problem in view.problems if view is not None else ():
            if problem.code == self.code:
                yield _diagnostic(analysis, self.code, problem.message, problem.step, problem.target)


@register
class PlanLayout(Lint):
    """**What.** A planned step whose `input` layout says something other than how its input
    really arrives on each rank: `input: Shard(1)` (a sequence shard) on activations every rank
    holds whole, or the default `Replicate()` on a sequence shard from a `sequence` norm.

    **Why it matters.** torch believes the declared layout (`DTensor.from_local`): a sequence shard
    read as whole is never all-gathered, so each rank attends to or projects only its own tokens.

    **Fix.** Write the layout it arrives in (`input: Shard(1)` after a sequence-parallel norm), or
    change the plan of the step before it."""

    code, example, origin = "plan-layout", "plan_layout", "sequence parallelism (torchtitan)"

    def check(self, analysis):
        view = analysis.rank
        for problem in view.problems if view is not None else ():
            if problem.code == self.code:
                yield _diagnostic(analysis, self.code, problem.message, problem.step, problem.target, problem.field)


@register
class RankShape(Lint):
    """**What.** A step whose shapes meet in the single-device run but not on a rank at the mesh's
    degrees, for a reason no other parallelism lint names: a residual `add` of a whole tensor and a
    column-parallel shard, a `split` of global sizes on a local tensor.

    **Why it matters.** The program every rank runs fails at this step.

    **Fix.** Write the rank's sizes (`d // tp`, `-1`), or plan the steps around it so that what
    meets here has the same layout (a `rowwise` projection all-reduces back to whole)."""

    code, example, origin = "rank-shape", "rank_shape", "tensor parallelism"

    def check(self, analysis):
        view = analysis.rank
        if view is None or view.analysis is None or _explained(analysis):
            return
        known = {ViewGlobalHeads.code: ViewGlobalHeads(), MissingReduction.code: MissingReduction()}
        named = {d.step for lint in known.values() for d in lint.check(analysis)}
        for node, error in _rank_errors(analysis):
            if node.id in named:
                continue
            message = f"on each rank ({_degrees(view)}): {error.message}"
            yield analysis.error(node, self.code, message, severity="warning")


@register
class ShardOffset(Lint):
    """**What.** Under a sequence split (context parallelism: `x: [Shard(1)]` over `cp`), a
    `rope` that counts positions from 0, or a causal mask built on the rank's own scores: each
    rank holds tokens `r·T/cp .. (r+1)·T/cp - 1`, but these steps treat them as `0 .. T/cp - 1`.

    **Why it matters.** Every rank but the first rotates its queries and keys by the wrong angles,
    and a causal mask on a shard hides the wrong keys (a rank's first query sees only itself); the
    single-device run is right, so only the ranks disagree.

    **Fix.** Give rope the positions split like the tokens (`positions: pos`, `pos: [Shard(0)]` in
    `parallel.inputs`), and make the attention an `sdpa` with `causal: true` planned `context`,
    which masks at the tokens' global positions."""

    code, example, origin = "shard-offset", "shard_offset", "context parallelism (ring attention)"

    def check(self, analysis):
        view = analysis.rank
        if view is None or view.analysis is None:
            return
        for node in analysis.nodes.values():
            if node.id in view.plan or not node.inputs:
                continue
            local = view.analysis.meta(node.inputs[0])
            rotation, masking = node.step.rotation(), node.step.masking()
            if local is None or not local.shape:
                continue
            ndim = len(local.shape)
            if rotation is not None and rotation.positions is None:
                axes, what = (rotation.seq_dim % ndim,), f"rope counts positions from {rotation.offset}"
            elif masking is not None and masking.causal:
                axes, what = (ndim - 2, ndim - 1), "the causal mask compares the rank's own query and key indices"
            else:
                continue
            sharded = [name for name, placement in zip(view.degrees, placements_of(local, list(view.degrees))) if _on_axes(placement, axes)]
            if not sharded:
                continue
            mesh_dim = sharded[0]
            message = (
                f"{what} on '{node.inputs[0]}' {local.symbolic}, whose tokens are split over {mesh_dim}={view.degrees[mesh_dim]}: "
                f"rank r holds tokens r·T/{mesh_dim} .. (r+1)·T/{mesh_dim} - 1, but this step treats them as starting at 0 — "
                + (
                    "give rope the positions split like the tokens (positions: pos, with pos: [Shard(0)] in parallel.inputs)"
                    if rotation is not None
                    else "use an sdpa with causal: true planned context (the mask at the global positions)"
                )
            )
            yield analysis.error(node, self.code, message, severity="warning")


def _on_axes(placement: str, axes: tuple[int, ...]) -> bool:
    return any(placement == f"Shard({axis})" for axis in axes)


@register
class NormalisedShard(Lint):
    """**What.** A softmax, or a norm over the last dim, along an axis that each rank holds only
    a shard of: router logits computed `colwise` and softmaxed over the experts, a weightless
    `layernorm` after a column-parallel projection.

    **Why it matters.** The shapes meet on every rank, but each rank normalises over its own
    slice: its softmax sums to 1 over `E // tp` experts instead of `E`, its norm's mean and
    variance are of `d // tp` features. torch raises nothing: the ranks simply disagree with the
    single-device run.

    **Fix.** Gather the axis before normalising (`output: Replicate()` on the projection, or plan
    it `replicate`), or shard another axis (heads, not the features a norm runs over)."""

    code, example, origin = "normalised-shard", "normalised_shard", "tensor parallelism"

    def check(self, analysis):
        view = analysis.rank
        if view is None or view.analysis is None or _explained(analysis):
            return
        mesh = list(view.degrees)
        for node in analysis.nodes.values():
            local = view.analysis.meta(node.inputs[0]) if node.inputs and node.id not in view.plan else None
            if local is None or not local.shape or not node.outs:
                continue
            ndim = len(local.shape)
            softmax = node.step.normalises()
            axis = softmax % ndim if softmax is not None else ndim - 1 if node.step.normalises_rows else None
            if axis is None:
                continue
            split = [m for m, placement in zip(mesh, placements_of(local, mesh)) if shard_axis(placement, ndim) == axis]
            if not split:
                continue
            what = "softmax" if softmax is not None else node.op
            message = (
                f"{what} runs over axis {axis} of '{node.inputs[0]}' {local.symbolic} {list(local.sizes)}, which each rank holds "
                f"only a shard of over {split[0]}={view.degrees[split[0]]}: it normalises over the rank's slice, not the whole axis — "
                f"gather it first (output: Replicate() on the step that splits it, or plan that step replicate)"
            )
            yield analysis.error(node, self.code, message, severity="warning")
