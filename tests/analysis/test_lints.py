"""Lints: each example reproduces its bug at its line, its fixed twin is clean, the bundled pipelines
stay clean, and --strict turns warnings into errors."""

import re

import pytest

import tracer
from tests.conftest import PIPELINES
from tracer.analysis.lints import LINTS
from tracer.cli import main
from tracer.runtime.watch import SoftmaxNaNs, runtime_warnings

EXAMPLES = PIPELINES / "lint_examples"


LINT_CODES = set(LINTS)


CANONICAL = ["self_attention", "causal_mha", "cross_attention"]


def warnings_of(text: str) -> list:
    return tracer.loads(text, "t.yaml").check().warnings


def codes(text: str) -> set[str]:
    return {d.code for d in warnings_of(text)}


def example(name: str) -> str:
    return (EXAMPLES / f"{name}.yaml").read_text()


def line_of(text: str, needle: str) -> int:
    return next(i for i, line in enumerate(text.splitlines(), 1) if needle in line)


@pytest.mark.parametrize("code", sorted(LINT_CODES))
def test_each_example_trips_exactly_its_lint_and_its_fixed_twin_is_clean(code):
    analysis = tracer.load(EXAMPLES / f"{LINTS[code].example}.yaml").check()
    assert not analysis.errors
    assert [d.code for d in analysis.warnings] == [code]
    fixed = tracer.load(EXAMPLES / "fixed" / f"{LINTS[code].example}.yaml").check()
    assert fixed.diagnostics == ()


def test_strict_check_of_all_examples_shows_every_code(capsys):
    files = sorted(str(p) for p in EXAMPLES.glob("*.yaml"))
    assert len(files) == len(LINT_CODES) + 1  # one example per lint, and one deliberate error
    assert main(["check", "--strict", *files]) == 1
    err = capsys.readouterr().err
    found = set(re.findall(r"^\S+:\d+:\d+: error\[([a-z-]+)\]", err, re.M))
    assert found == LINT_CODES | {"view-non-contiguous"}, err


def test_without_strict_lints_are_warnings(capsys):
    assert main(["check", str(EXAMPLES / "scale_mismatch.yaml")]) == 0
    err = capsys.readouterr().err
    assert re.search(r"scale_mismatch\.yaml:\d+:\d+: warning\[scale-mismatch\]: step 'matmul_scaled': ", err)


@pytest.mark.parametrize("name", CANONICAL)
def test_canonical_pipelines_are_clean_under_strict(name, capsys):
    assert main(["check", "--strict", str(PIPELINES / f"{name}.yaml")]) == 0
    assert capsys.readouterr().err == ""


def test_dead_step_located_and_fixed():
    text = example("dead_step")
    [d] = warnings_of(text)
    assert d.step == "attention_scores_dropout" and d.position.line == line_of(text, "id: attention_scores_dropout")
    fixed = text.replace("inputs: [attention_weights, values]", "inputs: [attention_scores_dropout, values]")
    assert codes(fixed) == set()


def test_scale_mismatch_message_and_fix():
    text = example("scale_mismatch")
    [d] = warnings_of(text)
    assert d.position.line == line_of(text, "id: matmul_scaled")
    assert "d=3" in d.message and "1/√3 = 0.5774" in d.message and "0.5" in d.message and "{sqrt: d}" in d.message
    assert codes(text.replace("divide: {sqrt: d_k}", "divide: {sqrt: d}")) == set()
    assert codes(text.replace("divide: {sqrt: d_k}", "multiply: 0.5773502691896258")) == set()


def test_scale_mismatch_sums_every_scale_and_ignores_unscaled_scores():
    text = example("scale_mismatch")
    # sqrt(3) split over two steps, around a mask-free chain: still correct
    two = text.replace(
        "- {id: matmul_scaled, op: scale, divide: {sqrt: d_k}}   # <- sqrt(4), keys are 3-dim",
        "- {id: half, op: scale, divide: {sqrt: d}}\n  - {id: matmul_scaled, op: scale, multiply: 1}",
    )
    assert codes(two) == set()
    # no scale at all (tutorial 001's first part) is not this lint's business
    none = text.replace("  - {id: matmul_scaled, op: scale, divide: {sqrt: d_k}}   # <- sqrt(4), keys are 3-dim\n", "")
    assert codes(none) == set()


def test_canonical_scale_change_is_caught():
    text = (PIPELINES / "causal_mha.yaml").read_text().replace("divide: {sqrt: Dh}", "divide: {sqrt: d_model}")
    [d] = warnings_of(text)
    assert d.code == "scale-mismatch" and "Dh=2" in d.message


def test_lossy_head_split_message_and_fix():
    text = example("lossy_head_split")
    [d] = warnings_of(text)
    assert d.step == "head_0" and "(T, d_v) [8, 4]" in d.message and "position 3" in d.message
    two_heads = (
        text.replace("num_heads: 3", "num_heads: 2")
        .replace("head_dim: 1 ", "head_dim: 2 ")
        .replace("  - {id: head_2, op: index, input: values, dim: 1, start: 2 * head_dim, stop: 3 * head_dim}\n", "")
        .replace("  - {id: context_vector_2, op: matmul, inputs: [attention_scores, head_2]}\n", "")
        .replace("inputs: [context_vector_0, context_vector_1, context_vector_2]", "inputs: [context_vector_0, context_vector_1]")
    )
    assert codes(two_heads) == set()


