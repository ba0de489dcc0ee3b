"""One rank of a pipeline spread over a device mesh (the file's ``parallel:`` section), run on
torch.distributed with torch's own sharding: a DeviceMesh from ``init_device_mesh``, every planned
projection an ``nn.Linear`` that ``parallelize_module`` shards (ColwiseParallel, RowwiseParallel),
and the collectives those styles issue counted by torch's ``CommDebugMode``.

The steps are each rank's program, as torchtitan's model code is: params are declared with their
global shapes (as a state_dict holds them), and a rank's program is the same file with

- every mesh dim a dim of its size (``H // tp`` is a rank's heads), where a single-device run
  takes them as 1;
- every planned projection's weight (and a colwise bias) its rank's shard: colwise splits the
  output features, rowwise the input features;
- every input sharded by ``parallel.inputs`` its rank's shard (``Shard(0)`` over ``dp``: the
  batch divided by ``dp``).

That program is analysed and compiled by the interpreter as any file is; only the planned steps'
kernels call their parallelised modules instead, so the styles' hooks move the data.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ..analysis.shapes import Analysis, analyze
from ..core.errors import Diagnostic, TracerError
from ..spec.pipeline import PipelineSpec
from ..spec.source import SourceMap
from .interpreter import Plan, torch_module
from .records import TensorRecord
from .tensors import create_tensors

SHARDED_STYLES = ("colwise", "rowwise")  # what a rank's program runs as a parallelised nn.Linear
SHORT_NAMES = {"all_gather_into_tensor": "all_gather", "reduce_scatter_tensor": "reduce_scatter", "all_to_all_single": "all_to_all"}
_SHARD = re.compile(r"^Shard\((-?\d+)\)$")


@dataclass(frozen=True)
class StepPlan:
    """How one step of the file is parallelised: its plan entry, with the glob resolved and the
    mesh dim's default filled in."""

    step: str
    index: int  # its position in steps:
    style: str
    mesh_dim: str
    input: str | None
    output: str | None
    local_output: bool


@dataclass(frozen=True)
class CollectiveEvent:
    """One collective a rank issued, as CommDebugMode traced it: the step whose module issued it,
    torch's op (``all_reduce``, ``all_gather``, ``reduce_scatter``), and the tensor it sent."""

    step: str | None
    op: str
    shape: tuple[int, ...]
    dtype: str
    bytes: int


@dataclass(frozen=True)
class RankJob:
    """Everything a rank needs, made once by the launching process (picklable for spawn)."""

    spec: PipelineSpec  # the rank's program
    reference: PipelineSpec  # the single-device file: global tensors, drawn from the same seed on every rank
    source: SourceMap
    dims: dict[str, int]  # the overrides of the rank's program (mesh dims included)
    reference_dims: dict[str, int]
    seed: int
    device: str
    mesh: tuple[tuple[str, int], ...]  # mesh dim -> size, outermost first
    steps: dict[str, StepPlan]
    placements: dict[str, tuple[str, ...]]  # input -> one placement per mesh dim

    @property
    def world(self) -> int:
        size = 1
        for _, n in self.mesh:
            size *= n
        return size


@dataclass
class RankResult:
    """What one rank sends back: its records, its collectives, and (rank 0) the gathered outputs."""

    rank: int
    records: list[TensorRecord]
    collectives: list[CollectiveEvent]
    outputs: dict[str, Any] = field(default_factory=dict)


# ---------------------------------------------------------------- the plan and the rank's program


def planned_steps(spec: PipelineSpec, source: SourceMap) -> dict[str, StepPlan]:
    """Every step the plan names (an id or a glob over the ids), each once; what a run cannot do
    with an entry is a located error at that entry."""
    parallel = spec.parallel
    if parallel is None:
        return {}
    found: dict[str, StepPlan] = {}
    ids = {step.id: i for i, step in enumerate(spec.steps)}
    for target, entry in parallel.plan.items():
        path = ("parallel", "plan", target)
        style = entry if isinstance(entry, str) else entry.style
        matched = [step_id for step_id in ids if fnmatch.fnmatchcase(step_id, target)]
        if not matched:
            raise TracerError(source.error(path, "plan-target", f"plan entry '{target}' names no step of the file", prefer_key=True))
        mesh_dim = (None if isinstance(entry, str) else entry.mesh_dim) or ("cp" if style == "context" else "tp")
        if mesh_dim not in parallel.mesh:
            message = f"plan entry '{target}': mesh dim '{mesh_dim}' is not in mesh: ({', '.join(parallel.mesh)})"
            raise TracerError(source.error(path, "plan-mesh-dim", message, prefer_key=True))
        for step_id in matched:
            if step_id in found:
                message = f"step '{step_id}' is planned twice (also by '{found[step_id].step}')"
                raise TracerError(source.error(path, "plan-twice", message, step_id, prefer_key=True))
            plain = isinstance(entry, str)
            found[step_id] = StepPlan(
                step_id,
                ids[step_id],
                style,
                mesh_dim,
                None if plain else entry.input,
                None if plain else entry.output,
                True if plain else entry.local_output,
            )
    return found


