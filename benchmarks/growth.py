"""How check and export grow with the size of a pipeline: a chain of steps, steps nothing reads
(dead fan-out), and derived dims declared last-first (the deepest walk there is). Every column
should stay near constant per item as n doubles; a quadratic step shows up as a column that
doubles. Then `tracer.load` (load + check) of pipelines/encoder_stack.yaml at 96, 192 and 384
layers, torch imported as in a notebook, the counts interleaved round by round
(benchmarks/measure.py): each doubling should cost about twice as much (target: 384 layers within
2.2x of 192, the median of per-round ratios). Prints tables; asserts nothing (speed is measured here, never in
the unit tests).

    .venv/bin/python benchmarks/growth.py [--sizes 1000 2000 4000 8000] [--layers 96 192 384]
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from measure import interleaved, ratios, target_line, times  # noqa: E402

import tracer  # noqa: E402
from tracer.presentation.export import export_source  # noqa: E402

DOUBLING = 2.2  # load + check of twice the layers, at most this many times as long
HEAD = ["dims: {B: 1, D: 4}", "inputs:", "  x: {shape: [B, D], init: randn}", "steps:"]


def chain(n: int) -> str:
    steps = [f"  - {{id: s{i}, op: tanh, input: {'x' if i == 0 else f's{i - 1}'}}}" for i in range(n)]
    return "\n".join(["name: chain", *HEAD, *steps]) + "\n"


def fan_out(n: int) -> str:
    return "\n".join(["name: fan", *HEAD, *(f"  - {{id: s{i}, op: tanh, input: x}}" for i in range(n))]) + "\n"


def reversed_dims(n: int) -> str:
    dims = [f"  d{i}: d{i - 1} + 1" for i in range(n - 1, 0, -1)] + ["  d0: 1"]
    return (
        "\n".join(
            [
                "name: dims",
                "dims:",
                *dims,
                "inputs:",
                f"  x: {{shape: [d{n - 1}], init: randn}}",
                "steps:",
                "  - {id: y, op: tanh, input: x}",
            ]
        )
        + "\n"
    )


def per_item_us(text: str, n: int, folder: Path) -> tuple[float, float]:
    """Microseconds per item for load + check, and for export."""
    path = folder / "p.yaml"
    path.write_text(text)
    start = time.perf_counter()
    pipeline = tracer.load(path)
    checked = time.perf_counter()
    export_source(pipeline)
    done = time.perf_counter()
    return (checked - start) / n * 1e6, (done - checked) / n * 1e6


def layer_stacks(counts: list[int], folder: Path) -> dict[int, Path]:
    """pipelines/encoder_stack.yaml with ``repeat: n`` for each n, beside a copy of its block files."""
    shutil.copytree(ROOT / "pipelines" / "blocks", folder / "blocks", dirs_exist_ok=True)
    text = (ROOT / "pipelines" / "encoder_stack.yaml").read_text()
    paths = {}
    for n in counts:
        paths[n] = folder / f"stack_{n}.yaml"
        paths[n].write_text(text.replace("repeat: 48", f"repeat: {n}"))
    return paths


def load_seconds(paths: dict[int, Path], rounds: int) -> dict:
    """Samples (benchmarks/measure.py) of ``tracer.load`` (YAML, validation, block expansion, check)
    per layer count, the counts interleaved round by round so that load on the machine hits them alike."""
    import torch  # noqa: F401  (its objects are what a collector pass over the whole process also walks)

    tracer.load(paths[min(paths)])  # warm up
    return interleaved({n: lambda path=path: tracer.load(path) for n, path in paths.items()}, rounds)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[1000, 2000, 4000, 8000])
    parser.add_argument("--layers", type=int, nargs="+", default=[96, 192, 384])
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args(argv)
    folder = Path(tempfile.mkdtemp(prefix="tracer-growth-"))
    per_item_us(chain(10), 10, folder)  # warm up imports and caches
    print(f"{'shape':<15}{'n':>7}{'check µs/item':>16}{'export µs/item':>16}")
    for shape, make in (("chain", chain), ("dead fan-out", fan_out), ("reversed dims", reversed_dims)):
        for n in args.sizes:
            check, export = per_item_us(make(n), n, folder)
            print(f"{shape:<15}{n:>7}{check:>16.1f}{export:>16.1f}")
    samples = load_seconds(layer_stacks(args.layers, folder), args.rounds)
    print(f"\n{'layers':>7}{'load + check':>14}{'CPU':>9}{'x previous [95% CI]':>24}")
    previous = None
    for n in samples:
        shown = ""
        if previous:
            grown = ratios(samples, n, previous)
            shown = f"{grown.median:.2f} [{grown.low:.2f}-{grown.high:.2f}]"
        print(f"{n:>7}{times(samples[n]).median * 1e3:>11.0f} ms{times(samples[n], 'cpu').median * 1e3:>6.0f} ms{shown:>24}")
        previous = n
    if len(samples) > 1:
        small, large = sorted(samples)[-2:]
        limit = round(DOUBLING * large / small / 2, 2)
        print(
            target_line(
                f"load + check, {large} layers vs {small}",
                ratios(samples, large, small),
                limit,
                "x",
                cpu=ratios(samples, large, small, "cpu"),
            )
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
