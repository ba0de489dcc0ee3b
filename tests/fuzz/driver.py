"""The campaign: generate cases by seed and index, run each through the oracle, report crashes, hangs and the share of each outcome."""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
import time
import traceback
from pathlib import Path

from tests.fuzz.folders import RUNNERS
from tests.fuzz.generators import STRATEGIES, pick_strategy
from tests.fuzz.oracle import Outcome, run_case
from tests.fuzz.pairs import run_pair
from tests.fuzz.pools import known_ops

MEMORY_LIMIT = 8 * 1024**3  # address space of a campaign (torch itself reserves about 1 GiB)


def make_case(seed: int | str, index: int) -> tuple[str, bytes, random.Random]:
    rng = random.Random(f"{seed}:{index}")
    strategy = pick_strategy(rng)
    return strategy, STRATEGIES[strategy][0](rng), rng


def run_one(seed: int | str, index: int, folder: Path) -> tuple[str, bytes, Outcome]:
    """Case ``index``, generated and judged; a generator that fails is a crash of the campaign too."""
    try:
        strategy, data, rng = make_case(seed, index)
    except Exception as exc:
        return "generator", b"", Outcome("crash", f"the generator failed: {type(exc).__name__}: {exc}\n{traceback.format_exc(limit=-6)}")
    if strategy == "diff":  # a pair of files, not one
        return strategy, data, run_pair(data, folder, rng)
    if strategy in RUNNERS:  # a folder, not a pipeline file: its own runner and oracles
        return strategy, data, RUNNERS[strategy](data, folder)
    return strategy, data, run_case(data, folder, rng, cpu=True, cli=rng.random() < 0.08)  # every small runnable case runs for real


def limit_memory(limit: int = MEMORY_LIMIT) -> None:
    """Cap the address space, so a case that allocates without bound fails with MemoryError (a crash
    the campaign reports) instead of waking the OOM killer on a shared machine."""
    try:
        import resource

        soft, hard = resource.getrlimit(resource.RLIMIT_AS)
        if soft == resource.RLIM_INFINITY or soft > limit:
            resource.setrlimit(resource.RLIMIT_AS, (limit if hard == resource.RLIM_INFINITY else min(limit, hard), hard))
    except (ImportError, ValueError, OSError):
        pass


class Progress:
    """One status line on stderr, rewritten at most a few times a second, only when stderr is a terminal."""

    def __init__(self, total: int, stream=None):
        self.stream = stream or sys.stderr
        self.total, self.shown = total, 0.0
        self.live = self.stream.isatty()

    def update(self, done: int, counts: dict[str, int], started: float) -> None:
        now = time.monotonic()
        if not self.live or (now - self.shown < 0.25 and done < self.total):
            return
        self.shown = now
        rate = done / max(now - started, 1e-9)
        line = (
            f"{done}/{self.total} cases, {counts.get('crash', 0)} crashes, {counts.get('hang', 0)} hangs, "
            f"valid {_percent(counts.get('ran', 0), done)}, {rate:.1f} cases/s"
        )
        self.stream.write("\r" + line + "\x1b[K" + ("\n" if done == self.total else ""))
        self.stream.flush()


def campaign(n: int, seed: int | str = 0, start: int = 0, show: bool = False, report: int = 3, out=None, progress=None) -> int:
    out = out or sys.stdout
    progress = progress or Progress(n)
    known_ops()
    import tracer  # noqa: F401  (import torch and friends before the clock starts)
    import tracer.runtime.interpreter  # noqa: F401

    tracer.runtime.interpreter.torch_module()
    counts: dict[str, int] = {}
    ran: dict[str, list[int]] = {}  # strategy -> [cases that ran, cases]
    failures: list[tuple[int, str, bytes, Outcome]] = []
    ratios: list[float] = []  # memory estimate / measured peak of each real run
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="tracer-fuzz-") as tmp:
        folder = Path(tmp)
        for index in range(start, start + n):
            strategy, data, outcome = run_one(seed, index, folder)
            counts[outcome.kind] = counts.get(outcome.kind, 0) + 1
            if outcome.ratio is not None:
                ratios.append(outcome.ratio)
            progress.update(index - start + 1, counts, started)
            tally = ran.setdefault(strategy, [0, 0])
            tally[0] += outcome.kind == "ran"
            tally[1] += 1
            if show:
                print(
                    f"--- case {index} ({strategy}): {outcome.kind}\n{data.decode('utf-8', 'replace')[:4000]}\n{outcome.detail}", file=out
                )
            if outcome.kind in ("crash", "hang"):
                failures.append((index, strategy, data, outcome))
    crashes = sum(1 for f in failures if f[3].kind == "crash")
    hangs = len(failures) - crashes
    for index, strategy, data, outcome in failures[:report]:
        print(
            f"\n=== {outcome.kind}: case {index} of seed {seed} ({strategy}); replay: python -m tests.fuzz 1 --seed {seed} --start {index} --show",
            file=out,
        )
        print(data.decode("utf-8", "replace")[:3000], file=out)
        print(outcome.detail, file=out)
    for index, strategy, _, outcome in failures:  # every failure, one line each
        print(f"{outcome.kind}: case {index} ({strategy}): {outcome.detail.splitlines()[0][:300] if outcome.detail else ''}", file=out)
    elapsed = time.monotonic() - started
    detail = ", ".join(f"{k} {v}" for k, v in sorted(counts.items()))
    print(f"{n} cases, {crashes} crashes, {hangs} hangs ({detail}; {elapsed:.0f} s)", file=out)
    print(_shares(counts, ran, n), file=out)
    print(_ratios(ratios), file=out)
    return 1 if failures else 0


def _ratios(ratios: list[float]) -> str:
    """The distribution of estimate / measured peak over the real runs (the oracle fails any below 1)."""
    if not ratios:
        return "memory estimate / measured peak: no real runs"
    ordered = sorted(ratios)

    def at(q: float) -> float:
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))]

    exact = sum(r == 1.0 for r in ordered)
    return (
        f"memory estimate / measured peak over {len(ordered)} real runs: min {ordered[0]:.3f}, median {at(0.5):.3f}, "
        f"p90 {at(0.9):.3f}, p99 {at(0.99):.3f}, max {ordered[-1]:.3f}; exact in {_percent(exact, len(ordered))}"
    )


def _percent(part: int, whole: int) -> str:
    return f"{100 * part / whole:.0f}%" if whole else "-"


def _shares(counts: dict[str, int], ran: dict[str, list[int]], n: int) -> str:
    """How much of the campaign got past validation: a strategy whose cases never run only tests the loader."""
    per_strategy = ", ".join(f"{name} {_percent(done, total)} of {total}" for name, (done, total) in sorted(ran.items()))
    return (
        f"valid and ran: {_percent(counts.get('ran', 0), n)}; located errors: {_percent(counts.get('invalid', 0), n)}; "
        f"ran, by strategy: {per_strategy}"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.fuzz", description="Fuzz the whole pipeline with hostile and mutated files.")
    parser.add_argument("n", type=int, nargs="?", default=1000, help="number of cases (default 1000)")
    parser.add_argument("--seed", default="0", help="campaign seed (default 0)")
    parser.add_argument("--start", type=int, default=0, help="index of the first case (to replay one)")
    parser.add_argument("--show", action="store_true", help="print every case and its outcome")
    args = parser.parse_args(argv)
    limit_memory()
    return campaign(args.n, args.seed, args.start, args.show)
