"""Runs an analysed pipeline on torch, one kernel per step, recording every tensor.

Like torch.fx's Interpreter, the op names the handler: each step kind builds its own kernel once
per (dims, device) into a flat plan; a run is a tight loop over that plan that records metadata
only. Tensors are dropped after their last use, so memory stays what eager PyTorch would use.
"""

from __future__ import annotations

import re
import weakref
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import replace
from operator import is_, itemgetter
from typing import Any, NamedTuple

from ..analysis.graph import ONE, Node
from ..analysis.memory import last_reads, table_groups
from ..analysis.shapes import Analysis
from ..core.dtypes import DTYPE_BYTES
from ..core.errors import InternalError, TracerError
from ..core.gcpause import gc_paused
from ..core.layout import Meta
from .records import TensorRecord, new_record

_COPY_NUMBER = re.compile(r"/\d+(?=/)")  # 'layers/3/q' -> 'layers/#/q': one step of every copy
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
    """What a step kind's ``kernel`` may use to build its function (the contract's ``KernelContext``)."""

    def __init__(self, analysis: Analysis, node: Node, device: Any, training: bool | None = None, tables: tuple[dict, dict] | None = None):
        """``tables``: (step id -> its table group, the plan's tables of the current run), for
        ``shared_table``; without it every step builds its own."""
        import torch.nn.functional as F

        self.torch, self.F, self.device, self.training = torch_module(), F, device, training
        self.ins = [analysis.metas[rid] for rid in node.reads]
        self.outs = [out.meta for out in node.outs]
        self.out = self.outs[-1]
        self._analysis, self._node, self._tables = analysis, node, tables

    def value(self, text) -> int:
        return self._node.dims.dim(text).value

    def error(self, code: str, message: str, field: str | None = None) -> TracerError:
        """A located error for what only a run can see (a token id outside its embedding table)."""
        return TracerError(self._analysis.error(self._node, code, message, field))

    def shared_table(self, build: Callable) -> Callable:
        """``build`` run once per run for the step's table group (``tracer.analysis.memory.
        table_groups``): the first step to need the tables keeps them for the others, which get
        copies (a record is its own storage, as the analysis predicts); the group's last step lets
        them go, and the plan drops whatever is left when the run ends, so nothing outlives a run."""
        group = None if self._tables is None else self._tables[0].get(self._node.id)
        if group is None:
            return build
        cache, key, last = self._tables[1], group[0], group[-1] == self._node.id

        def shared(*args):
            made = cache.pop(key, None) if last else cache.get(key)
            if made is not None:
                return tuple(table.clone() for table in made)
            made = build(*args)
            if not last:
                cache[key] = made
            return made

        return shared


class Expected(NamedTuple):
    """What the static analysis predicts for one record; a run that matches it reuses ``template``."""

    id: str
    sizes: tuple[int, ...]
    stride: tuple[int, ...]
    offset: int
    dtype: Any  # a torch.dtype
    view_of: str | None
    template: TensorRecord


class Planned(NamedTuple):
    """One step of a compiled plan, as the run loop unpacks it."""

    getter: Callable  # env -> the kernel's argument (one record) or arguments (several)
    fn: Callable  # the kernel
    single: bool  # one argument: fn(arg), else fn(*args)
    expect: Expected | None  # the one record it makes; None when the kernel returns a tuple
    expected: tuple[Expected, ...]  # every record it makes, in the kernel's order
    free: tuple[str, ...]  # records that die after this step
    step_id: str
    predicted: bool = False  # on the meta device, the predicted layouts stand in for the kernel
    shown: tuple[Expected, ...] = ()  # of a predicted step, the records a kernel, the outputs or a view reads: the only tensors made


class RunResult(NamedTuple):
    records: list[TensorRecord]
    outputs: dict[str, Any]
    as_predicted: bool  # every record matched the static prediction exactly


