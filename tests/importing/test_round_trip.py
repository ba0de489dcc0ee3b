"""`tracer export` a pipeline, `tracer import` the module it wrote: the pipeline comes back.

The exported module names its variables after the steps and its params and dims after the file's,
so the import pairs every step by id; ``tracer diff`` then shows no step, shape or param change, and
the values agree on the same weights."""

import importlib.util
import re

import pytest
import torch

import tracer
from tests.conftest import PIPELINES
from tracer.diff import diff
from tracer.importer.rules import exported_alibi_slopes
from tracer.importing import difference, from_module
from tracer.presentation.export import export_source


def _exported_module(pipeline, folder, seed):
    """The module `tracer export` writes, imported from its file (import names steps from its source lines)."""
    path = folder / "exported.py"  # one name for every export: an import's header names the module it read
    path.write_text(export_source(pipeline))
    spec = importlib.util.spec_from_file_location("exported", path)
    module_file = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module_file)
    return getattr(module_file, module_file.__all__[0])(seed=seed)


def _reimported(pipeline, folder):
    """Export, then import the module the export wrote, on the pipeline's own inputs."""
    folder.mkdir(exist_ok=True)
    module = _exported_module(pipeline, folder, pipeline.spec.seed)
    trace = pipeline.run(keep_values=True)
    inputs = {name: trace[name].tensor for name in pipeline.spec.inputs}
    back = from_module(module, **inputs)
    assert difference(back, module, **inputs) <= 1e-6
    return back


def _round_trip(path, folder):
    pipeline = tracer.load(path)
    return pipeline, _reimported(pipeline, folder)


def test_the_llama_layer_comes_back_unchanged_names_and_dims_included(tmp_path):
    pipeline, back = _round_trip(PIPELINES / "models/llama_decoder_layer.yaml", tmp_path)
    found = diff(pipeline, back, values=True)
    assert found.same and not found.renamed and found.compared_values and found.diverges is None
    assert set(back.spec.dims) == set(pipeline.spec.dims) - {"seed"}
    assert [s.op for s in back.spec.steps] == [s.op for s in pipeline.spec.steps]


def test_t5_relative_bias_comes_back_with_the_max_distance_its_export_writes(tmp_path):
    """At T = 12, max_distance 6 and 7 give the same buckets: the exported module's
    ``t5_buckets(torch, T, T, NB, 6, True, …)`` says which (a literal, held against the buckets),
    and the key mask's ``~key_mask_4d.bool()`` is the mask step's own cast."""
    pipeline, back = _round_trip(PIPELINES / "models/t5_self_attention.yaml", tmp_path)
    found = diff(pipeline, back, values=True)
    assert found.same and not found.renamed and found.compared_values and found.diverges is None
    assert [s.op for s in back.spec.steps] == [s.op for s in pipeline.spec.steps]
    assert not back.check().diagnostics


T5_SDPA = """\
name: t5_sdpa
dims: {B: 2, T: 12, d_model: 16, H: 2, Dh: 4, NB: 8}
inputs:
  x: {shape: [B, T, d_model], init: randn}
  keep: {shape: [B, T], dtype: bool, values: [[1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0]]}
params:
  W_q: {shape: [H * Dh, d_model], init: linear}
  W_k: {shape: [H * Dh, d_model], init: linear}
  rel_bias: {shape: [NB, H], init: embedding}
steps:
  - {id: q_flat, op: linear, input: x, weight: W_q}
  - {id: q_heads, op: view, shape: [B, T, H, Dh]}
  - {id: q, op: transpose, dims: [1, 2]}
  - {id: k_flat, op: linear, input: x, weight: W_k}
  - {id: k_heads, op: view, shape: [B, T, H, Dh]}
  - {id: k, op: transpose, dims: [1, 2]}
  # compute_bias, then transformers' create_position_bias_mask: the encoder's where(keep, bias, min),
  # the decoder's causal mask on its own bias
  - {id: encoder_bias, op: relative_position_bias, table: rel_bias, queries: T, keys: T, bidirectional: true, max_distance: 6}
  - {id: key_mask, op: view, input: keep, shape: [B, 1, 1, T]}
  - {id: encoder_mask, op: where, inputs: [key_mask, encoder_bias], otherwise: -3.4028234663852886e+38}
  - {id: encoder_context, op: sdpa, inputs: [q, k, k], mask: encoder_mask, scale: 1.0}
  - {id: decoder_bias, op: relative_position_bias, table: rel_bias, queries: T, keys: T, bidirectional: false, max_distance: 6}
  - {id: decoder_mask, op: mask, input: decoder_bias, causal: true, fill: min}
  - {id: decoder_context, op: sdpa, inputs: [q, k, k], mask: decoder_mask, scale: 1.0}
outputs: [encoder_context, decoder_context]
"""


