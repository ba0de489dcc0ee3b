"""One rank of a pipeline spread over a device mesh (the file's ``parallel:`` section), run on
torch.distributed with torch's own sharding: a DeviceMesh from ``init_device_mesh``, each planned
step a module that ``parallelize_module`` shards, and the collectives those styles issue counted
by torch's ``CommDebugMode``.

A rank's program is the rank's analysis (``tracer.analysis.parallel``: the file at the mesh's
degrees, params and inputs at their local shapes, planned steps' inputs and outputs in their
layouts), compiled by the interpreter as any analysis is; only a planned step's kernel calls its
parallelised module instead, so that torch's style hooks move the data:

- ``colwise`` / ``rowwise``: an ``nn.Linear`` holding the global params, sharded by
  ColwiseParallel / RowwiseParallel with the entry's input and output layouts;
- ``sequence``: the step's own kernel as a module with the step's params, under SequenceParallel
  (its input a sequence shard, the params replicated);
- ``context``: torch's ring attention (``_templated_ring_attention``) on the rank's sequence
  shard of q, k and v, with the CPU attention op on the CPU, where ``context_parallel`` replaces
  no kernel (``RingAttention``);
- ``replicate``: the step's kernel itself, on every rank.

Since the program is the static per-rank analysis, the interpreter's check that every tensor
torch makes has its predicted shape is the check that each rank's shapes are the static ones.
"""

from __future__ import annotations

import ctypes
import datetime
import os
import signal
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from multiprocessing import forkserver
from typing import Any

from ..analysis.parallel import PlanEntry, parse_placement, placements_of, resolved_plan
from ..analysis.shapes import Analysis, analyze
from ..core.errors import Diagnostic, TracerError
from ..spec.pipeline import PipelineSpec
from ..spec.source import SourceMap
from .interpreter import Plan, torch_module
from .records import TensorRecord
from .tensors import create_tensors

STARTING, JOINING = -2, -1  # a rank's progress before its first step (then the step's index)
PR_SET_PDEATHSIG = 1  # prctl(2): the signal a process gets when its parent dies
GROUP_TIMEOUT = datetime.timedelta(seconds=600)  # a collective waiting longer fails; the launcher's --timeout ends runs sooner
RANK_MODULES = (  # imported once, by the fork server, before it forks any rank
    "torch._dynamo",  # DTensor's dispatch imports it on a rank's first step: a second each
    "torch.distributed._functional_collectives",
    "torch.distributed.tensor.debug",
    "torch.distributed.device_mesh",
    "torch.distributed.tensor.parallel",
    "torch.distributed.tensor.experimental._context_parallel._attention",
)


@dataclass(frozen=True)
class CollectiveEvent:
    """One collective a rank issued, as CommDebugMode traced it: the step whose module issued it,
    torch's functional op (``all_reduce``, ``all_gather_into_tensor``, ``reduce_scatter_tensor``),
    the tensor it was called with, and the group's size."""

    step: str | None
    op: str
    shape: tuple[int, ...]
    dtype: str
    bytes: int
    group_size: int

    @property
    def whole_bytes(self) -> int:
        """The bytes of the whole tensor it works on, as the static prediction counts them: an
        all-gather's result (its input is one rank's shard), otherwise its input."""
        return self.bytes * self.group_size if self.op == "all_gather_into_tensor" else self.bytes


@dataclass(frozen=True)
class RankJob:
    """Everything a rank needs, made by the launching process (sent to each rank pickled)."""

    spec: PipelineSpec
    source: SourceMap
    dims: dict[str, int]
    seed: int
    device: str
    mesh: tuple[tuple[str, int], ...]  # mesh dim -> degree, outermost first
    analysis: Analysis | None = field(default=None, compare=False)  # the launcher's; a rank is sent none and makes its own

    def reference(self) -> Analysis:
        return self.analysis if self.analysis is not None else analyze(self.spec, self.source, self.dims)

    @property
    def world(self) -> int:
        size = 1
        for _, degree in self.mesh:
            size *= degree
        return size


@dataclass
class RankResult:
    """What one rank sends back: its records, its collectives, and (rank 0) the gathered outputs."""

    records: list[TensorRecord]
    collectives: list[CollectiveEvent]
    as_predicted: bool
    outputs: dict[str, Any] = field(default_factory=dict)


