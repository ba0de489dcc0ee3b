"""Start-up: `import tracer`, `tracer check` of one file (what an editor runs on save) and of every
bundled pipeline, each in a fresh process with torch unimportable (none needs it). Targets: 0.15 s
for the import, 0.3 s for the bundled check (issue 32).

Each check is measured twice: cold (``--no-cache``: every file read, validated and analysed) and
cached (the files unchanged since the last check, as on an editor's save or a pre-commit hook's
run: ``tracer/checkcache.py``; the cache is filled once, in a folder of its own, before the
rounds). The bundled check's target is judged on the cached row, the case the issue is about;
the cold row is shown against the same number with its own verdict.

Both the wall time and the process's CPU time (user + system, from the kernel's accounting of
the child) are shown, the best and the median of N rounds: on a machine shared with other work
the wall time waits for a core, the CPU time does not. tracer's modules are byte-compiled first,
as a wheel install has them.

    .venv/bin/python benchmarks/startup.py [--rounds N] [--against OTHER_CHECKOUT]

``--against`` measures another checkout (say, the commit before a change) in the same rounds,
interleaved with this one: on a shared machine, only numbers taken together compare.

Then where the bundled check's CPU time goes, stage by stage, in one fresh process (the best of
the rounds). Cold: the imports it needs (pydantic and PyYAML; the step kinds, ~90 pydantic
models; the rest of the format, the analysis and the command line), and, file by file, reading
the YAML, validating it (the first file of each kind builds that kind's validator) and analysing
it with every lint; the imports alone are the floor a single cold process cannot go under.
Cached: importing the command line and the cache, tracer's fingerprint (its source files'
sizes and times), and the lookups (each file and its blocks read and hashed, the entry read).
"""

from __future__ import annotations

import argparse
import compileall
import glob
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BUNDLED_COLD, BUNDLED_CACHED = "check bundled, cold", "check bundled, cached"
TARGETS = {"import tracer": 0.15, BUNDLED_CACHED: 0.3, BUNDLED_COLD: 0.3}
JUDGED = {"import tracer", BUNDLED_CACHED}  # the rows the targets are judged on
NO_TORCH = "import sys; sys.modules['torch'] = None; "
CHECK = NO_TORCH + "from tracer.cli import main; sys.exit(main())"  # as the `tracer` command runs it: its arguments from sys.argv
ONE_FILE = "pipelines/models/llama_decoder_layer.yaml"


def _env(root: Path) -> dict[str, str]:
    """The checkout first on the path, and a cache of its own (filled by ``_prime``)."""
    return {**os.environ, "PYTHONPATH": str(root), "TRACER_CACHE_DIR": os.path.join(CACHE_DIR, root.name + str(hash(root)))}


CACHE_DIR = tempfile.mkdtemp(prefix="tracer-startup-")


def _timed(argv: list[str], root: Path) -> tuple[float, float]:
    """(wall, CPU) seconds of one child process."""
    before = os.times()
    start = time.perf_counter()
    done = subprocess.run(argv, capture_output=True, text=True, cwd=root, env=_env(root))
    wall = time.perf_counter() - start
    after = os.times()
    if done.returncode != 0:
        raise SystemExit(f"{argv[:5]} failed: {done.stderr[-1000:]}")
    return wall, (after.children_user - before.children_user) + (after.children_system - before.children_system)


def _bundled(root: Path) -> list[str]:
    files = sorted(glob.glob("pipelines/**/*.yaml", root_dir=root, recursive=True))
    files.remove("pipelines/lint_examples/view_non_contiguous.yaml")  # an error on purpose: exit 1
    return files


def _cases(root: Path) -> dict[str, list[str]]:
    files = _bundled(root)
    cold = ["--no-cache"] if _caches(root) else []
    return {
        "python": [sys.executable, "-c", "pass"],
        "import tracer": [sys.executable, "-c", NO_TORCH + "import tracer"],
        "check one file, cold": [sys.executable, "-c", CHECK, "check", *cold, ONE_FILE],
        BUNDLED_COLD: [sys.executable, "-c", CHECK, "check", *cold, *files],
    } | (
        {
            "check one file, cached": [sys.executable, "-c", CHECK, "check", ONE_FILE],
            BUNDLED_CACHED: [sys.executable, "-c", CHECK, "check", *files],
        }
        if _caches(root)
        else {}
    )


def _caches(root: Path) -> bool:
    """Whether the checkout keeps check's results (``--against`` may name one from before)."""
    return (root / "tracer" / "checkcache.py").exists()