def test_unequal_or_single_slices_are_not_head_splits():
    text = example("lossy_head_split").replace("start: 2 * head_dim, stop: 3 * head_dim", "start: 2, stop: 4")
    assert "lossy-head-split" not in codes(text)  # widths 1, 1, 2: not equal heads


def test_nan_risk_mask_static_and_fix():
    text = example("nan_risk_mask")
    [d] = warnings_of(text)
    assert d.position.line == line_of(text, "id: attention_scores_masked")
    assert "mask[1, 0, 1, :]" in d.message and "-1e9" in d.message
    assert codes(text.replace("fill: -inf", "fill: -1e9")) == set()
    kept = text.replace("- [false, false, false]      # <- batch 1, query 1: every key hidden", "- [false, true, false]")
    assert codes(kept) == set()


def test_nan_risk_mask_at_run_time_counts_nan_rows():
    pipeline = tracer.load(EXAMPLES / "nan_risk_mask.yaml")
    trace = pipeline.run()  # no values kept: the softmax is the output, so it is available
    [d] = runtime_warnings(trace)
    assert d.code == "nan-risk-mask" and d.step == "attention_weights"
    assert "2 NaN rows of 12" in d.message and "attention_scores_masked" in d.message
    assert trace.outputs["attention_weights"][1, :, 1].isnan().all()


def test_runtime_warnings_clean_and_with_given_tensors():
    trace = tracer.load(PIPELINES / "causal_mha.yaml").run()
    assert runtime_warnings(trace) == []
    import torch

    nan = torch.full((2, 2, 6, 6), float("nan"))
    [d] = runtime_warnings(trace, tensors={"weights": nan})
    assert "24 NaN rows of 24" in d.message


def test_causal_flag_never_risks_nan():
    assert codes((PIPELINES / "causal_mha.yaml").read_text()) == set()  # causal: true with fill -inf


def test_mask_polarity_triu_keep_and_fix():
    text = example("mask_polarity")
    [d] = warnings_of(text)
    assert d.position.line == line_of(text, "id: masked") and "(T, T) [4, 4]" in d.message
    assert codes(text.replace("polarity: keep", "polarity: block")) == set()


def test_mask_polarity_tril_block():
    text = example("mask_polarity").replace("init: triu", "init: tril")
    assert codes(text) == set()  # tril = what each query may see: keep is right
    assert codes(text.replace("polarity: keep", "polarity: block")) == {"mask-polarity"}


def test_mask_polarity_on_literal_masks_and_seeds():
    text = example("mask_polarity").replace(
        'mask: {shape: [T, T], init: triu, note: "torch.triu(torch.ones(T, T), diagonal=1): 1 = future"}',
        "mask: {shape: [T, T], values: [[1, 0, 0, 0], [1, 1, 0, 0], [1, 1, 1, 0], [1, 1, 1, 1]]}",
    )
    assert codes(text) == set()  # tril as a literal, keep polarity: right
    assert codes(text.replace("polarity: keep", "polarity: block")) == {"mask-polarity"}
    # with -inf the flipped mask also hides every key of the last row
    assert codes(text.replace("polarity: keep", "polarity: block").replace("fill: -1e9", "fill: -inf")) == {
        "mask-polarity",
        "nan-risk-mask",
    }
    # tutorial 002 (triu + block) and 003 (random keep-mask) are right
    for name in ("002_weight_split_step_by_step", "003_mha_step_by_step"):
        found = {w.code for w in tracer.load(PIPELINES / "seeds" / f"{name}.yaml").check().warnings}
        assert not found & {"mask-polarity", "nan-risk-mask"}


def test_view_non_contiguous_is_an_error():
    with pytest.raises(tracer.TracerError) as info:
        tracer.load(EXAMPLES / "view_non_contiguous.yaml")
    assert [d.code for d in info.value.diagnostics] == ["view-non-contiguous"]


def test_lints_read_a_block_step_with_its_own_dims(tmp_path):
    """Two uses bind the block's d_k differently, so d_k is not a dim of the whole file."""
    (tmp_path / "attn.yaml").write_text(
        "name: attn\ndims: {T: 3, d: 4, d_k: 4}\ninputs:\n  x: {shape: [T, d], init: randn}\nsteps:\n"
        "  - {id: kt, op: transpose, input: x, dims: [0, 1]}\n"
        "  - {id: s, op: matmul, inputs: [x, kt]}\n"
        "  - {id: scaled, op: scale, divide: {sqrt: d_k}}\n"
        "  - {id: w, op: softmax, dim: -1}\n"
    )
    top = tmp_path / "top.yaml"
    top.write_text(
        "name: top\ndims: {T: 3}\ninputs:\n  a: {shape: [T, 4], init: randn}\n  b: {shape: [T, 8], init: randn}\n"
        "steps:\n"
        "  - {id: one, op: block, use: attn.yaml, input: a, dims: {d: 4, d_k: 4}}\n"
        "  - {id: two, op: block, use: attn.yaml, input: b, dims: {d: 8, d_k: 2}}\n"
        "outputs: [one, two]\n"
    )
    [d] = tracer.load(top).check().warnings
    assert d.code == "scale-mismatch" and d.step == "two/scaled" and "d_k=2" in d.message and "d=8" in d.message


