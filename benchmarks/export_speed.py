"""The exported module, ``tracer.to_module`` and the traced run against transformers' own Llama
decoder layer, on the same weights and input, at a real layer's size (d 2048, GQA 16/4 heads,
d_ff 5632, T 512). Each call includes what one layer needs: the rotary table and the causal mask
(transformers' ``LlamaRotaryEmbedding`` and ``create_causal_mask``; the pipeline computes its own).

Every contender computes the same output from the same weights and input (checked first) and is
called twice before timing. The contenders run interleaved, one call each per round in a rotated
order, many rounds (benchmarks/measure.py, the one timing loop of benchmarks/): a ratio is taken
per round, so drift and other processes' load hit every side alike, and each target is judged on
the median of its per-round ratios, printed with a 95% bootstrap interval, the interquartile
range, the same ratio in CPU time and each side's minor page faults per call.

The allocator starts in the state a long-running process reaches: glibc trims the heap back to
the system whenever its free top exceeds a threshold that only grows after the first large block
(up to 32 MiB) is freed. Until then every call of every contender gives its tensors' pages back
and faults them in again (~15,000 faults a call here, about 6 µs each on a VM: 10% of a call), by
an amount that depends on which contender happened to run before, not on its own code. One 30 MiB
tensor, freed before anything is timed, settles that threshold for all of them alike, as any
tensor of that size freed earlier in a real program does. ``--cold-allocator`` leaves it unsettled.

Target: each ratio ≤ 1.02. Prints; asserts nothing (speed is measured here, never in the unit
tests).

    .venv/bin/python benchmarks/export_speed.py [--rounds 21] [--T 512] [--threads N] [--cold-allocator]
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import torch  # noqa: E402
from measure import interleaved, ratios, target_line, times  # noqa: E402
from transformers import LlamaConfig  # noqa: E402
from transformers.masking_utils import create_causal_mask  # noqa: E402
from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaRotaryEmbedding  # noqa: E402

import tracer  # noqa: E402
from tracer.presentation.export import export_source  # noqa: E402

TARGET = 1.02  # each contender's median ratio to eager
PIPELINE = ROOT / "pipelines" / "models" / "llama_decoder_layer.yaml"
NAMES = {  # pipeline param -> transformers' state_dict key
    "ln_1": "input_layernorm.weight",
    "W_q": "self_attn.q_proj.weight",
    "W_k": "self_attn.k_proj.weight",
    "W_v": "self_attn.v_proj.weight",
    "W_o": "self_attn.o_proj.weight",
    "ln_2": "post_attention_layernorm.weight",
    "W_gate": "mlp.gate_proj.weight",
    "W_up": "mlp.up_proj.weight",
    "W_down": "mlp.down_proj.weight",
}


def transformers_layer(d: int, heads: int, kv_heads: int, d_ff: int):
    config = LlamaConfig(hidden_size=d, num_attention_heads=heads, num_key_value_heads=kv_heads, intermediate_size=d_ff, rms_norm_eps=1e-6)
    config._attn_implementation = "eager"
    torch.manual_seed(0)
    layer = LlamaDecoderLayer(config, layer_idx=0).eval()
    with torch.no_grad():  # norm weights start at ones: random ones, so a mixed-up weight cannot pass
        layer.input_layernorm.weight.uniform_(0.5, 1.5)
        layer.post_attention_layernorm.weight.uniform_(0.5, 1.5)
    rotary = LlamaRotaryEmbedding(config)

    def call(x):
        positions = torch.arange(x.shape[1])[None].expand(x.shape[0], -1)
        mask = create_causal_mask(config, x, None, None, position_ids=positions, allow_is_causal_skip=False)
        return layer(x, attention_mask=mask, position_ids=positions, position_embeddings=rotary(x, positions))

    return layer, call


def exported_module(dims: dict):
    """The pipeline's exported source, imported from a file as a user would."""
    folder = Path(tempfile.mkdtemp())
    path = folder / "llama_layer.py"
    path.write_text(export_source(tracer.load(PIPELINE), dims), encoding="utf-8")
    spec = importlib.util.spec_from_file_location("llama_layer", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    cls = getattr(module, module.__all__[0])
    return cls(**{k: dims[k] for k in ("d_model", "H", "H_kv", "d_ff")}).eval()


def settle_allocator(torch) -> None:
    """Free one block just under glibc's largest dynamic mmap threshold (32 MiB): the heap's trim
    threshold becomes twice that, as in any process that has loaded a checkpoint."""
    block = torch.empty((30 << 20) // 4)
    del block


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=21)
    parser.add_argument("--T", type=int, default=512)
    parser.add_argument("--d", type=int, default=2048)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--cold-allocator", action="store_true", help="do not settle the allocator's trim threshold first")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    if not args.cold_allocator:
        settle_allocator(torch)
    heads, kv_heads, d_ff = 16, 4, int(args.d * 2.75)
    dims = {"B": 1, "T": args.T, "d_model": args.d, "H": heads, "H_kv": kv_heads, "d_ff": d_ff}
    layer, eager = transformers_layer(args.d, heads, kv_heads, d_ff)
    state = layer.state_dict()
    params = {name: state[key] for name, key in NAMES.items()}
    exported = exported_module(dims)
    exported.load_state_dict(params)
    module = tracer.to_module(PIPELINE, dims)
    module.load_state_dict(params)
    pipeline = tracer.load(PIPELINE)
    x = torch.randn(1, args.T, args.d)
    calls = {
        "eager": lambda: eager(x),
        "exported": lambda: exported(x),
        "to_module": lambda: module(x),
        "traced run": lambda: pipeline.run(dims, params=params, inputs={"x": x}).outputs["out"],
    }
    with torch.no_grad():
        expected = calls["eager"]()
        for name, call in calls.items():
            diff = (call() - expected).abs().max().item()
            if diff > 1e-4:
                raise SystemExit(f"{name} computes something else than transformers' layer (max difference {diff:.2e})")
            call()  # second warm-up call: plans built, tensors drawn, allocator at its working size
        samples = interleaved(calls, args.rounds)
    allocator = "cold" if args.cold_allocator else "settled"
    print(
        f"Llama decoder layer: d {args.d}, heads {heads}/{kv_heads}, d_ff {d_ff}, T {args.T}, {torch.get_num_threads()} threads, allocator {allocator}"
    )
    print(f"{'contender':<12}{'median ms':>11}{'CPU ms':>9}{'ratio to eager [95% CI]':>26}{'CPU ratio':>11}{'page faults':>13}")
    for name in calls:
        wall, cpu, ratio = times(samples[name]), times(samples[name], "cpu"), ratios(samples, name, "eager")
        span = f"{ratio.median:.3f} [{ratio.low:.3f}-{ratio.high:.3f}]"
        faults = statistics.median(s.faults for s in samples[name])
        cpu_ratio = ratios(samples, name, "eager", "cpu").median
        print(f"{name:<12}{wall.median * 1e3:>11.1f}{cpu.median * 1e3:>9.1f}{span:>26}{cpu_ratio:>11.3f}{faults:>13.0f}")
    for name in ("exported", "to_module", "traced run"):
        print(target_line(f"{name} vs eager", ratios(samples, name, "eager"), TARGET, "x", cpu=ratios(samples, name, "eager", "cpu")))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
