"""The exported Mixtral sparse MoE (``pipelines/models/mixtral_sparse_moe.yaml``) against
transformers' own ``MixtralSparseMoeBlock`` (eager experts), on the same weights and input. The
exported module calls its experts as a module, ``MoeExperts`` (so that ``tracer import`` captures
them whole): this measures what that call costs beside the block it reproduces.

Both compute the same output (checked first, exactly: the same loop over the experts, op for op)
and are called twice before timing; they run interleaved, many rounds (benchmarks/measure.py),
judged on the median of the per-round ratios with a 95% bootstrap interval, in wall and CPU time.
Target: the ratio ≤ 1.02. Prints; asserts nothing.

    .venv/bin/python benchmarks/moe_export_speed.py [--rounds 101] [--d 256] [--d-ff 512] [--experts 8] [--T 64] [--threads 1]
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import torch  # noqa: E402
from export_speed import settle_allocator  # noqa: E402
from measure import interleaved, ratios, target_line, times  # noqa: E402
from transformers import MixtralConfig  # noqa: E402
from transformers.models.mixtral.modeling_mixtral import MixtralSparseMoeBlock  # noqa: E402

import tracer  # noqa: E402
from tracer.presentation.export import export_source  # noqa: E402

TARGET = 1.02
PIPELINE = ROOT / "pipelines" / "models" / "mixtral_sparse_moe.yaml"
NAMES = {"W_router": "gate.weight", "W_gate_up": "experts.gate_up_proj", "W_down": "experts.down_proj"}


def exported_module(dims: dict):
    """The pipeline's exported source, imported from a file as a user would."""
    path = Path(tempfile.mkdtemp()) / "mixtral_moe.py"
    path.write_text(export_source(tracer.load(PIPELINE)), encoding="utf-8")
    spec = importlib.util.spec_from_file_location("mixtral_moe", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return getattr(module, module.__all__[0])(**dims).eval()


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=101)
    parser.add_argument("--d", type=int, default=256)
    parser.add_argument("--d-ff", type=int, default=512)
    parser.add_argument("--experts", type=int, default=8)
    parser.add_argument("--T", type=int, default=64)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    settle_allocator(torch)
    config = MixtralConfig(hidden_size=args.d, intermediate_size=args.d_ff, num_local_experts=args.experts, num_experts_per_tok=2)
    config._experts_implementation = "eager"
    torch.manual_seed(0)
    block = MixtralSparseMoeBlock(config).eval()
    with torch.no_grad():
        for p in block.parameters():  # the experts' weights start as torch.empty
            p.normal_(0, 0.02)
    state = block.state_dict()
    exported = exported_module({"d_model": args.d, "E": args.experts, "K": 2, "d_ff": args.d_ff})
    exported.load_state_dict({name: state[key] for name, key in NAMES.items()})
    x = torch.randn(1, args.T, args.d)
    calls = {"eager": lambda: _first(block(x)), "exported": lambda: exported(x)}
    with torch.no_grad():
        expected = calls["eager"]()
        for name, call in calls.items():
            if not torch.equal(call(), expected):
                raise SystemExit(f"{name} computes something else than transformers' block")
            call()
        samples = interleaved(calls, args.rounds, per_round=5)
    print(f"Mixtral sparse MoE: d {args.d}, d_ff {args.d_ff}, {args.experts} experts, top 2, T {args.T}, {torch.get_num_threads()} threads")
    for name in calls:
        print(f"{name:<10}{times(samples[name]).median * 1e3:>9.2f} ms{times(samples[name], 'cpu').median * 1e3:>9.2f} ms CPU")
    print(
        target_line("exported vs eager", ratios(samples, "exported", "eager"), TARGET, "x", cpu=ratios(samples, "exported", "eager", "cpu"))
    )
    return 0


def _first(out):
    """The hidden states (a transformers version may return the router logits beside them)."""
    return out[0] if isinstance(out, tuple) else out


if __name__ == "__main__":
    raise SystemExit(main())