def check_runnable(analysis: Analysis) -> None:
    """What ``--world`` cannot run, as a located error at its plan entry, before any process
    starts: an attention torch's ring attention cannot run (a mask, a window, gqa, dropout), a
    DTensor output (``local_output: false``), and a
    sharded projection whose param another step reads too (each rank holds only its shard)."""
    source = analysis.source
    for step_id, entry in resolved_plan(analysis).items():
        path = ("parallel", "plan", entry.target)
        if entry.style == "context" and (unsupported := _ring_unsupported(analysis, analysis.node(step_id))):
            message = (
                f"--world runs context parallelism as torch's ring attention, which takes no {unsupported}; it is checked statically only"
            )
            raise TracerError(source.error(path, "plan-runtime", message, step_id, prefer_key=True))
        if not entry.local_output:
            message = (
                "--world runs every step on the rank's local tensors: local_output: false (a DTensor output) is checked statically only"
            )
            raise TracerError(source.error(path, "plan-runtime", message, step_id, prefer_key=True))
        projection = analysis.node(step_id).step.projection() if entry.style in ("colwise", "rowwise") else None
        for param in filter(None, (projection.weight, projection.bias) if projection else ()):
            others = [node.id for node in analysis.users(param) if node.id != step_id]
            if others:
                message = f"param '{param}' of {entry.style} step '{step_id}' is read by step '{others[0]}' too, but each rank holds only its shard"
                raise TracerError(source.error(path, "plan-shared-param", message, step_id, prefer_key=True))


def _ring_unsupported(analysis: Analysis, node) -> str | None:
    """What of a ``context`` step torch's ring attention does not take (its attention op is
    called with ``is_causal`` and ``scale`` only, and causal blocks must be square), or None."""
    step = node.step
    queries, keys = (analysis.meta(record).sizes[-2] for record in node.reads[:2])
    if step.causal and queries != keys:
        return f"causal mask between {queries} queries and {keys} keys (it needs as many of each)"
    if step.mask is not None:
        return "mask"
    if step.window is not None:
        return "window"
    if step.gqa:
        return "gqa (fewer kv heads)"
    return "dropout" if step.is_random() else None


# ---------------------------------------------------------------- in the rank's process


def run_rank(rank: int, job: RankJob, port: int, folder: str, progress) -> None:
    """The body of rank ``rank``'s process: join the group at the launcher's store, run the rank's
    program, save its result in ``folder``. ``progress[rank]`` is the index of the step it is in
    (``JOINING`` while it joins the group), for the launcher's message when it fails or hangs."""
    import torch.distributed as dist

    torch = torch_module()
    progress[rank] = JOINING
    _release_fork_server()
    _die_with_parent()
    torch.set_num_threads(1)  # as torchrun's OMP_NUM_THREADS=1: N ranks on one machine, each not as many threads as cores
    store = dist.TCPStore("127.0.0.1", port, job.world, is_master=False, timeout=GROUP_TIMEOUT)
    cuda = job.device == "cuda"
    device = f"cuda:{rank % torch.cuda.device_count()}" if cuda else job.device
    if cuda:
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if cuda else "gloo", store=store, rank=rank, world_size=job.world, timeout=GROUP_TIMEOUT)
    try:
        torch.save(_rank_program(rank, job, device, progress), f"{folder}/rank{rank}.pt")
    finally:
        dist.destroy_process_group()


def _die_with_parent() -> None:
    """On Linux, the kernel kills this rank when its parent dies, however it dies (SIGKILL
    included; PR_SET_PDEATHSIG). The parent is multiprocessing's fork server, which exits when its
    launcher does (``_release_fork_server``): no rank outlives its launcher."""
    if not sys.platform.startswith("linux"):
        return
    parent = os.getppid()
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent:  # it died before the request was made
        os._exit(1)


def _release_fork_server() -> None:
    """The fork server exits when no process holds its "alive" pipe any more: the launching
    process, and every process the server forked, which is given a copy so that it could start
    processes of its own. A rank starts none: closing its copy leaves the server's life the
    launcher's."""
    alive = forkserver._forkserver._forkserver_alive_fd
    if alive is not None:
        os.close(alive)
        forkserver._forkserver._forkserver_alive_fd = None


def _rank_program(rank: int, job: RankJob, device: str, progress) -> RankResult:
    from torch.distributed.device_mesh import init_device_mesh

    mesh_dims = tuple(name for name, _ in job.mesh)
    mesh = init_device_mesh(device.split(":")[0], tuple(degree for _, degree in job.mesh), mesh_dim_names=mesh_dims)
    reference = job.reference()
    analysis = reference.rank.analysis
    created = create_tensors(reference, device, job.seed)  # the global tensors: the same on every rank
    placements = job.spec.parallel.inputs
    tensors = {name: _local(created[name], mesh, placements.get(name)) for name in analysis.declared}
    plan = Plan(analysis, device)
    mode = collective_mode()()
    modules = _parallelised(analysis, resolved_plan(reference), plan, created, tensors, mesh)
    plan.steps = tuple(
        planned._replace(fn=_module_call(modules[planned.step_id], planned.step_id, mode)) if planned.step_id in modules else planned
        for planned in plan.steps
    )
    step_of = {out.id: i for i, node in enumerate(analysis.nodes.values()) for out in node.outs}

    def observe(record_id: str, tensor) -> None:
        progress[rank] = step_of[record_id] + 1  # done with its step: in the next one

    progress[rank] = 0
    with mode:
        records, outputs, as_predicted = plan.run(tensors, False, observe)
    progress[rank] = len(analysis.nodes)
    gathered = {name: _gathered(analysis.meta(name), tensor, mesh) for name, tensor in outputs.items()}
    return RankResult(records, list(mode.events), as_predicted, {n: t.cpu() for n, t in gathered.items()} if rank == 0 else {})