def runnable(spec: PipelineSpec, source: SourceMap, steps: Mapping[str, StepPlan]) -> None:
    """What ``--world`` runs: colwise and rowwise projections with replicated activations between
    them, replicated steps, and inputs sharded by ``parallel.inputs``. Anything else is a located
    error at its plan entry (checked before any process starts)."""
    users: dict[str, list[str]] = {}
    for step in spec.steps:
        for name in step.param_fields:
            if getattr(step, name, None):
                users.setdefault(getattr(step, name), []).append(step.id)
    for plan in steps.values():
        step = spec.steps[plan.index]
        path = ("parallel", "plan")
        if plan.style == "replicate":
            continue
        if plan.style not in SHARDED_STYLES:
            raise TracerError(source.error(path, "plan-runtime", _NOT_RUN[plan.style], plan.step, prefer_key=True))
        projection = step.projection()
        if projection is None:
            message = (
                f"step '{plan.step}' ({step.op}) is planned {plan.style}, which parallelises a projection (an nn.Linear): a linear step"
            )
            raise TracerError(source.error(path, "plan-style", message, plan.step, prefer_key=True))
        if plan.input not in (None, "Replicate()") or plan.output not in (None, "Replicate()") or not plan.local_output:
            message = (
                f"step '{plan.step}': --world runs {plan.style} with replicated activations and local outputs "
                "(input/output Shard(d), sequence parallelism, is not run yet)"
            )
            raise TracerError(source.error(path, "plan-runtime", message, plan.step, prefer_key=True))
        for param in filter(None, (projection.weight, projection.bias)):
            others = [user for user in users.get(param, []) if user != plan.step]
            if others:
                message = (
                    f"param '{param}' of {plan.style} step '{plan.step}' is read by step '{others[0]}' too: each rank holds only its shard"
                )
                raise TracerError(source.error(("params", param), "plan-shared-param", message, plan.step, prefer_key=True))


_NOT_RUN = {
    "sequence": "sequence parallelism (style: sequence) is checked statically but not run by --world yet",
    "context": (
        "context parallelism is not run by --world: torch 2.13's ring attention (context_parallel) replaces only the CUDA "
        "attention kernels (aten._scaled_dot_product_flash/efficient/cudnn_attention), never the CPU kernel "
        "(_scaled_dot_product_flash_attention_for_cpu)"
    ),
}


def rank_spec(
    spec: PipelineSpec, mesh_sizes: Mapping[str, str], steps: Mapping[str, StepPlan], placements: Mapping[str, tuple[str, ...]]
) -> PipelineSpec:
    """The program one rank runs: mesh dims as dims of these sizes (texts: ``'2'``, or ``'1'`` for
    the single-device reference), planned projections' params and sharded inputs at their local
    shapes, and no ``parallel:`` section (the program itself is plain)."""
    dims = {**mesh_sizes, **{name: text for name, text in spec.dims.items() if name not in mesh_sizes}}
    params = dict(spec.params)
    for plan in steps.values():
        projection = spec.steps[plan.index].projection()
        if plan.style not in SHARDED_STYLES or projection is None:
            continue
        out_axis = 1 if projection.transposed else 0
        axis = out_axis if plan.style == "colwise" else 1 - out_axis
        params[projection.weight] = _split(params[projection.weight], axis, plan.mesh_dim)
        if projection.bias and plan.style == "colwise":
            params[projection.bias] = _split(params[projection.bias], 0, plan.mesh_dim)
    inputs = dict(spec.inputs)
    mesh_dims = list(spec.parallel.mesh) if spec.parallel else []
    for name, layout in placements.items():
        for mesh_dim, placement in zip(mesh_dims, layout):
            found = _SHARD.match(placement)
            if found:
                inputs[name] = _split(inputs[name], int(found.group(1)), mesh_dim)
    return spec.model_copy(update={"dims": dims, "params": params, "inputs": inputs, "parallel": None})


def _split(decl, axis: int, mesh_dim: str):
    shape = list(decl.shape)
    shape[axis] = f"({shape[axis]}) // {mesh_dim}"
    return decl.model_copy(update={"shape": shape})


