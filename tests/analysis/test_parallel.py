"""The parallel: section before running: the plan resolved per step, each rank's local shapes,
the collectives with their bytes (worked out by hand from the ring formulas), located errors."""

from __future__ import annotations

import re

import pytest
import torch

import tracer
from tests.conftest import PIPELINES, ROOT
from tracer.analysis.parallel import Collective, collectives, mesh_coordinates, rank_view, resolved_plan
from tracer.core.errors import TracerError
from tracer.presentation.ranks import communication_line

PARALLEL = PIPELINES / "parallel"
F32 = 4


def local(analysis, rank: int = 0) -> dict[str, tuple[str, tuple[int, ...]]]:
    return {record: (t.symbolic, t.concrete) for record, t in rank_view(analysis, rank).items()}


def test_llama_tp_shards_heads_and_features_and_replicates_the_single_kv_head():
    analysis = tracer.load(PARALLEL / "llama_tp.yaml").check()
    shapes = local(analysis)
    assert shapes["W_q"] == ("(d_model // tp, d_model)", (8, 16))  # colwise: Shard(0)
    assert shapes["W_o"] == ("(d_model, d_model // tp)", (16, 8))  # rowwise: Shard(1)
    assert shapes["W_k"] == ("(H_kv * Dh, d_model)", (4, 16))  # replicate: whole
    assert shapes["q_heads"] == ("(B, T, H_local, Dh)", (2, 4, 2, 4))
    assert shapes["k_heads"] == ("(B, T, H_kv, Dh)", (2, 4, 1, 4))
    assert shapes["context"] == ("(B, H_local, T, Dh)", (2, 2, 4, 4))
    assert shapes["gate"] == ("(B, T, d_ff // tp)", (2, 4, 16))
    assert shapes["down"] == ("(B, T, d_model)", (2, 4, 16))
    assert rank_view(analysis, 1)["q"].placements == ("Shard(2)",)
    assert rank_view(analysis, 1)["out"].placements == ("Replicate()",)
    # all-reduce of a (2, 4, 16) float32 tensor over 2 ranks: 2 (n - 1) / n · S = S = 512 bytes
    whole = 2 * 4 * 16 * F32
    assert collectives(analysis) == [
        Collective("all_reduce", "attn_out", "tp", (2, 4, 16), "float32", whole),
        Collective("all_reduce", "down", "tp", (2, 4, 16), "float32", whole),
    ]
    plan = resolved_plan(analysis)
    assert list(plan) == ["q", "k", "v", "attn_out", "gate", "up", "down"]
    assert (plan["attn_out"].style, plan["attn_out"].input, plan["attn_out"].output) == ("rowwise", "Shard(-1)", "Replicate()")
    assert (plan["q"].mesh_dim, plan["q"].local_output) == ("tp", True)


def test_the_reference_is_the_single_device_run_with_every_mesh_dim_one():
    text = (PARALLEL / "llama_tp.yaml").read_text()
    pipeline = tracer.loads(text)
    analysis = pipeline.check()
    assert analysis.dims["tp"] == 1 and analysis.degrees == {"tp": 2}
    assert analysis.meta("q").sizes == (2, 4, 16) and analysis.meta("W_q").sizes == (16, 16)
    plain = text[: text.index("\nparallel:")].replace("  d_ff: 32", "  d_ff: 32\n  tp: 1")
    ran, alone = pipeline.run(keep_values=["out"]), tracer.loads(plain).run(keep_values=["out"])
    torch.testing.assert_close(ran["out"].tensor, alone["out"].tensor, rtol=0, atol=0)