def test_t5_bias_handed_to_sdpa_comes_back_as_relative_position_bias(tmp_path):
    """T5's bias as an sdpa's float mask (``relative_position_bias``, under a padding ``where`` and
    a causal ``mask``), exported and imported again: the same steps, settings and values."""
    path = tmp_path / "t5_sdpa.yaml"
    path.write_text(T5_SDPA)
    pipeline, back = _round_trip(path, tmp_path / "back")
    found = diff(pipeline, back, values=True)
    assert found.same and not found.renamed and found.compared_values and found.diverges is None
    assert sorted(s.op for s in back.spec.steps) == sorted(s.op for s in pipeline.spec.steps)
    assert [s.model_dump(exclude={"id", "input", "inputs"}) for s in back.spec.steps if s.op == "relative_position_bias"] == [
        s.model_dump(exclude={"id", "input", "inputs"}) for s in pipeline.spec.steps if s.op == "relative_position_bias"
    ]
    assert not back.check().diagnostics and not pipeline.check().diagnostics


def test_causal_mha_comes_back_without_its_eval_mode_dropout_then_stays(tmp_path):
    pipeline, back = _round_trip(PIPELINES / "causal_mha.yaml", tmp_path / "once")
    found = diff(pipeline, back, values=True)
    # dropout is the identity in eval mode, where modules are captured: the one step import drops
    assert found.removed == ["weights_d: dropout"] and not found.added and not found.shapes and not found.params
    assert found.changed_op == ["context: reads weights_d, v_h -> weights, v_h"] and not found.renamed
    assert found.diverges is None
    # so a hand-written file is a fixed point after one round, not before (its groups, notes and
    # comments are not in the exported module either)
    assert _reimported(back, tmp_path / "twice").files == back.files


def _uncommented(text: str) -> list[str]:
    return [re.sub(r"  # .*$", "", line) for line in text.splitlines() if not line.lstrip().startswith("#")]


@pytest.mark.parametrize("name", sorted(p.stem for p in (PIPELINES / "imported").glob("*.yaml")))
def test_export_then_import_gives_an_imported_file_back(tmp_path, name):
    committed = (PIPELINES / "imported" / f"{name}.yaml").read_text()
    once = _reimported(tracer.load(PIPELINES / "imported" / f"{name}.yaml"), tmp_path / "once")
    # the same YAML; only comments say where it came from (a line of modeling_llama.py, then the exported module)
    assert _uncommented(once.to_yaml()) == _uncommented(committed)
    twice = _reimported(once, tmp_path / "twice")
    assert twice.files == once.files  # export -> import -> export -> import: a fixed point, comments and all


def test_a_split_in_an_exported_block_keeps_its_dotted_output_names(tmp_path):
    """Export writes the outputs h.0.q, h.0.k of the step h.0.qkv_split as the variables h_0_q, h_0_k;
    import reads them back with the step's prefix (a name the step's prefix does not start stays)."""
    from tracer.importer.rules import _exported_outputs
    from tracer.presentation.export import HEADER

    module = tmp_path / "exported.py"
    module.write_text("\n".join(HEADER) + "\n")
    line = "h_0_q, h_0_k, other = h_0_qkv.split(d_model, dim=2)  # (B, T, d_model), (B, T, d_model), (B, T, d_model) h.0.qkv_split"
    assert _exported_outputs(str(module), line) == ["h.0.q", "h.0.k", "other"]
    (tmp_path / "own.py").write_text("import torch\n")  # a module tracer did not write: names as assigned
    assert _exported_outputs(str(tmp_path / "own.py"), line) == ["h_0_q", "h_0_k", "other"]


