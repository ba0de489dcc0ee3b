"""Semantic lints, held-out variants: the direction of attention (causal masks on cross-attention,
a declared role), KV-cache concat order, padding masks followed through layout and arithmetic
(polarity, multiplied masks, masks never applied, left padding with a causal -inf mask). Each
variant is written differently from the lint's example; the correct designs check clean."""

import textwrap

import pytest

import tracer
from tests.conftest import PIPELINES


def warnings(text: str) -> list:
    """The warnings, but unused-tensor's: the templates declare masks some variants do not read."""
    return [d for d in tracer.loads(textwrap.dedent(text), "t.yaml").check().warnings if d.code != "unused-tensor"]


def codes(text: str) -> list[str]:
    return [d.code for d in warnings(text)]


def line_of(text: str, needle: str) -> int:
    return next(i for i, line in enumerate(textwrap.dedent(text).splitlines(), 1) if needle in line)


# ------------------------------------------------------------------ direction of attention

CROSS = """\
name: cross
{role}
dims: {{B: 1, H: 2, T: 3, {src}, Dh: 4}}
inputs:
  x: {{shape: [B, H, T, Dh], init: randn}}
  memory: {{shape: [B, H, {s}, Dh], init: randn}}
  src_keep: {{shape: [B, 1, 1, {s}], values: {keep}}}
params:
  W: {{shape: [Dh, Dh], init: linear}}
steps:
  - {{id: q, op: linear, input: x, weight: W}}
  - {{id: k, op: linear, input: memory, weight: W}}
  - {{id: v, op: linear, input: memory, weight: W}}
  - {{id: k_t, op: transpose, input: k, dims: [2, 3]}}
  - {{id: scores, op: matmul, inputs: [q, k_t]}}
  - {{id: scaled, op: scale, divide: {{sqrt: Dh}}}}
  - {{id: masked, op: mask, {mask}, fill: min}}
  - {{id: weights, op: softmax, dim: -1}}
  - {{id: context, op: matmul, inputs: [weights, v]}}
"""
KEEP5 = "[[[[true, true, true, false, false]]]]"


def cross(mask: str, role: str = "", src: str = "S: 5", s: str = "S", keep: str = KEEP5) -> str:
    return CROSS.format(role=role, src=src, s=s, keep=keep, mask=mask)


def test_causal_mask_on_unfused_cross_attention_is_reported_at_the_mask_step():
    text = cross("causal: true, mask: src_keep, polarity: keep")
    [d] = warnings(text)
    assert d.code == "causal-cross-attention" and d.step == "masked"
    assert "queries (T tokens, from x)" in d.message and "keys (S tokens, from memory)" in d.message


def test_triangular_mask_tensor_on_cross_attention_is_causal_too():
    text = cross("mask: fut, polarity: block").replace("params:", "  fut: {shape: [T, S], init: triu}\nparams:")
    assert codes(text) == ["causal-cross-attention"]


def test_cross_attention_declared_when_the_lengths_share_a_dim():
    """Source and target of the same length T: only the declaration says it is cross-attention."""
    text = cross("causal: true", role="attention: {kind: cross}", src="S: 3", s="T", keep="[[[[true, true, true]]]]")
    assert codes(text) == ["causal-cross-attention"]
    assert codes(text.replace("attention: {kind: cross}", "")) == []


def test_cross_attention_with_only_the_source_padding_mask_is_clean():
    assert codes(cross("mask: src_keep, polarity: keep")) == []


def test_decoder_file_cross_attention_is_not_asked_for_a_causal_mask():
    assert codes(cross("mask: src_keep, polarity: keep", role="attention: {kind: decoder}")) == []


