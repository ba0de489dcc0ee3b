"""Real checkpoints in: tiny random transformers models saved with ``save_pretrained`` (one file, or
sharded with an index) fill the bundled pipelines through their ``checkpoint:`` sections, and a
layer's output equals the model's own layer on the same input. A folder tracer cannot use as
written is a located error."""

from __future__ import annotations

import json
import os

import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import (
    Gemma2Config,
    Gemma2ForCausalLM,
    GPT2Config,
    GPT2LMHeadModel,
    LlamaConfig,
    LlamaForCausalLM,
    MistralConfig,
    MistralForCausalLM,
    Qwen3Config,
    Qwen3ForCausalLM,
)
from transformers.masking_utils import create_causal_mask, create_sliding_window_causal_mask

import tracer
from tests.conftest import tracer_cli
from tests.models.test_models import ATOL, MODELS
from tracer.checkpoints import bind, from_pretrained, read_params
from tracer.core.errors import TracerError

B, T = 2, 6
SMALL = dict(num_hidden_layers=2, vocab_size=40, attn_implementation="eager")


def saved(model, folder, shard: str | None = None):
    """``model`` with every weight random (norms start at 1 or 0, where a swapped one would not
    show), saved with save_pretrained: one model.safetensors, or shards of at most ``shard``."""
    torch.manual_seed(1)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.rand_like(p) + 0.5 if p.dim() == 1 else torch.randn_like(p) * 0.1)
    model.eval().save_pretrained(folder, **({"max_shard_size": shard} if shard else {}))
    return model


def decoder_layer_output(model, index: int, x, window: bool = False):
    """What layer ``index`` of a Llama-style model computes on ``x`` at positions 0 .. T-1."""
    pos = torch.arange(x.shape[1])[None].expand(x.shape[0], -1)
    make_mask = create_sliding_window_causal_mask if window else create_causal_mask
    mask = make_mask(model.config, x, None, None, position_ids=pos)
    rope = model.model.rotary_emb(x, pos)
    return model.model.layers[index](x, attention_mask=mask, position_embeddings=rope, position_ids=pos)


def llama(folder):
    config = LlamaConfig(hidden_size=64, num_attention_heads=4, num_key_value_heads=2, intermediate_size=48, rms_norm_eps=1e-5, **SMALL)
    config.rope_parameters["rope_theta"] = 500000.0  # not the file's 10000: the config's value is the one used
    return saved(LlamaForCausalLM(config), folder, shard="4KB")


def llama31(folder):  # Llama 3.1's rope: the file's rope_scaling, required of the config
    rope = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0}
    config = LlamaConfig(
        hidden_size=32, num_attention_heads=4, num_key_value_heads=2, intermediate_size=48, rms_norm_eps=1e-5,
        rope_parameters={**rope, "original_max_position_embeddings": 8192}, **SMALL,
    )  # fmt: skip
    return saved(LlamaForCausalLM(config), folder)


def qwen3(folder):
    config = Qwen3Config(hidden_size=24, num_attention_heads=4, num_key_value_heads=2, head_dim=8, intermediate_size=40, **SMALL)
    return saved(Qwen3ForCausalLM(config), folder)


def gemma2(folder):
    config = Gemma2Config(
        hidden_size=16, num_attention_heads=2, num_key_value_heads=1, head_dim=8, intermediate_size=32, query_pre_attn_scalar=16,
        attn_logit_softcapping=2.0, sliding_window=3, **{**SMALL, "num_hidden_layers": 3},
    )  # fmt: skip
    return saved(Gemma2ForCausalLM(config), folder, shard="3KB")


def mistral(folder):
    config = MistralConfig(hidden_size=16, num_attention_heads=4, num_key_value_heads=2, intermediate_size=32, sliding_window=3, **SMALL)
    return saved(MistralForCausalLM(config), folder)


def gpt2(folder):
    config = GPT2Config(
        n_embd=12, n_head=3, n_layer=2, n_positions=16, vocab_size=40, bos_token_id=0, eos_token_id=0, attn_implementation="eager"
    )
    return saved(GPT2LMHeadModel(config), folder)


def llama_expected(model, x):
    return decoder_layer_output(model, 1, x)


def qwen3_expected(model, x):
    return decoder_layer_output(model, 1, x)


def gemma2_expected(model, x):
    return decoder_layer_output(model, 0, x, window=True)  # layer 0 is a sliding_attention layer