@pytest.mark.parametrize(
    ("name", "tables"),
    [
        ("llama4_nope_attention", {"positions"}),  # the positions its floor/log1p temperature is computed from
        ("phi3_decoder_layer", {"cos", "sin"}),  # rotary on part of the head, joined back by cat
    ],
)
def test_a_constant_no_step_computes_comes_back_as_the_values_it_holds(tmp_path, name, tables):
    """No rope (or other) step of the capture's constants computes these tables: they come back as
    params holding their values, read by the module's own ops, strictly clean and equal in value to
    the module (``_reimported``)."""
    _, back = _round_trip(PIPELINES / f"models/{name}.yaml", tmp_path)
    found = {name: decl for name, decl in back.spec.params.items() if decl.values is not None}
    assert set(found) == tables and all(d.buffer and "computed at import by" in d.note for d in found.values())
    assert not back.check().diagnostics


def test_the_decode_steps_rope_comes_back_at_offset_past(tmp_path):
    """The exported decode step rotates one token at position past (its cos and sin a table of one
    row): it comes back as ``rope offset: past``, the step it was."""
    pipeline, back = _round_trip(PIPELINES / "models/kv_cache_decode.yaml", tmp_path)
    found = diff(pipeline, back, values=True)
    assert not found.added and not found.removed and not found.changed_op and not found.params and found.diverges is None
    assert [(s.id, s.offset) for s in back.spec.steps if s.op == "rope"] == [("q_rot", "past"), ("k_rot", "past")]
    assert back.spec.inputs["k_cache"].shape == ["B", "H_kv", "past", "Dh"]  # B = H_kv = 2: the cat says which
    assert not back.check().diagnostics


def test_packed_attentions_frequencies_are_named_half_the_head_width(tmp_path):
    """Llama 3.1 packed attention rotates at positions it is given, with llama3-scaled frequencies
    computed from constants (4 of them, a head width of 8, and H = 4 too): the computed constant
    is ``Dh // 2`` wide, followed to the heads it rotates, so ``cat((freqs, freqs), -1)`` is the head
    width its view names, and the file is clean under --strict (``H`` made that view look like one
    that scrambles dims)."""
    _, back = _round_trip(PIPELINES / "models/llama31_packed_attention.yaml", tmp_path)
    (frequencies,) = [decl for decl in back.spec.params.values() if decl.values is not None]
    assert frequencies.shape == ["Dh // 2"] and "computed at import by" in frequencies.note
    assert not back.check().diagnostics


@pytest.mark.parametrize("name", ["llama31_decoder_layer", "deepseek_v3_mla"])
def test_a_scaled_rope_comes_back_with_the_scaling_its_exported_module_says(tmp_path, name):
    """The exported module has no config: its rope's frequencies call (``rope_llama3(torch, Dh,
    500000.0, x.device, factor=8.0, …)``) says the scaling, and the table it computes is held against
    the one captured before the rope step is written."""
    pipeline, back = _round_trip(PIPELINES / f"models/{name}.yaml", tmp_path)
    ropes = [s for s in pipeline.spec.steps if s.op == "rope"]
    came_back = {s.id: s for s in back.spec.steps if s.op == "rope"}
    assert set(came_back) == {s.id for s in ropes}
    for step in ropes:
        assert came_back[step.id].rope_scaling == step.rope_scaling and came_back[step.id].theta == step.theta
    assert not back.check().diagnostics