SELF = """\
name: self
{role}
dims: {{B: 2, H: 2, T: 4, Dh: 4}}
inputs:
  q: {{shape: [B, H, T, Dh], init: randn}}
  k: {{shape: [B, H, T, Dh], init: randn}}
  v: {{shape: [B, H, T, Dh], init: randn}}
  attention_mask: {{shape: [B, T], dtype: int64, values: {rows}}}
steps:
{steps}
"""
RIGHT_PADDED = "[[1, 1, 1, 1], [1, 1, 1, 0]]"
LEFT_PADDED = "[[1, 1, 1, 1], [0, 0, 1, 1]]"


def self_attention(steps: str, role: str = "", rows: str = RIGHT_PADDED) -> str:
    return SELF.format(role=role, rows=rows, steps=textwrap.indent(textwrap.dedent(steps).strip(), "  "))


def test_decoder_sdpa_with_only_a_padding_mask_is_reported():
    steps = """\
    - {id: keep, op: view, input: attention_mask, shape: [B, 1, 1, T]}
    - {id: keep_b, op: cast, dtype: bool}
    - {id: context, op: sdpa, inputs: [q, k, v], mask: keep_b, polarity: keep}
    """
    text = self_attention(steps, role="attention: {kind: decoder}")
    [d] = warnings(text)
    assert d.code == "attention-role" and d.step == "context" and "causal: true" in d.message
    assert codes(text.replace("polarity: keep}", "polarity: keep, causal: true}")) == []
    assert codes(text.replace("attention: {kind: decoder}", "")) == []  # an encoder's design without the declaration


def test_decoder_without_any_mask_is_reported_and_a_full_mask_of_unknown_content_is_not():
    text = self_attention("- {id: context, op: sdpa, inputs: [q, k, v]}", role="attention: {kind: decoder}")
    assert codes(text) == ["attention-role"]
    full = text.replace("steps:", "  m: {shape: [T, T], dtype: bool, init: randn}\nsteps:").replace(
        "inputs: [q, k, v]}", "inputs: [q, k, v], mask: m, polarity: keep}"
    )
    assert "attention-role" not in codes(full.replace("init: randn}\nsteps", "init: tril}\nsteps"))


def test_encoder_with_a_causal_mask_is_reported_at_causal():
    text = self_attention("- {id: context, op: sdpa, inputs: [q, k, v], causal: true}", role="attention: {kind: encoder}")
    [d] = warnings(text)
    assert d.code == "attention-role" and "encoder" in d.message
    assert d.position.line == line_of(text, "causal: true")


@pytest.mark.parametrize("name", ["bart_cross_attention", "kv_cache_decode", "llama31_packed_attention", "t5_self_attention"])
def test_zoo_models_stay_clean(name):
    assert tracer.load(PIPELINES / "models" / f"{name}.yaml").check().diagnostics == ()


# ------------------------------------------------------------------ KV-cache order

DECODE = """\
name: decode
dims: {B: 1, H: 2, H_kv: 1, n_rep: H // H_kv, past: 3, T: 2, Dh: 4}
inputs:
  x: {shape: [B, T, Dh], init: randn}
  k_cache: {shape: [B, H_kv, past, Dh], init: randn}
  v_cache: {shape: [B, H_kv, past, Dh], init: randn}
params:
  W_q: {shape: [H * Dh, Dh], init: linear}
  W_k: {shape: [H_kv * Dh, Dh], init: linear}
steps:
  - {id: q, op: linear, input: x, weight: W_q}
  - {id: q_h, op: view, shape: [B, T, H, Dh]}
  - {id: q_t, op: transpose, dims: [1, 2]}
  - {id: k, op: linear, input: x, weight: W_k}
  - {id: k_h, op: reshape, shape: [B, T, H_kv, Dh]}
  - {id: k_t, op: permute, dims: [0, 2, 1, 3]}
  - {id: v_t, op: contiguous, input: k_t}
  - {id: q_rot, op: rope, input: q_t, offset: past}
  - {id: k_rot, op: rope, input: k_t, offset: past}
  - {id: k_all, op: cat, inputs: KEYS, dim: -2}
  - {id: v_all, op: cat, inputs: VALUES, dim: 2}
  - {id: k_rep, op: repeat_interleave, input: k_all, repeats: n_rep, dim: 1}
  - {id: v_rep, op: repeat_interleave, input: v_all, repeats: n_rep, dim: 1}
  - {id: kT, op: transpose, input: k_rep, dims: [2, 3]}
  - {id: scores, op: matmul, inputs: [q_rot, kT]}
  - {id: scaled, op: scale, divide: {sqrt: Dh}}
  - {id: masked, op: mask, causal: true}
  - {id: weights, op: softmax, dim: -1}
  - {id: context, op: matmul, inputs: [weights, v_rep]}
"""


