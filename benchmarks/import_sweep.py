"""`tracer.from_module` on public architectures: transformers models from tiny random configs (no
downloads, the configs' defaults kept: ``use_cache=True`` too), with eager and sdpa attention, and
torch's TransformerDecoderLayer. For each: does the import check clean under ``--strict`` and run
equal to the module on its weights, and how long does it take beside a static
``torch.export.export`` of the same module (the ratio's target is 1.2)? Prints the markdown table
docs/import.md shows; tests/importing/test_architectures.py runs some rows.

Timing: one untimed import and export first (torch's and tracer's once-per-process work: op
tables, the idiom patterns), then ``--repeat`` rounds, each an export and an import in turn (the
first of the pair alternating, so that neither always runs on a warmer cache). Each column is the
median over the rounds, of wall time and of this process's CPU time (``time.process_time``:
steadier than wall time on a machine busy with other work); ``ratio`` is the median of the
rounds' import / export, and the verdict reads the CPU ratio.

    .venv/bin/python benchmarks/import_sweep.py [--layers N] [--repeat N] [FAMILY ...]
"""

from __future__ import annotations

import argparse
import copy
import gc
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

B, T, D = 2, 7, 32
SIZES = {"hidden_size": D, "intermediate_size": 56, "num_attention_heads": 4, "vocab_size": 64}
CONFIGS = {  # family: (model class, config class, config arguments besides SIZES and the layer count)
    "mistral": ("MistralModel", "MistralConfig", {"num_key_value_heads": 2, "sliding_window": 4}),  # a window shorter than T
    "qwen2": ("Qwen2Model", "Qwen2Config", {"num_key_value_heads": 2}),
    "gemma": ("GemmaModel", "GemmaConfig", {"num_key_value_heads": 1, "head_dim": 8}),
    "phi3": ("Phi3Model", "Phi3Config", {"num_key_value_heads": 2, "pad_token_id": 0}),
    "gpt_neox": ("GPTNeoXModel", "GPTNeoXConfig", {}),  # rotary_pct 0.25: rope on 2 of 8 dims
    "bert": ("BertModel", "BertConfig", {"max_position_embeddings": 16}),
    "llama": ("LlamaModel", "LlamaConfig", {"num_key_value_heads": 2}),  # a padded batch: causal and padding masks
    "qwen3": ("Qwen3Model", "Qwen3Config", {"num_key_value_heads": 2, "head_dim": 8, "use_sliding_window": True, "sliding_window": 4}),
    # multipliers on the embeddings, the residuals, the scores (in place of 1/sqrt(Dh)) and the logits
    "granite": (
        "GraniteModel",
        "GraniteConfig",
        {"num_key_value_heads": 2, "embedding_multiplier": 12.0, "residual_multiplier": 0.22, "attention_multiplier": 0.0078125},
    ),
    # softcapped scores, query_pre_attn_scalar for the scale, sliding-window layers
    "gemma2": ("Gemma2Model", "Gemma2Config", {"num_key_value_heads": 2, "head_dim": 8, "query_pre_attn_scalar": 16, "sliding_window": 4}),
    "cohere": ("CohereModel", "CohereConfig", {"num_key_value_heads": 2}),  # a bias-free LayerNorm written out, interleaved rope
    "phi": ("PhiModel", "PhiConfig", {}),  # partial rotary, parallel attention and MLP
    # rotary tables computed from the config: rope with rope_scaling (positions 0..6 pass the original context of 4)
    "llama3_rope": ("LlamaModel", "LlamaConfig", {"num_key_value_heads": 2, "rope_parameters": {"rope_type": "llama3", "factor": 8.0,
                    "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 4, "rope_theta": 500000.0}}),
    "yarn_rope": ("Qwen2Model", "Qwen2Config", {"num_key_value_heads": 2, "rope_parameters": {"rope_type": "yarn", "factor": 4.0,
                  "original_max_position_embeddings": 4, "rope_theta": 10000.0}}),
    "dynamic_rope": ("LlamaModel", "LlamaConfig", {"num_key_value_heads": 2, "max_position_embeddings": 4,
                     "rope_parameters": {"rope_type": "dynamic", "factor": 2.0, "rope_theta": 10000.0}}),
    "longrope": ("Phi3Model", "Phi3Config", {"num_key_value_heads": 2, "pad_token_id": 0, "max_position_embeddings": 16,
                 "original_max_position_embeddings": 4, "rope_parameters": {"rope_type": "longrope", "rope_theta": 10000.0,
                 "short_factor": [1.0, 1.5, 2.0, 2.5], "long_factor": [2.0, 3.0, 4.0, 5.0]}}),
    "bloom": ("BloomModel", "BloomConfig", {}),  # ALiBi added by baddbmm; eager only (no sdpa path in transformers)
    "stablelm": ("StableLmModel", "StableLmConfig", {"num_key_value_heads": 2, "qk_layernorm": True}),  # a LayerNorm per head
    "mixtral": ("MixtralModel", "MixtralConfig", {"num_key_value_heads": 2, "num_local_experts": 4, "num_experts_per_tok": 2}),  # experts captured whole
}  # fmt: skip
ATTENTIONS = {"decoder_layer": ("torch",), "gemma2": ("eager",), "bloom": ("eager",)}  # if not eager and sdpa (Gemma 2 refuses sdpa)
T5 = {
    "d_model": D,
    "d_kv": 8,
    "d_ff": 56,
    "num_heads": 4,
    "vocab_size": 64,
    "relative_attention_num_buckets": 8,
    "relative_attention_max_distance": 16,
}
PADDED = ("bert", "llama", "qwen3")  # given an attention_mask: the second sequence ends after 4 tokens
BART = {"d_model": D, "encoder_attention_heads": 4, "decoder_attention_heads": 4, "encoder_ffn_dim": 56, "decoder_ffn_dim": 56}


def build(family: str, attention: str, layers: int):
    """(module, args, kwargs): a seeded model in eval mode and its example inputs."""
    torch.manual_seed(0)
    if family == "decoder_layer":  # torch's own; attention is torch's path, with the causal mask given
        layer = torch.nn.TransformerDecoderLayer(d_model=D, nhead=4, dim_feedforward=56, dropout=0.0, batch_first=True).eval()
        kwargs = {"tgt_mask": torch.nn.Transformer.generate_square_subsequent_mask(T), "tgt_is_causal": True}
        return layer, (torch.randn(B, T, D), torch.randn(B, 5, D)), kwargs
    import transformers

    if family == "bart":  # encoder-decoder: cross-attention, learned positions with an offset of 2
        config = transformers.BartConfig(encoder_layers=layers, decoder_layers=layers, vocab_size=64, max_position_embeddings=16, **BART)
        model_class = transformers.BartModel
    elif family == "t5":  # encoder-decoder: bucketed relative position bias, held by each stack's first block
        config, model_class = transformers.T5Config(num_layers=layers, **T5), transformers.T5Model
    else:
        model_name, config_name, extra = CONFIGS[family]
        config = getattr(transformers, config_name)(
            num_hidden_layers=layers, **SIZES, **copy.deepcopy(extra)
        )  # configs keep what they are given
        model_class = getattr(transformers, model_name)
    config._attn_implementation = attention  # use_cache stays the config's default (True): import turns it off itself
    if family == "qwen3":
        config.layer_types = ["sliding_attention"] * layers
    model = model_class(config).eval()
    kwargs = {"decoder_input_ids": torch.randint(1, 64, (B, 5))} if family in ("bart", "t5") else {}
    if family in PADDED:  # a padding mask: the second sequence ends after 4 tokens
        kwargs["attention_mask"] = (torch.arange(T) < torch.tensor([[T], [4]])).long()
    return model, (torch.randint(1, 64, (B, T)),), kwargs


def _portable(message: str) -> str:
    """The message with this machine's install folder cut from its paths (`transformers/models/...`)."""
    import transformers

    return message.replace(str(Path(transformers.__file__).parent.parent) + "/", "")


def row(family: str, attention: str, layers: int, repeat: int) -> str:
    from tracer import TracerError
    from tracer.importing import difference, from_module

    module, args, kwargs = build(family, attention, layers)
    try:
        pipeline = from_module(module, *args, name=family, **kwargs)  # untimed: once-per-process work, and the verdict
    except TracerError as error:
        return f"| {family} | {attention} | not mapped: {_portable(str(error).splitlines()[0])} | | | | | | | |"
    _export(module, args, kwargs)
    rounds = []
    for turn in range(repeat):
        calls = {"import": lambda: from_module(module, *args, name=family, **kwargs), "export": lambda: _export(module, args, kwargs)}
        order = ("import", "export") if turn % 2 else ("export", "import")
        times = {which: _timed(calls[which]) for which in order}
        rounds.append((times["import"], times["export"]))
    problems = [d for d in pipeline.check().diagnostics if d.severity in ("error", "warning")]
    verdict = "ok" if not problems else f"{len(problems)} warnings under --strict: {problems[0].code}"
    folded = ", ".join(f"{s.id}: repeat {s.repeat}" for s in pipeline.spec.steps if s.op == "block") or "-"
    wall, cpu = (statistics.median(i[k] for i, _ in rounds) for k in (0, 1))
    export_wall, export_cpu = (statistics.median(e[k] for _, e in rounds) for k in (0, 1))
    ratio, cpu_ratio = (statistics.median(i[k] / e[k] for i, e in rounds) for k in (0, 1))
    met = "yes" if cpu_ratio <= TARGET else "no"
    seconds = f"{wall:.2f} / {cpu:.2f} | {export_wall:.2f} / {export_cpu:.2f} | {ratio:.2f} | {cpu_ratio:.2f} | {met}"
    return f"| {family} | {attention} | {verdict} | {folded} | {difference(pipeline, module, *args, **kwargs):.1e} | {seconds} |"


TARGET = 1.2  # issue 31: an import costs at most 1.2x a static torch.export of the module


def _export(module, args, kwargs):
    """A plain static ``torch.export.export(strict=False)``, as tracer captures: cache off, no
    grad, a dynamic rope's frequencies settled at the example (its data-dependent branch cannot
    be exported)."""
    from tracer.importer.capture import capturing
    from tracer.importer.rotary import settled_rope_updates

    with capturing(module), settled_rope_updates(module, args, kwargs):
        return torch.export.export(module, tuple(args), dict(kwargs), strict=False)


def _timed(call) -> tuple[float, float]:
    """(wall seconds, CPU seconds of this process) of one call, garbage collected before."""
    gc.collect()
    wall, cpu = time.perf_counter(), time.process_time()
    call()
    return time.perf_counter() - wall, time.process_time() - cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--repeat", type=int, default=5, help="timed rounds of an import and an export; medians are shown")
    parser.add_argument("families", nargs="*", default=[*CONFIGS, "bart", "t5", "decoder_layer"])
    options = parser.parse_args()
    print(
        "| model | attention | --strict | layers folded | max diff | import s (wall / CPU) "
        f"| static torch.export s (wall / CPU) | ratio | CPU ratio | <= {TARGET}x |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for family in options.families:
        for attention in ATTENTIONS.get(family, ("eager", "sdpa")):
            print(row(family, attention, options.layers, options.repeat), flush=True)


if __name__ == "__main__":
    main()
