# causal_mha: written by `tracer export causal_mha.yaml`.
# Causal multi-head self-attention with weight split (tutorial 002).
# Shapes are symbolic, as in the trace: each line says which YAML step it is.

import math

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["CausalMha"]


def linear_bound(fan_in: int, ndim: int) -> float:
    """nn.Linear's reset_parameters, bit for bit: kaiming_uniform_(a=√5) for a weight, U(±1/√fan_in) for a bias."""
    if ndim >= 2:
        gain = math.sqrt(2.0 / (1 + 5))
        return math.sqrt(3.0) * gain / math.sqrt(fan_in) if fan_in else 0.0
    return 1 / math.sqrt(fan_in) if fan_in > 0 else 0.0


class CausalMha(nn.Module):
    # The pipeline 'causal_mha', as PyTorch.

    def __init__(self, *, B=2, T=6, d_model=4, H=2, seed=0):
        super().__init__()
        if H == 0:
            raise ValueError(f"dim Dh = d_model // H: division by zero in 'd_model // H' (H={H})")
        if d_model % H:
            raise ValueError(f"dim Dh = d_model // H: d_model={d_model} is not divisible by H={H}")
        Dh = d_model // H
        self.B, self.T, self.d_model, self.H, self.Dh = B, T, d_model, H, Dh
        if seed is not None:
            torch.manual_seed(seed)  # then every tensor in the order the file declares it
        torch.empty(B, T, d_model).normal_()  # input 'x' is drawn here in the traced run: same seed, same params
        bound = linear_bound(d_model, 2)  # as nn.Linear initialises it
        self.W_q = nn.Parameter(torch.empty(d_model, d_model).uniform_(-bound, bound))  # (d_model, d_model)
        bound = linear_bound(d_model, 2)  # as nn.Linear initialises it
        self.W_k = nn.Parameter(torch.empty(d_model, d_model).uniform_(-bound, bound))  # (d_model, d_model)
        bound = linear_bound(d_model, 2)  # as nn.Linear initialises it
        self.W_v = nn.Parameter(torch.empty(d_model, d_model).uniform_(-bound, bound))  # (d_model, d_model)
        bound = linear_bound(d_model, 2)  # as nn.Linear initialises it
        self.W_o = nn.Parameter(torch.empty(d_model, d_model).uniform_(-bound, bound))  # (d_model, d_model)
        bound = linear_bound(d_model, 1)  # as nn.Linear initialises it
        self.b_o = nn.Parameter(torch.empty(d_model).uniform_(-bound, bound))  # (d_model)

    def forward(self, x):
        B, T, d_model, H, Dh = self.B, self.T, self.d_model, self.H, self.Dh  # dims
        q = F.linear(x, self.W_q)  # (B, T, d_model) q
        k = F.linear(x, self.W_k)  # (B, T, d_model) k
        v = F.linear(x, self.W_v)  # (B, T, d_model) v
        q_heads = q.view(B, T, H, Dh)  # (B, T, H, Dh) q_heads
        q_h = q_heads.transpose(1, 2)  # (B, H, T, Dh) q_h
        k_heads = k.view(B, T, H, Dh)  # (B, T, H, Dh) k_heads
        k_h = k_heads.transpose(1, 2)  # (B, H, T, Dh) k_h
        v_heads = v.view(B, T, H, Dh)  # (B, T, H, Dh) v_heads
        v_h = v_heads.transpose(1, 2)  # (B, H, T, Dh) v_h
        k_t = k_h.transpose(-2, -1)  # (B, H, Dh, T) k_t
        scores = q_h @ k_t  # (B, H, T, T) scores
        masked = scores.masked_fill(torch.ones(T, T, dtype=torch.bool, device=scores.device).triu(1), -math.inf)  # (B, H, T, T) masked
        scaled = masked / math.sqrt(Dh)  # (B, H, T, T) scaled
        weights = torch.softmax(scaled, dim=-1)  # (B, H, T, T) weights
        weights_d = F.dropout(weights, p=0.2, training=self.training)  # (B, H, T, T) weights_d
        context = weights_d @ v_h  # (B, H, T, Dh) context
        merged = context.transpose(-3, -2).contiguous().view(B, T, d_model)  # (B, T, d_model) merged
        out = F.linear(merged, self.W_o, self.b_o)  # (B, T, d_model) out
        return out  # (B, T, d_model)