def decode(keys: str, values: str = "[v_cache, v_t]") -> str:
    return DECODE.replace("KEYS", keys).replace("VALUES", values)


def test_swapped_key_cache_is_reported_at_the_cat_and_rope_offset_stays_quiet():
    text = decode("[k_rot, k_cache]")
    [d] = warnings(text)
    assert d.code == "cache-order" and d.step == "k_all" and "inputs: [k_cache, k_rot]" in d.message
    assert d.position.line == line_of(text, "id: k_all")
    assert codes(decode("[k_cache, k_rot]")) == []


def test_swapped_value_cache_is_reported_too():
    [d] = warnings(decode("[k_cache, k_rot]", "[v_t, v_cache]"))
    assert d.code == "cache-order" and d.step == "v_all" and "inputs: [v_cache, v_t]" in d.message


def test_swapped_cache_of_declared_new_keys_is_found_by_their_length():
    """q, the new keys and the cache all inputs: the new keys are the ones as long as the queries."""
    text = """\
    name: d
    dims: {B: 1, H: 2, past: 4, T: 1, Dh: 4}
    inputs:
      q: {shape: [B, H, T, Dh], init: randn}
      k_new: {shape: [B, H, T, Dh], init: randn}
      k_cache: {shape: [B, H, past, Dh], init: randn}
      v_all: {shape: [B, H, past + T, Dh], init: randn}
    steps:
      - {id: k_all, op: cat, inputs: [k_new, k_cache], dim: 2}
      - {id: context, op: sdpa, inputs: [q, k_all, v_all], causal: true}
    """
    assert codes(text) == ["cache-order"]
    assert codes(text.replace("[k_new, k_cache]", "[k_cache, k_new]")) == []


# ------------------------------------------------------------------ padding masks through layout and arithmetic

UNFUSED = """\
- {id: k_t, op: transpose, input: k, dims: [2, 3]}
- {id: scores, op: matmul, inputs: [q, k_t]}
- {id: scaled, op: scale, divide: {sqrt: Dh}}
"""
SOFTMAX = """\
- {id: weights, op: softmax, dim: -1}
- {id: context, op: matmul, inputs: [weights, v]}
"""


def padded(layout: str, mask: str, rows: str = RIGHT_PADDED) -> str:
    return self_attention(textwrap.dedent(layout) + UNFUSED + f"- {{id: masked, op: mask, {mask}}}\n" + SOFTMAX, rows=rows)


@pytest.mark.parametrize(
    "layout",
    [
        "- {id: m, op: view, input: attention_mask, shape: [B, 1, 1, T]}\n- {id: mb, op: cast, dtype: bool}\n",
        "- {id: m, op: unsqueeze, input: attention_mask, dim: 1}\n- {id: mb, op: unsqueeze, dim: -2}\n",
        "- {id: m, op: reshape, input: attention_mask, shape: [B, 1, 1, T]}\n- {id: mb, op: expand, shape: [B, H, T, T]}\n",
    ],
)
def test_token_mask_read_as_block_is_reported_through_layout_steps(layout):
    text = padded(layout, "mask: mb, polarity: block, fill: -inf")
    [d] = warnings(text)  # nan-risk-mask stays quiet: the fill is not the line to edit
    assert d.code == "padding-polarity" and d.step == "masked" and "use polarity: keep" in d.message
    assert d.position.line == line_of(text, "id: masked")
    assert codes(text.replace("polarity: block", "polarity: keep")) == []