def mistral_expected(model, x):
    attn = model.model.layers[1].self_attn
    pos = torch.arange(x.shape[1])[None].expand(x.shape[0], -1)
    mask = create_sliding_window_causal_mask(model.config, x, None, None, position_ids=pos)
    return attn(x, position_embeddings=model.model.rotary_emb(x, pos), attention_mask=mask)[0]


def gpt2_expected(model, x):
    pos = torch.arange(x.shape[1])[None].expand(x.shape[0], -1)
    mask = create_causal_mask(model.config, x, None, None, position_ids=pos, allow_is_causal_skip=False)
    return model.transformer.h[1].attn(x, attention_mask=mask)[0]


CASES = {  # pipeline, the model saved, the layer picked, what that layer computes, another layer of the same kind
    "llama (sharded)": ("llama_decoder_layer.yaml", llama, 1, llama_expected, 0),
    "qwen3": ("qwen3_decoder_layer.yaml", qwen3, 1, qwen3_expected, 0),
    "llama31": ("llama31_decoder_layer.yaml", llama31, 1, llama_expected, 0),
    "gemma2 (sharded)": ("gemma2_decoder_layer.yaml", gemma2, 0, gemma2_expected, 2),
    "mistral": ("mistral_sliding_window.yaml", mistral, 1, mistral_expected, 0),
    "gpt2": ("gpt2_attention.yaml", gpt2, 1, gpt2_expected, 0),
}


@pytest.mark.parametrize("case", CASES)
@torch.no_grad()
def test_a_saved_layer_runs_in_its_pipeline_as_in_the_model(case, tmp_path):
    name, build, layer, expected_of, other = CASES[case]
    model = build(tmp_path)
    x = torch.randn(B, T, model.config.hidden_size)
    expected = expected_of(model, x)
    pipeline, params = from_pretrained(MODELS / name, tmp_path, layer=layer)
    out = pipeline.run(dims={"B": B, "T": T}, params=params, inputs={"x": x}, keep_values=True)["out"].tensor
    diff = (out - expected).abs().max().item()
    print(f"{case}: max abs diff {diff:.3g}")
    assert out.shape == expected.shape and diff <= ATOL
    # another layer's weights compute something else: the comparison can fail
    pipeline, params = from_pretrained(MODELS / name, tmp_path, layer=other)
    wrong = pipeline.run(dims={"B": B, "T": T}, params=params, inputs={"x": x}, keep_values=True)["out"].tensor
    assert (wrong - expected).abs().max().item() > 1e-3


@pytest.fixture(scope="module")
def llama_folder(tmp_path_factory):
    folder = tmp_path_factory.mktemp("llama")
    llama(folder)
    return folder


