"""What the HTML report of a repeated stack costs as the stack grows: `encoder_stack` with 48 and
192 layers (and whatever ``--layers`` asks for), run on the meta device, each report written once
after a warm-up of the smallest. Targets: the 192-layer report within 2x the 48-layer one in
bytes and in seconds, and under 1 MB (drawing every copy made 18.6 MB in 46 s). Prints a table
and the ratios against the first size; asserts nothing (speed is measured here, never in the
unit tests).

    .venv/bin/python benchmarks/report_size.py [--layers 48 192 384]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import tracer  # noqa: E402

STACK = ROOT / "pipelines" / "encoder_stack.yaml"
BLOCK = ROOT / "pipelines" / "blocks" / "encoder_layer.yaml"


def stack(layers: int, folder: Path) -> tracer.Pipeline:
    """encoder_stack with ``repeat: layers``, its block file beside it."""
    (folder / "blocks").mkdir(exist_ok=True)
    (folder / "blocks" / BLOCK.name).write_text(BLOCK.read_text())
    path = folder / f"stack_{layers}.yaml"
    path.write_text(STACK.read_text().replace("repeat: 48", f"repeat: {layers}"))
    return tracer.load(path)


def report(layers: int, folder: Path) -> tuple[int, float]:
    """The report's size in bytes and the seconds that writing it took (the run not included)."""
    trace = stack(layers, folder).run(device="meta")
    start = time.perf_counter()
    page = trace.save(folder / f"stack_{layers}.html")
    return page.stat().st_size, time.perf_counter() - start


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, nargs="+", default=[48, 192])
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        report(args.layers[0], Path(folder))  # warm-up: imports, Graphviz's first start
        rows = [(n, *report(n, Path(folder))) for n in args.layers]
    base_size, base_time = rows[0][1], rows[0][2]
    print(f"{'layers':>6}  {'bytes':>10}  {'seconds':>8}  {'bytes ×':>7}  {'time ×':>6}")
    for layers, size, seconds in rows:
        print(f"{layers:>6}  {size:>10,}  {seconds:>8.2f}  {size / base_size:>7.2f}  {seconds / base_time:>6.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
