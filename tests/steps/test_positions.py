"""Position kinds (rope, alibi) against the public code they come from."""

from __future__ import annotations

import math

import pytest
import torch
import yaml
from torch.nn import functional as F

import tracer
from tests.conftest import covers, pipeline_text, refused
from tests.kinds import agrees, close, trace_of
from tests.measure import PeakStorage
from tracer.analysis.lints.patterns import paper_slopes  # the paper's get_slopes, in plain Python


def llama_rope(x, theta, offset, rot=None):
    """transformers' LlamaRotaryEmbedding + apply_rotary_pos_emb (with GPT-NeoX's partial rotary)."""
    rot = rot or x.shape[-1]
    inv_freq = 1.0 / (theta ** (torch.arange(0, rot, 2, dtype=torch.int64).float() / rot))
    position_ids = torch.arange(offset, offset + x.shape[-2])[None]
    freqs = position_ids[..., None].float() * inv_freq
    emb = torch.cat((freqs, freqs), dim=-1)
    cos, sin = emb.cos().unsqueeze(1), emb.sin().unsqueeze(1)
    x_rot, x_pass = x[..., :rot], x[..., rot:]
    x1, x2 = x_rot[..., : rot // 2], x_rot[..., rot // 2 :]
    return torch.cat(((x_rot * cos) + (torch.cat((-x2, x1), dim=-1) * sin), x_pass), dim=-1)


def gptj_rope(x, rot):
    """transformers' GPT-J: create_sinusoional_positions + rotate_every_two on (B, T, H, Dh)."""
    inv_freq = 1.0 / (10000 ** (torch.arange(0, rot, 2, dtype=torch.int64) / rot))
    sinusoid = torch.einsum("i , j -> i j", torch.arange(x.shape[1], dtype=torch.int64).float(), inv_freq).float()
    sin, cos = torch.sin(sinusoid)[None, :, None, :], torch.cos(sinusoid)[None, :, None, :]
    sin, cos = torch.repeat_interleave(sin, 2, 3), torch.repeat_interleave(cos, 2, 3)
    x_rot, x_pass = x[..., :rot], x[..., rot:]
    turned = torch.stack((-x_rot[:, :, :, 1::2], x_rot[:, :, :, ::2]), dim=-1).flatten(-2)
    return torch.cat([x_rot * cos + turned * sin, x_pass], dim=-1)


def bloom_alibi(heads, length):
    """transformers' build_alibi_tensor (BLOOM) for an all-ones attention mask, as (H, 1, T)."""
    closest = 2 ** math.floor(math.log2(heads))
    base = torch.tensor(2 ** (-(2 ** -(math.log2(closest) - 3))), dtype=torch.float32)
    slopes = torch.pow(base, torch.arange(1, 1 + closest, dtype=torch.int32))
    if closest != heads:
        extra = torch.tensor(2 ** (-(2 ** -(math.log2(2 * closest) - 3))), dtype=torch.float32)
        n = min(closest, heads - closest)
        slopes = torch.cat([slopes, torch.pow(extra, torch.arange(1, 1 + 2 * n, 2, dtype=torch.int32))], dim=0)
    mask = torch.ones(1, length, dtype=torch.long)
    positions = ((mask.cumsum(dim=-1) - 1) * mask)[:, None, :]
    return (slopes[..., None] * positions).reshape(heads, 1, length)


@covers("rope")
def test_rope_matches_llama_neox_and_gptj():
    t = trace_of(
        """
        - {id: xt, op: transpose, input: x, dims: [1, 2]}
        - {id: full, op: rope, input: xt, theta: 500000.0}
        - {id: decode, op: rope, input: xt, offset: past}
        - {id: partial, op: rope, input: xt, rotary_dim: R}
        - {id: gptj, op: rope, input: x, style: interleaved, rotary_dim: R, seq_dim: -3}
        """,
        inputs="x: {shape: [2, T, 3, 8], init: randn}",
        dims="{T: 5, past: 7, R: 4}",
    )
    x = t["x"].tensor
    xt = x.transpose(1, 2)
    assert close(t["full"].tensor, llama_rope(xt, 500000.0, 0), atol=1e-5)
    assert close(t["decode"].tensor, llama_rope(xt, 10000.0, 7), atol=1e-5)
    assert close(t["partial"].tensor, llama_rope(xt, 10000.0, 0, rot=4), atol=1e-5)
    assert close(t["gptj"].tensor, gptj_rope(x, 4), atol=1e-5)
    assert t["decode/cos"].shape == (5, 8) and t["decode/cos"].view_of is None


def test_a_run_builds_each_rope_table_once(monkeypatch):
    """transformers computes a layer's cos and sin once for q and k: so does a run, for every rope
    of equal frequencies, positions, size and dtype. A later step gets a copy, its own storage as
    predicted (values unchanged, the memory estimate counts the kept table); a different offset or
    theta builds its own, and nothing is kept from one run to the next."""
    from tracer.steps import positions

    builds = []
    real = positions.rope_default
    monkeypatch.setattr(
        positions, "rope_default", lambda torch, rot, theta, device: builds.append(theta) or real(torch, rot, theta, device)
    )
    steps = """
        - {id: q_rot, op: rope, input: q}
        - {id: k_rot, op: rope, input: k}
        - {id: later, op: rope, input: k, offset: past}
        - {id: slower, op: rope, input: k, theta: 500000.0}
        - {id: again, op: rope, input: q}
    """
    inputs = "q: {shape: [1, 1, T, 8], init: randn}\nk: {shape: [1, 1, T, 8], init: randn}"
    t = agrees(steps, inputs, dims="{T: 64, past: 2}")
    live, table_bytes = t.analysis.memory.live, t["q_rot/cos"].nbytes
    assert live["later"] == live["q_rot"] + 2 * table_bytes  # cos and sin kept from q_rot to again, the group's last step
    builds.clear()
    t = t.pipeline.run(keep_values=True)
    assert sorted(builds) == [10000.0, 10000.0, 500000.0] and t.as_predicted  # q, k and again share one; later and slower build theirs
    q, k = t["q"].tensor, t["k"].tensor
    for rid, x, theta, offset in (
        ("q_rot", q, 1e4, 0),
        ("k_rot", k, 1e4, 0),
        ("later", k, 1e4, 2),
        ("slower", k, 5e5, 0),
        ("again", q, 1e4, 0),
    ):
        assert close(t[rid].tensor, llama_rope(x, theta, offset), atol=1e-5), rid
    tables = [t[f"{rid}/cos"].tensor for rid in ("q_rot", "k_rot", "again")]
    assert all(torch.equal(tables[0], table) for table in tables)
    assert len({table.untyped_storage().data_ptr() for table in tables}) == 3
    builds.clear()
    assert t.pipeline.run({"T": 9}).as_predicted and len(builds) == 3  # other dims: tables of their own size


def test_mrope_section_is_qwen2_vls_multimodal_rope():
    from transformers import Qwen2VLTextConfig
    from transformers.models.qwen2_vl.modeling_qwen2_vl import Qwen2VLRotaryEmbedding, apply_rotary_pos_emb

    parameters = {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 3, 3]}
    rotary = Qwen2VLRotaryEmbedding(Qwen2VLTextConfig(hidden_size=32, num_attention_heads=2, rope_parameters=parameters))
    t = trace_of(
        "- {id: q_rot, op: rope, input: q, positions: position_ids, mrope_section: [2, 3, 3]}",
        inputs="q: {shape: [2, 2, 5, 16], init: randn}\nposition_ids: {shape: [3, 2, 5], init: arange, dtype: int64}",
    )
    q = t["q"].tensor
    cos, sin = rotary(q, t["position_ids"].tensor)
    assert torch.equal(t["q_rot"].tensor, apply_rotary_pos_emb(q, q, cos, sin)[0])
    with pytest.raises(tracer.TracerError, match="sums to 3"):
        tracer.loads(
            pipeline_text(
                "- {id: r, op: rope, input: q, positions: p, mrope_section: [1, 2]}",
                inputs="q: {shape: [1, 1, 2, 8], init: randn}\np: {shape: [2, 1, 2], init: zeros, dtype: int64}",
            ),
            "t.yaml",
        )