def test_the_command_line_runs_a_layer_of_a_saved_model_by_the_bundled_models_name(llama_folder, tmp_path):
    done = tracer_cli("run", "llama_decoder_layer", "--weights", llama_folder, "--layer", "0", "-q", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "W_q" in done.stdout and "[64, 64]" in done.stdout  # d_model from config.json, not the file's 16


def refusal(*argv) -> str:
    done = tracer_cli("run", *argv, "-q")
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    return done.stderr


def test_per_layer_keys_need_a_layer_and_a_missing_layer_is_named(llama_folder):
    assert "give the layer, --layer N" in refusal(MODELS / "llama_decoder_layer.yaml", "--weights", llama_folder)
    past = refusal(MODELS / "llama_decoder_layer.yaml", "--weights", llama_folder, "--layer", "7")
    assert "--layer 7: the model has 2 layers (" in past and "num_hidden_layers: 2); give one of layers 0 to 1" in past
    assert past.count("error[") == 1
    assert "--layer picks a layer of a save_pretrained folder" in refusal(MODELS / "llama_decoder_layer.yaml", "--layer", "0")


@torch.no_grad()
def test_a_tensor_the_pipeline_does_not_compute_with_is_refused_not_dropped(tmp_path):
    # a q_proj bias (Qwen2's layer is Llama's plus q/k/v biases) left out would make the result silently wrong
    config = LlamaConfig(hidden_size=16, num_attention_heads=4, num_key_value_heads=2, intermediate_size=32, **SMALL)
    saved(LlamaForCausalLM(config), tmp_path)
    state = load_file(tmp_path / "model.safetensors")
    save_file({**state, "model.layers.0.self_attn.q_proj.bias": torch.zeros(16)}, tmp_path / "model.safetensors", {"format": "pt"})
    message = refusal(MODELS / "llama_decoder_layer.yaml", "--weights", tmp_path, "--layer", "0")
    assert (
        "llama_decoder_layer.yaml:" in message
        and "'model.layers.0.self_attn.q_proj.bias', which the checkpoint map does not name" in message
    )
    assert (
        tracer_cli("run", MODELS / "llama_decoder_layer.yaml", "--weights", tmp_path, "--layer", "1", "-q").returncode == 0
    )  # no bias there


@torch.no_grad()
def test_a_config_the_pipeline_is_not_written_for_is_refused_at_its_require_line(tmp_path):
    config = LlamaConfig(hidden_size=16, num_attention_heads=4, num_key_value_heads=2, intermediate_size=32, hidden_act="gelu", **SMALL)
    saved(LlamaForCausalLM(config), tmp_path)
    with pytest.raises(TracerError) as info:
        from_pretrained(MODELS / "llama_decoder_layer.yaml", tmp_path, layer=0)
    (problem,) = info.value.diagnostics
    assert problem.code == "checkpoint" and problem.position is not None
    assert 'gives hidden_act: "gelu"; this pipeline computes the model with hidden_act: "silu"' in problem.message


def test_a_shard_outside_the_folder_is_refused(llama_folder, tmp_path):
    for item in llama_folder.iterdir():
        (tmp_path / item.name).write_bytes(item.read_bytes())
    index = json.loads((tmp_path / "model.safetensors.index.json").read_text())
    index["weight_map"]["model.layers.0.input_layernorm.weight"] = "../elsewhere.safetensors"
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(index))
    message = refusal(MODELS / "llama_decoder_layer.yaml", "--weights", tmp_path, "--layer", "0")
    assert 'names "../elsewhere.safetensors" as the shard of' in message


def test_only_the_shards_holding_the_layer_are_read(llama_folder, tmp_path):
    index = json.loads((llama_folder / "model.safetensors.index.json").read_text())["weight_map"]
    needed = {shard for key, shard in index.items() if key.startswith("model.layers.1.")}
    for item in llama_folder.iterdir():
        junk = item.name.endswith(".safetensors") and item.name not in needed
        (tmp_path / item.name).write_bytes(b"not safetensors" if junk else item.read_bytes())
    assert len(set(index.values()) - needed) >= 2
    from_pretrained(MODELS / "llama_decoder_layer.yaml", tmp_path, layer=1)
    with pytest.raises(TracerError, match="cannot read weights"):
        from_pretrained(MODELS / "llama_decoder_layer.yaml", tmp_path, layer=0)


def test_tensors_over_the_budget_are_refused_before_any_is_read(llama_folder):
    pipeline = bind(MODELS / "llama_decoder_layer.yaml", llama_folder, layer=0)
    layer_bytes = 4 * (2 * 64 + 2 * 64 * 64 + 2 * 32 * 64 + 3 * 48 * 64)  # float32: two norms, q and o, k and v (H_kv = 2), the MLP
    read_params(pipeline, llama_folder, 0, max_bytes=layer_bytes)
    with pytest.raises(TracerError) as info:
        read_params(pipeline, llama_folder, 0, max_bytes=layer_bytes - 1)
    assert [d.code for d in info.value.diagnostics] == ["weights-too-large"]


def test_a_config_that_is_not_a_regular_file_is_refused_without_blocking(llama_folder, tmp_path):
    for item in llama_folder.iterdir():
        if item.name != "config.json":
            (tmp_path / item.name).symlink_to(item)
    os.mkfifo(tmp_path / "config.json")  # opening it for reading would wait for a writer forever
    message = refusal(MODELS / "llama_decoder_layer.yaml", "--weights", tmp_path, "--layer", "0")
    assert "config.json" in message and "is a FIFO, not a regular file" in message


def test_config_keys_per_layer_need_a_per_layer_prefix(tmp_path):
    text = (MODELS / "llama_decoder_layer.yaml").read_text().replace("prefix: model.layers.{layer}.", "prefix: model.layers.0.")
    text = text.replace("    mlp_bias: false\n", "    mlp_bias: false\n    layer_types.{layer}: full_attention\n")
    (tmp_path / "p.yaml").write_text(text)
    with pytest.raises(TracerError) as info:
        tracer.load(tmp_path / "p.yaml")
    (problem,) = info.value.diagnostics
    assert problem.position is not None and "needs a per-layer prefix" in problem.message


