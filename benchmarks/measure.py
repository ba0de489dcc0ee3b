"""The one timing loop of benchmarks/, and the statistics every target is judged on.

On a shared 2-core VM one call can take ±20% of another's time for reasons that have nothing to
do with the code: another process holds a core, the allocator trims, the CPU clock moves. So the
variants a target compares run interleaved, many short rounds (A B C, B C A, C A B, …: no variant
always runs right after the same other one), and a ratio is taken per round, where load hits both
sides alike. A target is judged on the median of the per-round ratios (or, for growth, on the
slope fitted to the per-size medians), printed with a 95% bootstrap confidence interval over the
rounds and with CPU time (``time.process_time``: the work itself, not the wait for a core) beside
wall time.
"""

from __future__ import annotations

import math
import random
import resource
import statistics
import time
from collections.abc import Callable, Hashable, Mapping
from typing import NamedTuple

RESAMPLES = 2000  # bootstrap resamples: the interval's ends move by well under 1% between seeds
LEVEL = 0.95


class Sample(NamedTuple):
    """One round of one variant, per call."""

    wall: float  # seconds (time.perf_counter)
    cpu: float  # seconds of CPU time of the whole process, every thread (time.process_time)
    faults: float  # minor page faults


def interleaved(calls: Mapping[Hashable, Callable[[], object]], rounds: int, per_round: int = 1) -> dict[Hashable, list[Sample]]:
    """Each variant's samples, the variants interleaved round by round in a rotated order; a
    sample is the mean of ``per_round`` back-to-back calls (many for calls of microseconds)."""
    names = list(calls)
    samples: dict[Hashable, list[Sample]] = {name: [] for name in names}
    for r in range(rounds):
        start = r % len(names)
        for name in names[start:] + names[:start]:
            call = calls[name]
            faults, cpu, wall = _faults(), time.process_time(), time.perf_counter()
            for _ in range(per_round):
                call()
            wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
            samples[name].append(Sample(wall / per_round, cpu / per_round, (_faults() - faults) / per_round))
    return samples


def repeated(call: Callable[[], object], rounds: int, field: str = "wall") -> Summary:
    """One variant alone (nothing to compare it with), ``rounds`` times: its time per call."""
    return times(interleaved({0: call}, rounds)[0], field)


def _faults() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


class Summary(NamedTuple):
    """A median with its spread: min-max, interquartile range and a bootstrap interval."""

    median: float
    low: float  # the confidence interval of the median
    high: float
    q1: float
    q3: float
    min: float
    max: float
    n: int

    def as_dict(self) -> dict:
        return self._asdict()


def summary(values: list[float], seed: int = 0) -> Summary:
    ordered = sorted(values)
    q1, _, q3 = statistics.quantiles(ordered, n=4, method="inclusive") if len(ordered) > 1 else (ordered[0],) * 3
    low, high = bootstrap(ordered, statistics.median, seed)
    return Summary(statistics.median(ordered), low, high, q1, q3, ordered[0], ordered[-1], len(ordered))


def bootstrap(values: list, statistic: Callable[[list], float], seed: int = 0) -> tuple[float, float]:
    """The central ``LEVEL`` interval of ``statistic`` over resamples of ``values`` (percentile bootstrap)."""
    rng = random.Random(seed)
    estimates = sorted(statistic(rng.choices(values, k=len(values))) for _ in range(RESAMPLES))
    tail = (1 - LEVEL) / 2
    return estimates[int(tail * RESAMPLES)], estimates[min(RESAMPLES - 1, int((1 - tail) * RESAMPLES))]


def ratios(samples: dict[Hashable, list[Sample]], name: Hashable, base: Hashable, field: str = "wall") -> Summary:
    """The per-round ratio of ``name`` to ``base`` (both from one :func:`interleaved` run)."""
    return summary([getattr(a, field) / getattr(b, field) for a, b in zip(samples[name], samples[base])])


def times(samples: list[Sample], field: str = "wall") -> Summary:
    return summary([getattr(s, field) for s in samples])


def slope(sizes: list[float], seconds: list[float]) -> float:
    """The least-squares exponent k of seconds ~ size**k (1.0: linear), over every size."""
    xs, ys = [math.log(n) for n in sizes], [math.log(s) for s in seconds]
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)


def growth(samples: Mapping[int, list[Sample]], field: str = "wall") -> Summary:
    """The growth exponent fitted to each size's median, with its spread: the interval is the
    exponent's over resampled rounds (a round keeps all its sizes together, as they ran), the
    quartiles and min-max those of the exponents of single rounds."""
    sizes = sorted(samples)
    rounds = [[getattr(samples[n][r], field) for n in sizes] for r in range(min(len(samples[n]) for n in sizes))]

    def fitted(chosen: list[list[float]]) -> float:
        return slope(sizes, [statistics.median(column) for column in zip(*chosen)])

    low, high = bootstrap(rounds, fitted)
    single = sorted(slope(sizes, row) for row in rounds)
    q1, _, q3 = statistics.quantiles(single, n=4, method="inclusive") if len(single) > 1 else (single[0],) * 3
    return Summary(fitted(rounds), low, high, q1, q3, single[0], single[-1], len(rounds))


def verdict(measured: Summary, limit: float, scale: float = 1.0) -> str:
    """``met`` or ``NOT MET``, judged on the median (times ``scale``: the limit's unit); the
    interval says whether this machine's noise could flip it."""
    median, low, high = (value * scale for value in (measured.median, measured.low, measured.high))
    met = "met" if median <= limit else "NOT MET"
    return met if high <= limit or low > limit else f"{met} (the interval straddles the limit: within noise)"


def target_line(what: str, measured: Summary, limit: float, unit: str = "", scale: float = 1.0, cpu: Summary | None = None) -> str:
    """``target: WHAT VALUE (target <= LIMIT) met|NOT MET; spread``, the line benchmarks/run.py
    reads into its table; ``unit`` as written after a number (``x``, `` ms``), ``scale`` from
    the measured seconds to it."""

    def show(value: float) -> str:
        return f"{value * scale:.3f}{unit}"

    spread = f"95% CI {show(measured.low)}-{show(measured.high)}, IQR {show(measured.q1)}-{show(measured.q3)}, {measured.n} rounds"
    if cpu is not None:
        spread += f"; CPU time {show(cpu.median)} (CI {show(cpu.low)}-{show(cpu.high)})"
    return f"target: {what} {show(measured.median)} (target <= {limit}{unit}) {verdict(measured, limit, scale)}; {spread}"