@covers("alibi")
@pytest.mark.parametrize("heads", [8, 6, 1, 12])
def test_alibi_slopes_and_bias(heads):
    t = trace_of(
        """
        - {id: b, op: alibi, input: s}
        - {id: rel, op: alibi, input: s, relative: true}
        """,
        inputs=f"s: {{shape: [2, {heads}, 5, 5], init: randn}}",
    )
    s = t["s"].tensor
    assert close(t["b"].tensor, s + bloom_alibi(heads, 5))
    slopes = torch.tensor(paper_slopes(heads))
    assert torch.allclose(t["b/bias"].tensor[:, 0, 1], slopes)
    distance = (torch.arange(5)[None] - torch.arange(5)[:, None]).float()
    assert close(t["rel"].tensor, s + slopes[:, None, None] * distance)


@pytest.mark.parametrize("heads", [8, 6])
def test_alibi_bias_max_is_mpts_bias(heads):
    from transformers.models.mpt.modeling_mpt import build_mpt_alibi_tensor

    t = trace_of("- {id: b, op: alibi, input: s, bias_max: 8.0}", inputs=f"s: {{shape: [2, {heads}, 3, 5], init: randn}}")
    bias = build_mpt_alibi_tensor(heads, 16)[:, -3:, -5:]  # MptAttention slices a max_seq_len table to the last keys
    assert torch.equal(t["b"].tensor, t["s"].tensor + bias)