@torch.no_grad()
def test_a_whole_saved_model_fills_every_copy_of_a_repeated_block(tmp_path):
    """gpt2_lm.yaml from a GPT2LMHeadModel folder, no --layer: n_layer (3) sets the block's repeat
    (2 in the file) and each {layer} entry fills that param of every copy; the logits, padded
    positions included, are the model's."""
    config = GPT2Config(
        n_embd=12, n_head=3, n_layer=3, n_positions=16, vocab_size=40, bos_token_id=0, eos_token_id=0, attn_implementation="eager"
    )
    model = saved(GPT2LMHeadModel(config), tmp_path)
    pipeline, params = from_pretrained(MODELS / "gpt2_lm.yaml", tmp_path)
    assert {name.split("/")[1] for name in params if name.startswith("h/")} == {"0", "1", "2"}
    trace = pipeline.run(params=params, keep_values=True)
    ids, keep = trace["ids"].tensor, trace["keep"].tensor.reshape(B, -1)
    expected = model(input_ids=ids, attention_mask=keep.long()).logits
    assert (trace["logits"].tensor - expected).abs().max().item() <= ATOL
    done = tracer_cli("run", MODELS / "gpt2_lm.yaml", "--weights", tmp_path, "-q")
    assert done.returncode == 0 and "h/1…2" in done.stdout, done.stderr
    assert "drop --layer" in tracer_cli("run", MODELS / "gpt2_lm.yaml", "--weights", tmp_path, "--layer", "1").stderr


@pytest.mark.parametrize(
    "entry",
    ["    transformer.h.{layer}.ln_2.bias: ln_2_b\n", "    transformer.h.0.ln_2.bias: h.{layer}.ln_2_b\n"],
    ids=["key per copy, param not", "param per copy, key not"],
)
def test_a_per_copy_entry_names_layer_on_both_sides(tmp_path, entry):
    text = (MODELS / "gpt2_lm.yaml").read_text().replace("    transformer.h.{layer}.ln_2.bias: h.{layer}.ln_2_b\n", entry)
    (tmp_path / "blocks").symlink_to(MODELS / "blocks")
    (tmp_path / "p.yaml").write_text(text)
    with pytest.raises(TracerError) as info:
        tracer.load(tmp_path / "p.yaml")
    (problem,) = info.value.diagnostics
    assert problem.position is not None and "maps to params with {layer}" in problem.message


def test_a_template_of_many_layer_marks_matches_without_backtracking():
    """Every {layer} is one number (the first captures it, the rest repeat it), so a hostile map
    ({layer} 28 times against a name of 64 digits) is answered at once, and copies must agree."""
    import re
    import time

    from tracer.checkpoints import _copy_pattern

    started = time.process_time()
    assert re.fullmatch(_copy_pattern("{layer}" * 28), "1" * 64) is None
    assert time.process_time() - started < 0.1
    assert re.fullmatch(_copy_pattern("a/{layer}/b/{layer}/W"), "a/3/b/3/W")["layer"] == "3"
    assert re.fullmatch(_copy_pattern("a/{layer}/b/{layer}/W"), "a/3/b/4/W") is None
    assert re.fullmatch(_copy_pattern("h/{layer}/W"), "h/012/W") is None  # a copy number has no leading zero


def copied(folder, into):
    for item in folder.iterdir():
        (into / item.name).write_bytes(item.read_bytes())
    return into


