"""The oracle: take one case file through everything a user can reach; only a success or a located TracerError may come out."""

from __future__ import annotations

import contextlib
import functools
import io
import json
import random
import re
import shutil
import signal
import traceback
from dataclasses import dataclass
from pathlib import Path

from tests.fuzz.pools import PIPELINES

# Of CPU time (see time_limit); the 48-layer stack through everything (meta runs, a CPU run with
# values, its JSON and DOT) legitimately takes up to about 7 s of it on a loaded 2-core machine.
CASE_SECONDS = 15.0
CPU_RUN_BYTES = 4 * 1024 * 1024  # run for real only when every tensor together fits in this
EXPORT_SHARE = 0.4  # of the real runs, how many also export the pipeline and compare the module with the run


class Hang(BaseException):
    """A case ran past ``CASE_SECONDS`` (BaseException, so no ``except Exception`` swallows it)."""


class OracleFailure(AssertionError):
    """An outcome that is neither a success nor a well-formed TracerError."""


WALL_FACTOR = 10  # wall-clock limit, in CPU-time limits


@contextlib.contextmanager
def time_limit(seconds: float):
    if not hasattr(signal, "setitimer"):
        yield
        return

    def _alarm(signum, frame):
        raise Hang(f"case ran longer than {seconds} s")

    # a busy loop shows in CPU time, which a loaded CI machine does not inflate; a blocked read
    # (a FIFO) burns none, so a generous wall-clock limit catches that
    timers = ((signal.SIGPROF, signal.ITIMER_PROF, seconds), (signal.SIGALRM, signal.ITIMER_REAL, WALL_FACTOR * seconds))
    previous = [signal.signal(sig, _alarm) for sig, _, _ in timers]
    for _, timer, limit in timers:
        signal.setitimer(timer, limit)
    try:
        yield
    finally:
        for (sig, timer, _), handler in zip(timers, previous):
            signal.setitimer(timer, 0)
            signal.signal(sig, handler)


def check_lines(text: str, file: str) -> None:
    """Every line starts ``FILE:LINE:COL: `` or ``FILE: `` (the oracle for every message)."""
    if not text:
        raise OracleFailure("an empty error message")
    # a block's own errors point into its file, which sits under the case's folder
    blocks = re.escape(str(Path(file).parent / "blocks")) + r"/[^:\n]+\.yaml"
    located = re.compile(f"(?:{re.escape(file)}|{blocks})" + r"(:[1-9]\d*:[1-9]\d*)?: ")
    for line in text.splitlines() or [text]:
        if not located.match(line):
            raise OracleFailure(f"message line does not start '{file}:LINE:COL: ': {line[:200]!r}")


@dataclass
class Outcome:
    kind: str  # "ran", "invalid" (located errors), "crash", "hang"
    detail: str = ""
    ratio: float | None = None  # memory estimate / measured peak of the real run, when one ran


@functools.cache
def warm_up() -> None:
    """Run a bundled pipeline on meta and CPU, watched, once per process before any time limit:
    torch imports modules on first use (torch._dynamo, seconds on a loaded machine), and a time
    limit that interrupts an import leaves it half-initialised for every later case."""
    from tracer.api import load

    pipeline = load(PIPELINES / "causal_mha.yaml")
    pipeline.run(device="meta", observe=layout_into({}))
    _real_runs(pipeline, random.Random(0))


def run_case(data: bytes, folder: Path, rng, cpu: bool = True, cli: bool = False) -> Outcome:
    """Take one file through everything; ``crash``/``hang`` outcomes carry a traceback."""
    from tracer.core.errors import TracerError

    warm_up()
    path = folder / "case.yaml"
    path.write_bytes(data)
    if not (folder / "blocks").exists():  # the bundled pipelines' includes resolve beside the case
        shutil.copytree(PIPELINES / "blocks", folder / "blocks")
    try:
        with time_limit(CASE_SECONDS):
            kind, ratio = _exercise(path, rng, cpu)
            if cli:
                _exercise_cli(path, rng)
        return Outcome(kind, ratio=ratio)
    except Hang as exc:
        return Outcome("hang", f"{exc}\n{traceback.format_exc(limit=-8)}")
    except TracerError as exc:  # escaped from somewhere the oracle did not expect it: still fine if located
        try:
            check_lines(str(exc), str(path))
        except OracleFailure as bad:
            return Outcome("crash", f"OracleFailure: {bad}")
        return Outcome("invalid")
    except Exception as exc:
        return Outcome("crash", f"{type(exc).__name__}: {exc}\n{traceback.format_exc(limit=-12)}")