class Plan:
    """A pipeline compiled for fixed dims and device: kernels built, lifetimes known."""

    def __init__(self, analysis: Analysis, device: str, training: bool | None = None, meta_kernels: bool = False):
        """``training`` turns every dropout on or off whatever its step says (``tracer.to_module``).

        On the meta device a repeated block's later copies take the layouts the static analysis
        predicts (``torch.empty_strided``, views by ``as_strided``: a few microseconds a tensor)
        instead of torch's Python meta kernels (about 10 ms a layer), once the first copy's kernels
        have agreed with the same prediction for the same step, sizes and strides; and only the
        tensors something reads (a later kernel, an output, ``observe``, ``keep_values``) are made
        at all, the other records coming from their templates. ``meta_kernels`` runs torch's meta
        kernel for every step.
        """
        analysis.raise_errors()
        torch = torch_module()
        self.analysis, self.training = analysis, training
        self.device = torch.device(device)
        self.predicts = self.device.type == "meta" and not meta_kernels
        self.device_name = str(self.device)
        self.dtypes = {getattr(torch, name): name for name in DTYPE_BYTES}
        self._torch_dtypes = {name: dtype for dtype, name in self.dtypes.items()}
        self._tables: dict = {}  # group's first step id -> tables one step built for the others, this run only
        self.steps = self._compile(analysis)
        self._inputs_cache: tuple | None = None  # (names, tensors, input records, storage roots) of the last run

    @gc_paused  # a plan is all new, long-lived objects: a collector pass over them finds nothing
    def _compile(self, analysis: Analysis) -> tuple[Planned, ...]:
        keep = {analysis.record_of(name) for name in analysis.outputs}
        self.output_ids = tuple((name, analysis.record_of(name)) for name in analysis.outputs)
        shared: dict[tuple, tuple] = {}  # symbolic shape -> one tuple for every record printing it alike
        self.inputs_expected = {name: self._expect(name, d.section[:-1], (), d.meta, 0, shared) for name, d in analysis.declared.items()}
        # Every record, inner ones too, dies after its last reader (or its own step), by the step's
        # position: small ints hash to themselves, so at 1,000 layers this table is walked in order.
        dying: dict[int, list[str]] = {}
        for rid, last in last_reads(analysis).items():
            if rid not in keep and rid not in analysis.declared:
                dying.setdefault(last, []).append(rid)
        planned, tables, random = [], (table_groups(analysis), self._tables), False
        verified = _VerifiedSteps(analysis) if self.predicts else None
        for i, (step_id, node) in enumerate(analysis.nodes.items()):  # one pass over the nodes: at 1,000 layers they are out of cache
            random = random or node.step.is_random()
            predicted = verified is not None and verified.repeats(node, step_id)
            fn = None if predicted else node.step.kernel(KernelContext(analysis, node, self.device, self.training, tables))
            last = node.outs[-1] if node.outs else None
            expected = tuple(
                [self._expect(out.id, out.op, out.reads, out.meta, node.flops if out is last else 0, shared) for out in node.outs]
            )
            single = node.form == ONE
            getter = itemgetter(*node.reads) if node.reads else (lambda env: ())
            planned.append(
                Planned(
                    getter, fn, len(node.reads) == 1, expected[0] if single else None, expected, tuple(dying.get(i, ())), step_id, predicted
                )
            )
        self.random = random
        return self._shown(analysis, planned, keep) if self.predicts else tuple(planned)

    @staticmethod
    def _shown(analysis: Analysis, planned: list[Planned], outputs: set[str]) -> tuple[Planned, ...]:
        """The plan with each predicted step's ``shown`` records: those a kernel reads, the
        outputs, and the owners of their storages. Nothing else of a repeated block's copy is ever
        looked at (when no ``observe`` or ``keep_values`` asks for every tensor), so a run records
        it from its template and makes no tensor (encoder_stack's layer: 25 torch calls fewer)."""
        read = set(outputs)
        for node, step in zip(analysis.nodes.values(), planned):
            if not step.predicted:
                read.update(node.reads)
        metas = analysis.metas
        read |= {metas[rid].root or rid for rid in read if rid in metas}
        for i, step in enumerate(planned):
            if step.predicted and any(e.id in read for e in step.expected):
                planned[i] = step._replace(shown=tuple(e for e in step.expected if e.id in read))
        return tuple(planned)

    def _expect(self, rid: str, op: str, inputs: tuple, meta: Meta, flops: int, shared: dict) -> Expected:
        view_of = None if meta.root == rid else meta.root
        symbolic = tuple(map(str, meta.shape))
        symbolic = shared.setdefault(symbolic, symbolic)
        sizes, stride, offset = meta.sizes, meta.stride, meta.offset
        template = new_record(
            rid, op, inputs, sizes, symbolic, meta.dtype, self.device_name, stride, offset, meta.contiguous, view_of, meta.nbytes, flops
        )
        return Expected(rid, sizes, stride, offset, self._torch_dtypes[meta.dtype], view_of, template)

    @gc_paused  # a run makes records and tensors freed by reference counts: a collector pass finds no garbage,
    # and at 1,000 layers a full one (over every object of the process) cost more than the meta run itself
    def run(self, tensors: dict[str, Any], keep_values: bool, observe: Callable | None = None, grad: bool = False) -> RunResult:
        """Run every kernel and record every tensor; ``observe(record_id, tensor)``, when given, sees
        each tensor a step produces (inner records too) while it is still alive.

        Each step's records were built at compile time from the static analysis; a record is reused
        only after checking that torch's tensor has exactly the predicted shape, strides, offset,
        dtype and storage owner, so the trace is still what torch did (any difference is recorded
        as observed). That check is all a run adds to the kernels themselves. ``grad`` keeps
        autograd on (``tracer.to_module``); otherwise a run records no graph.
        """
        try:
            return self._run(tensors, keep_values, observe, grad)
        finally:
            self._tables.clear()  # tables shared within this run (a run that raised may leave some)

    def _run(self, tensors: dict[str, Any], keep_values: bool, observe: Callable | None, grad: bool) -> RunResult:
        torch = torch_module()
        env = dict(tensors)
        storages = _StorageIndex()
        owner = storages.owner
        cache = self._inputs_cache
        diverged = False
        if (
            not keep_values
            and cache is not None
            and len(tensors) == len(cache[1])
            and all(map(is_, tensors.values(), cache[1]))
            and tuple(tensors) == cache[0]
        ):
            records = list(cache[2])  # the same tensors as the last run: same records, same storages
            storages.roots = dict(cache[3])
        else:
            records = []
            for name, tensor in tensors.items():
                diverged |= self._append(records.append, self.inputs_expected[name], tensor, owner(tensor, name), keep_values, "")
            if not keep_values:
                self._inputs_cache = (tuple(tensors), tuple(tensors.values()), tuple(records), dict(storages.roots))
        append = records.append
        roots, ref = storages.roots, weakref.ref
        on_meta = self.device.type == "meta"
        bases: dict[str, Any] = {}  # on the meta device: record id -> the tensor holding the storage it owns
        every = observe is not None or keep_values  # else a predicted step makes only its shown tensors
        with torch.no_grad() if torch.is_grad_enabled() and not grad else _NO_CONTEXT:
            for getter, fn, single, expect, expected, free, step_id, predicted, shown in self.steps:
                if predicted:
                    if every:
                        self._predicted(expected, getter(env), single, env, bases, roots, append, observe)
                    else:
                        for made in expected:
                            append(made.template)
                        if shown:
                            self._predicted(shown, None, single, env, bases, roots, None, None)
                    if free:
                        for name in free:
                            env.pop(name, None)
                    continue
                result = fn(getter(env)) if single else fn(*getter(env))
                if expect is not None:
                    rid, sizes, stride, offset, dtype, static_view_of, template = expect
                    env[rid] = result
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
                        if on_meta:
                            result = env[rid] = self._as_on_cpu(result, expect, view_of, roots)
                        diverged |= self._append(append, expect, result, view_of, keep_values, step_id)
                    if on_meta and view_of is None:
                        bases[rid] = result
                    if observe is not None:  # after a meta tensor took the layout a real run gives it
                        observe(rid, result)
                else:
                    for expect, tensor in zip(expected, result):
                        view_of = owner(tensor, expect.id)
                        if on_meta:
                            tensor = self._as_on_cpu(tensor, expect, view_of, roots)
                        env[expect.id] = tensor
                        if on_meta and view_of is None:
                            bases[expect.id] = tensor
                        if observe is not None:
                            observe(expect.id, tensor)
                        diverged |= self._append(append, expect, tensor, view_of, keep_values, step_id)
                if free and not keep_values:
                    for name in free:
                        del env[name]
                result = base = tensor = None  # no local keeps a freed tensor alive into the next step
        outputs = {name: env[rid] for name, rid in self.output_ids}
        return RunResult(records, outputs, not diverged)

    def _predicted(self, expected, args, single: bool, env: dict, bases: dict, roots: dict, append, observe) -> None:
        """A step's tensors on the meta device, laid out as predicted: a fresh storage per record
        that owns one, a view of its owner's storage (``bases``: every owner this run made; an input
        or a param; or one of the step's ``args``) for the rest; ``append`` None: the records are appended already."""
        torch, device = torch_module(), self.device
        for expect in expected:
            if expect.view_of is None:
                tensor = torch.empty_strided(expect.sizes, expect.stride, dtype=expect.dtype, device=device)
                roots[id(tensor)] = (weakref.ref(tensor), expect.id)
                bases[expect.id] = tensor
            else:
                base = bases.get(expect.view_of)
                if base is None:  # an input's or a param's: env holds them for the whole run
                    base = env.get(expect.view_of)
                if base is None or base._base is not None:
                    base = _storage_read(() if args is None else (args,) if single else args, expect.view_of, roots)
                tensor = base.as_strided(expect.sizes, expect.stride, expect.offset)
            env[expect.id] = tensor
            if append is not None:
                append(expect.template)
            if observe is not None:
                observe(expect.id, tensor)

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

    @staticmethod
    def _as_on_cpu(tensor, expect: Expected, view_of, roots: dict):
        """On the meta device, a fresh tensor laid out as the static analysis predicts for a real
        run. torch's meta kernels do not model every device-specific layout (scaled_dot_product_
        attention's CPU flash kernel lays its output out like q; its meta kernel row-major), and a
        meta trace is meant to show what a real run does: later views then see those strides too."""
        if view_of is not None or expect.view_of is not None or tensor.shape != expect.sizes or tensor.stride() == expect.stride:
            return tensor
        restrided = tensor.new_empty_strided(expect.sizes, expect.stride)
        roots[id(restrided)] = (weakref.ref(restrided), expect.id)
        return restrided