def _local(tensor, mesh, layout: list[str] | None):
    """A rank's shard of a global tensor, cut by DTensor from the placements (nothing is sent:
    every rank holds the same global tensor)."""
    if layout is None:
        return tensor
    from torch.distributed.tensor import distribute_tensor

    return distribute_tensor(tensor, mesh, [placement(p) for p in layout], src_data_rank=None).to_local()


def placement(text: str):
    """A DTensor placement from its written form (``Shard(1)``, ``Replicate()``, ``Partial()``)."""
    from torch.distributed.tensor import Partial, Replicate, Shard

    kind, axis = parse_placement(text)
    return Shard(axis) if kind == "shard" else Partial() if kind == "partial" else Replicate()


def _parallelised(analysis: Analysis, entries: Mapping[str, PlanEntry], plan: Plan, created: dict, tensors: dict, mesh) -> dict[str, Any]:
    """step id -> its module, sharded by ``parallelize_module`` on its mesh dim: an nn.Linear for
    a colwise or rowwise projection, the step's own kernel for a sequence-parallel norm. The
    rank's shards of a projection's params replace the global ones in ``tensors``."""
    from torch import nn
    from torch.distributed.tensor.parallel import parallelize_module

    kernels = {planned.step_id: planned.fn for planned in plan.steps}
    root, plans, modules = nn.Module(), {}, {}
    for step_id, entry in entries.items():
        if entry.style == "replicate":
            continue
        node = analysis.node(step_id)
        projection = node.step.projection()
        if entry.style == "context":
            modules[step_id] = RingAttention(node.step, mesh[entry.mesh_dim])
            continue
        if entry.style in ("colwise", "rowwise"):
            module = _linear(projection, created)
        else:
            module = _kernel_module(kernels[step_id], node.reads, _params_read(analysis, node, created))
        name = f"step{len(modules)}"
        root.add_module(name, module)
        plans.setdefault(entry.mesh_dim, {})[name] = style(entry)
        modules[step_id] = module
    for mesh_dim, by_name in plans.items():
        parallelize_module(root, mesh[mesh_dim], by_name)
    for step_id, module in modules.items():
        projection = analysis.node(step_id).step.projection()
        if entries[step_id].style in ("colwise", "rowwise"):
            local = module.weight.to_local().detach()
            tensors[projection.weight] = local.t() if projection.transposed else local
            if projection.bias:
                tensors[projection.bias] = module.bias.to_local().detach()
    return modules


def _params_read(analysis: Analysis, node, created: dict) -> dict:
    """The params a step reads (its data inputs stay arguments of the module)."""
    declared = analysis.declared
    return {r: created[r] for r in node.reads if r in declared and declared[r].section == "params"}


def style(entry: PlanEntry):
    """torch's parallel style for a plan entry, with its layouts."""
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, SequenceParallel

    if entry.style == "sequence":
        return SequenceParallel(sequence_dim=parse_placement(entry.input)[1], use_local_output=True)
    kind = ColwiseParallel if entry.style == "colwise" else RowwiseParallel
    return kind(input_layouts=placement(entry.input), output_layouts=placement(entry.output), use_local_output=True)


def _linear(projection, created: dict):
    """An nn.Linear holding a projection's global params (``x @ W`` weights stored transposed)."""
    from torch import nn

    torch = torch_module()
    weight = created[projection.weight]
    weight = weight.t() if projection.transposed else weight
    linear = nn.Linear(weight.shape[1], weight.shape[0], bias=projection.bias is not None, device=weight.device, dtype=weight.dtype)
    with torch.no_grad():
        linear.weight.copy_(weight)
        if projection.bias:
            linear.bias.copy_(created[projection.bias])
    return linear


def _kernel_module(kernel, reads: tuple[str, ...], params: dict):
    """A step's kernel as an nn.Module whose parameters are the step's params, for the styles
    that take any module (SequenceParallel replicates its parameters)."""
    from torch import nn

    class StepModule(nn.Module):
        def __init__(self):
            super().__init__()
            self.slots = {name: f"p{i}" for i, name in enumerate(params)}
            for name, tensor in params.items():
                self.register_parameter(self.slots[name], nn.Parameter(tensor.clone(), requires_grad=False))

        def forward(self, x):
            args = [getattr(self, self.slots[r]) if r in self.slots else x for r in reads]
            return kernel(*args) if len(args) > 1 else kernel(args[0])

    return StepModule()


