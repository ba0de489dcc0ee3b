"""rmsnorm against transformers' LlamaRMSNorm (and Gemma's 1 + w)."""

import pytest
import torch

from tests.conftest import covers
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
