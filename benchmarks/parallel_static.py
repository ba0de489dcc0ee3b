"""What the per-rank static check costs: a 70B-class Llama layer (d_model 8192, H 64, H_kv 8,
d_ff 28672, T 4096) tensor parallel over tp = 8, checked with nothing allocated. Prints the median
time of the whole check (load, the single-device analysis, the rank's analysis, every lint), of
the rank view of one rank, and the predicted collectives with their bytes per rank.

    .venv/bin/python benchmarks/parallel_static.py [--rounds N] [--dim tp=4 ...]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from measure import repeated  # noqa: E402

from tracer.analysis.parallel import collectives, rank_view  # noqa: E402
from tracer.analysis.shapes import analyze  # noqa: E402
from tracer.core.formatting import human_bytes  # noqa: E402
from tracer.spec.load import load_spec  # noqa: E402

LAYER = ROOT / "benchmarks" / "llama70b_layer_tp8.yaml"


def _ms(work, rounds: int) -> float:
    return repeated(work, rounds).median * 1000


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--dim", action="append", default=[], metavar="NAME=VALUE")
    args = parser.parse_args()
    dims = {name: int(value) for name, value in (pair.split("=") for pair in args.dim)}
    analysis = analyze(*load_spec(LAYER), dims)  # warm-up
    assert not analysis.diagnostics, analysis.diagnostics
    check = _ms(lambda: analyze(*load_spec(LAYER), dims), args.rounds)
    view = _ms(lambda: rank_view(analysis, 0), args.rounds)
    print(
        f"{LAYER.name} at {', '.join(f'{k}={v}' for k, v in analysis.degrees.items())}: "
        f"static check {check:.1f} ms, one rank's view {view:.2f} ms (medians of {args.rounds})"
    )
    for c in collectives(analysis):
        print(f"  {c.op:<24} {c.step:<10} over {c.mesh_dim}  {list(c.shape)} {c.dtype}  {human_bytes(c.bytes_per_rank)} per rank")
    local = analysis.rank.analysis
    print(
        f"  each rank: {local.total_flops / 1e12:.2f} TFLOPs, estimated peak {human_bytes(local.peak_bytes)} "
        f"(one device: {analysis.total_flops / 1e12:.2f} TFLOPs, {human_bytes(analysis.peak_bytes)})"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