def test_alibi_on_meta_allocates_nothing_for_many_heads():
    pipeline = tracer.loads(
        pipeline_text("- {id: y, op: alibi, input: x}", dims="H: 67108864", inputs="x: {shape: [H, 1, 1], init: randn}")
    )
    with PeakStorage() as mode:
        pipeline.run(device="meta")
    assert mode.peak == 0  # the slopes were 256 MiB of real memory


SCALINGS = {
    "linear": "{type: linear, factor: 2.5}",
    "dynamic, past max_position_embeddings": "{type: dynamic, factor: 3.0, max_position_embeddings: 8}",
    "dynamic, within": "{type: dynamic, factor: 3.0, max_position_embeddings: 64}",
    "llama3": "{type: llama3, factor: 8.0, low_freq_factor: 1.0, high_freq_factor: 4.0, original_max_position_embeddings: 32}",
    "yarn": "{type: yarn, factor: 4.0, original_max_position_embeddings: 16, beta_fast: 32, beta_slow: 1}",
    "yarn, deepseek mscale": "{type: yarn, factor: 40.0, original_max_position_embeddings: 16, mscale: 1.0, mscale_all_dim: 0.8}",
    "longrope, short": "{type: longrope, short_factor: [1.0, 1.5, 2.0, 3.5], long_factor: [2.0, 4.0, 8.0, 9.0], original_max_position_embeddings: 64, factor: 4.0}",
    "longrope, long": "{type: longrope, short_factor: [1.0, 1.5, 2.0, 3.5], long_factor: [2.0, 4.0, 8.0, 9.0], original_max_position_embeddings: 8, factor: 4.0}",
}


def transformers_rope(x, position_ids, theta, scaling: dict):
    """LlamaRotaryEmbedding (ROPE_INIT_FUNCTIONS, dynamic_rope_update) and apply_rotary_pos_emb."""
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding, apply_rotary_pos_emb

    parameters = {"rope_type": scaling.pop("type"), "rope_theta": theta, **scaling}
    max_positions = scaling.get("max_position_embeddings", 128)
    heads, head_dim = x.shape[1], x.shape[-1]
    config = LlamaConfig(
        hidden_size=heads * head_dim, num_attention_heads=heads, max_position_embeddings=max_positions, rope_parameters=parameters
    )
    cos, sin = LlamaRotaryEmbedding(config)(x, position_ids)
    return apply_rotary_pos_emb(x, x, cos, sin)[0]


@covers("rope")
@pytest.mark.parametrize("case", list(SCALINGS))
def test_rope_scaling_and_positions_match_transformers(case):
    """Each rope_type's frequencies and attention factor, at per-token positions (two packed
    documents in row 0, a left-padded row 1), bit for bit what transformers computes."""
    t = trace_of(
        f"""
        - {{id: y, op: rope, input: x, theta: 10000.0, positions: pos, rope_scaling: {SCALINGS[case]}}}
        - {{id: z, op: rope, input: x, theta: 10000.0, offset: 3, rope_scaling: {SCALINGS[case]}}}
        """,
        inputs="x: {shape: [2, 2, 6, 8], init: randn}\npos: {shape: [2, 6], dtype: int64, values: [[0, 1, 2, 0, 1, 12], [0, 0, 0, 1, 2, 3]]}",
    )
    scaling = yaml.safe_load(SCALINGS[case])
    x, pos = t["x"].tensor, t["pos"].tensor
    assert torch.equal(t["y"].tensor, transformers_rope(x, pos, 10000.0, dict(scaling)))
    assert torch.equal(t["z"].tensor, transformers_rope(x, torch.arange(3, 9)[None].expand(2, -1), 10000.0, dict(scaling)))


