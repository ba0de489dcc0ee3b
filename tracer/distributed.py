"""``tracer run FILE --world N`` and ``tracer.run_parallel``: a pipeline with a ``parallel:``
section run as N processes on torch.distributed, checked against its single-device run.

The processes are started by torch's own launcher (``torch.multiprocessing.start_processes``)
with multiprocessing's fork server: a process of its own, started once with torch.distributed
imported, forks each rank. The launching process is never forked itself: a copy of it would
inherit only the forking thread, and a lock another thread held at that moment (the store's
server thread, a notebook's or a test runner's) would stay held in the rank forever. The ranks
meet at a ``TCPStore`` this process holds, listening on a port the system chose free, and run
gloo (CPU) or nccl (CUDA). A rank that raises ends the run at once (torch's launcher stops the
others); one that has not finished within ``timeout`` seconds is killed with the rest, and the
message says which step each rank was in. No rank outlives the call; the fork server lives as
long as the launching process, for its next run.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import multiprocessing
import sys
import tempfile
import time
import types
from collections import Counter
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from .analysis.parallel import Collective, collectives, ring_bytes
from .analysis.shapes import Analysis
from .api import Pipeline, load
from .core.dtypes import DTYPE_BYTES
from .core.errors import Diagnostic, TracerError
from .presentation.trace import Trace
from .runtime.interpreter import device_problem, torch_module
from .runtime.sharded import RANK_MODULES, STARTING, CollectiveEvent, RankJob, RankResult, check_runnable, rank_error, run_rank

TOLERANCE = 1e-5  # the gathered outputs against the single-device run's
_POLL = 0.02  # seconds between looks at the ranks while they run
# how the ranks are started (see the module's doc); Windows has no fork server: spawn, each rank importing torch
START = "forkserver" if "forkserver" in multiprocessing.get_all_start_methods() else "spawn"


@dataclass
class ParallelRun:
    """What a run on torch.distributed found: every rank's records (local shapes) and
    collectives, the outputs gathered from the ranks, and the single-device run they equal."""

    pipeline: Pipeline
    mesh: dict[str, int]
    reference: Trace
    ranks: list[Trace]  # rank r's records, read against its program's analysis
    collectives: list[list[CollectiveEvent]]  # rank r's, in the order it issued them
    outputs: dict[str, Any]  # gathered: the global tensors
    differences: dict[str, float] = field(default_factory=dict)  # output -> largest |parallel - single device|
    predicted: list[Collective] = field(default_factory=list)  # the static analysis's, for one forward on every rank

    @property
    def world(self) -> int:
        return len(self.ranks)

    def counts(self, rank: int = 0) -> Counter:
        """How many collectives of each (step, op) the rank issued."""
        return Counter((event.step, event.op) for event in self.collectives[rank])

    def to_json(self) -> str:
        """The run as JSON: the mesh, every rank's trace (``tracer run --json``'s form), each rank's
        collectives and each output's largest difference from the single-device run."""
        return json.dumps(
            {
                "pipeline": self.pipeline.name,
                "world": self.world,
                "mesh": self.mesh,
                "ranks": [json.loads(trace.to_json()) for trace in self.ranks],
                "collectives": [[asdict(event) for event in events] for events in self.collectives],
                "differences": self.differences,
            },
            indent=2,
        )

    def summary(self, rank: int = 0) -> str:
        """A few lines: the mesh, each step's collectives on ``rank`` (as torch ran them, the whole
        tensor's bytes as the static analysis counts them, and the ring's bytes sent per rank),
        the outputs' differences."""
        mesh = " × ".join(f"{name}={size}" for name, size in self.mesh.items())
        lines = [f"{self.pipeline.name} on torch.distributed: world {self.world} ({mesh}); the records above are rank {rank}'s"]
        sent: dict[tuple, list[CollectiveEvent]] = {}
        for event in self.collectives[rank]:
            sent.setdefault((event.step, event.op), []).append(event)
        for (step, op), events in sent.items():
            whole = sum(event.whole_bytes for event in events)
            per_rank = sum(ring_bytes(op, event.whole_bytes, event.group_size) for event in events)
            lines.append(
                f"collective: {op} ×{len(events)} in step '{step}' over {events[0].group_size} ranks: {whole} B, {per_rank} B sent per rank"
            )
        if not sent:
            lines.append("collectives: none")
        lines.append(f"collectives as predicted: {len(self.predicted)} on every rank, step by step")
        for name, difference in self.differences.items():
            lines.append(f"output {name}: max |parallel - single device| = {difference:.3g} (≤ {TOLERANCE:g})")
        return "\n".join(lines)


