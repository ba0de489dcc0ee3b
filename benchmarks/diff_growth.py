"""How `tracer diff` grows with the steps it pairs: steps that pair by position only, behind steps
only one side has (see :func:`unmatched`), and a chain with every step renamed (each step pairs
through its renamed input). Each doubling of n should cost about twice as much (pairing is
linear); before, the first was cubic (150, 300 steps: 4.6 s, 42 s; the issue measured 132 s at
600) and the second quadratic (1,000, 2,000 steps: 2.2 s, 10 s; 44 s at 4,000). Times
``tracer.diff.diff`` on loaded pipelines (load and check excluded). Prints a table; asserts
nothing (speed is measured here, never in the unit tests).

    .venv/bin/python benchmarks/diff_growth.py [--unmatched 150 300 600] [--renamed 1000 2000 4000]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from measure import repeated  # noqa: E402

import tracer  # noqa: E402
from tracer.diff import diff  # noqa: E402

HEAD = "dims: {B: 1, D: 4}\ninputs:\n  x: {shape: [B, D], init: randn}\nsteps:\n"


def chain(n: int, prefix: str = "s") -> str:
    steps = "".join(f"  - {{id: {prefix}{i}, op: tanh, input: {'x' if i == 0 else f'{prefix}{i - 1}'}}}\n" for i in range(n))
    return f"name: chain\n{HEAD}{steps}"


def fan_out(n: int, prefix: str = "f", op: str = "tanh") -> str:
    return "".join(f"  - {{id: {prefix}{i}, op: {op}, input: x}}\n" for i in range(n))


def unmatched(n: int) -> tuple[str, str]:
    """A: n/2 sigmoids B lacks, then a chain of n/2 tanh; B: n/2 gelus A lacks, then n/2 tanh
    that each read x: the tanh pair by position only, one at a time, past the sigmoids."""
    a = f"name: a\n{HEAD}{fan_out(n // 2, 'only_a', 'sigmoid')}" + chain(n // 2).split("steps:\n")[1]
    b = f"name: b\n{HEAD}{fan_out(n // 2, 'only_b', 'gelu')}{fan_out(n // 2)}"
    return a, b


CASES = {
    "unmatched": unmatched,
    "renamed chain": lambda n: (chain(n), chain(n, "renamed_")),
}


def diff_seconds(case: str, n: int, rounds: int) -> tuple[float, object]:
    """Median seconds of one diff of the case's two pipelines at n steps, and the diff."""
    a_text, b_text = CASES[case](n)
    a, b = tracer.loads(a_text, "a.yaml"), tracer.loads(b_text, "b.yaml")
    return repeated(lambda: diff(a, b), rounds).median, diff(a, b)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--unmatched", type=int, nargs="+", default=[150, 300, 600])
    parser.add_argument("--renamed", type=int, nargs="+", default=[1000, 2000, 4000])
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    diff_seconds("renamed chain", 10, 1)  # warm up imports and caches
    print(f"{'case':<15}{'n':>7}{'diff':>12}{'x previous':>12}  pairs")
    for case, sizes in (("unmatched", args.unmatched), ("renamed chain", args.renamed)):
        previous = None
        for n in sizes:
            took, found = diff_seconds(case, n, args.rounds)
            ratio = f"{took / previous:.2f}" if previous else ""
            pairs = f"{len([r for r in found.renamed if r.startswith('step ')])} renamed, {len(found.changed_op)} changed"
            print(f"{case:<15}{n:>7}{took * 1e3:>9.0f} ms{ratio:>12}  {pairs}")
            previous = took
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