@pytest.mark.parametrize(
    ("negation", "right"),
    [
        ("- {id: mb, op: logical, fn: not}\n", "block"),
        ("- {id: mb, op: compare, cmp: ne, value: 1}\n", "block"),
        ("- {id: mb, op: compare, cmp: gt, value: 0}\n", "keep"),
    ],
)
def test_polarity_is_judged_through_negations(negation, right):
    layout = "- {id: m, op: view, input: attention_mask, shape: [B, 1, 1, T]}\n" + negation
    wrong = "keep" if right == "block" else "block"
    assert codes(padded(layout, f"mask: mb, polarity: {wrong}, fill: min")) == ["padding-polarity"]
    assert codes(padded(layout, f"mask: mb, polarity: {right}, fill: min")) == []


def test_polarity_combined_with_causal_in_one_step():
    layout = "- {id: mb, op: view, input: attention_mask, shape: [B, 1, 1, T]}\n"
    assert codes(padded(layout, "causal: true, mask: mb, polarity: block, fill: min")) == ["padding-polarity"]
    assert codes(padded(layout, "causal: true, mask: mb, polarity: keep, fill: min")) == []


def test_left_padding_with_a_causal_minus_inf_mask_is_a_nan_risk_at_the_fill():
    layout = "- {id: mb, op: unsqueeze, input: attention_mask, dim: 1}\n- {id: keep, op: unsqueeze, dim: 1}\n"
    text = padded(layout, "causal: true, mask: keep, polarity: keep, fill: -inf", rows=LEFT_PADDED)
    [d] = warnings(text)
    assert d.code == "nan-risk-mask" and "row 1" in d.message and "first 2 queries" in d.message
    assert codes(text.replace("fill: -inf", "fill: min")) == []
    assert codes(padded(layout, "causal: true, mask: keep, polarity: keep, fill: -inf")) == []  # right padding


def test_left_padding_nan_risk_with_causal_and_padding_in_separate_steps():
    layout = "- {id: keep, op: view, input: attention_mask, shape: [B, 1, 1, T]}\n"
    steps = (
        textwrap.dedent(layout) + UNFUSED + "- {id: causal, op: mask, causal: true}\n- {id: masked, op: mask, mask: keep, polarity: keep}\n"
    )
    text = self_attention(steps + SOFTMAX, rows=LEFT_PADDED)
    assert [(d.code, d.step) for d in warnings(text)] == [("nan-risk-mask", "masked")]


@pytest.mark.parametrize(
    "layout",
    [
        "- {id: mb, op: view, input: attention_mask, shape: [B, 1, 1, T]}\n",
        "- {id: m1, op: unsqueeze, input: attention_mask, dim: 1}\n- {id: m2, op: unsqueeze, dim: 1}\n- {id: mb, op: cast, dtype: float32}\n",
    ],
)
def test_mask_multiplied_into_the_scores(layout):
    steps = (
        textwrap.dedent(layout)
        + UNFUSED
        + "- {id: masked, op: mul, inputs: [mb, scaled]}\n- {id: weights, op: softmax, input: masked, dim: -1}\n"
    )
    text = self_attention(steps + "- {id: context, op: matmul, inputs: [weights, v]}\n")
    [d] = warnings(text)
    assert d.code == "mask-multiplied" and d.step == "masked"


def test_weights_multiplied_after_the_softmax_are_not_judged():
    steps = (
        "- {id: mb, op: view, input: attention_mask, shape: [B, 1, 1, T]}\n"
        + UNFUSED
        + textwrap.dedent(
            """\
        - {id: weights, op: softmax, input: scaled, dim: -1}
        - {id: zeroed, op: mul, inputs: [weights, mb]}
        - {id: context, op: matmul, inputs: [zeroed, v]}
        """
        )
    )
    assert "mask-multiplied" not in codes(self_attention(steps))


