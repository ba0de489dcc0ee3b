"""tracer.verify: pipelines against F.scaled_dot_product_attention, nn.MultiheadAttention and each
other."""

import pytest
import torch

import tracer
import tracer.verify as verify
from tests.conftest import PIPELINES


def test_verify_shows_one_sdpa_step_equals_the_unfused_mistral_attention():
    unfused = PIPELINES / "models" / "mistral_sliding_window.yaml"
    text = unfused.read_text()
    start, end = text.index("  - {id: k_rep"), text.index("  # merge heads")
    fused = tracer.loads(
        text[:start]
        + "  - {id: context, op: sdpa, inputs: [q_rot, k_rot, v_h], causal: true, window: W, gqa: true}\n\n"
        + text[end:].replace("  scores: [B, H, T, T]\n", ""),
        "fused.yaml",
    )
    assert verify.against_pipeline(fused, unfused) <= 1e-5
    assert verify.against_pipeline(fused, unfused, dims={"T": 1}) <= 1e-5
    scores = 2 * 4 * 128 * 128 * 4  # (B, H, T, T) float32: the fused step never holds them
    assert tracer.load(unfused).check({"T": 128}).peak_bytes - fused.check({"T": 128}).peak_bytes >= scores


SEEDS = PIPELINES / "seeds"


def loads(text):
    return tracer.loads(text, "t.yaml")


@pytest.mark.parametrize(
    "path",
    [
        PIPELINES / "self_attention.yaml",
        PIPELINES / "causal_mha.yaml",  # causal: true -> is_causal=True
        PIPELINES / "cross_attention.yaml",  # keep-mask (B, 1, 1, T_kv) -> attn_mask
        SEEDS / "001_self_attention_trainable.yaml",  # 2-d, no mask
        SEEDS / "002_weight_split_step_by_step.yaml",  # triu buffer, block polarity, mask before scale
        SEEDS / "003_mha_step_by_step.yaml",  # keep-mask, -1e9, a fully masked row
    ],
    ids=lambda p: p.stem,
)
def test_core_matches_sdpa(path):
    assert verify.against_sdpa(path) <= 1e-5


BIASED = """\
name: biased
dims: {B: 2, H: 2, T: 5, Dh: 4}
inputs:
  q: {shape: [B, H, T, Dh], init: randn}
  k: {shape: [B, H, T, Dh], init: randn}
  v: {shape: [B, H, T, Dh], init: randn}
  bias: {shape: [B, 1, 1, T], init: randn}
steps:
  - {id: k_t, op: transpose, input: k, dims: [-2, -1]}
  - {id: scores, op: matmul, inputs: [q, k_t]}
SCORES
  - {id: weights, op: softmax, dim: -1}
  - {id: context, op: matmul, inputs: [weights, v]}
"""


@pytest.mark.parametrize(
    "scores",
    [
        "  - {id: scaled, op: scale, divide: {sqrt: Dh}}\n  - {id: biased, op: add, inputs: [scaled, bias]}",  # BERT
        "  - {id: biased, op: add, inputs: [scores, bias]}\n  - {id: scaled, op: scale, multiply: 0.5}",  # the bias scaled too
        "  - {id: biased, op: add, inputs: [scores, bias]}\n  - {id: hidden, op: mask, causal: true}",  # a bias and a mask
        "  - {id: biased, op: alibi, input: scores}\n  - {id: hidden, op: mask, causal: true}",  # BLOOM
        "  - {id: biased, op: alibi, input: scores, relative: true}\n  - {id: scaled, op: scale, multiply: 0.5}",
    ],
    ids=["bert", "bias-then-scale", "bias-and-causal", "alibi", "alibi-relative-scaled"],
)
def test_biases_added_to_the_scores_become_sdpas_float_mask(scores):
    pipeline = loads(BIASED.replace("SCORES", scores))
    assert verify.against_sdpa(pipeline) <= 1e-5
    core = verify.attention_core(pipeline.check())
    assert len(core.biases) == 1 and core.biases[0][1] == (0.5 if "0.5" in scores else 1.0)


@pytest.mark.parametrize("model", ["bert_self_attention", "t5_self_attention"])
def test_zoo_models_with_additive_masks_and_biases_match_sdpa(model):
    assert verify.against_sdpa(PIPELINES / "models" / f"{model}.yaml") <= 1e-5


def test_a_bias_that_the_reference_left_out_would_be_caught():
    """The control: the same file with the bias dropped from the reference differs."""
    pipeline = loads(BIASED.replace("SCORES", "  - {id: biased, op: add, inputs: [scores, bias]}"))
    trace = pipeline.run(keep_values=True)
    q, k, v = (trace[n].tensor for n in "qkv")
    unbiased = torch.nn.functional.scaled_dot_product_attention(q, k, v, scale=1.0)
    assert not torch.allclose(unbiased, trace["context"].tensor, atol=1e-3)


