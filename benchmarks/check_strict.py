"""What the semantic checks cost: `tracer check --strict` of every bundled pipeline with every lint,
against the same check with only the lints of architecture round two (before axis roles, token
positions and the semantic lints). Target: at most 1.2x.

Timings are interleaved per pipeline (all lints, round-two lints, all, ...), in-process, after a
warm-up; the ratio of the summed medians is printed with each pipeline's own.

    .venv/bin/python benchmarks/check_strict.py [--rounds N]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tracer.analysis import lints  # noqa: E402
from tracer.analysis.shapes import analyze  # noqa: E402
from tracer.core.errors import TracerError  # noqa: E402
from tracer.spec.load import load_spec  # noqa: E402

ROUND_TWO = ("dead-step", "lossy-head-split", "view-scrambles-dims", "scale-mismatch", "softmax-over-queries")
ROUND_TWO += ("nan-risk-mask", "mask-polarity", "gqa-head-order")


def _check(path: Path) -> None:
    try:
        analyze(*load_spec(path))
    except TracerError:
        pass  # the deliberate error among the lint examples: its cost is the same either way


def _timed(path: Path, registry: dict) -> float:
    everything = dict(lints.LINTS)
    lints.LINTS.clear()
    lints.LINTS.update(registry)
    try:
        start = time.perf_counter()
        _check(path)
        return time.perf_counter() - start
    finally:
        lints.LINTS.clear()
        lints.LINTS.update(everything)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15)
    args = parser.parse_args(argv)
    full = dict(lints.LINTS)
    before = {code: lint for code, lint in full.items() if code in ROUND_TWO}
    paths = sorted((ROOT / "pipelines").rglob("*.yaml"))
    totals = {"all": 0.0, "round two": 0.0}
    print(f"{'pipeline':<52} {'all lints':>10} {'round two':>10} {'ratio':>6}")
    for path in paths:
        _check(path)  # warm-up: imports, caches
        times: dict[str, list[float]] = {"all": [], "round two": []}
        for _ in range(args.rounds):
            times["all"].append(_timed(path, full))
            times["round two"].append(_timed(path, before))
        medians = {name: statistics.median(values) for name, values in times.items()}
        for name in totals:
            totals[name] += medians[name]
        name = path.relative_to(ROOT / "pipelines").as_posix()
        print(
            f"{name:<52} {medians['all'] * 1e3:>8.2f}ms {medians['round two'] * 1e3:>8.2f}ms {medians['all'] / medians['round two']:>6.2f}"
        )
    ratio = totals["all"] / totals["round two"]
    print(f"\ncheck --strict of {len(paths)} bundled pipelines: {totals['all'] * 1e3:.1f} ms with every lint ({len(full)}), ", end="")
    print(f"{totals['round two'] * 1e3:.1f} ms with round two's ({len(before)}): ratio {ratio:.2f} (target <= 1.2)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
