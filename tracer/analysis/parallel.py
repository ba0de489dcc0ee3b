"""Parallelism known before running: the ``parallel:`` plan resolved per step, each rank's local
shapes, and the collectives the plan implies, with their bytes.

The steps are each rank's program (torchtitan's model code): a view after a column-parallel
projection writes the local heads (``H // tp``). Inputs and params are declared global; the plan
shards them as torch's ``parallelize_module`` styles do:

- ``colwise`` (ColwiseParallel): weight and bias ``Shard(0)`` (the output features), input
  ``Replicate()``, output ``Shard(-1)``;
- ``rowwise`` (RowwiseParallel): weight ``Shard(1)`` (the input features), bias replicated, input
  ``Shard(-1)``, output the partial sums reduced: ``Replicate()`` (all-reduce) or ``Shard(1)``
  (reduce-scatter: sequence parallel);
- ``sequence`` (SequenceParallel): a norm on a sequence shard, ``Shard(1)`` in and out;
- ``replicate``: the whole step on every rank;
- ``context``: an ``sdpa`` whose q, k and v are sequence shards (``Shard(2)``); the keys and values
  are gathered once (torch's default ring rotation, ``_RotateMethod.ALL_GATHER``: one
  ``all_gather_into_tensor`` of ``cat(k.flatten(), v.flatten())``).

A planned step's ``input`` layout says how the local tensor that arrives is to be read (torch's
``input_layouts``); the shape pass redistributes it to what the style computes on, and its output
to ``output``. Which axis of a tensor is sharded is read off its local symbolic shape: an axis
whose dim is divided by a mesh dim (``H * Dh // tp``) is that mesh dim's shard.

A collective's ``bytes_per_rank`` follows the ring algorithms NCCL and gloo use, ``n`` the degree
and ``S`` the bytes of the whole tensor (``shape``): all-reduce ``2 (n - 1) / n · S``, all-gather
(``S`` the gathered tensor), reduce-scatter (``S`` the tensor before it is scattered) and
all-to-all ``(n - 1) / n · S``.

Nothing here imports torch or the shape pass: ``tracer.analysis.shapes`` runs the rank's shape
pass with the hooks of a :class:`Sharding` and hands the result to the functions below.
"""

from __future__ import annotations

import difflib
import fnmatch
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from ..core.dtypes import DTYPE_BYTES
from ..core.layout import Meta, fresh, with_root
from ..core.symbolic import Dim, DimAlgebra, Poly

REPLICATE, PARTIAL = "Replicate()", "Partial()"
LAYOUT_CODES = ("double-reduction", "missing-reduction", "plan-layout")  # a step reading its input in the wrong layout
DEFAULT_MESH_DIM = {"context": "cp"}  # every other style: tp
SEQUENCE_AXIS = 1  # SequenceParallel's sequence_dim, and the (B, T, …) layout of activations
CONTEXT_AXIS = 2  # the sequence axis of sdpa's (B, H, T, Dh) q, k, v (torch's context parallel shards it)
DEFAULTS = {  # style -> (input layout, output layout), as torch's styles default them
    "colwise": (REPLICATE, "Shard(-1)"),
    "rowwise": ("Shard(-1)", REPLICATE),
    "sequence": (f"Shard({SEQUENCE_AXIS})", f"Shard({SEQUENCE_AXIS})"),
    "replicate": (REPLICATE, REPLICATE),
    "context": (f"Shard({CONTEXT_AXIS})", f"Shard({CONTEXT_AXIS})"),
}
APPLIES = {  # style -> (what it applies to, the test on a step)
    "colwise": ("a linear step (a projection with a weight)", lambda step: step.projection() is not None),
    "rowwise": ("a linear step (a projection with a weight)", lambda step: step.projection() is not None),
    "sequence": ("a norm (layernorm, rmsnorm)", lambda step: step.normalises_rows),
    "context": ("an attention kernel (sdpa)", lambda step: step.fused_attention() is not None),
    "replicate": ("any step", lambda step: True),
}