def run_parallel(
    pipeline: Pipeline | str | Path,
    world: int,
    dims: Mapping[str, int] | None = None,
    seed: int | None = None,
    timeout: float = 60.0,
    device: str = "cpu",
) -> ParallelRun:
    """Run ``pipeline`` (a file, a bundled name or a ``tracer.Pipeline``) as ``world`` processes
    on torch.distributed, sharded as its ``parallel:`` section plans it, and check it against the
    static analysis and the single-device run: the outputs gathered from the ranks equal the
    single-device run's (≤ 1e-5), the collectives each rank issued are the predicted ones, step by
    step, and every tensor a rank makes has the static per-rank shape. ``dims`` may set the mesh's
    degrees (``{"tp": 4}``); every rank draws the global tensors from ``seed`` (the file's, else 0).
    A rank that fails or is still running after ``timeout`` seconds ends the run with a located
    ``TracerError``; no process is left behind."""
    if not isinstance(pipeline, Pipeline):
        pipeline = load(pipeline)
    spec, source = pipeline.spec, pipeline.source
    if spec.parallel is None:
        message = "--world runs a pipeline on several processes as its parallel: section plans it; this file has none (docs/parallel.md)"
        raise TracerError(Diagnostic(source.file, None, "no-parallel", message))
    problem = device_problem(device)
    if problem is not None or device not in ("cpu", "cuda"):
        message = problem or f"--world runs on cpu (gloo) or cuda (nccl, a GPU per rank), not {device}"
        raise TracerError(Diagnostic(source.file, None, "device", message))
    _start_fork_server()  # it imports torch.distributed while this process checks the file and runs the reference
    dims = dict(dims or {})
    analysis = pipeline.check(dims)
    ranks_analysis = _rank_analysis(analysis)
    _check_world(source, analysis.degrees, world)
    check_runnable(analysis)
    seed = (spec.seed if spec.seed is not None else 0) if seed is None else seed
    reference = pipeline.run(dims=dims, seed=seed)
    results = _launch(RankJob(spec, source, dims, seed, device, tuple(analysis.degrees.items()), analysis), timeout)
    traces = [Trace(pipeline, ranks_analysis, r.records, {}, seed, False, as_predicted=r.as_predicted) for r in results]
    run = ParallelRun(pipeline, dict(analysis.degrees), reference, traces, [r.collectives for r in results], results[0].outputs)
    run.predicted = collectives(analysis)
    run.differences = _compare(run)
    _check_collectives(run)
    return run


def _rank_analysis(analysis: Analysis) -> Analysis:
    """The rank's program, from the static analysis: its errors (and the reference's) first."""
    analysis.raise_errors()
    view = analysis.rank
    if view.failure is not None:
        raise TracerError(view.failure)
    view.analysis.raise_errors()
    return view.analysis


def _check_world(source, degrees: dict[str, int], world: int) -> None:
    size = math.prod(degrees.values())
    if world != size:
        shape = " × ".join(f"{name}={n}" for name, n in degrees.items())
        message = f"--world {world}, but the mesh is {shape} = {size} ranks: give --world {size}, or change the mesh's degrees (--dim)"
        raise TracerError(source.error(("parallel", "mesh"), "world-size", message, prefer_key=True))


def _compare(run: ParallelRun) -> dict[str, float]:
    """Each gathered output against the single-device run's; a difference over the tolerance is a
    located error at the step that makes the output."""
    torch = torch_module()
    analysis = run.reference.analysis
    differences, problems = {}, []
    for name, expected in run.reference.outputs.items():
        got, producer = run.outputs[name], analysis.producer(name)
        if got.shape != expected.shape:
            message = f"output '{name}': gathered {list(got.shape)}, the single-device run made {list(expected.shape)}"
            problems.append(_at_step(analysis, producer, "parallel-mismatch", message))
            continue
        difference = (got.double() - expected.double()).abs().max().item() if got.numel() else 0.0
        differences[name] = difference
        if not difference <= TOLERANCE or torch.isnan(got).any() != torch.isnan(expected).any():
            message = f"output '{name}' differs from the single-device run by up to {difference:.3g} (more than {TOLERANCE:g})"
            problems.append(_at_step(analysis, producer, "parallel-mismatch", message))
    if problems:
        raise TracerError(problems)
    return differences


def _check_collectives(run: ParallelRun) -> None:
    """Every rank issued the predicted collectives, step by step and op by op, each on a tensor of
    the predicted size; a difference is a located error at the first step where they part."""
    analysis = run.reference.analysis
    expected = [(c.step, c.op, _whole_bytes(c)) for c in run.predicted]
    for rank, events in enumerate(run.collectives):
        measured = [(e.step, e.op, e.whole_bytes) for e in events]
        if measured == expected:
            continue
        at = next((i for i, (m, e) in enumerate(zip(measured, expected)) if m != e), min(len(measured), len(expected)))
        found = measured[at] if at < len(measured) else None
        wanted = expected[at] if at < len(expected) else None
        step = (found or wanted)[0]
        message = (
            f"rank {rank} issued {len(measured)} collectives, the plan predicts {len(expected)}; the {at + 1}th: "
            f"torch ran {_shown(found)}, the static analysis predicts {_shown(wanted)}"
        )
        node = analysis.nodes.get(step) if step is not None else None
        raise TracerError(_at_step(analysis, node, "collective-mismatch", message))


