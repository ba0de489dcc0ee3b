"""Start-up: `import tracer`, and `tracer check` of every bundled pipeline, each in a fresh process
with torch unimportable (neither needs it). Targets: 0.15 s and 0.3 s.

Both the wall time and the process's CPU time (user + system, from the kernel's accounting of
the child) are shown, the best of N rounds: on a machine shared with other work the wall time
waits for a core, the CPU time does not. tracer's modules are byte-compiled first, as a wheel
install has them.

    .venv/bin/python benchmarks/startup.py [--rounds N]
"""

from __future__ import annotations

import argparse
import compileall
import glob
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TARGETS = {"import tracer": 0.15, "tracer check (bundled)": 0.3}
NO_TORCH = "import sys; sys.modules['torch'] = None; "


def _timed(argv: list[str]) -> tuple[float, float]:
    """(wall, CPU) seconds of one child process."""
    before = os.times()
    start = time.perf_counter()
    done = subprocess.run(argv, capture_output=True, text=True, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    wall = time.perf_counter() - start
    after = os.times()
    if done.returncode != 0:
        raise SystemExit(f"{argv[:3]} failed: {done.stderr[-1000:]}")
    return wall, (after.children_user - before.children_user) + (after.children_system - before.children_system)


def measure(rounds: int) -> dict[str, tuple[float, float]]:
    compileall.compile_dir(str(ROOT / "tracer"), quiet=1)
    files = sorted(glob.glob(str(ROOT / "pipelines" / "**" / "*.yaml"), recursive=True))
    files.remove(str(ROOT / "pipelines" / "lint_examples" / "view_non_contiguous.yaml"))  # an error on purpose: exit 1
    cases = {
        "python": [sys.executable, "-c", "pass"],
        "import tracer": [sys.executable, "-c", NO_TORCH + "import tracer"],
        "tracer check (bundled)": [
            sys.executable,
            "-c",
            NO_TORCH + "from tracer.cli import main; sys.exit(main(sys.argv[1:]))",
            "check",
            *files,
        ],
    }
    best = {name: (float("inf"), float("inf")) for name in cases}
    for _ in range(rounds):  # interleaved: a burst of load hits every case alike
        for name, argv in cases.items():
            wall, cpu = _timed(argv)
            best[name] = (min(best[name][0], wall), min(best[name][1], cpu))
    return best


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args(argv)
    best = measure(args.rounds)
    print(f"{'':<24} {'wall':>8} {'CPU':>8} {'target':>8}")
    for name, (wall, cpu) in best.items():
        target = f"{TARGETS[name]:.2f} s" if name in TARGETS else ""
        print(f"{name:<24} {wall:>6.3f} s {cpu:>6.3f} s {target:>8}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