@dataclass(frozen=True)
class PlanEntry:
    """One step's resolved plan: its style, the mesh dim it is sharded over, the layout its input
    arrives in and the layout its output leaves in (torch's input_layouts / output_layouts), and the
    plan key that named it (``layers/*/q_proj``)."""

    style: str
    mesh_dim: str
    input: str
    output: str
    local_output: bool
    target: str


@dataclass(frozen=True)
class Collective:
    """One collective of a forward, as torch's functional collectives name it (what CommDebugMode
    counts): ``shape`` is the whole tensor it works on (the all-reduced tensor, the gathered one,
    the one scattered), ``bytes_per_rank`` what each rank sends (ring accounting: module docs)."""

    op: str
    step: str
    mesh_dim: str
    shape: tuple[int, ...]
    dtype: str
    bytes_per_rank: int
    at: str = "output"  # "input": the step's input redistributed before it; "output": after it; "inside": context's k/v exchange


@dataclass(frozen=True)
class Problem:
    """Something the plan does wrong on a rank, for the lints to report at its step."""

    code: str
    step: str
    message: str
    field: str | None = None
    target: str | None = None  # the plan key it belongs to, when it is the plan's fault


@dataclass(frozen=True)
class LocalTensor:
    """One tensor as a rank holds it."""

    symbolic: str
    concrete: tuple[int, ...]
    placements: tuple[str, ...]  # one per mesh dim
    positions: tuple[str | None, ...] = ()  # the tokens each positions axis holds on this rank


@dataclass
class RankView:
    """Everything known about one rank (every rank: the shapes are the same on each, the positions
    each holds are not): its analysis at the declared degrees, the plan, the collectives, and what
    the plan does wrong."""

    degrees: dict[str, int]
    plan: dict[str, PlanEntry]
    analysis: Any = None  # the rank's tracer.analysis.shapes.Analysis (None when its dims fail)
    collectives: list[Collective] = field(default_factory=list)
    problems: list[Problem] = field(default_factory=list)
    failure: Any = None  # the Diagnostic of dims that cannot be computed at these degrees

    @property
    def shape_errors(self):
        """The rank's own shape errors (the reference analysis had none)."""
        return [] if self.analysis is None else self.analysis.errors


# ------------------------------------------------------------------ placements


def parse_placement(text: str) -> tuple[str, int | None]:
    """``Shard(-1)`` -> ("shard", -1); ``Replicate()`` -> ("replicate", None); ``Partial()`` -> ("partial", None)."""
    found = re.fullmatch(r"Shard\((-?\d+)\)", text)
    if found:
        return "shard", int(found.group(1))
    return ("partial" if text == PARTIAL else "replicate"), None


def shard_axis(text: str, ndim: int) -> int | None:
    kind, axis = parse_placement(text)
    return axis % ndim if kind == "shard" and ndim and -ndim <= axis < ndim else None


def divided_by(dim: Dim, mesh_dim: str) -> bool:
    """Whether a dim is a shard over ``mesh_dim``: its polynomial divides by it (``H * Dh // tp``),
    or it is the opaque quotient of a division that is not exact (``(d_ff // tp)`` at d_ff=16, tp=3)."""
    uneven = f" // {mesh_dim})"
    return any(
        (name == mesh_dim and exp < 0) or (exp > 0 and name.startswith("(") and name.endswith(uneven))
        for mono, _ in dim.poly.terms
        for name, exp in mono
    )


def placements_of(meta: Meta, mesh: list[str]) -> tuple[str, ...]:
    """One placement per mesh dim, read off the local symbolic shape."""
    found = []
    for mesh_dim in mesh:
        axis = next((a for a, dim in enumerate(meta.shape) if divided_by(dim, mesh_dim)), None)
        found.append(REPLICATE if axis is None else f"Shard({axis})")
    return tuple(found)


def ring_bytes(op: str, nbytes: int, degree: int) -> int:
    """Bytes each rank sends for ``op`` on a whole tensor of ``nbytes`` (module docs)."""
    share = nbytes * (degree - 1) // degree
    return 2 * share if op == "all_reduce" else share


# ------------------------------------------------------------------ the plan