def _exercise(path: Path, rng, cpu: bool) -> tuple[str, float | None]:
    """The outcome's kind, and the estimate/peak ratio of the real run (None when none ran)."""
    from tracer.api import Pipeline
    from tracer.core.errors import TracerError
    from tracer.spec.load import load_spec

    name = str(path)
    try:
        pipeline = Pipeline(*load_spec(path))
    except TracerError as exc:
        check_lines(str(exc), name)
        return "invalid", None
    analysis = pipeline.check()
    for d in analysis.diagnostics:
        check_lines(str(d), name)
    if analysis.errors:
        try:
            pipeline.run(device="meta")
        except TracerError as exc:
            check_lines(str(exc), name)
            return "invalid", None
        raise OracleFailure("a pipeline with static errors ran")
    kind, ratio = "ran", None
    for attempt in _dims_to_try(analysis, rng):
        seen: dict[str, tuple] = {}
        try:
            trace = pipeline.run(dims=attempt, device="meta", observe=layout_into(seen))
        except TracerError as exc:
            check_lines(str(exc), name)
            kind = "invalid" if not attempt else kind
            continue
        check_prediction(trace, seen)
        str(trace)
        json.loads(trace.to_json())
        if rng.random() < 0.3:
            _render(trace, rng)
        if cpu and not attempt and _small(trace.analysis):
            try:
                ratio = _real_runs(pipeline, rng)
                if rng.random() < EXPORT_SHARE:
                    _export_matches(pipeline)
            except TracerError as exc:
                check_lines(str(exc), name)
    return kind, ratio


def layout_into(seen: dict[str, tuple]):
    """An ``observe`` hook that keeps what torch made of each tensor (never the tensor itself)."""

    def observe(record_id: str, tensor) -> None:
        seen[record_id] = (tuple(tensor.shape), tuple(tensor.stride()), tensor.storage_offset(), str(tensor.dtype), tensor.is_contiguous())

    return observe


def check_prediction(trace, seen: dict[str, tuple]) -> None:
    """Every record is what the static analysis predicted (shape, stride, offset, dtype, contiguity,
    storage owner), and so is every tensor torch made (``seen``, from the run's ``observe``).

    Strides are compared where they mean something: not on dims of size 1, and not in tensors of
    no elements (nor their storage offset). There torch's own kernels disagree between devices (meta and CPU allocate a
    (2, 1, 1, 3) masked_fill or a (0, 1, 5, 4, 8) linear result with different strides), so no
    static prediction can match both; contiguity, which ignores them, is compared everywhere.
    """
    metas = trace.analysis.metas
    differs = False
    for record in trace.records:
        meta = metas[record.id]
        owner = None if meta.root in (None, record.id) else meta.root
        predicted = (meta.sizes, _strides(meta.sizes, meta.stride), _offset(meta.sizes, meta.offset), meta.dtype, meta.contiguous, owner)
        found = (
            record.shape,
            _strides(record.shape, record.stride),
            _offset(record.shape, record.storage_offset),
            record.dtype,
            record.contiguous,
            record.view_of,
        )
        differs |= (meta.stride, meta.offset, meta.dtype, owner) != (record.stride, record.storage_offset, record.dtype, record.view_of)
        made = seen.get(record.id)
        if made is not None:
            made = (made[0], _strides(made[0], made[1]), _offset(made[0], made[2]), made[3].removeprefix("torch."), made[4], owner)
        if predicted != found or made not in (None, predicted):
            fields = "(shape, stride, offset, dtype, contiguous, view_of)"
            raise OracleFailure(
                f"record '{record.id}' ({record.op}): predicted {fields} = {predicted}, the record says {found}"
                + (f", torch made {made}" if made is not None else "")
            )
    if differs == trace.as_predicted:
        raise OracleFailure(f"the run says as_predicted={trace.as_predicted}, but its records {'differ' if differs else 'do not'}")


def _offset(sizes: tuple[int, ...], offset: int) -> int | None:
    return None if 0 in sizes else offset