@covers("rope")
def test_rope_positions_on_every_layout():
    """(T,) and (B, T) positions on (B, H, T, Dh), (B, T, H, Dh) and (B, T, D), against the offset form."""
    t = trace_of(
        """
        - {id: a, op: rope, input: x, positions: p1}
        - {id: b, op: rope, input: x, offset: 2}
        - {id: xt, op: transpose, input: x, dims: [1, 2]}
        - {id: c, op: rope, input: xt, positions: p2, seq_dim: -3, style: interleaved}
        - {id: d, op: rope, input: xt, offset: 2, seq_dim: -3, style: interleaved}
        - {id: flat, op: reshape, input: xt, shape: [2, 5, 24]}
        - {id: e, op: rope, input: flat, positions: p2, rotary_dim: 6}
        - {id: f, op: rope, input: flat, offset: 2, rotary_dim: 6}
        """,
        inputs="x: {shape: [2, 3, 5, 8], init: randn}\np1: {shape: [5], dtype: int64, values: [2, 3, 4, 5, 6]}\n"
        "p2: {shape: [1, 5], dtype: int32, values: [[2, 3, 4, 5, 6]]}",
    )
    for got, want in (("a", "b"), ("c", "d"), ("e", "f")):
        assert torch.equal(t[got].tensor, t[want].tensor), got
    assert t["c/cos"].shape == (1, 5, 8)


@pytest.mark.parametrize(
    ("step", "pos", "code", "says"),
    [
        ("positions: pos", "{shape: [6], init: randn}", "rope-positions", "integer positions"),
        ("positions: pos", "{shape: [5], dtype: int64, init: zeros}", "rope-positions", "(T,) or (B, T) with T = 6"),
        ("positions: pos", "{shape: [3, 6], dtype: int64, init: zeros}", "rope-positions", "pair B with the input's dim 0"),
        ("positions: pos, offset: 2", "{shape: [6], dtype: int64, init: zeros}", "invalid-value", "not both"),
        (
            "rope_scaling: {type: longrope, short_factor: [1.0], long_factor: [2.0], original_max_position_embeddings: 4, factor: 2.0}",
            "{shape: [6], dtype: int64, init: zeros}",
            "rope-scaling",
            "one factor per frequency: 4",
        ),
        (
            "rope_scaling: {type: longrope, short_factor: [1.0], long_factor: [2.0], original_max_position_embeddings: 4}",
            "{shape: [6], dtype: int64, init: zeros}",
            "invalid-value",
            "needs 'factor'",
        ),
    ],
)
def test_rope_refuses_bad_positions_and_scaling(step, pos, code, says, tmp_path):
    text = pipeline_text(f"- {{id: y, op: rope, input: x, {step}}}", inputs=f"x: {{shape: [2, 2, 6, 8], init: randn}}\npos: {pos}")
    assert says in str(refused(text, tmp_path, code))


def t5_attention(buckets: int, max_distance: int, heads: int, decoder: bool):
    from transformers import T5Config
    from transformers.models.t5.modeling_t5 import T5Attention

    config = T5Config(
        d_model=8, d_kv=4, num_heads=heads, relative_attention_num_buckets=buckets, relative_attention_max_distance=max_distance,
        is_decoder=decoder, attn_implementation="eager",
    )  # fmt: skip
    return T5Attention(config, has_relative_attention_bias=True).eval()