def test_only_literals_of_a_frequencies_call_are_read_as_rope_parameters():
    from tracer.importer.rotary import exported_parameters

    line = "frequencies = rope_llama3(torch, Dh, 500000.0, x.device, factor=8.0, low_freq_factor=1.0)  # q_rot"
    assert exported_parameters(line) == {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0}
    dynamic = "frequencies = rope_dynamic(torch, Dh, 10000.0, x.device, seq_len=torch.tensor(T), factor=2.0)"
    assert exported_parameters(dynamic) == {"rope_type": "dynamic", "rope_theta": 10000.0, "factor": 2.0}  # seq_len is no literal
    assert exported_parameters("frequencies = rope_llama3(torch, Dh, __import__('os').getcwd(), x.device)") is None
    assert exported_parameters("frequencies = my_rope(torch, Dh, 10000.0, x.device, factor=8.0)") is None


def test_only_literals_of_a_t5_buckets_call_are_read_as_its_settings():
    from tracer.importer.rules import exported_t5_settings

    line = "biased_buckets = t5_buckets(torch, T, T, self.rel_bias.shape[0], 6, True, scores.device)  # biased"
    assert exported_t5_settings(line) == {"max_distance": 6, "bidirectional": True}
    assert exported_t5_settings("b = t5_buckets(torch, T, T, NB, __import__('os').getpid(), True, d)") is None
    assert exported_t5_settings("b = my_buckets(torch, T, T, NB, 6, True, d)") is None


def test_mixtrals_moe_comes_back_as_its_moe_step(tmp_path):
    """The exported experts are the module ``MoeExperts`` (its class says ``tracer_step = "moe"``),
    captured whole as the moe step it was; the router's float32 cast (the identity on float32
    logits, a line of its own) stays the step it is; ``N: B * T`` written out as ``B * T`` is no rename."""
    pipeline, back = _round_trip(PIPELINES / "models/mixtral_sparse_moe.yaml", tmp_path)
    found = diff(pipeline, back, values=True)
    assert found.same and not found.renamed and not found.dims and found.compared_values and found.diverges is None
    assert [(s.id, s.op) for s in back.spec.steps] == [(s.id, s.op) for s in pipeline.spec.steps]
    (experts,) = [s for s in back.spec.steps if s.op == "moe"]
    assert (experts.gate_up, experts.down, experts.activation) == ("W_gate_up", "W_down", "silu")
    assert back.spec.params["W_gate_up"].shape == ["E", "2 * d_ff", "d_model"] and not back.check().diagnostics


GPT_OSS_MOE = """\
name: gpt_oss_moe
dims: {B: 2, T: 3, d_model: 8, E: 4, K: 2, d_ff: 6}
inputs:
  h: {shape: [B, T, d_model], init: randn}
  p: {shape: [B, T, E], init: rand}
params:
  gu: {shape: [E, d_model, 2 * d_ff], init: randn}
  dn: {shape: [E, d_ff, d_model], init: randn}
  gub: {shape: [E, 2 * d_ff], init: randn}
  dnb: {shape: [E, d_model], init: randn}
steps:
  - {id: route, op: topk, input: p, k: K, normalize: true, outputs: [w, i]}
  - {id: y, op: moe, inputs: [h, w, i], gate_up: gu, down: dn, gate_up_bias: gub, down_bias: dnb, layout: in_out,
     interleave: true, activation: clamped_swiglu, alpha: 1.5, limit: 0.8}
"""


def test_a_moe_steps_settings_and_biases_come_back_from_its_exported_module(tmp_path):
    """GPT-OSS's variant: the settings the exported ``MoeExperts`` holds are the step's fields again,
    its biases the step's biases, its weights named (E, d_model, 2 * d_ff) in its in_out layout."""
    path = tmp_path / "gpt_oss_moe.yaml"
    path.write_text(GPT_OSS_MOE)
    pipeline, back = _round_trip(path, tmp_path / "out")
    found = diff(pipeline, back, values=True)
    assert found.same and not found.renamed and not found.dims and found.diverges is None
    fields = ("gate_up_bias", "down_bias", "layout", "interleave", "gated", "activation", "alpha", "limit")
    (source,), (came_back,) = ([s for s in p.spec.steps if s.op == "moe"] for p in (pipeline, back))
    assert {f: getattr(came_back, f) for f in fields} == {f: getattr(source, f) for f in fields}
    assert back.spec.params["gu"].shape == ["E", "d_model", "2 * d_ff"] and back.spec.params["dn"].shape == ["E", "d_ff", "d_model"]


