"""Runs an analysed pipeline on torch, one kernel per step, recording every tensor.

Like torch.fx's Interpreter, the op names the handler: each step kind builds its own kernel once
per (dims, device) into a flat plan; a run is a tight loop over that plan that records metadata
only. Tensors are dropped after their last use, so memory stays what eager PyTorch would use.
"""

from __future__ import annotations

import math
import weakref
from dataclasses import dataclass
from typing import Any, Callable

from .errors import Diagnostic, InternalError, TracerError
from .shapes.check import Analysis
from .shapes.layout import Meta
from .spec.pipeline import TensorDecl
from .trace import TensorRecord, Trace

DTYPES = ("float32", "float64", "float16", "bfloat16", "int64", "int32", "bool")


def torch_module():
    import torch

    return torch


class KernelContext:
    """What a step kind's ``kernel`` may use to build its function."""

    def __init__(self, analysis: Analysis, refs: list[str], out: Meta, device: Any):
        import torch.nn.functional as F

        self.torch, self.F, self.device = torch_module(), F, device
        self.ins = [analysis.metas[r] for r in refs]
        self.out = out
        self._alg = analysis.alg

    def value(self, text) -> int:
        return self._alg.dim(text).value


@dataclass
class PlannedStep:
    step_id: str
    fn: Callable
    refs: tuple[str, ...]
    records: tuple[tuple[str, str, tuple[int, ...], tuple[str, ...], str | None], ...]  # id, op, sizes, symbolic, static view_of
    free: tuple[str, ...]


class Plan:
    """A pipeline compiled for fixed dims and device: kernels built, lifetimes known."""

    def __init__(self, analysis: Analysis, device: str):
        analysis.raise_errors()
        torch = torch_module()
        self.analysis = analysis
        self.device = torch.device(device)
        self.device_name = str(self.device)
        self.dtypes = {getattr(torch, name): name for name in DTYPES}
        self.steps = self._compile(analysis)

    def _compile(self, analysis: Analysis) -> list[PlannedStep]:
        keep = set(analysis.outputs)
        last_use: dict[str, str] = {}
        for step_id in analysis.graph.order:
            for ref in analysis.graph.refs[step_id]:
                last_use[analysis.output_of(ref)] = step_id
        planned = []
        for step_id in analysis.graph.order:
            step = analysis.step(step_id)
            refs = analysis.graph.refs[step_id]
            inner = analysis.inner.get(step_id) or [(step_id, step.op)]
            records = tuple((rid, op, analysis.metas[rid].sizes, tuple(str(d) for d in analysis.metas[rid].shape),
                             _static_view_of(analysis.metas[rid], rid)) for rid, op in inner)
            fn = step.kernel(KernelContext(analysis, refs, analysis.metas[inner[-1][0]], self.device))
            free = tuple(r for r, last in last_use.items() if last == step_id and r not in keep and r in analysis.graph.index)
            planned.append(PlannedStep(step_id, fn, tuple(analysis.output_of(r) for r in refs), records, free))
        return planned

    def run(self, tensors: dict[str, Any], keep_values: bool) -> tuple[list[TensorRecord], dict[str, Any]]:
        torch = torch_module()
        env = dict(tensors)
        storages = _StorageIndex()
        records = [self._record(name, self.analysis.pipeline.inputs.get(name) and "input" or "param", (), t, storages, keep_values)
                   for name, t in tensors.items()]
        with torch.no_grad():
            for planned in self.steps:
                result = planned.fn(*[env[r] for r in planned.refs])
                results = result if len(planned.records) > 1 else (result,)
                refs = planned.refs
                for (rid, op, sizes, symbolic, _), tensor in zip(planned.records, results):
                    env[rid] = tensor
                    if tuple(tensor.shape) != sizes:
                        raise InternalError(f"step '{planned.step_id}': the shape rule for '{op}' predicted {list(sizes)}, torch produced {list(tensor.shape)}")
                    records.append(self._record(rid, op, refs, tensor, storages, keep_values, symbolic))
                    refs = (rid,)
                if not keep_values:
                    for name in planned.free:
                        env.pop(name, None)
        outputs = {name: env[self.analysis.output_of(name)] for name in self.analysis.outputs}
        return records, outputs

    def _record(self, rid, op, inputs, tensor, storages, keep_values, symbolic=None) -> TensorRecord:
        if symbolic is None:
            symbolic = tuple(str(d) for d in self.analysis.metas[rid].shape)
        return TensorRecord(rid, op, tuple(inputs), tuple(tensor.shape), symbolic, self.dtypes.get(tensor.dtype, str(tensor.dtype)),
                            self.device_name, tuple(tensor.stride()), tensor.storage_offset(), tensor.is_contiguous(),
                            storages.owner(tensor, rid), tensor.numel() * tensor.element_size(), tensor if keep_values else None)