def resolve_plan(parallel, nodes: Mapping[str, Any], error: Callable[..., Any]) -> tuple[dict[str, PlanEntry], list]:
    """step id -> its resolved entry, in execution order, and the plan's located errors: a key that
    matches no step, a step two keys plan, a style on a kind it cannot apply to, a default mesh dim
    the mesh lacks. ``error(path, code, message)`` makes a diagnostic at the file's ``parallel:``."""
    found: dict[str, PlanEntry] = {}
    problems = []
    ids = list(nodes)
    for target, written in parallel.plan.items():
        entry = _entry(target, written, parallel, error, problems)
        matched = [step_id for step_id in ids if fnmatch.fnmatchcase(step_id, target)]
        if not matched:
            hint = difflib.get_close_matches(target, ids, n=1)
            known = f"; did you mean '{hint[0]}'?" if hint else " (a step id, or a glob over the expanded ids such as layers/*/q_proj)"
            problems.append(error(("parallel", "plan", target), "plan-unknown-step", f"'{target}' matches no step{known}", True))
            continue
        if entry is None:
            continue
        for step_id in matched:
            step = nodes[step_id].step
            what, applies = APPLIES[entry.style]
            if step_id in found:
                message = f"step '{step_id}' is planned twice: by '{found[step_id].target}' and by '{target}' — keep one (narrow the glob)"
                problems.append(error(("parallel", "plan", target), "plan-twice", message, True))
            elif not applies(step):
                message = (
                    f"'{target}': {entry.style} applies to {what}, but step '{step_id}' is op {step.op} — plan the step of that kind, "
                    f"or replicate this one"
                )
                problems.append(error(("parallel", "plan", target), "plan-style", message, False))
            else:
                found[step_id] = entry
    return {step_id: found[step_id] for step_id in ids if step_id in found}, problems


def _entry(target: str, written, parallel, error, problems: list) -> PlanEntry | None:
    style = written if isinstance(written, str) else written.style
    mesh_dim = (None if isinstance(written, str) else written.mesh_dim) or DEFAULT_MESH_DIM.get(style, "tp")
    if mesh_dim not in parallel.mesh:
        message = (
            f"'{target}': {style} runs over mesh dim '{mesh_dim}' by default, which the mesh ({', '.join(parallel.mesh)}) lacks; "
            f"write {{style: {style}, mesh_dim: {next(iter(parallel.mesh))}}}"
        )
        problems.append(error(("parallel", "plan", target), "unknown-mesh-dim", message, False))
        return None
    if not isinstance(written, str) and not written.local_output:
        message = (
            f"'{target}': local_output: false hands the next steps a DTensor, whose global shapes and implicit "
            f"redistributions tracer does not follow (its steps are each rank's program on local tensors) — leave "
            f"local_output out (true), and write the next steps for the rank's shard"
        )
        problems.append(error(("parallel", "plan", target, "local_output"), "local-output", message, False))
        return None
    given_in = None if isinstance(written, str) else written.input
    given_out = None if isinstance(written, str) else written.output
    default_in, default_out = DEFAULTS[style]
    return PlanEntry(style, mesh_dim, given_in or default_in, given_out or default_out, True, target)


# ------------------------------------------------------------------ the rank's shape pass