STAGES = (
    NO_TORCH
    + """
import glob, time
clock = time.process_time
marks = [("start", clock())]
import pydantic.main, yaml
marks.append(("import pydantic, yaml", clock()))
import tracer.steps
marks.append(("import the step kinds", clock()))
import importlib.util, tracer.cli
if importlib.util.find_spec('tracer.checking'):  # what a cache miss imports (--against: a checkout from before may lack it)
    import tracer.checking
from tracer.analysis.shapes import analyze
from tracer.spec.load import validate
from tracer.spec.source import read_document
marks.append(("import the rest of tracer", clock()))
spent = dict.fromkeys(("read YAML", "validate", "analyse + lints"), 0.0)
for path in sys.argv[1:]:
    start = clock()
    data, source = read_document(path)
    read = clock()
    spec = validate(data, source)
    valid = clock()
    analyze(spec, source)
    spent["read YAML"] += read - start
    spent["validate"] += valid - read
    spent["analyse + lints"] += clock() - valid
print(*(f"{name}={end - begin}" for (_, begin), (name, end) in zip(marks, marks[1:])), *(f"{k}={v}" for k, v in spent.items()), sep="\\n")
"""
)


CACHED_STAGES = (
    NO_TORCH
    + """
import time
clock = time.process_time
start = clock()
import tracer.cli
imported = clock()
cache = tracer.cli._check_cache(tracer.cli._parser().parse_args(["check", *sys.argv[1:]]))
keyed = clock()
missed = [path for path in sys.argv[1:] if cache.get(path) is None]
assert not missed, missed
print(f"import the command line={imported - start}", f"tracer's fingerprint={keyed - imported}", f"look up every file={clock() - keyed}", sep="\\n")
"""
)


def stages(rounds: int, root: Path, script: str) -> dict[str, float]:
    """Stage -> its CPU seconds in a fresh process checking the bundle (the best of ``rounds``)."""
    best: dict[str, float] = {}
    for _ in range(rounds):
        done = subprocess.run([sys.executable, "-c", script, *_bundled(root)], capture_output=True, text=True, cwd=root, env=_env(root))
        if done.returncode != 0:
            raise SystemExit(f"stages failed: {done.stderr[-1000:]}")
        for line in done.stdout.splitlines():
            name, value = line.split("=")
            best[name] = min(best.get(name, math.inf), float(value))
    return best


def _verdict(seconds: float, target: float) -> str:
    return "met" if seconds <= target else f"{seconds / target:.1f}x over"


def measure(rounds: int, roots: list[Path]) -> dict[tuple[Path, str], list[tuple[float, float]]]:
    for root in roots:
        compileall.compile_dir(str(root / "tracer"), quiet=1)
    for root in filter(_caches, roots):  # fill each checkout's cache
        _timed(_cases(root)[BUNDLED_CACHED], root)
    cases = {(root, name): argv for root in roots for name, argv in _cases(root).items()}
    times: dict[tuple[Path, str], list[tuple[float, float]]] = {key: [] for key in cases}
    for _ in range(rounds):  # interleaved: a burst of load hits every case alike
        for (root, name), argv in cases.items():
            times[root, name].append(_timed(argv, root))
    return times


def _print_stages(what: str, spent: dict[str, float], rounds: int) -> None:
    print(f"\nwhere the bundled check's CPU goes, {what} (best of {rounds} fresh processes; python's own start-up aside):")
    for name, seconds in spent.items():
        print(f"  {name:<28} {seconds:>7.3f} s")
    imports = sum(v for k, v in spent.items() if k.startswith("import"))
    target = TARGETS[BUNDLED_CACHED]
    print(f"  {'the imports alone':<28} {imports:>7.3f} s  ({_verdict(imports, target)} the {target:.2f} s target of the whole check)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--against", type=Path, help="another checkout, measured in the same rounds")
    args = parser.parse_args(argv)
    roots = [ROOT] + ([args.against.resolve()] if args.against else [])
    times = measure(args.rounds, roots)
    for root in roots:
        print(f"\n{root}: {args.rounds} rounds; bundled: every file under pipelines/ that checks clean ({len(_bundled(root))})")
        print(f"{'':<24} {'wall best':>10} {'median':>9} {'CPU best':>10} {'median':>9} {'target':>8}  best vs target: wall, CPU")
        for name in _cases(root):
            walls, cpus = [wall for wall, _ in times[root, name]], [cpu for _, cpu in times[root, name]]
            target = f"{TARGETS[name]:.2f} s" if name in TARGETS else ""
            verdict = f"{_verdict(min(walls), TARGETS[name])}, {_verdict(min(cpus), TARGETS[name])}" if name in TARGETS else ""
            verdict += "" if name in JUDGED or not verdict else "  (shown, not judged)"
            print(
                f"{name:<24} {min(walls):>8.3f} s {statistics.median(walls):>7.3f} s"
                f" {min(cpus):>8.3f} s {statistics.median(cpus):>7.3f} s {target:>8}  {verdict}"
            )
        if _caches(root):
            print(f"targets judged on: {', '.join(sorted(JUDGED))} (the bundled check on an editor's save: files unchanged, cached)")
        else:
            print("this checkout keeps no results: its checks are cold")
        _print_stages("cold, every file checked", stages(args.rounds, root, STAGES), args.rounds)
        if _caches(root):
            _print_stages("cached, every file unchanged", stages(args.rounds, root, CACHED_STAGES), args.rounds)
    return 0


if __name__ == "__main__":
    sys.exit(main())