def test_dim_overrides_the_degree_and_the_bytes_follow_the_ring_formula():
    analysis = tracer.load(PARALLEL / "llama_tp.yaml").check({"tp": 4})
    assert analysis.dims["tp"] == 1 and analysis.degrees == {"tp": 4}
    shapes = local(analysis)
    assert shapes["W_q"][1] == (4, 16) and shapes["q_heads"][1] == (2, 4, 1, 4) and shapes["W_down"][1] == (16, 8)
    whole = 2 * 4 * 16 * F32  # all-reduce over 4 ranks: 2 · 3/4 · S
    assert [c.bytes_per_rank for c in collectives(analysis)] == [2 * 3 * whole // 4] * 2


def test_sequence_parallel_gathers_before_the_projections_and_reduce_scatters_after():
    analysis = tracer.load(PARALLEL / "sequence_parallel.yaml").check()
    shapes = local(analysis)
    assert shapes["x"] == ("(B, T // tp, d_model)", (2, 2, 8))
    assert shapes["h"] == ("(B, T // tp, d_model)", (2, 2, 8))  # the norm on the sequence shard
    assert shapes["q"] == ("(B, T, d_model // tp)", (2, 4, 4))  # gathered, then column-parallel
    assert shapes["attn_out"] == ("(B, T // tp, d_model)", (2, 2, 8))  # reduce-scattered
    assert shapes["out"] == ("(B, T // tp, d_model)", (2, 2, 8))
    gathered = 2 * 4 * 8 * F32  # (n - 1) / n · S of the whole (B, T, d_model)
    assert collectives(analysis) == [
        Collective("all_gather_into_tensor", "q", "tp", (2, 4, 8), "float32", gathered // 2, "input"),
        Collective("all_gather_into_tensor", "k", "tp", (2, 4, 8), "float32", gathered // 2, "input"),
        Collective("all_gather_into_tensor", "v", "tp", (2, 4, 8), "float32", gathered // 2, "input"),
        Collective("reduce_scatter_tensor", "attn_out", "tp", (2, 4, 8), "float32", gathered // 2),
    ]


def test_context_parallel_gathers_keys_and_values_once_and_each_rank_holds_its_positions():
    analysis = tracer.load(PARALLEL / "context_parallel.yaml").check()
    # k and v: (B, H, T // cp, Dh) = 2·2·4·4 = 64 elements each on a rank; cat(k, v) gathered over 2 ranks
    assert collectives(analysis) == [Collective("all_gather_into_tensor", "context", "cp", (256,), "float32", 256 * F32 // 2, "inside")]
    assert [rank_view(analysis, r)["x"].positions[1] for r in (0, 1)] == ["0 .. T // cp - 1", "T // cp .. 2*T // cp - 1"]
    assert rank_view(analysis, 1)["pos"].concrete == (4,)


def test_a_2d_mesh_splits_the_batch_over_dp_and_reduces_over_tp_only():
    analysis = tracer.load(PARALLEL / "dp_tp.yaml").check()
    assert mesh_coordinates(analysis.degrees, 3) == {"dp": 1, "tp": 1} and mesh_coordinates(analysis.degrees, 1) == {"dp": 0, "tp": 1}
    view = rank_view(analysis, 2)
    assert (view["x"].symbolic, view["x"].placements) == ("(B // dp, T, d_model)", ("Shard(0)", "Replicate()"))
    assert view["gate"].placements == ("Shard(0)", "Shard(2)")
    assert collectives(analysis) == [Collective("all_reduce", "down", "tp", (2, 4, 8), "float32", 2 * 4 * 8 * F32)]
    with pytest.raises(ValueError, match="outside the mesh"):
        rank_view(analysis, 4)


def test_a_file_without_parallel_has_no_rank_view():
    analysis = tracer.load(PIPELINES / "models" / "llama_decoder_layer.yaml").check()
    assert analysis.rank is None and collectives(analysis) == [] and rank_view(analysis) == {} and analysis.degrees == {}


LAYER_70B = ROOT / "benchmarks" / "llama70b_layer_tp8.yaml"


def test_a_70b_class_layer_at_tp_8_has_the_local_shapes_megatron_gives_it():
    analysis = tracer.load(LAYER_70B).check()
    assert not analysis.diagnostics
    shapes = {record: t.concrete for record, t in rank_view(analysis, 7).items()}
    assert shapes["W_q"] == (1024, 8192) and shapes["W_k"] == (128, 8192) and shapes["W_o"] == (8192, 1024)
    assert shapes["q_heads"] == (1, 4096, 8, 128) and shapes["k_heads"] == (1, 4096, 1, 128)
    assert shapes["context"] == (1, 8, 4096, 128) and shapes["gate"] == (1, 4096, 3584) and shapes["W_down"] == (8192, 3584)
    whole = 4096 * 8192 * 2  # bfloat16 (1, T, d_model); all-reduce over 8 ranks: 2 · 7/8 · S
    assert [(c.op, c.step, c.bytes_per_rank) for c in collectives(analysis)] == [
        ("all_reduce", "attn_out", 2 * 7 * whole // 8),
        ("all_reduce", "down", 2 * 7 * whole // 8),
    ]
    assert analysis.rank.analysis.total_flops * 8 < analysis.total_flops * 1.01  # each rank does an eighth of the matmuls


BASE = """\
name: planned
dims: {B: 2, T: 4, d: 8}
inputs:
  x: {shape: [B, T, d], init: randn}
params:
  ln: {shape: [d], init: ones}
  W_1: {shape: [d, d], init: linear}
  W_2: {shape: [d, d], init: linear}
steps:
  - {id: h, op: rmsnorm, input: x, weight: ln}
  - {id: up, op: linear, input: h, weight: W_1}
  - {id: down, op: linear, input: up, weight: W_2}
"""


def located(text: str) -> list[tuple[int, str, str]]:
    with pytest.raises(TracerError) as info:
        tracer.loads(text)
    return [(d.position.line, d.code, d.message) for d in info.value.diagnostics]


def line_of(text: str, needle: str) -> int:
    return next(i for i, line in enumerate(text.splitlines(), 1) if needle in line)


@pytest.mark.parametrize(
    ("section", "needle", "code", "says"),
    [
        ("parallel:\n  mesh: {tp: 2}\n  plan: {upp: colwise}\n", "upp", "plan-unknown-step", "did you mean 'up'"),
        ("parallel:\n  mesh: {tp: 2}\n  plan: {'layers/*/q': colwise}\n", "layers", "plan-unknown-step", "matches no step"),
        ("parallel:\n  mesh: {tp: 2}\n  plan: {up: sequence}\n", "up: sequence", "plan-style", "applies to a norm"),
        ("parallel:\n  mesh: {tp: 2}\n  plan: {h: colwise}\n", "h: colwise", "plan-style", "a linear step"),
        ("parallel:\n  mesh: {tp: 2}\n  plan:\n    up: {style: colwise, mesh_dim: dp}\n", "mesh_dim: dp", "unknown-mesh-dim", "not a dim"),
        ("parallel:\n  mesh: {dp: 2}\n  plan:\n    up: colwise\n", "up: colwise", "unknown-mesh-dim", "mesh_dim: dp"),
        ("parallel:\n  mesh: {tp: 2}\n  inputs:\n    y: [Shard(1)]\n", "y: [", "unknown-input", "(inputs: x)"),
        ("parallel:\n  mesh: {dp: 2, tp: 2}\n  inputs:\n    x: [Shard(1)]\n", "x: [", "placements", "one per mesh dim"),
        ("parallel:\n  mesh: {tp: 2}\n  plan:\n    up: colwise\n    'u*': rowwise\n", "u*", "plan-twice", "planned twice"),
        ("parallel:\n  mesh: {tp: 2}\n  plan:\n    up: {style: colwise, local_output: false}\n", "up: {", "local-output", "a DTensor"),
    ],
)
def test_a_wrong_plan_is_a_located_error(section, needle, code, says):
    text = BASE + section
    found = located(text)
    assert (line_of(text, needle), code) in [(line, c) for line, c, _ in found], found
    assert any(says in message for _, _, message in found), found


def test_a_mesh_dim_declared_in_dims_too_is_an_error_at_the_mesh():
    text = BASE.replace("{B: 2, T: 4, d: 8}", "{B: 2, T: 4, d: 8, tp: 2}") + "parallel:\n  mesh: {tp: 2}\n"
    [(line, code, message)] = located(text)
    assert (line, code) == (line_of(text, "mesh:"), "mesh-dim-twice") and "remove it from dims" in message


def test_a_degree_below_one_is_an_error_at_the_mesh():
    pipeline = tracer.loads(BASE + "parallel:\n  mesh: {tp: 2}\n")
    with pytest.raises(TracerError, match=r"mesh dim tp is 0; a degree is at least 1") as info:
        pipeline.check({"tp": 0})
    assert info.value.code == "mesh-degree"


def stack(folder, layer_dims: str, parallel: str, repeat: int) -> tracer.Pipeline:
    """A file of ``repeat`` copies of a two-projection layer whose dims pass ``tp`` down."""
    (folder / "layer.yaml").write_text(
        f"name: layer\ndims: {{B: 1, T: 2, d: 4, tp: 1{layer_dims}}}\ninputs:\n  x: {{shape: [B, T, d], init: randn}}\n"
        "params:\n  W_1: {shape: [d, d], init: linear}\n  W_2: {shape: [d, d], init: linear}\n"
        "steps:\n  - {id: up, op: linear, input: x, weight: W_1}\n  - {id: down, op: linear, weight: W_2}\n"
    )
    (folder / "stack.yaml").write_text(
        "name: stack\ndims: {B: 1, T: 2, d: 4}\nseed: 0\ninputs:\n  x: {shape: [B, T, d], init: randn}\n"
        f"steps:\n  - {{id: layers, op: block, use: layer.yaml, input: x, repeat: {repeat}, dims: {{tp: tp}}}}\n{parallel}"
    )
    return tracer.load(folder / "stack.yaml")


def test_globs_plan_every_copy_of_a_block(tmp_path):
    plan = "parallel:\n  mesh: {tp: 2}\n  plan: {'layers/*/up': colwise, 'layers/*/down': rowwise}\n"
    analysis = stack(tmp_path, "", plan, 3).check()
    assert not analysis.diagnostics
    assert list(resolved_plan(analysis)) == [f"layers/{i}/{s}" for i in range(3) for s in ("up", "down")]
    assert [c.step for c in collectives(analysis)] == ["layers/0/down", "layers/1/down", "layers/2/down"]
    assert rank_view(analysis)["layers/1/W_1"].concrete == (2, 4)
    # each copy's all-reduce of a (1, 2, 4) float32 tensor over 2 ranks: 2 · 1/2 · 32 B
    assert communication_line(analysis) == "communication per layer: 1 all_reduce (tp), 32 B per rank (3 layers: 96 B per rank per forward)"


def test_a_colwise_output_projection_after_sharded_heads_is_a_missing_reduction_at_its_plan_entry():
    text = (PIPELINES / "lint_examples" / "fixed" / "missing_reduction.yaml").read_text().replace("attn_out: rowwise", "attn_out: colwise")
    analysis = tracer.loads(text).check()
    [warning] = analysis.warnings
    assert (warning.code, warning.position.line) == ("missing-reduction", line_of(text, "attn_out: colwise"))
    assert "rowwise, not colwise" in warning.message


def test_a_correct_plan_checks_clean_under_strict_at_other_degrees():
    for name, dims in (("llama_tp.yaml", {"tp": 4}), ("dp_tp.yaml", {"dp": 1, "tp": 4}), ("context_parallel.yaml", {"cp": 4})):
        analysis = tracer.load(PARALLEL / name).check(dims)
        assert analysis.diagnostics == (), (name, dims)


def test_a_degree_that_does_not_divide_the_heads_is_a_warning_at_the_mesh():
    analysis = tracer.load(PARALLEL / "llama_tp.yaml").check({"tp": 8})
    [warning] = analysis.warnings
    assert warning.code == "shard-not-divisible" and re.search(r"H=4 is not divisible by tp=8", warning.message)


def test_check_rank_prints_the_local_shapes_the_collectives_and_the_communication(capsys):
    from tracer.cli import main

    assert main(["check", str(PARALLEL / "dp_tp.yaml"), "--rank", "3"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("rank 3 of 4 (mesh dp=2, tp=2; coordinates dp=1, tp=1):")
    assert re.search(r"^  W_down +\(d_model, d_ff // tp\) +\[8, 8\] +Replicate\(\) Shard\(1\)$", out, re.M)
    assert re.search(r"^  all_reduce +down +tp +\[2, 4, 8\] +256 B$", out, re.M)
    assert out.rstrip().endswith("communication per layer: 1 all_reduce (tp), 256 B per rank")


def test_rank_outside_the_mesh_or_without_parallel_is_a_located_error(capsys):
    from tracer.cli import main

    assert main(["check", str(PARALLEL / "dp_tp.yaml"), "--rank", "4"]) == 1
    assert "error[rank]: --rank 4: the mesh (dp=2, tp=2) has ranks 0 .. 3" in capsys.readouterr().err
    assert main(["run", str(PIPELINES / "causal_mha.yaml"), "--rank", "0"]) == 1
    assert "has no parallel: section" in capsys.readouterr().err


def test_run_json_holds_the_rank_and_a_file_without_parallel_has_none():
    trace = tracer.load(PARALLEL / "context_parallel.yaml").run(device="meta")
    shown = trace.to_dict(rank=1)["rank"]
    assert (shown["rank"], shown["mesh"], shown["coordinates"]) == (1, {"cp": 2}, {"cp": 1})
    x = next(t for t in shown["tensors"] if t["id"] == "x")
    assert (x["shape"], x["placements"], x["positions"][1]) == ([2, 4, 8], ["Shard(1)"], "T // cp .. 2*T // cp - 1")
    assert shown["collectives"] == [
        {
            "op": "all_gather_into_tensor",
            "step": "context",
            "mesh_dim": "cp",
            "shape": [256],
            "dtype": "float32",
            "bytes_per_rank": 512,
            "at": "inside",
        }
    ]
    assert shown["plan"]["context"]["style"] == "context" and shown["totals"]["communication_bytes"] == 512
    assert "rank" not in tracer.load(PIPELINES / "causal_mha.yaml").run(device="meta").to_dict()


def test_a_rank_diagram_draws_the_collectives_and_the_local_shapes():
    from tracer.presentation.diagram import dot_source

    trace = tracer.load(PARALLEL / "sequence_parallel.yaml").run(device="meta")
    plain, ranked = dot_source(trace), dot_source(trace, rank=1)
    assert "collective@" not in plain and "rank 1:" not in plain
    assert ranked.count("octagon") == 4 and "reduce_scatter_tensor" in ranked and "128 B per rank" in ranked
    assert "rank 1: (B, T // tp, d_model) [2, 2, 8]" in ranked and "rank 1 of 2 (mesh tp=2)" in ranked
    assert '"collective@0" -> q [' in ranked and 'attn_out -> "collective@3" [' in ranked  # gathered into q, scattered after it


@pytest.mark.parametrize(
    ("section", "needle"),
    [
        ("parallel:\n  mesh: {tp: 2}\n  inputs:\n    x: [Shard(3)]\n", "x: [Shard(3)]"),
        ("parallel:\n  mesh: {tp: 2}\n  plan:\n    up: {style: colwise, input: Shard(-4)}\n", "input: Shard(-4)"),
        ("parallel:\n  mesh: {tp: 2}\n  plan:\n    up: colwise\n    down: {style: rowwise, output: Shard(7)}\n", "output: Shard(7)"),
    ],
)
def test_a_shard_past_the_tensors_dims_is_an_error_at_its_placement(section, needle):
    text = BASE + section
    [(line, code, message)] = located(text)
    assert (line, code) == (line_of(text, needle), "placement") and "has 3 dims, so d is -3 .. 2" in message


def test_several_replicated_kv_heads_under_split_query_heads_trip_kv_heads_below_tp():
    """Two kv heads whole on every rank: rank 1's query heads (global 2, 3) would attend with kv
    heads 0 and 1, not kv head 0 twice; a single replicated kv head is right (llama_tp.yaml)."""
    text = (PIPELINES / "lint_examples" / "fixed" / "kv_heads_below_tp.yaml").read_text().replace("H_kv: 1", "H_kv: 2")
    [warning] = tracer.loads(text).check().warnings
    assert (warning.code, warning.step) == ("kv-heads-below-tp", "context") and "all H_kv=2 kv heads" in warning.message
    assert tracer.loads(text.replace("H_kv: 2", "H_kv: 1")).check().diagnostics == ()


def test_a_context_steps_flops_are_its_queries_against_every_key():
    analysis = tracer.load(PARALLEL / "context_parallel.yaml").check({"cp": 4})
    local = analysis.rank.analysis
    assert local.nodes["context"].flops * 4 == analysis.nodes["context"].flops  # T/cp queries × T keys
    assert local.nodes["q"].flops * 4 == analysis.nodes["q"].flops  # a projection of T/cp tokens


@pytest.mark.parametrize("name", ["llama_tp.yaml", "context_parallel.yaml"])
def test_export_of_a_parallel_pipeline_takes_its_mesh_dims_as_arguments_one_by_default(name):
    from tests.exporting import check_export

    pipeline = tracer.load(PARALLEL / name)
    check_export(pipeline, pipeline.run(keep_values=True))  # the module equals the single-device run


def test_a_hand_built_causal_mask_on_a_sequence_shard_trips_shard_offset():
    text = """\
name: cp_mask
dims: {B: 1, T: 8, d: 4}
seed: 0
inputs:
  x: {shape: [B, T, d], init: randn}
steps:
  - {id: k_t, op: transpose, input: x, dims: [1, 2]}
  - {id: scores, op: matmul, inputs: [x, k_t]}
  - {id: masked, op: mask, causal: true}
  - {id: weights, op: softmax, dim: -1}
  - {id: context, op: matmul, inputs: [weights, x]}
parallel:
  mesh: {cp: 2}
  inputs:
    x: [Shard(1)]
"""
    [warning] = tracer.loads(text).check().warnings
    assert (warning.code, warning.step, warning.position.line) == ("shard-offset", "masked", line_of(text, "id: masked"))
    assert "the causal mask compares the rank's own query and key indices" in warning.message
    assert tracer.loads(text.replace("    x: [Shard(1)]\n", "").replace("  inputs:\n", "")).check().diagnostics == ()


def test_a_block_dim_the_degree_does_not_divide_is_a_warning_not_a_failure(tmp_path):
    pipeline = stack(tmp_path, ", d_local: d // tp", "parallel:\n  mesh: {tp: 3}\n", 2)
    analysis = pipeline.check()
    [warning] = analysis.warnings
    assert warning.code == "shard-not-divisible" and "not divisible by tp=3" in warning.message
    assert pipeline.check({"tp": 2}).diagnostics == ()


def test_an_uneven_split_is_only_shard_not_divisible():
    analysis = tracer.load(PARALLEL / "dp_tp.yaml").check({"tp": 3})
    assert [(w.code, w.step) for w in analysis.warnings] == [("shard-not-divisible", s) for s in ("gate", "up", "down")]
    assert rank_view(analysis)["gated"].placements == ("Shard(0)", "Shard(2)")  # (d_ff // tp) is still tp's shard