@pytest.mark.parametrize("name", ["causal_mha", "cross_attention"])
def test_block_matches_multihead_attention(name):
    assert verify.against_mha(PIPELINES / f"{name}.yaml") <= 1e-5


@pytest.mark.parametrize("dims", [{"B": 3, "T": 5, "d_model": 12, "H": 3}, {"B": 1, "T": 2, "d_model": 8, "H": 4}])
def test_causal_mha_matches_at_other_dims_and_seeds(dims):
    pipeline = tracer.load(PIPELINES / "causal_mha.yaml")
    for seed in (1, 2):
        assert verify.against_mha(pipeline, dims=dims, seed=seed) <= 1e-5
        assert verify.against_sdpa(pipeline, dims=dims, seed=seed) <= 1e-5


def test_cross_attention_with_given_tensors():
    """Same weights, user inputs: a different padding pattern given through tensors=."""
    pipeline = tracer.load(PIPELINES / "cross_attention.yaml")
    mask = torch.tensor([True, True, False, False, False, False]).view(1, 1, 1, 6).repeat(2, 1, 1, 1)
    given = {"x_q": torch.randn(2, 4, 8), "x_kv": torch.randn(2, 6, 8), "pad_mask": mask}
    assert verify.against_mha(pipeline, tensors=given) <= 1e-5
    assert verify.against_sdpa(pipeline, tensors=given) <= 1e-5


def test_seed_classes_match_multihead_attention():
    """Tutorial 002's and 003's classes are nn.MultiheadAttention too, once their weights are named."""
    assert (
        verify.against_mha(
            SEEDS / "002_multi_head_attention_class.yaml", num_heads=2, weights=("Wq.weight", "Wk.weight", "Wv.weight", "out_proj.weight")
        )
        <= 1e-5
    )
    assert (
        verify.against_mha(
            SEEDS / "003_multi_headed_attention_class.yaml", num_heads=2, weights=tuple(f"linear_layers.{i}.weight" for i in range(4))
        )
        <= 1e-5
    )


def test_accepts_a_trace():
    trace = tracer.load(PIPELINES / "cross_attention.yaml").run(keep_values=True)
    assert verify.against_sdpa(trace) <= 1e-5
    assert verify.against_mha(tracer.load(PIPELINES / "causal_mha.yaml").run()) <= 1e-5  # re-run with values


def test_attention_core_is_found():
    core = verify.attention_core(tracer.load(PIPELINES / "causal_mha.yaml").check())
    assert (core.query, core.keys_t, core.value, core.softmax, core.context) == ("q_h", "k_t", "v_h", "weights", "context")
    assert core.causal and core.mask is None and core.scale == pytest.approx(2**-0.5)
    cross = verify.attention_core(tracer.load(PIPELINES / "cross_attention.yaml").check())
    assert (cross.mask, cross.polarity, cross.fill) == ("pad_mask", "keep", float("-inf"))


def test_wrong_scale_is_caught_by_mha():
    text = (PIPELINES / "cross_attention.yaml").read_text().replace("divide: {sqrt: Dh}", "divide: {sqrt: d_model}")
    with pytest.raises(verify.VerificationError, match=r"output 'out' vs nn.MultiheadAttention: max abs difference"):
        verify.against_mha(loads(text))
    assert verify.against_sdpa(loads(text)) <= 1e-5  # the core itself is consistent with its own scale


def test_flipped_polarity_is_caught():
    text = (PIPELINES / "cross_attention.yaml").read_text()
    flipped = text.replace("polarity: keep", "polarity: block")
    # against the *intended* semantics (True = real token), encoded by the original file
    pipeline, intended = loads(flipped), loads(text)
    mine = pipeline.run(keep_values=True)["out"].tensor
    ref = intended.run(keep_values=True)["out"].tensor
    assert not torch.allclose(mine, ref, atol=1e-3)
    assert verify.against_mha(pipeline) <= 1e-5  # both follow the file's (flipped) polarity


def test_training_dropout_and_ambiguity_are_refused():
    text = (PIPELINES / "causal_mha.yaml").read_text().replace("p: 0.2,", "p: 0.2, training: true,")
    with pytest.raises(verify.VerificationError, match="training mode"):
        verify.against_sdpa(loads(text))
    with pytest.raises(verify.VerificationError, match="3 softmax steps|2 softmax steps"):
        verify.against_sdpa(SEEDS / "004_multi_head_attention_modulelist.yaml")
    assert verify.against_sdpa(SEEDS / "004_multi_head_attention_modulelist.yaml", softmax="attn_weights_1") <= 1e-5


def test_mismatch_message_names_shapes_and_index():
    with pytest.raises(verify.VerificationError, match=r"x: max abs difference 1 > atol 1e-05 at index \[1, 0\]"):
        verify._compare("x", torch.zeros(2, 2), torch.tensor([[0.0, 0.0], [1.0, 0.0]]), 1e-5)
    with pytest.raises(verify.VerificationError, match=r"shapes differ, \[2\] vs \[3\]"):
        verify._compare("x", torch.zeros(2), torch.zeros(3), 1e-5)
