"""Memory estimates from the static analysis alone, and the guard that refuses runs that cannot fit.

Every tensor that owns its storage (its ``Meta.root`` is its own id) costs its bytes from the step
that creates it until the last step that reads it or any view of it; inputs and params live for
the whole run; outputs live to the end. That is exactly the lifetime the interpreter gives them
(it drops each tensor after its last use), so the peak below is what a real run holds in tensors.
What a kernel keeps for later runs (``costs.kept``: a small mask pattern) counts from its step on.
While a step runs, the copies its kernel makes and frees again (``StepBase.workspace_bytes``: the
operands torch.matmul broadcasts) count too, and so does the temporary an init makes while
the inputs are created (an int64 range before its cast). No torch: ``tracer check`` and the guard stay cheap.
"""

from __future__ import annotations

import os
import time
from collections.abc import Collection, Iterable
from dataclasses import dataclass, field

from ..core.errors import Diagnostic, TracerError
from ..core.formatting import human_bytes, parse_bytes
from ..spec.inits import INITS
from . import costs


@dataclass(frozen=True)
class MemoryEstimate:
    """What a real run at these dims would hold in tensor storage."""

    peak_bytes: int  # inputs + params + the largest set of storages alive at once
    peak_step: str | None  # the step running when the peak is reached (None: no steps ran)
    persistent_bytes: int  # inputs and params (alive for the whole run)
    storages: dict[str, int] = field(default_factory=dict)  # root record id -> bytes it allocates
    live: dict[str, int] = field(default_factory=dict)  # step id -> bytes alive while it runs

    def largest(self, n: int = 3) -> list[tuple[str, int]]:
        return sorted(self.storages.items(), key=lambda kv: -kv[1])[:n]


def created_at_steps(analysis) -> dict[str, int]:
    """Record id -> position (in execution order) of the step that makes it; inner records too."""
    return {out.id: i for i, node in enumerate(analysis.nodes.values()) for out in node.outs}


def last_reads(analysis) -> dict[str, int]:
    """Record id -> position of the last step that reads it (its own step when nobody does).

    The one liveness analysis: the interpreter frees each tensor after this step, and the memory
    estimate counts its storage until then.
    """
    last: dict[str, int] = {}
    for i, node in enumerate(analysis.nodes.values()):  # one pass: a record is read after the step that makes it
        for out in node.outs:
            for rid in out.reads:
                if rid in last:
                    last[rid] = i
            last[out.id] = i
    return last


def table_groups(analysis) -> dict[str, tuple[str, ...]]:
    """Step id -> the steps, in execution order, whose kernels build equal tables in one run
    (``StepBase.table_key``: rope's cos and sin for q and for k); only groups of two or more. The
    interpreter builds such a table once and keeps it from the first step to the last of its group."""
    groups: dict[tuple, list[str]] = {}
    for node in analysis.nodes.values():
        if node.step.table_records and node.outs:
            key = node.step.table_key(lambda text, node=node: node.dims.dim(text).value, node.reads, [out.meta for out in node.outs])
            if key is not None:
                groups.setdefault(key, []).append(node.id)
    return {step_id: tuple(members) for members in groups.values() if len(members) > 1 for step_id in members}


def estimate_peak(analysis, kept: Iterable[str] = ()) -> MemoryEstimate:
    """The peak bytes of tensor storage of a real run of ``analysis`` (see the module docstring);
    the tensors ``kept`` (their values kept for the trace) live to the end, as outputs do."""
    metas = analysis.metas
    nodes = list(analysis.nodes.values())
    persistent = sum(d.meta.nbytes for d in analysis.declared.values())
    storages = {name: d.meta.nbytes for name, d in analysis.declared.items()}
    created_at = created_at_steps(analysis)
    last = last_reads(analysis)
    end = len(nodes) - 1
    for name in [*analysis.outputs, *kept]:  # outputs and kept values live to the end of the run
        rid = analysis.record_of(name)
        if rid in last:
            last[rid] = end
    span: dict[str, list[int]] = {}  # root -> [first step, last step] its storage is alive
    for rid, start in created_at.items():
        meta = metas[rid]
        root = meta.root or rid
        if root in storages and root not in created_at:
            continue  # a view of an input or param: no new storage
        if root == rid:
            storages[rid] = meta.nbytes
        s = span.setdefault(root, [start, last[rid]])
        s[0], s[1] = min(s[0], start), max(s[1], last[rid])
    order = {node.id: i for i, node in enumerate(nodes)}
    for step_id, members in table_groups(analysis).items():  # a shared table lives until its group's last step
        if step_id == members[0]:
            for suffix in analysis.nodes[step_id].step.table_records:
                s = span[metas[f"{step_id}/{suffix}"].root]
                s[1] = max(s[1], order[members[-1]])
    delta = [0] * (len(nodes) + 1)
    for root, (first, final) in span.items():
        nbytes = storages.get(root, 0)
        delta[first] += nbytes
        delta[final + 1] -= nbytes
    for i, node in enumerate(nodes):  # what a kernel keeps for later runs stays to the end
        delta[i] += costs.kept(node, [metas[rid] for rid in node.reads]) if node.outs else 0
    live, running, peak, peak_step = {}, persistent, persistent + _making_inputs(analysis), None
    for i, node in enumerate(nodes):
        running += delta[i]
        live[node.id] = running + _workspace(analysis, node)
        if live[node.id] > peak or peak_step is None:
            peak, peak_step = max(peak, live[node.id]), node.id
    return MemoryEstimate(peak, peak_step, persistent, storages, live)