def test_mask_used_only_for_pooling_never_reaches_the_attention():
    steps = textwrap.dedent(
        """\
        - {id: context, op: sdpa, inputs: [q, k, v]}
        - {id: keep, op: view, input: attention_mask, shape: [B, 1, T, 1]}
        - {id: pooled, op: mul, inputs: [context, keep]}
        """
    )
    text = self_attention(steps)
    [d] = warnings(text)
    assert d.code == "mask-not-applied" and d.step == "context" and "'keep'" in d.message


# ------------------------------------------------------------------ reported at the line to edit


@pytest.mark.parametrize(
    ("layout", "culprit", "field"),
    [
        ("- {id: a, op: unsqueeze, input: attention_mask, dim: 1}\n- {id: mb, op: unsqueeze, dim: -1}\n", "mb", "dim: -1"),
        ("- {id: mb, op: view, input: attention_mask, shape: [B, 1, T, 1]}\n", "mb", "shape"),
        ("- {id: a, op: reshape, input: attention_mask, shape: [B, 1, T, 1]}\n- {id: mb, op: cast, dtype: bool}\n", "a", "shape"),
    ],
)
def test_mask_on_queries_is_reported_at_the_step_that_put_it_there(layout, culprit, field):
    text = padded(layout, "mask: mb, polarity: keep, fill: min")
    [d] = warnings(text)
    assert d.code == "mask-on-queries" and d.step == culprit and "under the queries" in d.message
    assert d.position.line == line_of(text, f"id: {culprit},")


# ------------------------------------------------------------------ positions follow padding and documents


def roped(positions: str, mask: str, rows: str = LEFT_PADDED, extra: str = "") -> str:
    steps = textwrap.dedent(extra) + textwrap.dedent(
        f"""\
        - {{id: q_rot, op: rope, input: q{positions}}}
        - {{id: k_rot, op: rope, input: k{positions}}}
        - {{id: kT, op: transpose, input: k_rot, dims: [2, 3]}}
        - {{id: scores, op: matmul, inputs: [q_rot, kT]}}
        - {{id: masked, op: mask, {mask}, fill: min}}
        - {{id: weights, op: softmax, dim: -1}}
        - {{id: context, op: matmul, inputs: [weights, v]}}
        """
    )
    return self_attention(steps, rows=rows)


PAD = "causal: true, mask: keep, polarity: keep"
KEEP_VIEW = "- {id: keep, op: unsqueeze, input: attention_mask, dim: 1}\n- {id: keep2, op: unsqueeze, dim: 1}\n"


def test_rope_without_positions_on_a_left_padded_batch():
    text = roped("", PAD.replace("keep,", "keep2,"), extra=KEEP_VIEW)
    [d] = warnings(text)
    assert d.code == "positions-ignore-padding" and d.step == "q_rot" and "column 2" in d.message and "'k_rot'" in d.message
    assert codes(roped("", PAD.replace("keep,", "keep2,"), rows=RIGHT_PADDED, extra=KEEP_VIEW)) == []


def test_arange_positions_on_a_left_padded_batch_are_reported_at_the_arange():
    extra = KEEP_VIEW + "- {id: pos, op: arange, stop: T}\n"
    text = roped(", positions: pos", PAD.replace("keep,", "keep2,"), extra=extra)
    [d] = warnings(text)
    assert d.code == "positions-ignore-padding" and d.step == "pos"