def _whole_bytes(collective) -> int:
    size = DTYPE_BYTES.get(collective.dtype, 4)
    for n in collective.shape:
        size *= n
    return size


def _shown(entry) -> str:
    return "none" if entry is None else f"{entry[1]} of {entry[2]} B in step '{entry[0]}'"


def _at_step(analysis: Analysis, node, code: str, message: str) -> Diagnostic:
    if node is None:
        return Diagnostic(analysis.source.file, None, code, message)
    return analysis.error(node, code, message)


# ---------------------------------------------------------------- the processes


def _start_fork_server() -> None:
    """The process that forks the ranks, started now if it isn't running, with what every rank
    imports imported once (it returns at once: the server imports them on its own)."""
    if START != "forkserver":
        return
    from multiprocessing import forkserver

    forkserver.set_forkserver_preload([*RANK_MODULES, "tracer.runtime.sharded"])
    forkserver.ensure_running()


def _launch(job: RankJob, timeout: float) -> list[RankResult]:
    """Start the ranks, wait for all of them (or the first failure, or the timeout), and read
    what they saved; every rank is gone when this returns or raises."""
    import torch.distributed as dist
    import torch.multiprocessing as mp

    progress = mp.get_context(START).Array("i", [STARTING] * job.world, lock=False)
    store = dist.TCPStore("127.0.0.1", 0, job.world, is_master=True, wait_for_workers=False)
    try:
        with tempfile.TemporaryDirectory(prefix="tracer-world-") as folder:
            sent = replace(job, analysis=None)  # each rank analyses the file again: it is sent its job pickled
            with _without_main_script():
                context = mp.start_processes(
                    run_rank, (sent, store.port, folder, progress), nprocs=job.world, join=False, start_method=START
                )
            try:
                _wait(context, job, timeout, progress)
            finally:
                _stop(context)
            torch = torch_module()
            return [torch.load(f"{folder}/rank{rank}.pt", weights_only=False) for rank in range(job.world)]
    finally:
        del store  # its server thread joined now, not whenever a traceback that holds it is freed


@contextlib.contextmanager
def _without_main_script():
    """The ranks run tracer's code only: multiprocessing would have each one run the launching
    program's script again first (as ``__mp_main__``, to unpickle what it defines), and a script
    that calls ``run_parallel`` without an ``if __name__ == "__main__":`` guard would launch again
    from inside its own ranks."""
    script = sys.modules["__main__"]
    sys.modules["__main__"] = types.ModuleType("__main__")
    try:
        yield
    finally:
        sys.modules["__main__"] = script


def _wait(context, job: RankJob, timeout: float, progress) -> None:
    import torch.multiprocessing as mp

    deadline = time.monotonic() + timeout
    while True:
        try:
            with _quiet_launcher():
                done = context.join(timeout=_POLL)
            if done:
                return
        except mp.ProcessRaisedException as exc:
            raise TracerError(_failed(job, exc.error_index, _last_line(str(exc)), progress)) from None
        except mp.ProcessExitedException as exc:
            raise TracerError(_failed(job, exc.error_index, f"exited with code {exc.exit_code}", progress)) from None
        if time.monotonic() > deadline:
            stuck = [rank for rank, process in enumerate(context.processes) if process.is_alive()]
            raise TracerError(
                [
                    _failed(job, rank, f"had not finished after {timeout:g} s (--timeout); every rank was stopped", progress)
                    for rank in stuck
                ]
            )


@contextlib.contextmanager
def _quiet_launcher():
    """torch's launcher logs a warning for each rank it stops after another failed: the failure
    itself is what tracer reports."""
    logger = logging.getLogger("torch.multiprocessing.spawn")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)


def _failed(job: RankJob, rank: int, what: str, progress) -> Diagnostic:
    """A rank's failure, located at the step it was in (the message's step), else at the file."""
    return rank_error(job, progress[rank], f"rank {rank} of {job.world}: {what}")


def _last_line(text: str) -> str:
    """The exception's own line from a rank's traceback ('ValueError: …')."""
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1].strip() if lines else "failed"


def _stop(context) -> None:
    """Every rank's process ended and reaped (kill is a no-op on one that has exited)."""
    for process in context.processes:
        if process.is_alive():
            process.kill()
    for process in context.processes:
        process.join()