def test_the_run_hook_counts_nan_rows_of_a_softmax_that_is_freed(capsys):
    """With `outputs:` elsewhere the softmax is freed after its last reader; the hook saw it first."""
    text = example("nan_risk_mask").rstrip() + "\n  - {id: after, op: relu, input: attention_weights}\noutputs: [after]\n"
    pipeline = tracer.loads(text, "n.yaml")
    seen = []
    trace = pipeline.run(observe=lambda rid, tensor: seen.append((rid, tuple(tensor.shape))))
    assert [rid for rid, _ in seen] == [r.id for r in trace.records if r.op not in ("input", "param")]
    assert all(shape == trace[rid].shape for rid, shape in seen)
    assert "attention_weights" not in trace.outputs and runtime_warnings(trace) == []
    nans = SoftmaxNaNs(pipeline.check())
    pipeline.run(observe=nans)
    [d] = nans.warnings()
    assert d.step == "attention_weights" and "2 NaN rows of 12" in d.message


def test_cli_run_reports_nan_rows_without_keeping_values(tmp_path, capsys):
    path = tmp_path / "n.yaml"
    path.write_text(example("nan_risk_mask").rstrip() + "\n  - {id: after, op: relu, input: attention_weights}\noutputs: [after]\n")
    assert main(["run", str(path)]) == 0
    assert "step 'attention_weights': softmax produced 2 NaN rows of 12" in capsys.readouterr().err


@pytest.mark.parametrize("path", sorted((PIPELINES / "models").glob("*.yaml")), ids=lambda p: p.stem)
def test_model_pipelines_are_clean_under_strict(path, capsys):
    assert main(["check", "--strict", str(path)]) == 0
    # nothing but a lint the file allows, with its reason (DeepSeek's YaRN scaling is legitimately unusual)
    assert all("allowed[" in line for line in capsys.readouterr().err.splitlines())


def test_view_scrambles_dims_located_and_fixed():
    text = example("view_scrambles_dims")
    [warning] = warnings_of(text)
    assert warning.position.line == line_of(text, "id: merged") and warning.step == "merged"
    assert "(B, H, T, Dh) [2, 2, 6, 4] into (B, T, d_model)" in warning.message
    fixed = text.replace(
        "  - {id: merged, op: view, input: context, shape: [B, T, d_model]}",
        "  - {id: context_t, op: transpose, input: context, dims: [1, 2]}\n  - {id: merged, op: reshape, shape: [B, T, d_model]}",
    )
    assert codes(fixed) == set()


@pytest.mark.parametrize(
    "before, after, scrambled",
    [
        ("[B, T, d_model]", "[B, T, H, Dh]", False),  # split heads
        ("[B, T, H, Dh]", "[B, T, d_model]", False),  # merge heads
        ("[B, H, T, Dh]", "[B, T, H, Dh]", True),  # a transpose written as a view
        ("[B, H_kv, n_rep, T, Dh]", "[B, H, T, Dh]", False),  # repeat_kv's reshape
        ("[B, T, H, Dh]", "[B, T, Dh, H]", True),
        ("[1, T, d_model]", "[B, T, H, Dh]", False),  # an unsqueezed batch of 1 becomes B
        ("[B, T, 3 * d_model]", "[B, T, H, 3 * Dh]", False),  # GPT-NeoX's fused qkv per head
        ("[B, T, (H + 2) * Dh]", "[B, T, H + 2, Dh]", False),  # Falcon's multi-query qkv: sums are not judged
        ("[B, T, H, 3 * Dh]", "[B, H, T, 3 * Dh]", True),
        # ViT's patches, with the patches per side written in place rather than declared as a dim
        ("[B, d_model, d_model // H, d_model // H]", "[B, d_model, (d_model // H) * (d_model // H)]", False),
        ("[B, d_model, d_model // H, d_model // H]", "[B, (d_model // H) * (d_model // H), d_model]", True),
    ],
)
def test_view_scrambles_dims_reads_symbols(before, after, scrambled):
    text = f"""
name: v
dims: {{B: 1, T: 4, H: 4, H_kv: 2, n_rep: H // H_kv, d_model: 8, Dh: d_model // H}}
inputs:
  x: {{shape: {before}, init: randn}}
steps:
  - {{id: y, op: reshape, input: x, shape: {after}}}
"""
    assert codes(text) == ({"view-scrambles-dims"} if scrambled else set())