class Sharding:
    """The hooks a rank's shape pass runs: declared tensors made local, and a planned step's
    inputs and output redistributed, each collective recorded."""

    def __init__(self, parallel, plan: dict[str, PlanEntry], degrees: dict[str, int], nodes: Mapping[str, Any]):
        self.parallel, self.plan, self.degrees = parallel, plan, degrees
        self.mesh = list(parallel.mesh)
        self.collectives: list[Collective] = []
        self.problems: list[Problem] = []
        self.errors: list[tuple[tuple, str]] = []  # (path in the file, message): a Shard(d) past the tensor's dims
        self.params = self._param_shards(nodes)  # param -> (axis, mesh dim, the step whose plan shards it)

    def _param_shards(self, nodes) -> dict[str, tuple[int, str, str]]:
        shards = {}
        for step_id, entry in self.plan.items():
            projection = nodes[step_id].step.projection()
            if entry.style not in ("colwise", "rowwise") or projection is None:
                continue
            out_axis, in_axis = (1, 0) if projection.transposed else (0, 1)
            shards.setdefault(projection.weight, (out_axis if entry.style == "colwise" else in_axis, entry.mesh_dim, step_id))
            if projection.bias is not None and entry.style == "colwise":
                shards.setdefault(projection.bias, (0, entry.mesh_dim, step_id))
        return shards

    # -------------------------------------------------------------- declared tensors

    def declared(self, name: str, section: str, meta: Meta, alg: DimAlgebra) -> Meta:
        if section == "inputs":
            placements = self.parallel.inputs.get(name, [REPLICATE] * len(self.mesh))
            for mesh_dim, placement in zip(self.mesh, placements):
                axis = self._axis(placement, meta, ("parallel", "inputs", name), f"input '{name}'")
                if axis is not None:
                    meta = self._split(meta, axis, mesh_dim, alg, name, None)
            return meta
        if name in self.params:
            axis, mesh_dim, step_id = self.params[name]
            return self._split(meta, axis, mesh_dim, alg, name, step_id)
        return meta

    def _axis(self, placement: str, meta: Meta, path: tuple, what: str) -> int | None:
        """The axis a ``Shard(d)`` splits, None for Replicate()/Partial(); a ``d`` past the tensor's
        dims is an error at ``path``."""
        kind, written = parse_placement(placement)
        axis = shard_axis(placement, len(meta.shape))
        if kind == "shard" and axis is None:
            ndim = len(meta.shape)
            message = f"{placement}: {what} {meta.symbolic} has {ndim} dim{'s' if ndim != 1 else ''}, so d is -{ndim} .. {ndim - 1}"
            self.errors.append((path, message))
        return axis

    def _split(self, meta: Meta, axis: int, mesh_dim: str, alg: DimAlgebra, name: str, step_id: str | None) -> Meta:
        dim, degree = meta.shape[axis], self.degrees[mesh_dim]
        if dim.value % degree:
            where = f"planned by '{step_id}'" if step_id else "placed by parallel.inputs"
            message = (
                f"'{name}' {meta.symbolic} {list(meta.sizes)} is split along axis {axis} ({dim}={dim.value}) over "
                f"{mesh_dim}={degree} ({where}), which does not divide it: ranks would hold shards of different sizes"
            )
            self.problems.append(
                Problem("shard-not-divisible", step_id or "", message, target=self.plan[step_id].target if step_id else None)
            )
        return self._resized(meta, axis, alg.floordiv(dim, alg.dim(mesh_dim)), name)

    @staticmethod
    def _resized(meta: Meta, axis: int, dim: Dim, root: str | None) -> Meta:
        shape = meta.shape[:axis] + (dim,) + meta.shape[axis + 1 :]
        made = fresh(shape, meta.dtype)
        return with_root(made, root) if root else made

    # -------------------------------------------------------------- planned steps

    def step(self, node, metas: dict[str, Meta], infer: Callable, value: Callable[[str], str]) -> Any:
        """``node`` inferred on this rank: a planned step's data inputs redistributed first, its
        output after."""
        entry = self.plan.get(node.id)
        if entry is None:
            return infer(node)
        saved = {}
        inputs = node.inputs[:3] if entry.style == "context" else node.inputs[:1]
        for ref in dict.fromkeys(inputs):
            record = value(ref)
            if record in metas:
                saved[record] = metas[record]
                metas[record] = self._arriving(node, entry, record, metas[record])
        try:
            done = infer(node)
        finally:
            metas.update(saved)
        if not done.outs:
            return done
        if entry.style == "context":
            self._exchange_kv(node, entry, [saved.get(value(ref)) for ref in inputs[1:3]])
            # the rank's queries meet every shard's keys (a causal ring skips the blocks above the diagonal: a bound)
            done = replace(done, flops=done.flops * self.degrees[entry.mesh_dim])
        last = done.outs[-1]
        leaving = self._leaving(node, entry, last.meta, node.dims)
        if leaving is last.meta:
            return done
        metas[last.id] = leaving
        outs = done.outs[:-1] + (replace(last, meta=leaving),)
        return replace(done, outs=outs)

    def _arriving(self, node, entry: PlanEntry, record: str, meta: Meta) -> Meta:
        """The local tensor as the step computes on it: read as ``entry.input`` (a mismatch with
        how it really arrives is a problem), then redistributed to the style's own input."""
        arrived = placements_of(meta, self.mesh)[self.mesh.index(entry.mesh_dim)]
        if self._axis(
            entry.input, meta, ("parallel", "plan", entry.target, "input"), f"the input of '{node.id}'"
        ) is None and entry.input.startswith("Shard"):
            return meta
        declared = _normal(entry.input, len(meta.shape))
        if arrived != declared and not any(problem.code in LAYOUT_CODES for problem in self.problems):
            # only the first: what follows a wrong layout is read wrong too, and fixing it re-checks the rest
            self.problems.append(self._mismatch(node, entry, record, meta, arrived, declared))
        wanted = {"colwise": REPLICATE, "rowwise": f"Shard({len(meta.shape) - 1})"}.get(entry.style, declared)
        return self._redistribute(node, entry.mesh_dim, meta, declared, _normal(wanted, len(meta.shape)), node.dims, "input")

    def _leaving(self, node, entry: PlanEntry, meta: Meta, alg: DimAlgebra) -> Meta:
        natural = {"colwise": f"Shard({len(meta.shape) - 1})", "rowwise": PARTIAL}.get(entry.style)
        if natural is None:
            return meta
        if self._axis(
            entry.output, meta, ("parallel", "plan", entry.target, "output"), f"the output of '{node.id}'"
        ) is None and entry.output.startswith("Shard"):
            return meta
        return self._redistribute(node, entry.mesh_dim, meta, natural, _normal(entry.output, len(meta.shape)), alg)

    def _redistribute(self, node, mesh_dim: str, meta: Meta, have: str, want: str, alg: DimAlgebra, at: str = "output") -> Meta:
        if have == want:
            return meta
        ndim = len(meta.shape)
        have_axis, want_axis = shard_axis(have, ndim), shard_axis(want, ndim)
        whole = meta if have_axis is None else self._resized(meta, have_axis, alg.mul(meta.shape[have_axis], alg.dim(mesh_dim)), None)
        if have == PARTIAL:
            op = "all_reduce" if want_axis is None else "reduce_scatter_tensor"
        elif have_axis is not None:
            op = "all_gather_into_tensor" if want_axis is None else "all_to_all_single"
        else:
            op = None  # Replicate -> Shard: each rank keeps its chunk, nothing is sent
        if op is not None:
            self._record(op, node.id, mesh_dim, whole.sizes, meta.dtype, at)
        if want_axis is None:
            return whole
        return self._resized(whole, want_axis, alg.floordiv(whole.shape[want_axis], alg.dim(mesh_dim)), None)

    def _exchange_kv(self, node, entry: PlanEntry, kv: list[Meta | None]) -> None:
        """Context parallelism's key/value exchange: torch's ring attention all-gathers
        ``cat(k.flatten(), v.flatten())`` once (its default rotation)."""
        if any(meta is None for meta in kv):
            return
        local = sum(meta.numel for meta in kv)
        self._record("all_gather_into_tensor", node.id, entry.mesh_dim, (local * self.degrees[entry.mesh_dim],), kv[0].dtype, "inside")

    def _record(self, op: str, step: str, mesh_dim: str, shape: tuple[int, ...], dtype: str, at: str) -> None:
        degree = self.degrees[mesh_dim]
        if degree == 1:
            return  # torch skips a collective over one rank
        nbytes = DTYPE_BYTES.get(dtype, 4)
        for size in shape:
            nbytes *= size
        self.collectives.append(Collective(op, step, mesh_dim, tuple(shape), dtype, ring_bytes(op, nbytes, degree), at))

    def _mismatch(self, node, entry: PlanEntry, record: str, meta: Meta, arrived: str, declared: str) -> Problem:
        shown = f"'{record}' {meta.symbolic} {list(meta.sizes)}"
        where = f"over {entry.mesh_dim}={self.degrees[entry.mesh_dim]}"
        if entry.style == "rowwise" and arrived == REPLICATE:
            message = (
                f"rowwise reads {shown}, which is whole on every rank {where} (already reduced or never sharded), as a shard: "
                f"each rank would multiply all of it by its slice of the weight and the all-reduce would sum it again — plan "
                f"'{node.id}' colwise or replicate, or shard what feeds it (a colwise projection before it)"
            )
            return Problem("double-reduction", node.id, message, target=entry.target)
        if entry.style == "colwise" and arrived != REPLICATE and declared == REPLICATE and arrived == f"Shard({len(meta.shape) - 1})":
            return self.missing_reduction(node, record, meta, where, f"plan '{node.id}' rowwise, not colwise", entry.target)
        message = (
            f"{entry.style} reads {shown} as {declared} {where}, but it arrives as {arrived} on each rank — write "
            f"input: {arrived} in its plan entry, or plan the step before it to leave {declared}"
        )
        return Problem("plan-layout", node.id, message, "input", entry.target)

    @staticmethod
    def missing_reduction(node, record: str, meta: Meta, where: str, fix: str, target: str | None = None) -> Problem:
        message = (
            f"'{node.id}' contracts the features of '{record}' {meta.symbolic} {list(meta.sizes)}, which each rank holds only "
            f"a shard of {where}: every rank would compute a partial sum that nothing reduces — {fix} (RowwiseParallel: "
            f"weight Shard(1), an all-reduce after it)"
        )
        return Problem("missing-reduction", node.id, message, target=target)