def _module_call(module, step_id: str, mode):
    """A planned step's kernel: its parallelised module on the step's data inputs (one, or q, k
    and v for ring attention; a projection's params are the module's), the collectives it issues
    counted for the step."""
    from torch.distributed._functional_collectives import AsyncCollectiveTensor

    inputs = 3 if isinstance(module, RingAttention) else 1

    def call(*args):
        mode.step = step_id
        out = module(*args[:inputs])
        mode.step = None
        return out.wait() if isinstance(out, AsyncCollectiveTensor) else out

    return call


class RingAttention:
    """A ``context`` step: torch's ring attention (``_templated_ring_attention``, to which
    ``context_parallel`` dispatches the CUDA SDPA kernels) on the rank's contiguous sequence shard
    of q, k and v (``Shard(2)``). On the CPU it is called with the CPU attention op, which returns
    the log-sum-exp its merge needs (``_scaled_dot_product_flash_attention_for_cpu``, the kernel
    ``context_parallel`` does not replace); on CUDA through torch's own memory-efficient ring.
    The keys and values are exchanged by torch's all-gather rotation (one
    ``all_gather_into_tensor`` of ``cat(k.flatten(), v.flatten())``), and each rank attends the
    key block of its own tokens causally, the blocks before it whole and those after it not at
    all: the causal mask at the rank's query offset."""

    def __init__(self, step, mesh):
        self.mesh, self.causal = mesh, step.causal
        self.scale = None if step.scale is None else float(step.scale)

    def __call__(self, q, k, v):
        from torch.distributed.tensor.experimental._context_parallel import _attention as cp

        options = cp._cp_options
        saved = options.rotate_method, options.enable_load_balance
        # the contiguous layout (torch's default is load-balanced: two chunks per rank) and the
        # all-gather rotation, which set_rotate_method("allgather") selects
        options.rotate_method, options.enable_load_balance = cp._RotateMethod.ALL_GATHER, False
        try:
            if self.mesh.device_type == "cuda":
                out, *_ = cp._scaled_dot_product_ring_efficient_attention(self.mesh, q, k, v, is_causal=self.causal, scale=self.scale)
            else:
                op = torch_module().ops.aten._scaled_dot_product_flash_attention_for_cpu.default
                out, *_ = cp._templated_ring_attention(self.mesh.get_group(), 2, op, q, k, v, is_causal=self.causal, scale=self.scale)
        finally:
            options.rotate_method, options.enable_load_balance = saved
        return out


def _gathered(meta, tensor, mesh):
    """An output of the rank's program as the global tensor: gathered by DTensor along each axis
    a mesh dim shards (read off its local symbolic shape, ``B // dp``)."""
    from torch.distributed.tensor import DTensor

    layout = placements_of(meta, list(mesh.mesh_dim_names))
    if all(parse_placement(p)[0] == "replicate" for p in layout):
        return tensor
    return DTensor.from_local(tensor, mesh, [placement(p) for p in layout], run_check=False).full_tensor()


_MODE: list = []


def collective_mode():
    """CommDebugMode that also keeps each collective's step, op, tensor size and group size (the
    counts are torch's own; the sizes are read from the tensor each collective is called with).
    Made once per process."""
    if _MODE:
        return _MODE[0]
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
                self.events.append(_event(self.step, func, args))
            return out

    _MODE.append(CollectiveMode)
    return CollectiveMode


def _event(step: str | None, func, args) -> CollectiveEvent:
    """A collective as called: ``c10d_functional.<op>(tensor, …, group_size?, group_name)``."""
    import torch.distributed as dist

    torch = torch_module()
    sent = next(a for a in args if isinstance(a, torch.Tensor))
    group = dist.distributed_c10d._resolve_process_group(args[-1]) if isinstance(args[-1], str) else None
    size = group.size() if group is not None else dist.get_world_size()
    dtype = str(sent.dtype).removeprefix("torch.")
    return CollectiveEvent(step, func._overloadpacket.__name__, tuple(sent.shape), dtype, sent.numel() * sent.element_size(), size)


def rank_error(job: RankJob, index: int, message: str) -> Diagnostic:
    """A located message about the step at ``index`` of the expanded steps, else about the file,
    saying where the rank was: starting, joining the group, or past its last step."""
    analysis = job.reference()
    nodes = list(analysis.nodes.values())
    if 0 <= index < len(nodes):
        return analysis.error(nodes[index], "rank-failed", message)
    where = {
        STARTING: "starting, before it joined the process group",
        JOINING: "joining the process group or building its mesh and modules",
    }
    message += f" (it was {where.get(index, 'past its last step, gathering the outputs')})"
    return Diagnostic(job.source.file, None, "rank-failed", message)