def test_gqa_head_order_located_and_fixed():
    text = example("gqa_head_order")
    [warning] = warnings_of(text)
    assert warning.position.line == line_of(text, "id: k_rep") and "0, 1, 0, 1" in warning.message and "0, 0, 1, 1" in warning.message
    fixed = text.replace("op: repeat, input: k, repeats: [1, n_rep, 1, 1]", "op: repeat_interleave, input: k, repeats: n_rep, dim: 1")
    assert codes(fixed) == set()


def test_softmax_over_queries_located_and_fixed():
    text = example("softmax_over_queries")
    [warning] = warnings_of(text)
    assert warning.position.line == line_of(text, "id: weights") and "use dim: -1" in warning.message
    assert codes(text.replace("dim: -2", "dim: -1")) == set()


def test_softmax_over_queries_reads_einsum_axes():
    base = """
name: e
inputs:
  q: {shape: [2, 3, 4], init: randn}
  k: {shape: [2, 5, 4], init: randn}
steps:
  - {id: s, op: einsum, inputs: [q, k], equation: EQ}
  - {id: w, op: softmax, dim: DIM}
"""
    assert codes(base.replace("EQ", "'bqd,bkd->bqk'").replace("DIM", "-1")) == set()
    assert codes(base.replace("EQ", "'bqd,bkd->bkq'").replace("DIM", "-1")) == {"softmax-over-queries"}
    assert codes(base.replace("EQ", "'bqd,bkd->bkq'").replace("DIM", "-2")) == set()


def test_bottom_right_causal_with_more_queries_than_keys_risks_nan():
    text = """
name: n
inputs:
  s: {shape: [3, 2], init: randn}
steps:
  - {id: m, op: mask, input: s, causal: true}
"""
    assert codes(text) == {"nan-risk-mask"}
    assert codes(text.replace("causal: true", "causal: true, align: top-left")) == set()


# ---------------------------------------------------------------- allow: a lint tripped on purpose, reported with its reason

SHARPENED = """
name: sharpened_attention
dims: {B: 1, H: 2, T: 4, Dh: 4, d_k: 8}
inputs:
  q: {shape: [B, H, T, Dh], init: randn}
  k: {shape: [B, H, T, Dh], init: randn}
  v: {shape: [B, H, T, Dh], init: randn}
steps:
  - {id: k_t, op: transpose, input: k, dims: [-2, -1]}
  - {id: scores, op: matmul, inputs: [q, k_t]}
  - {id: scaled, op: scale, divide: {sqrt: d_k}ALLOW}
  - {id: weights, op: softmax, dim: -1}
  - {id: context, op: matmul, inputs: [weights, v]}
"""


def test_allow_reports_the_lint_as_allowed_with_its_reason_and_strict_passes(capsys):
    assert codes(SHARPENED.replace("ALLOW", "")) == {"scale-mismatch"}
    allowed = SHARPENED.replace("ALLOW", ', allow: {scale-mismatch: "a flatter softmax on purpose"}')
    analysis = tracer.loads(allowed, "g.yaml").check()
    [note] = analysis.diagnostics
    assert (note.severity, note.code, note.step) == ("allowed", "scale-mismatch", "scaled") and not analysis.warnings
    assert note.message.endswith("— allowed: a flatter softmax on purpose")
    assert str(note).startswith("g.yaml:11:") and "allowed[scale-mismatch]: step 'scaled'" in str(note)


def test_an_allow_naming_no_lint_is_an_error_and_a_stale_one_a_warning():
    with pytest.raises(tracer.TracerError) as typo:
        tracer.loads(SHARPENED.replace("ALLOW", ", allow: {scale-mismach: reason}"), "g.yaml")
    [error] = typo.value.diagnostics
    assert error.code == "unknown-lint" and "did you mean 'scale-mismatch'?" in error.message and error.position.line == 11
    stale = SHARPENED.replace("sqrt: d_k", "sqrt: Dh").replace("ALLOW", ", allow: {scale-mismatch: old reason}")
    [d] = tracer.loads(stale, "g.yaml").check().diagnostics
    assert (d.code, d.severity) == ("unused-allow", "warning") and "old reason" in d.message


# ---------------------------------------------------------------- held-out variants of the semantic lints

LLAMA = (PIPELINES / "models" / "llama_decoder_layer.yaml").read_text()
DECODE = (PIPELINES / "models" / "kv_cache_decode.yaml").read_text()