def _normal(placement: str, ndim: int) -> str:
    axis = shard_axis(placement, ndim)
    return placement if axis is None else f"Shard({axis})"


# ------------------------------------------------------------------ the interface


def resolved_plan(analysis) -> dict[str, PlanEntry]:
    """Per planned step (block copies' ids expanded), its resolved entry, for torch's styles."""
    return {} if analysis.rank is None else dict(analysis.rank.plan)


def collectives(analysis) -> list[Collective]:
    """The collectives one forward runs on every rank, in execution order."""
    return [] if analysis.rank is None else list(analysis.rank.collectives)


def mesh_coordinates(degrees: Mapping[str, int], rank: int) -> dict[str, int]:
    """Where ``rank`` sits on the mesh (row-major, the outermost mesh dim first, as DeviceMesh)."""
    coords = {}
    for mesh_dim in reversed(list(degrees)):
        coords[mesh_dim] = rank % degrees[mesh_dim]
        rank //= degrees[mesh_dim]
    return {mesh_dim: coords[mesh_dim] for mesh_dim in degrees}


def world_size(degrees: Mapping[str, int]) -> int:
    size = 1
    for degree in degrees.values():
        size *= degree
    return size


def rank_view(analysis, rank: int = 0) -> dict[str, LocalTensor]:
    """record id -> the tensor as ``rank`` holds it: its local symbolic and concrete shape, its
    placements, and the tokens each positions axis holds (a sequence shard over ``cp`` holds
    ``r·T/cp .. (r+1)·T/cp - 1``)."""
    view = analysis.rank
    if view is None or view.analysis is None:
        return {}
    if not 0 <= rank < world_size(view.degrees):
        raise ValueError(f"rank {rank} is outside the mesh ({world_size(view.degrees)} ranks)")
    coords, mesh = mesh_coordinates(view.degrees, rank), list(view.degrees)
    found = {}
    for record, meta in view.analysis.records():
        placements = placements_of(meta, mesh)
        positions = _positions(analysis.token_positions(record), meta, placements, mesh, coords)
        found[record] = LocalTensor(meta.symbolic, meta.sizes, placements, positions)
    return found


def _positions(intervals, meta: Meta, placements: tuple[str, ...], mesh: list[str], coords: dict[str, int]) -> tuple:
    """The reference's token intervals (tracer.analysis.positions), cut to this rank's shard along
    each sharded positions axis: shard c of n holds ``start + c·L/n .. start + (c+1)·L/n - 1``."""
    shown = []
    for axis, interval in enumerate(intervals):
        if interval is None or interval.start is None:
            shown.append(None if interval is None else str(interval))
            continue
        start, length = interval.start, meta.shape[axis] if axis < len(meta.shape) else interval.length
        for mesh_dim, placement in zip(mesh, placements):
            if shard_axis(placement, len(meta.shape)) == axis:
                start = start + Poly.const(coords[mesh_dim]) * length.poly
        shown.append(f"{start} .. {start + length.poly + Poly.const(-1)}")
    return tuple(shown)
