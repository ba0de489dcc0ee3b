"""``tracer diff`` of the hand-written causal attention and the imported nanoGPT one pairs the
steps a reader pairs: q with q, k with k (nanoGPT computes k first), the scores with the scores,
the output projection with ``c_proj``; causal_mha's separate k and v projections, which nanoGPT's
fused ``c_attn`` has no partner for, are removed, not renamed to ``c_proj``."""

import tracer
from tests.conftest import PIPELINES
from tracer.diff import diff


def test_causal_mha_against_imported_nanogpt_pairs_what_a_reader_pairs():
    found = diff(tracer.load(PIPELINES / "causal_mha.yaml"), tracer.load(PIPELINES / "imported/nanogpt_attention.yaml"))
    renamed = set(found.renamed)
    expected = {
        "step q_heads -> q_view: view",
        "step k_heads -> k_view: view",
        "step v_heads -> v_view: view",
        "step q_h -> q_2: transpose",
        "step k_h -> k_2: transpose",
        "step k_t -> att_transpose: transpose",
        "step scores -> att_matmul: matmul",
        "step masked -> att_2: mask",
        "step out -> c_proj: linear",
        "param W_o -> c_proj.weight",
    }
    assert expected <= renamed, sorted(renamed)
    assert {"k: linear", "v: linear", "weights_d: dropout"} <= set(found.removed) and found.added == ["q_split: split"]


DERIVED = """\
name: {name}
dims: {{B: 2, {length}: 3, past: 4{derived}}}
inputs:
  x: {{shape: [B, {length}, 8], init: randn}}
  cache: {{shape: [B, past, 8], init: randn}}
steps:
  - {{id: flat, op: view, input: x, shape: [{rows}, 8]}}
  - {{id: joined, op: cat, inputs: [cache, x], dim: 1}}
"""


def test_a_derived_dim_is_compared_by_what_it_is_made_of():
    """``N: B * T`` beside ``B * T`` written out is no rename and no dim the other file lacks;
    ``T_kv: past + T`` beside ``past + S`` follows from ``T -> S``, listed once (at the input that
    shows it: no step has T alone)."""
    named = tracer.loads(DERIVED.format(name="a", length="T", derived=", N: B * T, T_kv: past + T", rows="N"), "a.yaml")
    written = tracer.loads(DERIVED.format(name="b", length="T", derived="", rows="B * T"), "b.yaml")
    found = diff(named, written)
    assert found.same and not found.renamed and not found.dims
    other = tracer.loads(DERIVED.format(name="c", length="S", derived="", rows="B * S"), "c.yaml")
    found = diff(named, other)
    assert found.renamed == ["dim T -> S (as at x)"] and found.dims == [["T", "3", "-"], ["S", "-", "3"]]