@pytest.mark.parametrize(
    "text, old, new, code",
    [
        # rope turning the heads: q left (B, T, H, Dh) for rope, transposed after
        (
            LLAMA,
            "{id: q_rot, op: rope, input: q_h, theta: 10000.0, group: self_attn}",
            "{id: q_rot0, op: rope, input: q_heads}\n  - {id: q_rot, op: transpose, input: q_rot0, dims: [1, 2]}",
            "attention-axis",
        ),
        # a softmax over the heads of Llama's scores
        (LLAMA, "{id: weights, op: softmax, dim: -1", "{id: weights, op: softmax, dim: 1", "softmax-axis"),
        # the decode step's queries rotated from 0 while its keys sit after the cache
        (DECODE, "{id: q_rot, op: rope, input: q_h, offset: past}", "{id: q_rot, op: rope, input: q_h}", "rope-offset"),
        # top-left causal alignment after the cache
        (DECODE, "{id: masked, op: mask, causal: true,", "{id: masked, op: mask, causal: true, align: top-left,", "causal-align"),
        # repeat_kv's expand with the copies outside the kv heads: tiled, as repeat(1, n_rep, 1, 1) is
        (
            DECODE,
            "  - {id: k_rep, op: repeat_interleave, input: k_all, repeats: n_rep, dim: 1, group: attention}",
            "  - {id: k_u, op: unsqueeze, input: k_all, dim: 1}\n  - {id: k_e, op: expand, shape: [B, n_rep, H_kv, T_kv, Dh]}\n"
            "  - {id: k_rep, op: reshape, shape: [B, H, T_kv, Dh]}",
            "gqa-head-order",
        ),
        # new values rotated, then joined to the value cache
        (
            DECODE,
            "  - {id: v_all, op: cat, inputs: [v_cache, v_h], dim: 2, group: cache}",
            "  - {id: v_r, op: rope, input: v_h, offset: past}\n  - {id: v_all, op: cat, inputs: [v_cache, v_r], dim: 2, group: cache}",
            "rope-on-values",
        ),
    ],
)
def test_semantic_lints_catch_variants_of_the_bundled_models(text, old, new, code):
    assert old in text and codes(text) == set()
    assert code in codes(text.replace(old, new))


def test_repeat_kv_with_the_copies_inside_the_heads_is_clean():
    right = DECODE.replace(
        "  - {id: k_rep, op: repeat_interleave, input: k_all, repeats: n_rep, dim: 1, group: attention}",
        "  - {id: k_u, op: unsqueeze, input: k_all, dim: 2}\n  - {id: k_e, op: expand, shape: [B, H_kv, n_rep, T_kv, Dh]}\n"
        "  - {id: k_rep, op: reshape, shape: [B, H, T_kv, Dh]}",
    )
    assert codes(right) == set()
    trace = tracer.loads(right, "d.yaml").run()
    reference = tracer.loads(DECODE, "d.yaml").run()
    assert (trace.outputs["out"] == reference.outputs["out"]).all()  # the same heads as repeat_interleave


def test_expect_compares_dim_names_not_only_sizes():
    text = """
name: e
dims: {B: 1, H: 2, T: 4, hs: 4}
inputs:
  q: {shape: [B, H, T, hs], init: randn}
  k: {shape: [B, H, hs, T], init: randn}
steps:
  - {id: scores, op: matmul, inputs: [q, k]}
expect:
  scores: [B, H, T, T]
  q: [1, 2, 4, 4]
"""
    assert tracer.loads(text, "e.yaml").check().diagnostics == ()
    wrong = text.replace("k: {shape: [B, H, hs, T]", "k: {shape: [B, H, hs, hs]")
    with pytest.raises(tracer.TracerError) as found:
        tracer.loads(wrong, "e.yaml")
    [error] = found.value.diagnostics
    assert error.code == "expect" and "T where the tensor has hs (both 4)" in error.message


# ---------------------------------------------------------------- masks added to the scores, and masks that fit by coincidence

BERT = (PIPELINES / "models" / "bert_self_attention.yaml").read_text()
BERT_BIAS = """  - {id: padding, op: sub, inputs: [one, mask_f], group: padding mask}
  - {id: bias, op: mul, inputs: [padding, min_value], group: padding mask}"""


@pytest.mark.parametrize(
    "old, new",
    [
        # BERT's mask cast to float and added as it is
        (BERT_BIAS, "  - {id: bias, op: expand, input: mask_f, shape: [B, 1, 1, T]}"),
        # a bool mask made float, through a view instead of unsqueezes
        (
            "  attention_mask: {shape: [B, T], init: ones, dtype: int64}",
            "  attention_mask: {shape: [B, T], init: ones, dtype: bool}",
        ),
    ],
)
def test_binary_mask_added_catches_variants_of_bert(old, new):
    assert old in BERT and codes(BERT) == set()
    text = BERT.replace(old, new)
    if "dtype: bool" in new:  # the bool mask still goes through (1 - m) * min: right, until the sub is dropped
        assert codes(text) == set()
        text = text.replace(BERT_BIAS, "  - {id: bias, op: view, input: mask_f, shape: [B, 1, 1, T]}")
    [warning] = [d for d in warnings_of(text) if d.code == "binary-mask-added"]  # (and `one`, `min_value` now unused)
    assert warning.step == "masked" and warning.position.line == line_of(text, "{id: masked, op: add")


