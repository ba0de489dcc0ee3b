"""Shapes-only runs (``--device meta``) of an N-layer stack of the bundled encoder layer, at toy
dims and at a 70B-class layer's (d 8192, 64 heads, T 4096), N from 125 to 1,000.

For each N it prints the plan build (kernels compiled, lifetimes known), a run (every record of
every layer; the plan and the drawn tensors reused) and their cost per layer, then the growth
exponent from the smallest N to the largest (1.0 is linear). Targets: a run ≤ 0.2 ms a layer,
both exponents ≤ 1.05 (a line per target says met or NOT MET). The same stack with ``meta_kernels=True`` (torch's meta kernel for every
step) is timed at the smallest N, for comparison. Prints; asserts nothing.

    .venv/bin/python benchmarks/meta_growth.py [--layers 125 250 500 1000] [--rounds 3]
"""

from __future__ import annotations

import argparse
import gc
import math
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from growth import layer_stacks  # noqa: E402

import tracer  # noqa: E402
from tracer.runtime.interpreter import Plan  # noqa: E402

RUN_MS_PER_LAYER, EXPONENT = 0.2, 1.05
SIZES = {"toy": {"B": 2, "T": 8, "d_model": 16, "H": 4}, "70B-class": {"B": 1, "T": 4096, "d_model": 8192, "H": 64}}


def timed(fn, rounds: int) -> float:
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def measure(path: Path, dims: dict, rounds: int, meta_kernels: bool = False) -> tuple[float, float]:
    """(plan build seconds, run seconds) on the meta device."""
    pipeline = tracer.load(path)
    analysis = pipeline.check(dims)
    # the previous size's pipeline is garbage (cycles), and the analysis just built was made with the
    # collector paused: one full pass now, so that it does not land inside a timed build of this size
    gc.collect()
    build = timed(lambda: Plan(analysis, "meta", meta_kernels=meta_kernels), rounds)
    pipeline.run(dims, device="meta", meta_kernels=meta_kernels)  # plan and drawn tensors, kept for the runs below
    run = timed(lambda: pipeline.run(dims, device="meta", meta_kernels=meta_kernels), rounds)
    return build, run


def _target(what: str, value: float, limit: float, unit: str = "") -> None:
    print(
        f"target: {what} {value:.3f}{unit and ' ' + unit} (target <= {limit}{unit and ' ' + unit}) {'met' if value <= limit else 'NOT MET'}"
    )


def exponent(seconds: dict[int, float]) -> float:
    small, large = min(seconds), max(seconds)
    return math.log(seconds[large] / seconds[small]) / math.log(large / small)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, nargs="+", default=[125, 250, 500, 1000])
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    paths = layer_stacks(args.layers, Path(tempfile.mkdtemp(prefix="tracer-meta-")))
    tracer.load(paths[min(paths)]).run(SIZES["toy"], device="meta")  # warm: torch's first meta triu imports dynamo
    for size, dims in SIZES.items():
        print(f"\n{size}: {', '.join(f'{k}={v}' for k, v in dims.items())}")
        print(f"{'layers':>7}{'plan build':>13}{'per layer':>12}{'run':>11}{'per layer':>12}")
        builds, runs = {}, {}
        for n, path in paths.items():
            builds[n], runs[n] = measure(path, dims, args.rounds)
            print(f"{n:>7}{builds[n] * 1e3:>10.1f} ms{builds[n] / n * 1e3:>9.3f} ms{runs[n] * 1e3:>8.1f} ms{runs[n] / n * 1e3:>9.3f} ms")
        print(f"growth exponent {min(paths)} -> {max(paths)} layers: plan build {exponent(builds):.2f}, run {exponent(runs):.2f}")
        largest = max(paths)
        _target(f"{size} run per layer at {largest} layers", runs[largest] / largest * 1e3, RUN_MS_PER_LAYER, "ms")
        _target(f"{size} plan build growth exponent", exponent(builds), EXPONENT)
        _target(f"{size} run growth exponent", exponent(runs), EXPONENT)
        n = min(paths)
        _, kernels = measure(paths[n], dims, 1, meta_kernels=True)
        print(f"meta_kernels=True at {n} layers: run {kernels * 1e3:.1f} ms, {kernels / n * 1e3:.3f} ms a layer")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
