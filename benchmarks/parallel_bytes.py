"""Predicted against measured bytes per collective: every bundled parallel pipeline run on
torch.distributed (gloo, CPU) at world 2 and 4, each collective the static analysis predicts
(tracer.analysis.parallel.collectives) beside the one rank 0 issued (CommDebugMode, with the size
of the tensor it was called with): the whole tensor's bytes, and the ring's bytes sent per rank.

A mesh of another size runs with its innermost dim at the world and the others at 1 (``--dim
tp=4``, ``--dim dp=1 --dim tp=2``); a run that cannot be made (a degree that does not divide the
file's heads) is listed with its reason. Context parallelism runs as torch's ring attention with
the CPU attention op: one all-gather of every rank's cat(k, v).

    .venv/bin/python benchmarks/parallel_bytes.py [--worlds 2 4]
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import tracer  # noqa: E402
from tracer.analysis.parallel import ring_bytes  # noqa: E402
from tracer.core.dtypes import DTYPE_BYTES  # noqa: E402

PIPELINES = sorted((ROOT / "pipelines" / "parallel").glob("*.yaml"))


def _degrees(pipeline: tracer.Pipeline, world: int) -> dict[str, int]:
    """The mesh at ``world`` ranks: the file's, or its innermost mesh dim at ``world`` and the others at 1."""
    degrees = pipeline.check().degrees
    if math.prod(degrees.values()) == world:
        return {}
    return {name: world if name == list(degrees)[-1] else 1 for name in degrees}


def _rows(path: Path, world: int) -> list[str]:
    pipeline = tracer.load(path)
    dims = _degrees(pipeline, world)
    try:
        run = tracer.run_parallel(pipeline, world, dims=dims)
    except tracer.TracerError as exc:
        return [f"{path.stem:<18} {world:>5}  not run: {exc.diagnostics[0].message[:90]}"]
    rows = []
    for predicted, measured in zip(run.predicted, run.collectives[0], strict=True):
        whole_predicted = math.prod(predicted.shape) * DTYPE_BYTES[predicted.dtype]
        rows.append(
            f"{path.stem:<18} {world:>5}  {predicted.step:<10} {predicted.op:<24} "
            f"{whole_predicted:>10} {measured.whole_bytes:>10} {predicted.bytes_per_rank:>10} "
            f"{ring_bytes(measured.op, measured.whole_bytes, measured.group_size):>10}"
        )
    return rows or [f"{path.stem:<18} {world:>5}  no collectives"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worlds", type=int, nargs="+", default=[2, 4])
    args = parser.parse_args()
    header = (
        f"{'pipeline':<18} {'world':>5}  {'step':<10} {'op':<24} {'whole pred':>10} {'whole meas':>10} {'rank pred':>10} {'rank meas':>10}"
    )
    print(header)
    print("-" * len(header))
    for world in args.worlds:
        for path in PIPELINES:
            for row in _rows(path, world):
                print(row)


if __name__ == "__main__":
    main()
