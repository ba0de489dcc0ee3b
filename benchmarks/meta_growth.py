"""Shapes-only runs (``--device meta``) of an N-layer stack of the bundled encoder layer, at toy
dims and at a 70B-class layer's (d 8192, 64 heads, T 4096), N from 125 to 1,000.

For each N it prints the plan build (kernels compiled, lifetimes known), a run (every record of
every layer; the plan and the drawn tensors reused) and their cost per layer, in wall and CPU
time, then the growth exponent fitted over every N (1.0 is linear), and what a plan of the
largest N holds in memory (tracemalloc). The sizes run interleaved round by round
(benchmarks/measure.py), so load on the machine hits them alike; each target line gives the
median with its 95% bootstrap interval. Targets: a run ≤ 0.2 ms a layer, both exponents
≤ 1.05 (a line per target says met or NOT MET). The same stack with ``meta_kernels=True`` (torch's
meta kernel for every step) is timed at the smallest N, for comparison. Prints; asserts nothing.

    .venv/bin/python benchmarks/meta_growth.py [--layers 125 250 500 1000] [--rounds 9]
"""

from __future__ import annotations

import argparse
import gc
import sys
import tempfile
import tracemalloc
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from growth import layer_stacks  # noqa: E402
from measure import growth, interleaved, target_line, times  # noqa: E402

import tracer  # noqa: E402
from tracer.runtime.interpreter import Plan  # noqa: E402

RUN_MS_PER_LAYER, EXPONENT = 0.2, 1.05
SIZES = {"toy": {"B": 2, "T": 8, "d_model": 16, "H": 4}, "70B-class": {"B": 1, "T": 4096, "d_model": 8192, "H": 64}}


def measure(paths: dict[int, Path], dims: dict, rounds: int, meta_kernels: bool = False) -> tuple[dict, dict]:
    """Samples of the plan build and of a run on the meta device, per layer count, the counts
    interleaved round by round."""
    pipelines = {n: tracer.load(path) for n, path in paths.items()}
    analyses = {n: pipeline.check(dims) for n, pipeline in pipelines.items()}
    # the previous dims' pipelines are garbage (cycles), and the analyses just built were made with
    # the collector paused: one full pass now, so that it does not land inside a timed build
    gc.collect()
    builds = interleaved({n: lambda a=a: Plan(a, "meta", meta_kernels=meta_kernels) for n, a in analyses.items()}, rounds)
    for pipeline in pipelines.values():  # plan and drawn tensors, kept for the runs below
        pipeline.run(dims, device="meta", meta_kernels=meta_kernels)
    runs = interleaved({n: lambda p=p: p.run(dims, device="meta", meta_kernels=meta_kernels) for n, p in pipelines.items()}, rounds)
    return builds, runs


def plan_memory(path: Path, dims: dict) -> tuple[int, int]:
    """Bytes a plan of the pipeline keeps, and its build's peak (tracemalloc; the analysis built,
    and a first plan filled its caches, before tracing starts)."""
    analysis = tracer.load(path).check(dims)
    Plan(analysis, "meta")
    tracemalloc.start()
    try:
        plan = Plan(analysis, "meta")
        retained, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    del plan
    return retained, peak


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, nargs="+", default=[125, 250, 500, 1000])
    parser.add_argument("--rounds", type=int, default=9)
    args = parser.parse_args(argv)
    paths = layer_stacks(args.layers, Path(tempfile.mkdtemp(prefix="tracer-meta-")))
    tracer.load(paths[min(paths)]).run(SIZES["toy"], device="meta")  # warm: torch's first meta triu imports dynamo
    for size, dims in SIZES.items():
        print(f"\n{size}: {', '.join(f'{k}={v}' for k, v in dims.items())}  (medians of {args.rounds} interleaved rounds)")
        print(f"{'layers':>7}{'plan build':>13}{'per layer':>12}{'CPU':>11}{'run':>11}{'per layer':>12}{'CPU':>11}")
        builds, runs = measure(paths, dims, args.rounds)
        for n in paths:
            build, run = times(builds[n]).median, times(runs[n]).median
            build_cpu, run_cpu = times(builds[n], "cpu").median, times(runs[n], "cpu").median
            print(
                f"{n:>7}{build * 1e3:>10.1f} ms{build / n * 1e3:>9.3f} ms{build_cpu / n * 1e3:>8.3f} ms"
                f"{run * 1e3:>8.1f} ms{run / n * 1e3:>9.3f} ms{run_cpu / n * 1e3:>8.3f} ms"
            )
        largest = max(paths)
        per_layer = 1e3 / largest
        print(
            target_line(
                f"{size} run per layer at {largest} layers",
                times(runs[largest]),
                RUN_MS_PER_LAYER,
                " ms",
                per_layer,
                times(runs[largest], "cpu"),
            )
        )
        print(target_line(f"{size} plan build growth exponent", growth(builds), EXPONENT, cpu=growth(builds, "cpu")))
        print(target_line(f"{size} run growth exponent", growth(runs), EXPONENT, cpu=growth(runs, "cpu")))
        retained, peak = plan_memory(paths[largest], dims)
        print(
            f"plan memory at {largest} layers (tracemalloc): {retained / largest / 1e3:.1f} kB a layer kept, {peak / largest / 1e3:.1f} kB peak"
        )
        n = min(paths)
        _, kernels = measure({n: paths[n]}, dims, 1, meta_kernels=True)
        took = kernels[n][0].wall
        print(f"meta_kernels=True at {n} layers: run {took * 1e3:.1f} ms, {took / n * 1e3:.3f} ms a layer")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