def test_binary_mask_added_reads_declared_content_and_sdpa_float_masks():
    base = """
name: m
dims: {B: 1, H: 2, T: 4, Dh: 4}
inputs:
  q: {shape: [B, H, T, Dh], init: randn}
  k: {shape: [B, H, T, Dh], init: randn}
  v: {shape: [B, H, T, Dh], init: randn}
params:
  bias: {shape: [T, T], INIT}
steps:
  - {id: kt, op: transpose, input: k, dims: [2, 3]}
  - {id: s, op: matmul, inputs: [q, kt]}
  - {id: scaled, op: scale, divide: {sqrt: Dh}}
  - {id: masked, op: add, inputs: [scaled, bias]}
  - {id: w, op: softmax, dim: -1}
  - {id: c, op: matmul, inputs: [w, v]}
"""
    assert codes(base.replace("INIT", "init: tril")) == {"binary-mask-added"}  # a float tril: 1 = keep, added
    assert codes(base.replace("INIT", "values: [[0, 1, 1, 1], [0, 0, 1, 1], [0, 0, 0, 1], [0, 0, 0, 0]]")) == {"binary-mask-added"}
    assert codes(base.replace("INIT", "init: zeros")) == set()  # an all-zero additive mask hides nothing, rightly
    assert codes(base.replace("INIT", "init: randn")) == set()  # a learned bias (T5, ALiBi) is not judged
    fused = """
name: f
dims: {B: 1, H: 2, T: 4, Dh: 4}
inputs:
  q: {shape: [B, H, T, Dh], init: randn}
  k: {shape: [B, H, T, Dh], init: randn}
  v: {shape: [B, H, T, Dh], init: randn}
  keep: {shape: [T, T], init: tril, dtype: bool}
steps:
  - {id: keep_f, op: cast, input: keep, dtype: float32}
  - {id: c, op: sdpa, inputs: [q, k, v], mask: keep_f}
"""
    [warning] = warnings_of(fused)
    assert warning.code == "binary-mask-added" and "'keep'" in warning.message and "polarity: keep" in warning.message


def test_scores_pass_through_an_additive_mask_to_the_other_lints():
    """The attention core follows an add into the scores, so a wrong scale behind BERT's additive
    mask is caught as it is without one."""
    wrong = BERT.replace("divide: {sqrt: Dh}", "divide: {sqrt: d_model}")
    assert "scale-mismatch" in codes(wrong)
    [site] = tracer.loads(BERT, "b.yaml").check().attention
    assert site.biases == (("masked", "bias"),) and site.chain == ("scaled", "masked")


MASKED = """
name: p
dims: {B: 4, H: 2, T: 4, Dh: 4}
inputs:
  q: {shape: [B, H, T, Dh], init: randn}
  k: {shape: [B, H, T, Dh], init: randn}
  v: {shape: [B, H, T, Dh], init: randn}
  pad: {shape: [B, T], init: ones, dtype: bool}
steps:
  - {id: c, op: sdpa, inputs: [q, k, v], mask: pad, polarity: keep}
"""
UNFUSED = """  - {id: kt, op: transpose, input: k, dims: [2, 3]}
  - {id: s, op: matmul, inputs: [q, kt]}
  - {id: scaled, op: scale, divide: {sqrt: Dh}}
  - {id: c, op: mask, mask: pad, polarity: keep}
  - {id: w, op: softmax, dim: -1}
  - {id: out, op: matmul, inputs: [w, v]}"""


@pytest.mark.parametrize("fused", [True, False])
def test_a_padding_mask_that_broadcasts_only_because_batch_equals_length_is_warned(fused):
    """A (B, T) padding mask against (B, H, T, T) scores lines B up with the queries' T: it runs
    only while B == T, and hides the wrong keys even then."""
    text = MASKED if fused else MASKED.replace("  - {id: c, op: sdpa, inputs: [q, k, v], mask: pad, polarity: keep}", UNFUSED)
    [warning] = warnings_of(text)
    assert warning.code == "dim-mismatch" and warning.step == "c"
    assert "T and B are equal only because T=4 and B=4" in warning.message
    assert warning.position.line == line_of(text, "{id: c, op:")
    fixed = text.replace("pad: {shape: [B, T]", "pad: {shape: [B, 1, 1, T]")  # mask[:, None, None, :]
    assert codes(fixed) == set()
    with pytest.raises(tracer.TracerError) as refused:  # at other sizes it does not even run
        tracer.loads(text.replace("B: 4", "B: 2"), "p.yaml")
    assert refused.value.diagnostics[0].code == "broadcast"


def test_an_add_that_lines_up_different_dims_of_equal_size_is_warned():
    text = """
name: a
dims: {T: 4, d: 4}
inputs:
  x: {shape: [T, d], init: randn}
  pos: {shape: [d, T], init: randn}
steps:
  - {id: y, op: add, inputs: [x, pos]}
"""
    [warning] = warnings_of(text)
    assert warning.code == "dim-mismatch" and "d and T are equal only because d=4 and T=4" in warning.message


GPT2 = (PIPELINES / "models" / "gpt2_attention.yaml").read_text()


def test_an_unread_split_output_is_named_at_the_split():
    """GPT-2's fused qkv with the values never read: the queries stand in for them."""
    text = GPT2.replace("{id: v_heads, op: view, input: v,", "{id: v_heads, op: view, input: q,")
    assert text != GPT2 and codes(GPT2) == set()
    found = {d.code: d for d in warnings_of(text)}
    assert "output 'v' of this split is never read" in found["unused-tensor"].message
    assert found["unused-tensor"].position.line == line_of(text, "{id: qkv_split, op: split")


