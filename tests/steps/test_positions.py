"""Position kinds (rope, alibi) against the public code they come from."""

from __future__ import annotations

import math

import pytest
import torch

import tracer
from tests.conftest import covers, pipeline_text
from tests.kinds import close, trace_of
from tests.measure import PeakStorage


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


def paper_slopes(n):
    """The ALiBi paper's reference get_slopes."""

    def power_of_2(n):
        start = 2 ** (-(2 ** -(math.log2(n) - 3)))
        return [start * start**i for i in range(n)]

    if math.log2(n).is_integer():
        return power_of_2(n)
    closest = 2 ** math.floor(math.log2(n))
    return power_of_2(closest) + paper_slopes(2 * closest)[0::2][: n - closest]


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


def test_alibi_on_meta_allocates_nothing_for_many_heads():
    pipeline = tracer.loads(
        pipeline_text("- {id: y, op: alibi, input: x}", dims="H: 67108864", inputs="x: {shape: [H, 1, 1], init: randn}")
    )
    with PeakStorage() as mode:
        pipeline.run(device="meta")
    assert mode.peak == 0  # the slopes were 256 MiB of real memory