def test_a_module_marked_moe_with_settings_no_moe_step_has_is_refused_saying_which(tmp_path):
    import torch

    from tracer.core.errors import TracerError

    pipeline = tracer.load(PIPELINES / "models/mixtral_sparse_moe.yaml")
    module = _exported_module(pipeline, tmp_path, 0)
    module.experts.gated = "yes"  # the module runs (`not gated` is False), no moe step says it
    with pytest.raises(TracerError, match="tracer_step = 'moe' at 'experts': its gated is 'yes', not a bool"):
        from_module(module, torch.randn(2, 5, 16))


def test_the_decode_steps_query_length_of_one_is_one_rename_its_sums_follow(tmp_path):
    """The capture at one new token fixes T = 1 (torch.export fixes sizes of 1): ``dim T -> 1`` is
    the one rename, true of the files; ``T_kv: past + T`` beside ``past + 1`` follows from it. Given
    three new tokens, the import follows T from the inputs and names every size as the source does."""
    pipeline, back = _round_trip(PIPELINES / "models/kv_cache_decode.yaml", tmp_path)
    found = diff(pipeline, back, values=True)
    assert found.same and found.renamed == ["dim T -> 1 (as at q)"] and found.dims == [["T", "1", "-"]]
    assert found.diverges is None and found.compared_values
    import torch

    module = _exported_module(pipeline, tmp_path, 0)
    chunk = from_module(module, x=torch.randn(2, 3, 16), k_cache=torch.randn(2, 2, 5, 4), v_cache=torch.randn(2, 2, 5, 4))
    assert chunk.spec.inputs["x"].shape == ["B", "T", "d_model"] and chunk.spec.dims["T"] == 3
    assert not diff(pipeline, chunk).renamed  # only the sizes at T = 3 differ


@pytest.mark.parametrize("attention", ["eager", "sdpa"])
def test_an_imported_t5_model_exports_loads_its_weights_and_comes_back(tmp_path, attention):
    """Issue 31: T5's first layer holds the bias table every layer reads, a param of the main file
    under the folded block's path (``encoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight``
    beside the block ``encoder.block``). The export holds it in that copy's modules, so the
    exported module takes transformers' state_dict as it is, runs equal, and imports back the same."""
    from tests.importing.test_ops import _tiny_t5  # test_ops reads this module's helpers: imported here

    model, ids, decoder_ids = _tiny_t5(attention)  # B == H == 2, NB == Dh == 8
    inputs = {"input_ids": ids, "decoder_input_ids": decoder_ids}
    pipeline = from_module(model, **inputs)
    assert any(s.op == "block" and s.id == "encoder.block" for s in pipeline.spec.steps)
    layers = re.findall(r"class (T5Model\w+Block)\(nn.Module\):.*?def __init__\(self, \*, (.*?)\):", export_source(pipeline), re.S)
    # a layer's file declares the dims it names: the decoder's length T2 and the vocab are the main file's
    assert layers == [(f"T5Model{stack}Block", "d_model=16, d_ff=24, generator=None") for stack in ("Encoder", "Decoder")]
    exported = _exported_module(pipeline, tmp_path, 0).eval()
    exported.load_state_dict(model.state_dict())  # strict: every key, no more
    with torch.no_grad():
        decoded, encoded = exported(**inputs)
        expected = model(**inputs)
    assert torch.allclose(decoded, expected.last_hidden_state, atol=1e-5)
    assert torch.allclose(encoded, expected.encoder_last_hidden_state, atol=1e-5)
    back = from_module(exported, **inputs)
    found = diff(pipeline, back)
    assert found.same and not found.renamed, found