def test_an_unread_declaration_is_warned_at_its_line_unless_allowed_with_a_reason():
    text = example("unused_tensor")
    [d] = warnings_of(text)
    assert (d.code, d.position.line) == ("unused-tensor", line_of(text, "attention_mask: {shape"))
    allowed = text.replace("dtype: bool}", "dtype: bool, allow: {unused-tensor: kept for the API}}")
    [note] = tracer.loads(allowed, "u.yaml").check().diagnostics
    assert note.severity == "allowed" and "kept for the API" in note.message
    stale = example("fixed/unused_tensor").replace("dtype: bool}", "dtype: bool, allow: {unused-tensor: kept for the API}}")
    [d] = tracer.loads(stale, "u.yaml").check().diagnostics
    assert d.code == "unused-allow" and "kept for the API" in d.message
    with pytest.raises(tracer.TracerError):  # only unused-tensor can be allowed on a declaration
        tracer.loads(text.replace("dtype: bool}", "dtype: bool, allow: {dead-step: no}}"), "u.yaml")


MLA_KEYS = """\
name: mla_keys
dims: {B: 1, H: 2, T: 3, Dn: 4, Dr: 4}
inputs:
  q: {shape: [B, H, T, Dn + Dr], init: randn}
  k_nope: {shape: [B, H, T, Dn], init: randn}
  k_rope: {shape: [B, H, T, Dr], init: randn}
  v: {shape: [B, H, T, Dn], init: randn}
steps:
  - {id: k_rot, op: rope, input: k_rope}
  - {id: key, op: cat, inputs: [k_nope, k_rot], dim: DIM}
  - {id: context, op: sdpa, inputs: [q, key, v], causal: true}
"""


def test_keys_joined_along_their_features_are_no_cache_for_rope_offset():
    """DeepSeek's MLA keys are cat([k_nope, k_rope], -1): features, not a cache appended along the
    positions, so their rope at offset 0 is right (rope-offset fired on it before)."""
    assert "rope-offset" not in codes(MLA_KEYS.replace("DIM", "-1"))
    along_tokens = MLA_KEYS.replace("DIM", "2").replace("k_nope: {shape: [B, H, T, Dn]", "k_nope: {shape: [B, H, T, Dn + Dr]")
    assert "rope-offset" in codes(
        along_tokens.replace("v: {shape: [B, H, T, Dn]", "v: {shape: [B, H, 2 * T, Dn]").replace(
            "k_rope: {shape: [B, H, T, Dr]", "k_rope: {shape: [B, H, T, Dn + Dr]"
        )
    )


def test_an_additive_mask_after_a_composite_score_step_is_read_by_its_records():
    """T5's relative_bias is one step of several records; a 0/1 mask added after it is still
    found (the composite's id names its last record), and nothing crashes on the way."""
    t5 = (PIPELINES / "models" / "t5_self_attention.yaml").read_text()
    old = "  - {id: masked, op: mask, input: biased, mask: key_mask_4d, polarity: keep, fill: min}"
    assert old in t5 and codes(t5) == set()
    added = t5.replace(
        old, "  - {id: key_mask_f, op: cast, input: key_mask_4d, dtype: float32}\n  - {id: masked, op: add, inputs: [biased, key_mask_f]}"
    )
    [warning] = warnings_of(added)
    assert warning.code == "binary-mask-added" and "'key_mask_4d'" in warning.message
    [site] = tracer.loads(added, "t5.yaml").check().attention
    assert site.biases == (("masked", "key_mask_f"),)


MASKED_CORE = """
name: m
dims: {B: 2, H: 2, T: 4, Dh: 4}
inputs:
  q: {shape: [B, H, T, Dh], init: randn}
  k: {shape: [B, H, T, Dh], init: randn}
  v: {shape: [B, H, T, Dh], init: randn}
  keep: {shape: MASK_SHAPE, init: ones, dtype: MASK_DTYPE}
steps:
  - {id: kt, op: transpose, input: k, dims: [2, 3]}
  - {id: s, op: matmul, inputs: [q, kt]}
CHAIN
  - {id: w, op: softmax, dim: -1}
  - {id: c, op: matmul, inputs: [w, v]}
"""


def masked_core(chain: str, shape: str = "[B, 1, 1, T]", dtype: str = "bool") -> str:
    return MASKED_CORE.replace("CHAIN", chain).replace("MASK_SHAPE", shape).replace("MASK_DTYPE", dtype)


