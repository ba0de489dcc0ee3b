"""The attention core on its own: every attention computation found from the kinds' traits, with
its tensors, axes, scale and masks; unfused chains, einsum scores and fused sdpa alike."""

import math

import tracer
from tests.conftest import PIPELINES, pipeline_text


def sites_of(path_or_text):
    pipeline = tracer.load(path_or_text) if not isinstance(path_or_text, str) else tracer.loads(path_or_text, "a.yaml")
    return pipeline.check().attention


def test_an_unfused_chain_is_one_site_with_its_tensors_scale_and_mask():
    (site,) = sites_of(PIPELINES / "causal_mha.yaml")
    assert (site.product, site.query, site.keys, site.values, site.scores, site.softmax, site.context) == (
        "scores",
        "q_h",
        "k_t",
        "v_h",
        "scores",
        "weights",
        "context",
    )
    assert site.chain == ("masked", "scaled") and [s.step for s in site.scales] == ["scaled"]
    assert math.isclose(site.multiplier, 1 / math.sqrt(2)) and site.masks[0][0] == "masked" and site.masks[0][1].causal
    assert (site.query_axis, site.key_axis, str(site.head_dim)) == (2, 3, "Dh") and not site.fused and site.random == ()


def test_a_fused_step_is_a_site_with_the_kernels_own_scale():
    text = pipeline_text(
        "- {id: ctx, op: sdpa, inputs: [q, k, v], causal: true, window: 2}",
        inputs="q: {shape: [1, 2, 4, 8], init: randn}\nk: {shape: [1, 2, 4, 8], init: randn}\nv: {shape: [1, 2, 4, 8], init: randn}",
    )
    (site,) = sites_of(text)
    assert site.fused and site.scores is None and site.softmax is None and site.context == site.product
    assert math.isclose(site.multiplier, 1 / math.sqrt(site.head_dim.value)) and site.masks[0][1].window is not None


def test_einsum_scores_name_their_query_and_key_axes():
    text = pipeline_text(
        """
        - {id: s, op: einsum, inputs: [q, k], equation: 'bqd,bkd->bkq'}
        - {id: w, op: softmax, dim: -2}
        """,
        inputs="q: {shape: [2, 3, 4], init: randn}\nk: {shape: [2, 5, 4], init: randn}",
    )
    (site,) = sites_of(text)
    assert (site.query_axis, site.key_axis) == (2, 1) and site.values is None and site.context is None


def test_training_dropout_between_the_weights_and_the_values_is_named():
    text = (PIPELINES / "causal_mha.yaml").read_text().replace("p: 0.2,", "p: 0.2, training: true,")
    (site,) = sites_of(text)
    assert site.random == ("weights_d",) and site.context == "context"


def test_a_softmax_of_anything_but_scores_is_no_site():
    text = pipeline_text("- {id: w, op: softmax, dim: -1}", inputs="x: {shape: [2, 3], init: randn}")
    assert sites_of(text) == ()


def test_every_layer_of_a_stack_is_found():
    assert len(sites_of(PIPELINES / "encoder_stack.yaml")) == 48


def test_a_one_operand_einsum_before_a_softmax_is_a_reduction_not_scores():
    """The fuzzer's find: `abc->bc` feeding a softmax has no queries and keys to name."""
    text = pipeline_text(
        "- {id: s, op: einsum, inputs: [x], equation: 'abc->bc'}\n- {id: w, op: softmax, input: s, dim: -1}",
        inputs="x: {shape: [2, 3, 4], init: randn}",
    )
    assert sites_of(text) == ()
    two = text.replace("inputs: [x], equation: 'abc->bc'", "inputs: [x, x], equation: 'abc,adc->abd'")
    (site,) = sites_of(two)
    assert (site.query, site.keys, site.scores) == ("x", "x", "s")
