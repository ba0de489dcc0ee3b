"""Idioms from public attention code beyond transformers: Meta's original llama (complex RoPE with
``torch.polar``/``view_as_complex``, its RMSNorm and repeat_kv), and what happens to advanced indexing."""

import math

import pytest
import torch
from torch import nn
from torch.nn import functional as F

import tracer
from tracer.importing import difference, from_module


def precompute_freqs_cis(dim: int, end: int, theta: float = 10000.0):
    freqs = 1.0 / (theta ** (torch.arange(0, dim, 2)[: (dim // 2)].float() / dim))
    t = torch.arange(end, device=freqs.device)
    freqs = torch.outer(t, freqs).float()
    return torch.polar(torch.ones_like(freqs), freqs)  # complex64


def reshape_for_broadcast(freqs_cis, x):
    shape = [d if i == 1 or i == x.ndim - 1 else 1 for i, d in enumerate(x.shape)]
    return freqs_cis.view(*shape)


def apply_rotary_emb(xq, xk, freqs_cis):
    xq_ = torch.view_as_complex(xq.float().reshape(*xq.shape[:-1], -1, 2))
    xk_ = torch.view_as_complex(xk.float().reshape(*xk.shape[:-1], -1, 2))
    freqs_cis = reshape_for_broadcast(freqs_cis, xq_)
    xq_out = torch.view_as_real(xq_ * freqs_cis).flatten(3)
    xk_out = torch.view_as_real(xk_ * freqs_cis).flatten(3)
    return xq_out.type_as(xq), xk_out.type_as(xk)


def repeat_kv(x, n_rep):
    bs, slen, n_kv_heads, head_dim = x.shape
    return x[:, :, :, None, :].expand(bs, slen, n_kv_heads, n_rep, head_dim).reshape(bs, slen, n_kv_heads * n_rep, head_dim)


class RMSNorm(nn.Module):
    def __init__(self, dim, eps=1e-6):
        super().__init__()
        self.eps, self.weight = eps, nn.Parameter(torch.ones(dim))

    def _norm(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)

    def forward(self, x):
        return self._norm(x.float()).type_as(x) * self.weight


class Attention(nn.Module):
    """meta-llama/llama model.py's attention (no KV cache), with its RMSNorm and a residual."""

    def __init__(self, dim=32, n_heads=4, n_kv_heads=2, max_seq_len=16, theta=500000.0):
        super().__init__()
        self.n_heads, self.n_kv_heads, self.n_rep, self.head_dim = n_heads, n_kv_heads, n_heads // n_kv_heads, dim // n_heads
        self.wq = nn.Linear(dim, n_heads * self.head_dim, bias=False)
        self.wk = nn.Linear(dim, n_kv_heads * self.head_dim, bias=False)
        self.wv = nn.Linear(dim, n_kv_heads * self.head_dim, bias=False)
        self.wo = nn.Linear(n_heads * self.head_dim, dim, bias=False)
        self.norm = RMSNorm(dim)
        self.register_buffer("freqs_cis", precompute_freqs_cis(self.head_dim, max_seq_len, theta), persistent=False)

    def forward(self, x):
        bsz, seqlen, _ = x.shape
        h = self.norm(x)
        xq, xk, xv = self.wq(h), self.wk(h), self.wv(h)
        xq = xq.view(bsz, seqlen, self.n_heads, self.head_dim)
        xk = xk.view(bsz, seqlen, self.n_kv_heads, self.head_dim)
        xv = xv.view(bsz, seqlen, self.n_kv_heads, self.head_dim)
        xq, xk = apply_rotary_emb(xq, xk, freqs_cis=self.freqs_cis[:seqlen])
        keys, values = repeat_kv(xk, self.n_rep), repeat_kv(xv, self.n_rep)
        xq, keys, values = xq.transpose(1, 2), keys.transpose(1, 2), values.transpose(1, 2)
        scores = torch.matmul(xq, keys.transpose(2, 3)) / math.sqrt(self.head_dim)
        scores = scores + torch.triu(torch.full((seqlen, seqlen), float("-inf"), device=x.device), diagonal=1)
        scores = F.softmax(scores.float(), dim=-1).type_as(xq)
        output = torch.matmul(scores, values).transpose(1, 2).contiguous().view(bsz, seqlen, -1)
        return x + self.wo(output)


def test_metas_complex_rope_imports_as_interleaved_rope_on_the_sequence_axis_of_b_t_h_dh():
    torch.manual_seed(0)
    module, x = Attention(), torch.randn(2, 7, 32)
    pipeline = from_module(module, x)
    steps = {s.id: s for s in pipeline.spec.steps}
    ropes = [s for s in steps.values() if s.op == "rope"]
    assert [(s.style, s.seq_dim, s.theta) for s in ropes] == [("interleaved", -3, 500000.0)] * 2
    assert [s.op for s in steps.values()].count("repeat_interleave") == 2
    assert {s.dim for s in steps.values() if s.op == "repeat_interleave"} == {2}  # heads of (B, T, H, Dh)
    assert steps["norm"].op == "rmsnorm" and "freqs_cis" not in pipeline.spec.params  # a constant table, not a param
    assert difference(pipeline, module, x) <= 1e-5


class EveryOtherToken(nn.Module):
    """Advanced indexing by a list that is not a run of consecutive positions."""

    def __init__(self):
        super().__init__()
        self.lm_head = nn.Linear(8, 16, bias=False)

    def forward(self, x):
        return self.lm_head(x[:, [0, 2], :])


class Gather(nn.Module):
    def forward(self, x, ids):
        return torch.index_select(x, 1, ids)


@pytest.mark.parametrize(
    ("module", "args", "op", "line"),
    [
        (EveryOtherToken(), (torch.randn(2, 5, 8),), "aten.index.Tensor", "return self.lm_head(x[:, [0, 2], :])"),
        (Gather(), (torch.randn(2, 5, 8), torch.tensor([0, 2])), "aten.index_select.default", "return torch.index_select(x, 1, ids)"),
    ],
)
def test_advanced_indexing_is_reported_with_the_op_and_the_line_that_made_it(module, args, op, line):
    with pytest.raises(tracer.TracerError) as caught:
        from_module(module, *args)
    (problem,) = caught.value.diagnostics
    assert problem.code == "import-unmapped" and problem.file.endswith("test_capture_coverage.py") and problem.position.line > 0
    assert op in problem.message and line in problem.message, str(problem)
    assert "a run, as x[:, [-1]] or x[:, [2, 3]], imports as op: index" in problem.message  # what does import