def crafted_shard(path, key: str, dtype: str, shape: list[int], item_bits: int) -> None:
    """A .safetensors file holding one tensor of ``dtype`` (sparse: its bytes are never written)."""
    size = -(-item_bits * int(torch.tensor(shape).prod()) // 8)
    header = json.dumps({key: {"dtype": dtype, "shape": shape, "data_offsets": [0, size]}}).encode()
    header += b" " * (-len(header) % 8)
    with open(path, "wb") as file:
        file.write(len(header).to_bytes(8, "little") + header)
        file.truncate(8 + len(header) + size)


def with_shard(llama_folder, tmp_path, dtype: str, shape: list[int], item_bits: int):
    """The llama folder with layer 0's input norm moved to a crafted shard of its own."""
    folder = copied(llama_folder, tmp_path)
    index = json.loads((folder / "model.safetensors.index.json").read_text())
    index["weight_map"]["model.layers.0.input_layernorm.weight"] = "odd.safetensors"
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    crafted_shard(folder / "odd.safetensors", "model.layers.0.input_layernorm.weight", dtype, shape, item_bits)
    return folder


def test_a_shard_dtype_is_counted_at_its_real_size_against_the_budget(llama_folder, tmp_path):
    # complex64 is 8 bytes an element: 2**27 of them are 1 GiB (once counted as 1 byte each: 128 MiB, under 300 MiB)
    folder = with_shard(llama_folder, tmp_path, "C64", [2**27], 64)
    message = refusal(MODELS / "llama_decoder_layer.yaml", "--weights", folder, "--layer", "0", "--max-memory", "300MiB")
    assert "error[weights-too-large]" in message and "need 1.0 GiB" in message


@pytest.mark.parametrize("dtype, bits", [("F6_E2M3", 6), ("F4", 4), ("F8_E8M0", 8)])
def test_a_shard_dtype_torch_cannot_read_is_a_located_error(llama_folder, tmp_path, dtype, bits):
    folder = with_shard(llama_folder, tmp_path, dtype, [64], bits)
    message = refusal(MODELS / "llama_decoder_layer.yaml", "--weights", folder, "--layer", "0")
    assert f"odd.safetensors: error[weights-file]: cannot read weights: 'model.layers.0.input_layernorm.weight' is {dtype}" in message


def test_an_index_naming_a_shard_that_lacks_the_tensor_is_a_located_error(llama_folder, tmp_path):
    folder = copied(llama_folder, tmp_path)
    index = json.loads((folder / "model.safetensors.index.json").read_text())
    key = "model.layers.0.input_layernorm.weight"
    index["weight_map"][key] = next(shard for name, shard in index["weight_map"].items() if shard != index["weight_map"][key])
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    message = refusal(MODELS / "llama_decoder_layer.yaml", "--weights", folder, "--layer", "0")
    assert f"error[weights-folder]: does not hold the tensor '{key}', which model.safetensors.index.json says it holds" in message


def test_a_tensor_name_with_nul_is_escaped_not_an_internal_error(llama_folder, tmp_path):
    folder = copied(llama_folder, tmp_path)
    index = json.loads((folder / "model.safetensors.index.json").read_text())
    index["weight_map"]["model.layers.0.x\u0000\u001b[2J"] = index["weight_map"]["model.layers.0.input_layernorm.weight"]
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    message = refusal(MODELS / "llama_decoder_layer.yaml", "--weights", folder, "--layer", "0")
    assert "'model.layers.0.x\\x00\\x1b[2J'" in message and "\x1b" not in message


def test_a_dim_past_the_limit_in_the_config_is_a_located_error(llama_folder, tmp_path):
    folder = copied(llama_folder, tmp_path)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "hidden_size": 2**70}))
    message = refusal(MODELS / "llama_decoder_layer.yaml", "--weights", folder, "--layer", "0")
    line = next(
        i for i, text in enumerate((MODELS / "llama_decoder_layer.yaml").read_text().splitlines(), 1) if "hidden_size: d_model" in text
    )
    assert f"llama_decoder_layer.yaml:{line}:5: error[checkpoint]:" in message and "needs a whole number from 1 to 2**62" in message


def test_a_checkpoint_of_another_architecture_is_one_error_naming_its_model_type(tmp_path):
    gpt2(tmp_path)
    message = refusal(MODELS / "llama_decoder_layer.yaml", "--weights", tmp_path, "--layer", "0")
    assert message.count("error[") == 1 and "describes a 'gpt2' model (model_type)" in message and "another architecture" in message


def test_config_text_goes_through_the_control_character_rule(llama_folder, tmp_path):
    folder = copied(llama_folder, tmp_path)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "group_name": "attn\u001b[31m\u202e"}))
    text = (MODELS / "llama_decoder_layer.yaml").read_text().replace("  fields:\n", "  fields:\n    group_name: [q.group]\n")
    (tmp_path / "p.yaml").write_text(text)
    message = refusal(tmp_path / "p.yaml", "--weights", folder, "--layer", "0")
    assert "control character U+001B" in message and "\x1b" not in message and "\u202e" not in message


def test_the_run_says_which_checkpoint_and_layer_filled_the_params(llama_folder):
    done = tracer_cli("run", MODELS / "llama_decoder_layer.yaml", "--weights", llama_folder, "--layer", "1", "-q")
    assert done.returncode == 0, done.stderr
    assert f"params: 9 tensors (84.5 KiB) from {llama_folder}, layer 1" in done.stderr