def input_placements(spec: PipelineSpec, source: SourceMap) -> dict[str, tuple[str, ...]]:
    """``parallel.inputs``: one placement per mesh dim for each input it names (checked)."""
    parallel = spec.parallel
    if parallel is None:
        return {}
    found = {}
    for name, layout in parallel.inputs.items():
        path = ("parallel", "inputs", name)
        if name not in spec.inputs:
            raise TracerError(source.error(path, "placement-input", f"parallel.inputs names '{name}', which is no input", prefer_key=True))
        if len(layout) != len(parallel.mesh):
            message = f"'{name}' has {len(layout)} placements for a mesh of {len(parallel.mesh)} dims ({', '.join(parallel.mesh)}): one per mesh dim"
            raise TracerError(source.error(path, "placement-count", message, prefer_key=True))
        for placement in layout:
            found_shard = _SHARD.match(placement)
            if placement == "Partial()" or (
                found_shard and not -len(spec.inputs[name].shape) <= int(found_shard.group(1)) < len(spec.inputs[name].shape)
            ):
                message = f"'{name}': {placement} is not a placement of an input of {len(spec.inputs[name].shape)} dims"
                raise TracerError(source.error(path, "placement", message, prefer_key=True))
        found[name] = tuple(f"Shard({int(m.group(1)) % len(spec.inputs[name].shape)})" if (m := _SHARD.match(p)) else p for p in layout)
    return found


# ---------------------------------------------------------------- in the rank's process


def run_rank(rank: int, job: RankJob, port: int, folder: str, progress) -> None:
    """The body of rank ``rank``'s process: join the group through the launcher's store, run the
    rank's program, save its result to ``folder``. ``progress[rank]`` is the index of the step it
    is in, for a message when it fails or hangs."""
    import datetime

    import torch.distributed as dist

    torch = torch_module()
    progress[rank] = -1
    torch.set_num_threads(1)  # as torchrun's OMP_NUM_THREADS=1: a forked rank must not enter its parent's thread pool
    timeout = datetime.timedelta(seconds=60)
    store = dist.TCPStore("127.0.0.1", port, job.world, is_master=False, timeout=timeout)
    backend = "nccl" if job.device == "cuda" else "gloo"
    device = f"cuda:{rank % torch.cuda.device_count()}" if job.device == "cuda" else job.device
    if job.device == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group(backend, store=store, rank=rank, world_size=job.world, timeout=timeout)
    try:
        result = _rank_program(rank, job, device, progress)
        torch.save(result, f"{folder}/rank{rank}.pt")
    finally:
        dist.destroy_process_group()


def _rank_program(rank: int, job: RankJob, device: str, progress) -> RankResult:
    from torch.distributed.device_mesh import init_device_mesh

    names = tuple(name for name, _ in job.mesh)
    mesh = init_device_mesh(device.split(":")[0], tuple(n for _, n in job.mesh), mesh_dim_names=names)
    reference = analyze(job.reference, job.source, job.reference_dims)
    analysis = analyze(job.spec, job.source, job.dims)
    analysis.raise_errors()
    created = create_tensors(reference, device, job.seed)  # the global tensors: the same on every rank
    tensors = {name: _local(created[name], mesh, job.placements.get(name)) for name in analysis.declared}
    modules = _parallelised(analysis, job, created, mesh, tensors)
    plan = Plan(analysis, device)
    mode = collective_mode()()
    step_of = {out.id: node.index for node in analysis.nodes.values() for out in node.outs}
    plan.steps = tuple(
        planned._replace(fn=_module_call(modules[planned.step_id], planned.step_id, mode)) if planned.step_id in modules else planned
        for planned in plan.steps
    )
    progress[rank] = 0

    def observe(record_id: str, tensor) -> None:
        progress[rank] = step_of[record_id] + 1  # done with this one: in the next

    with mode:
        records, outputs, _ = plan.run(tensors, False, observe)
    progress[rank] = len(analysis.nodes)
    gathered = {name: _gathered(analysis, name, tensor, mesh) for name, tensor in outputs.items()}
    return RankResult(rank, records, list(mode.events), {name: t.cpu() for name, t in gathered.items()} if rank == 0 else {})


def _local(tensor, mesh, layout: tuple[str, ...] | None):
    """A rank's shard of a global tensor, cut by DTensor from the placements (no data moves:
    every rank holds the same global tensor)."""
    if layout is None:
        return tensor
    from torch.distributed.tensor import distribute_tensor

    return distribute_tensor(tensor, mesh, [placement(p) for p in layout], src_data_rank=None).to_local()


def placement(text: str):
    """A DTensor placement from its written form."""
    from torch.distributed.tensor import Partial, Replicate, Shard

    found = _SHARD.match(text)
    if found:
        return Shard(int(found.group(1)))
    return Partial() if text == "Partial()" else Replicate()