def _strides(sizes: tuple[int, ...], strides: tuple[int, ...]) -> tuple:
    """The strides that carry layout: None for a dim of size 1, and for every dim of an empty tensor."""
    if 0 in sizes:
        return (None,) * len(sizes)
    return tuple(None if size == 1 else stride for size, stride in zip(sizes, strides))


def _real_runs(pipeline, rng) -> float | None:
    """A real CPU run watched op by op: its layouts must be as predicted, and the memory estimate
    must bound its measured peak. Returns estimate / peak. Sometimes also a run that keeps values."""
    from tests.measure import PeakStorage

    pipeline._tensors.clear()  # the inputs are created inside the watched run
    seen: dict[str, tuple] = {}
    peaks: list[tuple[int, str]] = []  # (peak so far, record) after each record: where the peak was reached
    watch = layout_into(seen)

    def observe(record_id: str, tensor) -> None:
        watch(record_id, tensor)
        peaks.append((mode.peak, record_id))

    with PeakStorage() as mode:
        trace = pipeline.run(observe=observe)
    check_prediction(trace, seen)
    estimate = trace.analysis.memory.peak_bytes
    if mode.peak > estimate:
        during = next((rid for peak, rid in peaks if peak == mode.peak), "the end")
        raise OracleFailure(
            f"the memory estimate {estimate} B (peak at step '{trace.analysis.memory.peak_step}') is below the "
            f"measured peak {mode.peak} B (reached by '{during}')"
        )
    if rng.random() < 0.5:
        json.loads(pipeline.run(keep_values=True).to_json(values=True))
    return estimate / mode.peak if mode.peak else None


def _export_matches(pipeline) -> None:
    """``tracer export``'s module (checked token by token as it is written) computes the run: same
    state_dict keys and params from the same seed, same outputs; or the export is refused, located."""
    from tests.exporting import check_export

    trace = pipeline.run(keep_values=True)
    try:
        check_export(pipeline, trace)
    except AssertionError as exc:
        raise OracleFailure(f"the exported module does not compute the run: {exc}") from None


def _dims_to_try(analysis, rng) -> list[dict]:
    """The declared dims, and sometimes one base dim forced to a degenerate or huge value."""
    attempts: list[dict] = [{}]
    base = [n for n, text in analysis.pipeline.dims.items() if isinstance(text, int) or str(text).strip().lstrip("-").isdigit()]
    if base and rng.random() < 0.3:
        attempts.append({rng.choice(base): rng.choice([0, 1, 1, 3, 2**31, 2**62, 2**62 + 1, -1])})
    return attempts


def _small(analysis) -> bool:
    total = 0
    for meta in analysis.metas.values():
        total += meta.nbytes
        if total > CPU_RUN_BYTES:
            return False
    return True


def _render(trace, rng) -> None:
    """The full diagram, and one collapsed by some of its groups, their path prefixes or globs."""
    from tracer.core.errors import TracerError
    from tracer.presentation.diagram import dot_source

    dot_source(trace)
    groups = sorted({s.group for s in trace.analysis.pipeline.steps if s.group})
    candidates = groups + [g.rsplit("/", 1)[0] for g in groups] + [g[:1] + "*" for g in groups] + ["*", "*/*", "[", "x/*"]
    try:
        dot_source(trace, rng.sample(candidates, min(len(candidates), rng.randint(1, 3))))
    except TracerError as exc:
        check_lines(str(exc), trace.analysis.source.file)


def cli(argv: list[str]) -> tuple[int, str, str]:
    """``tracer ARGV`` in this process: its exit status, stdout and stderr."""
    from tracer.cli import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(argv)
        except SystemExit as exc:  # argparse usage errors
            code = exc.code
    return code, out.getvalue(), err.getvalue()


def _exercise_cli(path: Path, rng) -> None:
    name = str(path)
    commands = [["check", name], ["run", name, "--device", "meta", "--json"]]
    if rng.random() < 0.3:
        commands.append(["run", name, "--device", "meta", "--dim", f"{rng.choice(['T', 'B', 'H', 'x'])}={rng.choice([0, 1, 2**62])}"])
    for argv in commands:
        code, _, err = cli(argv)
        if code not in (0, 1, 2):
            raise OracleFailure(f"`tracer {' '.join(argv)}` exited {code}: {err[-2000:]}")
        if code == 1:
            try:
                check_lines(err, name)
            except OracleFailure as bad:
                raise OracleFailure(f"`tracer {' '.join(argv)}`: {bad}") from None