def _making_inputs(analysis) -> int:
    """The largest temporary tensor an init makes while inputs and params are created (all of them
    alive by the end): arange counts in int64 and then casts; triu and tril cut a ones tensor."""
    largest = 0
    for declared in analysis.declared.values():
        if declared.decl.init is not None:
            largest = max(largest, INITS[declared.decl.init].temporary_bytes(declared.meta.sizes, declared.meta.dtype))
    return largest


def _workspace(analysis, node) -> int:
    """Transient bytes the step's kernel allocates beyond its records (``tracer.analysis.costs``)."""
    return costs.workspace(node, [analysis.metas[rid] for rid in node.reads]) if node.outs else 0


# ---------------------------------------------------------------- budgets

_AVAILABLE: list[float] = [0.0, -1.0]  # [bytes, when read]: re-read at most once a second


def available_memory() -> int:
    """Available RAM in bytes: MemAvailable from /proc/meminfo, else free pages from sysconf."""
    now = time.monotonic()
    if now - _AVAILABLE[1] < 1.0:
        return int(_AVAILABLE[0])
    value = None
    try:
        with open("/proc/meminfo", "rb") as f:
            for line in f:
                if line.startswith(b"MemAvailable:"):
                    value = int(line.split()[1]) * 1024
                    break
    except (OSError, ValueError, IndexError):
        value = None
    if value is None:
        try:
            value = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        except (ValueError, OSError, AttributeError):
            value = 1 << 62  # unknown: do not refuse
    _AVAILABLE[0], _AVAILABLE[1] = value, now
    return value


MIN_DEFAULT_BUDGET = 64 << 20  # small runs are never refused because of a moment of memory pressure


def default_budget(device: str = "cpu") -> tuple[int, str]:
    """Half of the memory the device has free (at least 64 MiB), and how to say so."""
    if str(device).startswith("cuda"):
        try:
            import torch

            free, _ = torch.cuda.mem_get_info(torch.device(device))
            return max(free // 2, MIN_DEFAULT_BUDGET), "half of the free GPU memory"
        except Exception:  # no CUDA build or driver: let torch report it when the run starts
            return 1 << 62, "unknown"
    return max(available_memory() // 2, MIN_DEFAULT_BUDGET), "half of the available RAM"


def kept_records(analysis, keep_values: bool | Collection[str]) -> tuple[str, ...]:
    """The records whose values a run keeps: every one (``True``), none, or those named."""
    if isinstance(keep_values, bool):
        return tuple(analysis.metas) if keep_values else ()
    return tuple(keep_values)


def memory_of(analysis, keep_values: bool | Collection[str] = False) -> MemoryEstimate:
    """The estimate of a run that keeps these values (a kept tensor is never freed)."""
    kept = kept_records(analysis, keep_values)
    return estimate_peak(analysis, kept) if kept else analysis.memory


def check_budget(analysis, device: str = "cpu", max_memory: int | str | None = None, keep_values: bool | Collection[str] = False) -> None:
    """Refuse a real run whose estimated peak, the values it keeps included, exceeds the budget;
    meta runs allocate nothing."""
    if str(device) == "meta":
        return
    estimate = memory_of(analysis, keep_values)
    if max_memory is not None:
        budget, what = parse_bytes(max_memory), "max_memory"
        if estimate.peak_bytes <= budget:
            return
    else:
        if estimate.peak_bytes <= max(_AVAILABLE[0] // 2, MIN_DEFAULT_BUDGET) and time.monotonic() - _AVAILABLE[1] < 1.0:
            return  # fast path for repeated runs
        budget, what = default_budget(device)
        if estimate.peak_bytes <= budget:
            return
    largest = ", ".join(f"{rid} {human_bytes(n)}" for rid, n in estimate.largest())
    kept = " with every tensor's values kept" if keep_values is True else " with the values it keeps" if keep_values else ""
    message = (
        f"a real run at {analysis.bindings()}{kept} needs an estimated {human_bytes(estimate.peak_bytes)} of tensors "
        f"(peak at step '{estimate.peak_step}'; largest: {largest}), over the budget of {human_bytes(budget)} ({what}); "
        f"trace it without allocating anything with --device meta (device='meta'), "
        f"or raise the budget with --max-memory (max_memory=)"
    )
    raise TracerError(Diagnostic(analysis.source.file, None, "memory-budget", message))