def test_blooms_alibi_comes_back_as_its_alibi_step(tmp_path):
    """The exported alibi step's bias is a constant torch.export folds: its ``alibi_slopes(torch, H)``
    line says it was an alibi step, and the folded values are held against the step's own."""
    pipeline, back = _round_trip(PIPELINES / "models/bloom_block.yaml", tmp_path)
    found = diff(pipeline, back, values=True)
    assert found.same and not found.renamed and found.compared_values and found.diverges is None
    assert [s.op for s in back.spec.steps] == [s.op for s in pipeline.spec.steps]


ALIBI_VARIANTS = """\
name: alibi_variants
dims: {B: 1, H: 3, T: 5}
inputs:
  scores: {shape: [B, H, T, T], init: randn}
steps:
  - {id: mpt, op: alibi, input: scores, bias_max: 8.0}
  - {id: relative, op: alibi, input: mpt, relative: true}
"""


def test_mpt_and_relative_alibi_come_back_with_their_settings(tmp_path):
    path = tmp_path / "alibi.yaml"
    path.write_text(ALIBI_VARIANTS)
    pipeline, back = _round_trip(path, tmp_path / "back")
    assert diff(pipeline, back, values=True).same
    assert [s.model_dump(exclude={"id", "input"}) for s in back.spec.steps] == [
        s.model_dump(exclude={"id", "input"}) for s in pipeline.spec.steps
    ]


def test_only_an_alibi_slopes_call_with_a_literal_bias_max_says_an_alibi_step():
    assert exported_alibi_slopes("s = alibi_slopes(torch, H).to(x.device)  # b") == {}
    assert exported_alibi_slopes("s = mpt_alibi_slopes(torch, H, 8.0).to(x.device)  # b") == {"bias_max": 8.0}
    assert exported_alibi_slopes("s = mpt_alibi_slopes(torch, H, limit).to(x.device)  # b") is None
    assert exported_alibi_slopes("s = slopes(torch, H)") is None


@pytest.mark.long
def test_an_imported_transformers_mixtral_exports_loads_its_weights_and_comes_back(tmp_path):
    """Issue 31: the folded Mixtral layers' experts export as ``MoeExperts`` (captured whole, no
    data-dependent guard on re-capture): the export takes transformers' state_dict, runs equal and
    imports back the same pipeline."""
    from tests.importing.sweep_rows import imported_row

    model, args, kwargs, pipeline = imported_row("mixtral", "eager", 2)
    assert any(s.op == "block" for s in pipeline.spec.steps)
    exported = _exported_module(pipeline, tmp_path, 0).eval()
    exported.load_state_dict(model.state_dict())  # strict: every key, no more
    with torch.no_grad():
        assert torch.allclose(exported(*args, **kwargs), model(*args, **kwargs).last_hidden_state, atol=1e-5)
    found = diff(pipeline, from_module(exported, *args, **kwargs))
    assert found.same and not found.renamed, found


OFFSET_POSITIONS = """\
name: offset_positions
dims: {B: 2, T: 5, P: 9, d_model: 4}
inputs:
  x: {shape: [B, T, d_model], init: randn}
params:
  positions: {shape: [P, d_model], init: randn}
steps:
  - {id: table, op: index, input: positions, dim: 0, start: 2, stop: T + 2}
  - {id: y, op: add, inputs: [x, table]}
"""


def test_a_table_sliced_at_an_offset_keeps_its_length_named(tmp_path):
    """BART's learned positions, exported as ``weight[2:T + 2]``: the capture slices the table at
    numbers (2 and 7), and the import reads the slice's length as the input's T again, not a rename to 5."""
    path = tmp_path / "offset.yaml"
    path.write_text(OFFSET_POSITIONS)
    pipeline, back = _round_trip(path, tmp_path / "back")
    found = diff(pipeline, back, values=True)
    assert found.same and not found.renamed and found.compared_values and found.diverges is None
    (table,) = [s for s in back.spec.steps if s.op == "index"]
    assert (table.start, table.stop) == (2, "T + 2")