def test_declared_positions_judged_against_the_padding_and_mask_derived_ones_clean():
    declared = "  position_ids: {shape: [B, T], dtype: int64, values: ROWS}\nsteps:"
    base = roped(", positions: position_ids", PAD.replace("keep,", "keep2,"), extra=KEEP_VIEW)
    wrong = base.replace("steps:", declared.replace("ROWS", "[[0, 1, 2, 3], [0, 1, 2, 3]]"))
    assert codes(wrong) == ["positions-ignore-padding"]
    right = base.replace("steps:", declared.replace("ROWS", "[[0, 1, 2, 3], [1, 1, 0, 1]]"))
    assert codes(right) == []
    derived = "- {id: c, op: cumsum, input: attention_mask, dim: -1}\n- {id: pos, op: cast, dtype: int64}\n"
    assert codes(roped(", positions: pos", PAD.replace("keep,", "keep2,"), extra=KEEP_VIEW + derived)) == []


def test_learned_positions_on_a_left_padded_batch():
    text = """\
    name: gpt2_left_padded
    dims: {B: 2, T: 4, V: 10, C: 4}
    inputs:
      idx: {shape: [B, T], dtype: int64, values: [[1, 2, 3, 4], [0, 0, 5, 6]]}
      attention_mask: {shape: [B, T], dtype: int64, values: [[1, 1, 1, 1], [0, 0, 1, 1]]}
    params:
      wte: {shape: [V, C], init: embedding}
      wpe: {shape: [T, C], init: embedding}
    steps:
      - {id: tok, op: embed, input: idx, weight: wte}
      - {id: pos, op: arange, stop: T}
      - {id: pe, op: embed, input: pos, weight: wpe}
      - {id: x, op: add, inputs: [tok, pe]}
      - {id: x1, op: unsqueeze, dim: 1}
      - {id: keep, op: view, input: attention_mask, shape: [B, 1, 1, T]}
      - {id: context, op: sdpa, inputs: [x1, x1, x1], causal: true, mask: keep, polarity: keep}
    """
    assert [(d.code, d.step) for d in warnings(text)] == [("positions-ignore-padding", "pos")]


DOCS = "  documents: {shape: [B, T], dtype: int64, values: [[0, 0, 1, 1], [0, 0, 0, 0]]}\n"


def test_packed_documents_with_positions_that_run_on():
    text = roped("", "causal: true, segments: documents").replace("steps:", DOCS + "steps:")
    [d] = warnings(text)
    assert d.code == "positions-documents" and d.step == "q_rot" and "token 2" in d.message


def test_packed_documents_with_declared_positions_that_restart_are_clean_and_the_reverse_is_reported():
    restart = "  position_ids: {shape: [B, T], dtype: int64, values: [[0, 1, 0, 1], [0, 1, 2, 3]]}\n"
    text = roped(", positions: position_ids", "causal: true, segments: documents").replace("steps:", DOCS + restart + "steps:")
    assert codes(text) == []
    no_documents = roped(", positions: position_ids", "causal: true").replace("steps:", restart + "steps:")
    [d] = warnings(no_documents)
    assert d.code == "positions-documents" and "restart" in d.message and d.step == "q_rot"
    hf_left_padding = no_documents.replace("[[0, 1, 0, 1], [0, 1, 2, 3]]", "[[0, 1, 2, 3], [1, 1, 0, 1]]")
    assert codes(hf_left_padding) == []  # cumsum - 1 with the padding set to 1 is not a document restart
    zero_padded = no_documents.replace("[[0, 1, 0, 1], [0, 1, 2, 3]]", "[[0, 1, 2, 0], [0, 1, 0, 0]]")
    assert codes(zero_padded) == []  # right padding at position 0 is not a document either


def test_learned_positions_in_a_decode_step_declared_from_zero():
    text = (PIPELINES / "lint_examples" / "fixed" / "learned_position_offset.yaml").read_text()
    declared = text.replace("  - {id: pos, op: arange, start: past, stop: past + T}\n", "").replace(
        "  k_cache:", "  pos: {shape: [B, T], dtype: int64, values: [[0]]}\n  k_cache:"
    )
    assert [(d.code, d.step) for d in warnings(declared)] == [("learned-position-offset", "pos_emb")]
    assert codes(declared.replace("values: [[0]]}", "values: [[3]]}")) == []