@covers("relative_bias")
@pytest.mark.parametrize(
    ("batch", "t_q", "t_k", "decoder"),
    [([2], 12, 12, False), ([2], 12, 12, True), ([2], 3, 20, True), ([2], 1, 9, False), ([], 5, 5, False)],
)
def test_relative_bias_is_t5s_compute_bias(batch, t_q, t_k, decoder):
    t = trace_of(
        f"- {{id: y, op: relative_bias, input: s, table: rel, bidirectional: {str(not decoder).lower()}, max_distance: 6}}",
        inputs=f"s: {{shape: {[*batch, 3, t_q, t_k]}, init: randn}}",
        params="rel: {shape: [8, 3], init: randn}",
    )
    attention = t5_attention(8, 6, 3, decoder)
    with torch.no_grad():
        attention.relative_attention_bias.weight.copy_(t["rel"].tensor)
        bias = attention.compute_bias(t_q, t_k, past_seen_tokens=t_k - t_q)  # a query after t_k - t_q cached keys
    assert torch.equal(t["y/bias"].tensor, bias) and t["y/bias"].stride == bias.stride()
    assert torch.equal(t["y"].tensor, t["s"].tensor + bias)  # unbatched (H, T, T) scores broadcast to (1, H, T, T), as in torch
    assert len(t["y/buckets"].tensor.unique()) >= 4  # near, far and (for the encoder) both sides are exercised


@covers("relative_position_bias")
@pytest.mark.parametrize(("t_q", "t_k", "decoder"), [(12, 12, False), (12, 12, True), (3, 20, True), (1, 9, False)])
def test_relative_position_bias_is_t5s_compute_bias(t_q, t_k, decoder):
    """The bias alone, (1, H, T_q, T_kv), as compute_bias returns it (values and strides), for the
    encoder's bidirectional and the decoder's causal buckets, queries after a cache included."""
    t = trace_of(
        "- {id: y, op: relative_position_bias, table: rel, queries: Q, keys: K, "
        f"bidirectional: {str(not decoder).lower()}, max_distance: 6}}",
        inputs="",
        params="rel: {shape: [8, 3], init: randn}",
        dims=f"Q: {t_q}\nK: {t_k}",
    )
    attention = t5_attention(8, 6, 3, decoder)
    with torch.no_grad():
        attention.relative_attention_bias.weight.copy_(t["rel"].tensor)
        bias = attention.compute_bias(t_q, t_k, past_seen_tokens=t_k - t_q)
    assert torch.equal(t["y"].tensor, bias) and t["y"].stride == bias.stride()
    assert len(t["y/buckets"].tensor.unique()) >= 4  # near, far and (for the encoder) both sides are exercised


def test_relative_position_bias_is_the_bias_relative_bias_adds():
    """Added to scores, the bias alone is what relative_bias adds: one computation, two forms."""
    t = trace_of(
        """
        - {id: bias, op: relative_position_bias, table: rel, queries: T, keys: T, bidirectional: false, max_distance: 6}
        - {id: added, op: add, inputs: [s, bias]}
        - {id: y, op: relative_bias, input: s, table: rel, bidirectional: false, max_distance: 6}
        """,
        dims="T: 10",
        inputs="s: {shape: [2, 2, T, T], init: randn}",
        params="rel: {shape: [8, 2], init: randn}",
    )
    assert torch.equal(t["added"].tensor, t["y"].tensor)


@pytest.mark.parametrize(
    ("bias_steps", "sdpa_fields", "decoder"),
    [
        ("", "mask: bias", False),  # the encoder's: the (1, H, T, T) bias is the mask
        ("- {id: kept, op: mask, input: bias, causal: true, fill: min}", "mask: kept", True),  # where(causal, bias, min)
        ("", "mask: bias, causal: true", True),  # the pattern on the sdpa itself
    ],
)
def test_relative_position_bias_is_an_sdpa_mask_as_transformers_hands_it(bias_steps, sdpa_fields, decoder):
    """T5 under sdpa: a (1, H, T, T) bias, or its causally masked copy, broadcast over the batch as
    the sdpa's float mask: what torch computes with transformers' mask, with no lint raised."""
    t = trace_of(
        f"""
        - {{id: bias, op: relative_position_bias, table: rel, queries: T, keys: T, bidirectional: {str(not decoder).lower()}, max_distance: 6}}
        {bias_steps}
        - {{id: y, op: sdpa, inputs: [q, k, v], scale: 1.0, {sdpa_fields}}}
        """,
        dims="T: 10",
        inputs="q: {shape: [2, 2, T, 4], init: randn}\nk: {shape: [2, 2, T, 4], init: randn}\nv: {shape: [2, 2, T, 4], init: randn}",
        params="rel: {shape: [8, 2], init: randn}",
    )
    bias = t["bias"].tensor
    if decoder:
        bias = torch.where(torch.ones(10, 10, dtype=torch.bool).tril(), bias, torch.finfo(bias.dtype).min)
    expected = F.scaled_dot_product_attention(t["q"].tensor, t["k"].tensor, t["v"].tensor, attn_mask=bias, scale=1.0)
    assert torch.allclose(t["y"].tensor, expected, atol=1e-6)
    assert [str(d) for d in t.analysis.diagnostics] == []


