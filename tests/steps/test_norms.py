"""rmsnorm against transformers' LlamaRMSNorm (and Gemma's 1 + w)."""

import pytest
import torch
import torch.nn.functional as F

from tests.conftest import covers, pipeline_text, refused
from tests.kinds import close, trace_of


def llama_rmsnorm(x, weight, eps):
    h = x.to(torch.float32)
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(x.dtype)


@covers("rmsnorm")
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_rmsnorm_is_llama_rmsnorm(dtype):
    t = trace_of(
        """
        - {id: r, op: rmsnorm, input: x, weight: g, eps: 1.0e-5}
        - {id: xt, op: transpose, input: x, dims: [0, 1]}
        - {id: plain, op: rmsnorm, input: xt}
        - {id: gemma, op: rmsnorm, input: x, weight: g, unit_offset: true}
        """,
        inputs=f"x: {{shape: [3, 4, 8], init: randn, dtype: {dtype}}}",
        params=f"g: {{shape: [8], init: rand, dtype: {dtype}}}",
    )
    x, g = t["x"].tensor, t["g"].tensor
    assert close(t["r"].tensor, llama_rmsnorm(x, g, 1e-5))
    assert close(t["plain"].tensor, llama_rmsnorm(x.transpose(0, 1), torch.ones(8, dtype=x.dtype), 1e-6))
    h = x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-6)
    assert close(t["gemma"].tensor, (h * (1.0 + g.float())).to(x.dtype))


@covers("layernorm", "rmsnorm")
def test_per_head_norm_weights_are_coheres_and_qwen3s():
    """A (H, Dh) weight on (B, T, H, Dh): transformers' CohereLayerNorm((H, Dh)) and an RMS norm per head."""
    from transformers.models.cohere.modeling_cohere import CohereLayerNorm

    t = trace_of(
        """
        - {id: ln, op: layernorm, input: q, weight: w, eps: 1.0e-5}
        - {id: lnb, op: layernorm, input: q, weight: w, bias: b}
        - {id: rms, op: rmsnorm, input: q, weight: w, eps: 1.0e-6}
        """,
        inputs="q: {shape: [2, 5, 3, 4], init: randn}",
        params="w: {shape: [3, 4], init: randn}\nb: {shape: [3, 4], init: randn}",
    )
    q, w, b = t["q"].tensor, t["w"].tensor, t["b"].tensor
    cohere = CohereLayerNorm((3, 4), eps=1e-5)
    with torch.no_grad():
        cohere.weight.copy_(w)
    assert close(t["ln"].tensor, cohere(q), atol=1e-6)
    assert close(t["lnb"].tensor, F.layer_norm(q, (4,)) * w + b)
    h = q * torch.rsqrt(q.pow(2).mean(-1, keepdim=True) + 1e-6)
    assert close(t["rms"].tensor, w * h)


def test_a_per_head_weight_on_heads_first_layout_is_a_located_error(tmp_path):
    text = pipeline_text(
        "- {id: ln, op: layernorm, input: q, weight: w}",
        inputs="q: {shape: [2, 3, 5, 4], init: randn}",
        params="w: {shape: [3, 4], init: randn}",
    )
    error = str(refused(text, tmp_path))
    assert "must be (4) [4] or cover more trailing dims" in error and "normalise before the transpose" in error
