"""Runs an analysed pipeline on torch, one kernel per step, recording every tensor.

Like torch.fx's Interpreter, the op names the handler: each step kind builds its own kernel once
per (dims, device) into a flat plan; a run is a tight loop over that plan that records metadata
only. Tensors are dropped after their last use, so memory stays what eager PyTorch would use.
"""

from __future__ import annotations

import math
import weakref
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass, replace
from operator import is_, itemgetter
from typing import Any, NamedTuple

from ..analysis.memory import last_reads
from ..analysis.shapes import Analysis
from ..core.errors import InternalError, TracerError
from ..core.fields import DTYPE_BYTES
from ..core.layout import Meta
from ..spec.pipeline import TensorDecl
from .trace import TensorRecord, Trace

_NO_CONTEXT = nullcontext()  # grad already off: entering no_grad again costs a microsecond per run


def torch_module():
    import torch

    return torch


def device_problem(device: Any) -> str | None:
    """Why torch cannot use ``device`` on this machine ('bogus'; 'cuda' without CUDA), or None.
    The one check behind ``--device`` and ``Pipeline.run(device=...)``."""
    text = str(device)
    if text in ("cpu", "meta"):
        return None
    torch = torch_module()
    try:
        torch.empty(0, device=torch.device(device))
    except (RuntimeError, ValueError, TypeError, AssertionError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        return f"'{text}' is not a device torch can use here ({first}); try cpu or meta"
    return None


class KernelContext:
    """What a step kind's ``kernel`` may use to build its function."""

    def __init__(
        self, analysis: Analysis, refs: list[str], outs: list[Meta], device: Any, step_id: str | None = None, training: bool | None = None
    ):
        import torch.nn.functional as F

        self.torch, self.F, self.device, self.training = torch_module(), F, device, training
        self.ins = [analysis.metas[r] for r in refs]
        self.outs, self.out = outs, outs[-1]
        self._alg = analysis.alg if step_id is None else analysis.alg_of(step_id)
        self._where = (analysis, step_id)

    def value(self, text) -> int:
        return self._alg.dim(text).value

    def error(self, code: str, message: str, field: str | None = None) -> TracerError:
        """A located error for what only a run can see (a token id outside its embedding table)."""
        analysis, step_id = self._where
        i = analysis.graph.index.get(step_id) if step_id is not None else None
        path = () if i is None else ("steps", i) + ((field,) if field else ())
        return TracerError(analysis.source.error(path, code, message, step_id))


@dataclass
class PlannedStep:
    step_id: str
    fn: Callable
    refs: tuple[str, ...]
    free: tuple[str, ...]  # records that die after this step
    expected: tuple[Expected, ...]  # one per record the step makes
    getter: Callable  # env -> the kernel's argument (one ref) or arguments (several)


class Expected(NamedTuple):
    """What the static analysis predicts for one record; a run that matches it reuses ``template``."""

    id: str
    sizes: tuple[int, ...]
    stride: tuple[int, ...]
    offset: int
    dtype: Any  # a torch.dtype
    view_of: str | None
    template: TensorRecord


class RunResult(NamedTuple):
    records: list[TensorRecord]
    outputs: dict[str, Any]
    as_predicted: bool  # every record matched the static prediction exactly


class Plan:
    """A pipeline compiled for fixed dims and device: kernels built, lifetimes known."""

    def __init__(self, analysis: Analysis, device: str, training: bool | None = None):
        """``training`` turns every dropout on or off whatever its step says (``tracer.to_module``)."""
        analysis.raise_errors()
        torch = torch_module()
        self.analysis, self.training = analysis, training
        self.device = torch.device(device)
        self.device_name = str(self.device)
        self.dtypes = {getattr(torch, name): name for name in DTYPE_BYTES}
        self.steps = self._compile(analysis)

    def _compile(self, analysis: Analysis) -> list[PlannedStep]:
        torch = torch_module()
        keep = {analysis.output_of(name) for name in analysis.outputs}
        declared = set(analysis.pipeline.inputs) | set(analysis.pipeline.params)
        order = analysis.graph.order
        self.random = False
        self.output_ids = tuple((name, analysis.output_of(name)) for name in analysis.outputs)
        self.inputs_expected = {
            name: self._expect(name, "input" if name in analysis.pipeline.inputs else "param", (), torch)
            for name in declared
            if name in analysis.metas
        }
        dying: dict[str, list[str]] = {}  # every record, inner ones too, dies after its last reader (or its own step)
        for rid, last in last_reads(analysis).items():
            if rid not in keep and rid not in declared:
                dying.setdefault(order[last], []).append(rid)
        planned = []
        for step_id in analysis.graph.order:
            step = analysis.step(step_id)
            self.random = self.random or step.is_random()
            refs = analysis.graph.refs[step_id]
            inner = analysis.inner.get(step_id) or [(step_id, step.op)]
            fn = step.kernel(KernelContext(analysis, refs, [analysis.metas[rid] for rid, _ in inner], self.device, step_id, self.training))
            free = tuple(dying.get(step_id, ()))
            ins = tuple(analysis.output_of(r) for r in refs)
            chained = analysis.chained(step_id)  # a composite's inner op reads the one before; several outputs read the inputs
            expected = tuple(
                self._expect(rid, op, (inner[j - 1][0],) if chained and j else ins, torch) for j, (rid, op) in enumerate(inner)
            )
            planned.append(PlannedStep(step_id, fn, ins, free, expected, itemgetter(*ins) if ins else (lambda env: ())))
        # the loop's view of the plan: flat tuples, so a run touches no attributes
        # a step whose rule returned Outputs or a Composite gets a tuple from its kernel, even of one tensor
        self._loop = tuple(
            (p.getter, p.fn, len(p.refs) == 1, None if p.step_id in analysis.inner else p.expected[0], p.expected, p.free, p.step_id)
            for p in planned
        )
        self._inputs_cache: tuple | None = None  # (tensors dict, its values, input records, storage roots)
        return planned

    def _expect(self, rid: str, op: str, inputs: tuple, torch) -> Expected:
        meta = self.analysis.metas[rid]
        view_of = _static_view_of(meta, rid)
        template = TensorRecord(
            rid,
            op,
            inputs,
            meta.sizes,
            tuple(str(d) for d in meta.shape),
            meta.dtype,
            self.device_name,
            meta.stride,
            meta.offset,
            meta.contiguous,
            view_of,
            meta.nbytes,
            self.analysis.flops.get(rid, 0),
        )
        return Expected(rid, meta.sizes, meta.stride, meta.offset, getattr(torch, meta.dtype), view_of, template)

    def run(self, tensors: dict[str, Any], keep_values: bool, observe: Callable | None = None, grad: bool = False) -> RunResult:
        """Run every kernel and record every tensor; ``observe(record_id, tensor)``, when given, sees
        each tensor a step produces (inner records too) while it is still alive.

        Each step's records were built at compile time from the static analysis; a record is reused
        only after checking that torch's tensor has exactly the predicted shape, strides, offset,
        dtype and storage owner, so the trace is still what torch did (any difference is recorded
        as observed). That check is all a run adds to the kernels themselves. ``grad`` keeps
        autograd on (``tracer.to_module``); otherwise a run records no graph.
        """
        torch = torch_module()
        env = dict(tensors)
        storages = _StorageIndex()
        owner = storages.owner
        cache = self._inputs_cache
        diverged = False
        if (
            not keep_values
            and cache is not None
            and cache[0] is tensors
            and len(tensors) == len(cache[1])
            and all(map(is_, tensors.values(), cache[1]))
        ):
            records = list(cache[2])  # the same tensors as the last run: same records, same storages
            storages.roots = dict(cache[3])
        else:
            records = []
            for name, tensor in tensors.items():
                expected = self.inputs_expected.get(name)
                if expected is None:
                    records.append(
                        self._record(name, "input" if name in self.analysis.pipeline.inputs else "param", (), tensor, storages, keep_values)
                    )
                else:
                    diverged |= self._append(records.append, expected, tensor, owner(tensor, name), keep_values, "")
            if not keep_values:
                self._inputs_cache = (tensors, tuple(tensors.values()), tuple(records), dict(storages.roots))
        append = records.append
        roots, ref = storages.roots, weakref.ref
        with torch.no_grad() if torch.is_grad_enabled() and not grad else _NO_CONTEXT:
            for getter, fn, single, expect, expected, free, step_id in self._loop:
                result = fn(getter(env)) if single else fn(*getter(env))
                if expect is not None:
                    rid, sizes, stride, offset, dtype, static_view_of, template = expect
                    env[rid] = result
                    if observe is not None:
                        observe(rid, result)
                    base = result._base  # _StorageIndex.owner, inlined
                    if base is None:
                        base = result
                    entry = roots.get(id(base))
                    if entry is not None and entry[0]() is base:
                        view_of = entry[1]
                    else:
                        roots[id(base)] = (ref(base), rid)
                        view_of = None
                    if (
                        view_of == static_view_of
                        and not keep_values
                        and result.shape == sizes
                        and result.stride() == stride
                        and result.storage_offset() == offset
                        and result.dtype is dtype
                    ):
                        append(template)
                    else:
                        diverged |= self._append(append, expect, result, view_of, keep_values, step_id)
                else:
                    for expect, tensor in zip(expected, result):
                        env[expect.id] = tensor
                        if observe is not None:
                            observe(expect.id, tensor)
                        diverged |= self._append(append, expect, tensor, owner(tensor, expect.id), keep_values, step_id)
                if free and not keep_values:
                    for name in free:
                        del env[name]
                result = base = tensor = None  # no local keeps a freed tensor alive into the next step
        outputs = {name: env[rid] for name, rid in self.output_ids}
        return RunResult(records, outputs, not diverged)

    def _append(self, append, expect: Expected, tensor, view_of, keep_values: bool, step_id: str) -> bool:
        """Append the record of ``tensor``; True when its layout differs from the prediction."""
        template = expect.template
        if tensor.shape != expect.sizes:
            raise InternalError(
                f"step '{step_id}': the shape rule for '{template.op}' predicted {list(expect.sizes)}, torch produced {list(tensor.shape)}"
            )
        if (
            tensor.stride() == expect.stride
            and tensor.storage_offset() == expect.offset
            and tensor.dtype is expect.dtype
            and view_of == expect.view_of
        ):
            append(replace(template, tensor=tensor) if keep_values else template)
            return False
        append(self._observed(template, tensor, view_of, keep_values))
        return True

    def _observed(self, template: TensorRecord, tensor, view_of, keep_values: bool) -> TensorRecord:
        """The record of a tensor whose layout differs from the static prediction: torch's own values."""
        return TensorRecord(
            template.id,
            template.op,
            template.inputs,
            tuple(tensor.shape),
            template.symbolic_shape,
            self.dtypes.get(tensor.dtype, str(tensor.dtype)),
            self.device_name,
            tuple(tensor.stride()),
            tensor.storage_offset(),
            tensor.is_contiguous(),
            view_of,
            tensor.numel() * tensor.element_size(),
            template.flops,
            tensor if keep_values else None,
        )

    def _record(self, rid, op, inputs, tensor, storages, keep_values, symbolic=None) -> TensorRecord:
        if symbolic is None:
            symbolic = tuple(str(d) for d in self.analysis.metas[rid].shape)
        return TensorRecord(
            rid,
            op,
            tuple(inputs),
            tuple(tensor.shape),
            symbolic,
            self.dtypes.get(tensor.dtype, str(tensor.dtype)),
            self.device_name,
            tuple(tensor.stride()),
            tensor.storage_offset(),
            tensor.is_contiguous(),
            storages.owner(tensor, rid),
            tensor.numel() * tensor.element_size(),
            tensor=tensor if keep_values else None,
        )


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
        root = tensor._base
        if root is None:
            root = tensor
        key = id(root)
        entry = self.roots.get(key)
        if entry is not None and entry[0]() is root:
            return entry[1]
        self.roots[key] = (weakref.ref(root), record_id)
        return None


def create_tensors(analysis: Analysis, device: str, seed: int | None, given: dict[str, Any] | None = None) -> dict[str, Any]:
    """Inputs and params in declaration order, seeded exactly as the tutorials seed them; ``given``
    tensors (checked by ``tracer.runtime.weights.match``) take their places, moved to ``device``."""
    torch = torch_module()
    given = given or {}
    if seed is not None:
        torch.manual_seed(seed)
    created = {}
    for _, name, decl in _declaration_order(analysis):
        if name in given:
            created[name] = given[name].to(device)
            continue
        if decl.seed is not None:
            torch.manual_seed(decl.seed)
        created[name] = _create(decl, analysis.metas[name], torch, torch.device(device), analysis.alg_of(name))
    return created


def _declaration_order(analysis: Analysis):
    source, spec = analysis.source, analysis.pipeline
    # the section written first in the file is created first; a section the file lacks (blocks add
    # params to a file without any) comes last, inputs before params
    sections = sorted(("inputs", "params"), key=lambda s: source.keys[(s,)].line if (s,) in source.keys else math.inf)
    for section in sections:
        for name, decl in getattr(spec, section).items():
            yield section, name, decl


def _create(decl: TensorDecl, meta: Meta, torch, device, alg):
    dtype = getattr(torch, meta.dtype)
    if decl.values is not None:
        return torch.tensor(decl.values, dtype=dtype, device=device)
    if decl.tokens is not None:
        return torch.tensor(decl.tokens.ids(), dtype=dtype, device=device)
    return INITS[decl.init](decl, meta, torch, device, dtype, alg)


def _normal(decl, meta, torch, device, dtype, alg):
    return torch.empty(meta.sizes, dtype=dtype, device=device).normal_()  # torch.randn's numbers; nn.Embedding: normal_(0, 1)


def _triangle(upper: bool):
    def ones_above_or_below(decl, meta, torch, device, dtype, alg):
        ones = torch.ones(meta.sizes, dtype=dtype, device=device)
        return ones.triu(1) if upper else ones.tril()

    return ones_above_or_below


def _linear_init(decl: TensorDecl, meta: Meta, torch, device, dtype, alg):
    sizes = meta.sizes
    fan_in = alg.dim(decl.fan_in).value if decl.fan_in is not None else sizes[-1]
    bound = linear_bound(fan_in, len(sizes))
    return torch.empty(sizes, dtype=dtype, device=device).uniform_(-bound, bound)


def linear_bound(fan_in: int, ndim: int) -> float:
    """nn.Linear's reset_parameters, bit for bit: kaiming_uniform_(a=√5) for a weight, U(±1/√fan_in) for a bias."""
    if ndim >= 2:
        gain = math.sqrt(2.0 / (1 + 5))
        return math.sqrt(3.0) * gain / math.sqrt(fan_in) if fan_in else 0.0
    return 1 / math.sqrt(fan_in) if fan_in > 0 else 0.0


#: init name -> how it creates a tensor, as the tutorials do; exactly the inits the format accepts
INITS: dict[str, Callable] = {
    "randn": _normal,
    "embedding": _normal,
    "rand": lambda decl, meta, torch, device, dtype, alg: torch.rand(meta.sizes, dtype=dtype, device=device),
    "zeros": lambda decl, meta, torch, device, dtype, alg: torch.zeros(meta.sizes, dtype=dtype, device=device),
    "ones": lambda decl, meta, torch, device, dtype, alg: torch.ones(meta.sizes, dtype=dtype, device=device),
    "full": lambda decl, meta, torch, device, dtype, alg: torch.full(meta.sizes, decl.value, dtype=dtype, device=device),
    "arange": lambda decl, meta, torch, device, dtype, alg: torch.arange(meta.numel, device=device).to(dtype).reshape(meta.sizes),
    "triu": _triangle(upper=True),
    "tril": _triangle(upper=False),
    "linear": _linear_init,
}


def run_plan(
    plan: Plan, tensors: dict[str, Any], pipeline: Any, seed: int | None, keep_values: bool, observe: Callable | None = None
) -> Trace:
    records, outputs, as_predicted = plan.run(tensors, keep_values, observe)
    return Trace(pipeline, plan.analysis, records, outputs, seed, keep_values, as_predicted=as_predicted)