class _VerifiedSteps:
    """Which steps of a plan on the meta device may take their predicted layouts: a later block
    copy of a step whose kernel ran (in an earlier copy) on inputs and outputs of the same sizes,
    strides, offsets and dtypes."""

    def __init__(self, analysis: Analysis):
        self.metas = analysis.metas
        self.seen: set[tuple] = set()  # (step id with every copy number as '#', layout numbers) of the kernels that ran
        self.blocks: dict[str, str] = {}  # copy ('layers/3') -> its step ids' common part ('layers/#')
        self.layouts: dict[tuple, int] = {}  # (sizes, stride, offset, dtype) -> its number
        self.numbered: dict[str, int] = {}  # record id -> its layout's number

    def repeats(self, node: Node, step_id: str) -> bool:
        """Whether ``node`` (of ``step_id``) repeats a verified step; if not, its kernel runs and it is marked as seen."""
        copy = node.copy
        if copy is None:
            return False
        block = self.blocks.get(copy)
        if block is None:
            block = self.blocks[copy] = _COPY_NUMBER.sub("/#", copy + "/")
        number = self._number
        key = (block, step_id[len(copy) :], *map(number, node.reads), *[number(out.id) for out in node.outs])
        if key in self.seen:
            return True
        self.seen.add(key)
        return False

    def _number(self, rid: str) -> int:
        """The number of a record's layout: each record's is hashed once, when first met (as an
        output, or as the input or param a step reads), not again by every step that reads it."""
        found = self.numbered.get(rid)
        if found is None:
            meta = self.metas[rid]
            found = self.numbered[rid] = self.layouts.setdefault((meta.sizes, meta.stride, meta.offset, meta.dtype), len(self.layouts))
        return found


def _storage_read(args, owner: str, roots: dict):
    """The storage ``owner`` holds, as the base tensor of one of the step's inputs."""
    for tensor in args:
        base = tensor._base if tensor._base is not None else tensor
        entry = roots.get(id(base))
        if entry is not None and entry[1] == owner and entry[0]() is base:
            return base
    raise InternalError(f"no input of the step holds the storage of '{owner}' its view was predicted on")


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