def test_a_mask_of_one_value_is_not_judged():
    """An importer declares a captured attention_mask as zeros: it says nothing about polarity."""
    layout = "- {id: mb, op: view, input: attention_mask, shape: [B, 1, 1, T]}\n"
    assert codes(padded(layout, "mask: mb, polarity: keep, fill: min", rows="[[0, 0, 0, 0], [0, 0, 0, 0]]")) == []


def test_keys_joined_from_another_input_without_a_causal_mask_are_not_a_cache():
    """Flamingo's perceiver resampler: kv = cat([media, latents]), the latents (the queries) last."""
    text = """\
    name: resampler
    dims: {B: 1, H: 2, M: 5, L: 3, Dh: 4}
    inputs:
      latents: {shape: [B, H, L, Dh], init: randn}
      media: {shape: [B, H, M, Dh], init: randn}
    steps:
      - {id: kv, op: cat, inputs: [latents, media], dim: 2}
      - {id: context, op: sdpa, inputs: [latents, kv, kv]}
    """
    assert codes(text) == []
    assert codes(text.replace("kv, kv]}", "kv, kv], causal: true}")) == ["cache-order"]


def test_a_bool_input_over_features_is_not_a_forgotten_padding_mask():
    steps = """\
    - {id: context, op: sdpa, inputs: [q, k, v]}
    - {id: gated, op: where, inputs: [gate, context], otherwise: 0.0}
    """
    text = self_attention(steps).replace("steps:", "  gate: {shape: [Dh], dtype: bool, values: [true, false, true, true]}\nsteps:")
    assert codes(text) == []


BLOCK = """\
name: attn_block
{role}
dims: {{B: 1, H: 2, T: 4, Dh: 4}}
inputs:
  x: {{shape: [B, H, T, Dh], init: randn}}
steps:
  - {{id: context, op: sdpa, inputs: [x, x, x]}}
"""
STACK = """\
name: stack
{role}
dims: {{B: 1, H: 2, T: 4, Dh: 4}}
inputs:
  x: {{shape: [B, H, T, Dh], init: randn}}
steps:
  - {{id: layers, op: block, use: attn_block.yaml, input: x, repeat: 2}}
"""


@pytest.mark.parametrize(
    ("block_role", "stack_role", "expected"),
    [
        ("attention: {kind: decoder}", "", ["attention-role"]),  # both copies, in one warning at the block file's line
        ("", "attention: {kind: decoder}", []),  # the top file's declaration covers its own steps only
        ("attention: {kind: encoder}", "attention: {kind: decoder}", []),
    ],
)
def test_a_block_files_declaration_covers_its_copies(tmp_path, block_role, stack_role, expected):
    (tmp_path / "attn_block.yaml").write_text(BLOCK.format(role=block_role))
    (tmp_path / "stack.yaml").write_text(STACK.format(role=stack_role))
    found = tracer.load(tmp_path / "stack.yaml").check().warnings
    assert [d.code for d in found] == expected
    assert all("1 more copy" in d.message and d.file.endswith("attn_block.yaml") for d in found)


def test_a_prefill_over_a_kv_cache_without_a_causal_mask_is_a_decoder_missing_it():
    text = (
        decode("[k_cache, k_rot]")
        .replace("  - {id: masked, op: mask, causal: true}\n", "")
        .replace("{id: weights, op: softmax, dim: -1}", "{id: weights, op: softmax, input: scaled, dim: -1}")
    )
    [d] = warnings(text)  # T = 2 new tokens: query 0 sees key past + 1
    assert d.code == "attention-role" and "KV cache of 'k_all'" in d.message and "T=2" in d.message
    assert codes(text.replace("T: 2,", "T: 1,")) == []  # one query: every cached key is in its past
    assert tracer.load(PIPELINES / "models" / "kv_cache_decode.yaml").check(dims={"T": 4}).diagnostics == ()
