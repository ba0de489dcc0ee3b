"""What a kernel really reads: each step's kernel run again under a dispatch mode that follows
every tensor torch makes back to the tensors it was computed from, held against what tracer
records (``run --json``'s inputs, the liveness analysis) and against the edges the diagram draws.

A record's real inputs are the kernel's arguments and the step's other records that a chain of
torch ops leads from to it without passing through another of the step's records: rope's
``rotated`` reads the input, ``cos`` and ``sin``; ``cos`` reads the positions (if any), never the
input it only takes a size and a dtype from. Ops that take only the shape of a tensor
(``empty_like``, ``new_zeros``…) do not carry data, and an in-place op writes into every
tensor that shares the storage it writes to.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from tracer.analysis.graph import OUTPUTS
from tracer.runtime.interpreter import KernelContext

SHAPE_ONLY = re.compile(r"(_like|^new_\w+|^empty\w*|^zeros|^ones|^full|^rand\w*|^arange|^scalar_tensor|^lift_fresh\w*)$")


class Provenance(TorchDispatchMode):
    """For each tensor an op made while it is active: the tensors the op computed it from."""

    def __init__(self) -> None:
        super().__init__()
        self.parents: dict[int, set[int]] = {}
        self.alive: list[torch.Tensor] = []  # keeps every tensor seen, so no id is reused

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        name = func._schema.name.split("::")[-1]
        ins = [t for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
        made = [t for t in tree_leaves(out) if isinstance(t, torch.Tensor)]
        sources = set() if SHAPE_ONLY.search(name) else {id(t) for t in ins}
        self.alive += ins + made
        for tensor in made:
            self.parents.setdefault(id(tensor), set()).update(sources - {id(tensor)})
        for written in _written(func, args, kwargs):
            self._write(written, sources - {id(written)})
        return out

    def _write(self, target: torch.Tensor, sources: set[int]) -> None:
        """An in-place op changes every tensor that shares the storage it writes to."""
        storage = _storage(target)
        for tensor in self.alive:
            if tensor is target or (storage and _storage(tensor) == storage):
                self.parents.setdefault(id(tensor), set()).update(sources - {id(tensor)})


def _storage(tensor: torch.Tensor) -> int:
    try:
        return tensor.untyped_storage().data_ptr()
    except RuntimeError:
        return 0


def _written(func, args, kwargs) -> Iterable[torch.Tensor]:
    for j, argument in enumerate(func._schema.arguments):
        info = argument.alias_info
        if info is not None and info.is_write:
            value = args[j] if j < len(args) else kwargs.get(argument.name)
            yield from (t for t in tree_leaves(value) if isinstance(t, torch.Tensor))


def real_reads(trace, node) -> dict[str, set[str]]:
    """Record id -> the records its kernel really computed it from (see the module docstring)."""
    analysis = trace.analysis
    args = [trace[rid].tensor for rid in node.reads]
    fn = node.step.kernel(KernelContext(analysis, node, torch.device("cpu"), False))
    mode = Provenance()
    with torch.no_grad(), mode:
        result = fn(*args)
    made = list(result) if isinstance(result, tuple) else [result]
    known = {id(t): rid for rid, t in zip(node.reads, args)}
    found = {}
    for out, tensor in zip(node.outs, made):
        same = known.get(id(tensor))
        found[out.id] = {same} if same else _nearest(mode.parents, id(tensor), known)
        known[id(tensor)] = out.id  # a record that is an earlier one (contiguous of a contiguous tensor) is read under its new name
    return found


def _nearest(parents: dict[int, set[int]], start: int, known: dict[int, str]) -> set[str]:
    """The known tensors reached walking back from ``start``, not walking past a known one."""
    reads, seen, todo = set(), {start}, [start]
    while todo:
        for parent in parents.get(todo.pop(), ()):
            if parent in seen:
                continue
            seen.add(parent)
            if parent in known:
                reads.add(known[parent])
            else:
                todo.append(parent)
    return reads


EDGE = re.compile(r'^\s*("(?:[^"\\]|\\.)*"|[^\s"]+) -> ("(?:[^"\\]|\\.)*"|[^\s"]+) \[.* tooltip="([^"]*?): ', re.M)
NODE = re.compile(r'^\s*("(?:[^"\\]|\\.)*"|[^\s"]+) \[', re.M)


def drawn_reads(trace) -> dict[str, set[str]]:
    """Each node the diagram draws -> the records drawn flowing into it, each from the node that
    draws that record (its own, or its step's when it is one of several outputs)."""
    source = trace.diagram(legend=False).source
    drawn: dict[str, set[str]] = {name.strip('"'): set() for name in NODE.findall(source)}
    for tail, head, record in EDGE.findall(source):
        assert tail.strip('"') in (record, trace.analysis.graph.producer(record)) or "@" in tail, (tail, record)
        drawn[head.strip('"')].add(record)
    return drawn


def dataflow_problems(trace) -> list[str]:
    """Every recorded input and drawn edge that is not a real data dependency of its kernel, and
    every real one that is not recorded or not drawn. Steps alike but for their names (the copies
    of a repeated block) are run once; the steps a diagram folds into a block's ×N node are not drawn."""
    problems, drawn, seen = [], drawn_reads(trace), set()
    for node in trace.analysis.nodes.values():
        if _likeness(node) in seen:
            continue
        seen.add(_likeness(node))
        real = real_reads(trace, node)
        for out in node.outs:
            if set(out.reads) != real[out.id]:
                problems.append(f"{out.id} records inputs {sorted(out.reads)}, its kernel reads {sorted(real[out.id])}")
        if node.form == OUTPUTS:  # one node for every output: it reads what any of them reads
            heads = {node.id: set().union(*real.values())}
        else:
            heads = {out.id: real[out.id] for out in node.outs}
        for head, reads in heads.items():
            if head in drawn and drawn[head] != reads:
                problems.append(f"the diagram draws {sorted(drawn[head])} into {head}, its kernel reads {sorted(reads)}")
    return problems


def _likeness(node) -> tuple:
    """What makes two steps compute alike: all but the names of what they read and make."""
    names = {"id", "input", "inputs", "note", "group", *node.step.param_fields}
    return node.op, node.form, len(node.refs), node.step.model_dump_json(exclude=names)