@pytest.mark.parametrize(
    "chain, weak",
    [
        ("  - {id: m, op: mask, input: s, mask: keep, polarity: keep, fill: 0.0}", True),  # masked_fill(mask == 0, 0)
        ("  - {id: m, op: mask, input: s, mask: keep, polarity: keep, fill: -5.0}", True),
        ("  - {id: m, op: mask, input: s, mask: keep, polarity: keep, fill: -1.0e9}", False),  # tutorial 003
        ("  - {id: m, op: mask, input: s, mask: keep, polarity: keep, fill: min}", False),
        ("  - {id: m, op: mask, input: s, causal: true, fill: -100.0}\n  - {id: sc, op: scale, divide: {sqrt: Dh}}", False),  # -50
        ("  - {id: m, op: mask, input: s, causal: true, fill: -100.0}\n  - {id: sc, op: scale, multiply: 0.1}", True),  # -10
        ("  - {id: sc, op: scale, input: s, multiply: 0.1}\n  - {id: m, op: mask, causal: true, fill: -100.0}", False),  # before
    ],
)
def test_weak_mask_fill_judges_the_fill_softmax_sees(chain, weak):
    text = masked_core(chain)
    assert ("weak-mask-fill" in codes(text)) == weak
    if weak:
        [found] = [d for d in warnings_of(text) if d.code == "weak-mask-fill"]
        assert found.step == "m" and found.position.line == line_of(text, "{id: m, op: mask")


def test_weak_mask_fill_leaves_weights_zeroed_after_the_softmax_alone():
    text = masked_core("  - {id: m, op: mask, input: s, causal: true}").replace(
        "  - {id: c, op: matmul, inputs: [w, v]}",
        "  - {id: wz, op: mask, input: w, mask: keep, polarity: keep, fill: 0.0}\n  - {id: c, op: matmul, inputs: [wz, v]}",
    )
    assert "weak-mask-fill" not in codes(text)


@pytest.mark.parametrize(
    "shape, chain, on_queries",
    [
        ("[B, 1, T, 1]", "  - {id: m, op: mask, input: s, mask: keep, polarity: keep, fill: min}", True),
        ("[B, 1, 1, T]", "  - {id: m, op: mask, input: s, mask: keep, polarity: keep, fill: min}", False),
        ("[B, 1, T, T]", "  - {id: m, op: mask, input: s, mask: keep, polarity: keep, fill: min}", False),  # a full mask
        ("[T, 1]", "  - {id: m, op: mask, input: s, mask: keep, polarity: block, fill: min}", True),  # right-aligned: (T, 1)
        ("[T]", "  - {id: m, op: mask, input: s, mask: keep, polarity: keep, fill: min}", False),  # (T,) lines up with the keys
    ],
)
def test_mask_on_queries_reads_which_axis_the_mask_varies_along(shape, chain, on_queries):
    assert ("mask-on-queries" in codes(masked_core(chain, shape))) == on_queries


def test_mask_on_queries_catches_an_additive_bias_and_sdpas_mask():
    added = masked_core("  - {id: m, op: add, inputs: [s, keep]}", "[B, 1, T, 1]", "float32").replace("init: ones", "init: randn")
    [found] = [d for d in warnings_of(added) if d.code == "mask-on-queries"]
    assert "softmax ignores" in found.message and found.position.line == line_of(added, "{id: m, op: add")
    fused = (
        masked_core("", "[B, 1, T, 1]")
        .replace(
            "  - {id: w, op: softmax, dim: -1}\n  - {id: c, op: matmul, inputs: [w, v]}",
            "  - {id: c, op: sdpa, inputs: [q, k, v], mask: keep, polarity: keep}",
        )
        .replace("  - {id: kt, op: transpose, input: k, dims: [2, 3]}\n  - {id: s, op: matmul, inputs: [q, kt]}\n", "")
    )
    assert "mask-on-queries" in codes(fused)


def test_the_mask_on_queries_example_really_lets_real_tokens_attend_to_padding():
    """What the lint is about, measured: with the mask over the queries, batch 1's real tokens give
    the padded keys weight; with the fixed twin's mask over the keys they give them none."""
    bad = tracer.load(EXAMPLES / "mask_on_queries.yaml").run(keep_values=True)["weights"].tensor
    fixed = tracer.load(EXAMPLES / "fixed" / "mask_on_queries.yaml").run(keep_values=True)["weights"].tensor
    assert bad[1, :, :2, 2:].sum() > 0.1 and fixed[1, :, :2, 2:].sum() == 0


def test_rope_after_a_cat_of_heads_is_no_cache():
    """StableLM's per-head norms split the key heads and cat them back before RoPE: a cat along the
    heads, not the tokens, so no cached keys are rotated twice; a cat along the tokens still is."""
    text = """
name: heads
dims: {B: 2, H: 2, T: 5, Dh: 4}
inputs: {q: {shape: [B, H, T, Dh], init: randn}, k: {shape: [B, H, T, Dh], init: randn}, v: {shape: [B, H, T, Dh], init: randn}}
steps:
  - {id: parts, op: split, input: k, dim: 1, sizes: 1, outputs: [k0, k1]}
  - {id: joined, op: cat, inputs: [k0, k1], dim: JOIN, size: SIZE}
  - {id: k_rot, op: rope, input: joined}
  - {id: q_rot, op: rope, input: q}
  - {id: out, op: sdpa, inputs: [q_rot, k_rot, v]}
"""
    assert "rope-after-cache" not in codes(text.replace("JOIN", "1").replace("SIZE", "H"))
    assert "rope-after-cache" in codes(
        text.replace("dim: 1, sizes: 1", "dim: 2, sizes: [2, 3]").replace("JOIN", "2").replace(", size: SIZE", "")
    )