def _parallelised(analysis: Analysis, job: RankJob, created: dict, mesh, tensors: dict) -> dict[str, Any]:
    """One ``nn.Linear`` per planned projection holding the global params, sharded by
    ``parallelize_module`` on its mesh dim; ``tensors`` takes each rank's shards of them."""
    from torch import nn
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    torch = torch_module()
    styles = {"colwise": ColwiseParallel, "rowwise": RowwiseParallel}
    root, plans, modules = nn.Module(), {}, {}
    for plan in job.steps.values():
        if plan.style not in SHARDED_STYLES:
            continue
        projection = analysis.node(plan.step).step.projection()
        weight = created[projection.weight]
        weight = weight.t() if projection.transposed else weight
        linear = nn.Linear(weight.shape[1], weight.shape[0], bias=projection.bias is not None, device=weight.device, dtype=weight.dtype)
        with torch.no_grad():
            linear.weight.copy_(weight)
            if projection.bias:
                linear.bias.copy_(created[projection.bias])
        name = f"step{plan.index}"
        root.add_module(name, linear)
        plans.setdefault(plan.mesh_dim, {})[name] = styles[plan.style]()
        modules[plan.step] = linear
    for mesh_dim, plan in plans.items():
        parallelize_module(root, mesh[mesh_dim], plan)
    for plan in job.steps.values():
        if plan.step in modules:
            projection, linear = analysis.node(plan.step).step.projection(), modules[plan.step]
            local = linear.weight.to_local().detach()
            tensors[projection.weight] = local.t() if projection.transposed else local
            if projection.bias:
                tensors[projection.bias] = linear.bias.to_local().detach()
    return modules


def _module_call(module, step_id: str, mode):
    """A planned step's kernel: its parallelised module on the step's input (its params are the
    module's), the collectives it issues counted for the step."""
    from torch.distributed._functional_collectives import AsyncCollectiveTensor

    def call(x, *params):
        mode.step = step_id
        out = module(x)
        mode.step = None
        return out.wait() if isinstance(out, AsyncCollectiveTensor) else out

    return call


def _gathered(analysis: Analysis, name: str, tensor, mesh):
    """An output of the rank's program as the global tensor: each mesh dim that divides one of
    its axes (the batch of ``(B // dp, …)``) gathered along it by DTensor, the others replicated."""
    from torch.distributed.tensor import DTensor, Replicate, Shard

    meta = analysis.meta(name)
    placements = []
    for mesh_dim in mesh.mesh_dim_names:
        axes = [axis for axis, dim in enumerate(meta.shape) if _divided_by(dim, mesh_dim)]
        placements.append(Shard(axes[0]) if axes else Replicate())
    if all(isinstance(p, Replicate) for p in placements):
        return tensor
    return DTensor.from_local(tensor, mesh, placements, run_check=False).full_tensor()


def _divided_by(dim, mesh_dim: str) -> bool:
    """Whether a symbolic size is some size divided by the mesh dim (``B // dp``, ``(H // tp) * Dh``)."""
    terms = dim.poly.terms
    return bool(terms) and all(dict(monomial).get(mesh_dim, 0) < 0 for monomial, _ in terms)


_MODE: list = []


def collective_mode():
    """CommDebugMode that also keeps each collective's step, op and tensor size (its counts are
    torch's own; the sizes are read from the tensor each collective is called with). Made once,
    with every torch.distributed module a rank uses imported: a forked rank starts with them."""
    if _MODE:
        return _MODE[0]
    import torch.distributed._functional_collectives
    import torch.distributed.device_mesh
    import torch.distributed.tensor.parallel
    from torch.distributed.tensor.debug import CommDebugMode

    class CollectiveMode(CommDebugMode):
        def __init__(self):
            super().__init__()
            self.step: str | None = None
            self.events: list[CollectiveEvent] = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            before = self.get_total_counts()
            out = super().__torch_dispatch__(func, types, args, kwargs)
            if out is not NotImplemented and self.get_total_counts() != before:
                sent = next(a for a in args if isinstance(a, torch.Tensor))
                op = func._overloadpacket.__name__
                dtype = str(sent.dtype).removeprefix("torch.")
                self.events.append(
                    CollectiveEvent(self.step, SHORT_NAMES.get(op, op), tuple(sent.shape), dtype, sent.numel() * sent.element_size())
                )
            return out

    _MODE.append(CollectiveMode)
    return CollectiveMode


def rank_error(job: RankJob, index: int, message: str) -> Diagnostic:
    """A located message about the step at ``index`` of the file (or the file itself)."""
    if 0 <= index < len(job.spec.steps):
        return job.source.error(("steps", index), "rank-failed", message, job.spec.steps[index].id, prefer_key=True)
    return Diagnostic(job.source.file, None, "rank-failed", message)