def test_the_primitives_express_t5s_buckets_too():
    """T5's bucket written with arange, compare, abs, log, where, clamp: the same numbers as the step."""
    t = trace_of(
        """
        - {id: queries, op: arange, stop: T}
        - {id: column, op: unsqueeze, input: queries, dim: 1}
        - {id: keys, op: arange, stop: T}
        - {id: relative, op: sub, inputs: [keys, column]}      # j - i
        - {id: after, op: compare, input: relative, cmp: gt, value: 0}
        - {id: upper, op: where, inputs: [after], then: 4, otherwise: 0}      # half the buckets for keys after the query
        - {id: distance, op: abs, input: relative}
        - {id: small, op: compare, input: distance, cmp: lt, value: 2}   # max_exact = 4 // 2
        - {id: as_float, op: cast, input: distance, dtype: float32}
        - {id: ratio, op: scale, input: as_float, divide: 2}
        - {id: logs, op: log, input: ratio}
        - {id: per_log, op: scale, input: logs, divide: 1.0986122886681098}   # math.log(max_distance / max_exact)
        - {id: spread, op: scale, input: per_log, multiply: 2}                 # num_buckets - max_exact
        - {id: truncated, op: cast, input: spread, dtype: int64}              # .to(torch.long) truncates
        - {id: large, op: add, inputs: [max_exact, truncated]}
        - {id: capped, op: clamp, input: large, max: 3}
        - {id: near_or_far, op: where, inputs: [small, distance, capped]}
        - {id: buckets, op: add, inputs: [upper, near_or_far]}
        - {id: y, op: relative_bias, input: s, table: rel, bidirectional: true, max_distance: 6}
        """,
        dims="T: 12",
        inputs="s: {shape: [1, 2, T, T], init: randn}\nmax_exact: {shape: [], init: full, value: 2, dtype: int64}",
        params="rel: {shape: [8, 2], init: randn}",
    )
    assert torch.equal(t["buckets"].tensor, t["y/buckets"].tensor)


@pytest.mark.parametrize(
    ("table", "fields", "says"),
    [
        ("[8, 2]", "bidirectional: true", "relative_bias needs"),
        ("[2, 3]", "bidirectional: true", "2 buckets make 0 exact ones"),
        ("[8, 3]", "bidirectional: true, max_distance: 2", "max_distance 2 must be above"),
    ],
)
def test_relative_bias_refuses_a_table_that_cannot_bucket(table, fields, says, tmp_path):
    text = pipeline_text(
        f"- {{id: y, op: relative_bias, input: s, table: rel, {fields}}}",
        inputs="s: {shape: [1, 3, 4, 4], init: randn}",
        params=f"rel: {{shape: {table}, init: randn}}",
    )
    assert says in str(refused(text, tmp_path))


@pytest.mark.parametrize(
    ("table", "fields", "says"),
    [
        ("[8, 2, 1]", "bidirectional: true", "relative_position_bias needs an (num_buckets, H) table"),
        ("[2, 3]", "bidirectional: true", "2 buckets make 0 exact ones"),
        ("[8, 3]", "bidirectional: true, max_distance: 2", "max_distance 2 must be above"),
        ("[8, 3]", "bidirectional: true, keys: 3", "5 queries (T) and 3 keys (3)"),
    ],
)
def test_relative_position_bias_refuses_a_table_that_cannot_bucket(table, fields, says, tmp_path):
    keys = "" if "keys" in fields else "keys: T, "
    text = pipeline_text(
        f"- {{id: y, op: relative_position_bias, table: rel, queries: T, {keys}{fields}}}",
        dims="T: 5",
        inputs="",
        params=f"rel: {{shape: {table}, init: randn}}",
    )
    assert says in str(refused(text, tmp_path))


def test_relative_bias_memory_estimate_bounds_its_bucket_arithmetic():
    """With no heads the records are empty and the buckets' temporaries are the peak (a fuzz find)."""
    agrees(
        "- {id: y, op: relative_bias, input: s, table: rel, bidirectional: true, max_distance: 128}",
        "s: {shape: [0, 6, 16], init: randn}\nrel: {shape: [32, 0], init: randn}",
    )