def _static_view_of(meta: Meta, record_id: str) -> str | None:
    return None if meta.root == record_id else meta.root


class _StorageIndex:
    """Maps a tensor to the first recorded tensor sharing its storage, via torch's view tracking.

    ``tensor._base`` is set for every view (also on the meta device, where data pointers are all
    zero). Weak references guard against a dead tensor's id being reused by a new one.
    """

    def __init__(self):
        self.roots: dict[int, tuple[weakref.ref, str]] = {}

    def owner(self, tensor, record_id: str) -> str | None:
        root = tensor._base if tensor._base is not None else tensor
        entry = self.roots.get(id(root))
        if entry is not None and entry[0]() is root:
            return entry[1]
        self.roots[id(root)] = (weakref.ref(root), record_id)
        return None


def create_tensors(analysis: Analysis, device: str, seed: int | None, given: dict[str, Any] | None = None) -> dict[str, Any]:
    """Inputs and params in declaration order, seeded exactly as the tutorials seed them."""
    torch = torch_module()
    given = dict(given or {})
    if seed is not None:
        torch.manual_seed(seed)
    created = {}
    for section, name, decl in _declaration_order(analysis):
        meta = analysis.metas[name]
        if name in given:
            created[name] = _checked_given(name, given.pop(name), meta, analysis, section, device)
            continue
        if decl.seed is not None:
            torch.manual_seed(decl.seed)
        created[name] = _create(decl, meta, torch, torch.device(device), analysis.alg)
    if given:
        unknown = ", ".join(sorted(given))
        raise TracerError(Diagnostic(analysis.source.file, None, "unknown-tensor", f"tensors= names {unknown}, which are not inputs or params of this pipeline"))
    return created


def _declaration_order(analysis: Analysis):
    source, spec = analysis.source, analysis.pipeline
    sections = sorted(("inputs", "params"), key=lambda s: (source.keys.get((s,)) or source.values.get(()) or _FAR).line)
    for section in sections:
        for name, decl in getattr(spec, section).items():
            yield section, name, decl


class _Far:
    line = math.inf


_FAR = _Far()


def _checked_given(name, tensor, meta: Meta, analysis: Analysis, section: str, device: str):
    torch = torch_module()
    if not isinstance(tensor, torch.Tensor):
        raise TracerError(analysis.source.error((section, name), "tensor-given", f"tensors['{name}'] must be a torch.Tensor, got {type(tensor).__name__}", prefer_key=True))
    if tuple(tensor.shape) != meta.sizes:
        raise TracerError(analysis.source.error((section, name), "tensor-given", f"tensors['{name}'] has shape {list(tensor.shape)}, the pipeline declares {meta.symbolic} {meta.concrete}", prefer_key=True))
    return tensor.to(device)


def _create(decl: TensorDecl, meta: Meta, torch, device, alg):
    sizes, dtype = meta.sizes, getattr(torch, meta.dtype)
    if decl.values is not None:
        return torch.tensor(decl.values, dtype=dtype, device=device)
    if decl.tokens is not None:
        return torch.tensor(decl.tokens.ids(), dtype=dtype, device=device)
    init = decl.init
    if init in ("randn", "embedding"):
        return torch.empty(sizes, dtype=dtype, device=device).normal_()  # nn.Embedding: normal_(0, 1)
    if init == "rand":
        return torch.rand(sizes, dtype=dtype, device=device)
    if init == "zeros":
        return torch.zeros(sizes, dtype=dtype, device=device)
    if init == "ones":
        return torch.ones(sizes, dtype=dtype, device=device)
    if init == "arange":
        return torch.arange(meta.numel, device=device).to(dtype).reshape(sizes)
    if init in ("triu", "tril"):
        ones = torch.ones(sizes, dtype=dtype, device=device)
        return ones.triu(1) if init == "triu" else ones.tril()
    return _linear_init(decl, meta, torch, device, dtype, alg)


def _linear_init(decl: TensorDecl, meta: Meta, torch, device, dtype, alg):
    """nn.Linear's reset_parameters, bit for bit: kaiming_uniform_(a=√5) for W, U(±1/√fan_in) for b."""
    sizes = meta.sizes
    fan_in = alg.dim(decl.fan_in).value if decl.fan_in is not None else sizes[-1]
    if len(sizes) >= 2:
        gain = math.sqrt(2.0 / (1 + 5))
        bound = math.sqrt(3.0) * gain / math.sqrt(fan_in) if fan_in else 0.0
    else:
        bound = 1 / math.sqrt(fan_in) if fan_in > 0 else 0.0
    return torch.empty(sizes, dtype=dtype, device=device).uniform_(-bound, bound)


def run_plan(plan: Plan, tensors: dict[str, Any], pipeline: Any, seed: int | None, keep_values: bool) -> Trace:
    records, outputs = plan.run(tensors, keep_values)
    return Trace(pipeline, plan.analysis, records, outputs, seed, keep_values)
