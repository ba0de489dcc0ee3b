# cross_attention: written by `tracer export cross_attention.yaml`.
# Multi-head cross-attention with a padding keep-mask on the keys.
# Shapes are symbolic, as in the trace: each line says which YAML step it is.

import math

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["CrossAttention"]


def linear_bound(fan_in: int, ndim: int) -> float:
    """nn.Linear's reset_parameters, bit for bit: kaiming_uniform_(a=√5) for a weight, U(±1/√fan_in) for a bias."""
    if ndim >= 2:
        gain = math.sqrt(2.0 / (1 + 5))
        return math.sqrt(3.0) * gain / math.sqrt(fan_in) if fan_in else 0.0
    return 1 / math.sqrt(fan_in) if fan_in > 0 else 0.0


class CrossAttention(nn.Module):
    # The pipeline 'cross_attention', as PyTorch.

    def __init__(self, *, B=2, T_q=4, T_kv=6, d_model=8, H=2, seed=0):
        super().__init__()
        if H == 0:
            raise ValueError(f"dim Dh = d_model // H: division by zero in 'd_model // H' (H={H})")
        if d_model % H:
            raise ValueError(f"dim Dh = d_model // H: d_model={d_model} is not divisible by H={H}")
        Dh = d_model // H
        self.B, self.T_q, self.T_kv, self.d_model, self.H, self.Dh = B, T_q, T_kv, d_model, H, Dh
        if seed is not None:
            torch.manual_seed(seed)  # then every tensor in the order the file declares it
        torch.empty(B, T_q, d_model).normal_()  # input 'x_q' is drawn here in the traced run: same seed, same params
        torch.empty(B, T_kv, d_model).normal_()  # input 'x_kv' is drawn here in the traced run: same seed, same params
        bound = linear_bound(d_model, 2)  # as nn.Linear initialises it
        self.W_q = nn.Parameter(torch.empty(d_model, d_model).uniform_(-bound, bound))  # (d_model, d_model)
        bound = linear_bound(d_model, 1)  # as nn.Linear initialises it
        self.b_q = nn.Parameter(torch.empty(d_model).uniform_(-bound, bound))  # (d_model)
        bound = linear_bound(d_model, 2)  # as nn.Linear initialises it
        self.W_k = nn.Parameter(torch.empty(d_model, d_model).uniform_(-bound, bound))  # (d_model, d_model)
        bound = linear_bound(d_model, 1)  # as nn.Linear initialises it
        self.b_k = nn.Parameter(torch.empty(d_model).uniform_(-bound, bound))  # (d_model)
        bound = linear_bound(d_model, 2)  # as nn.Linear initialises it
        self.W_v = nn.Parameter(torch.empty(d_model, d_model).uniform_(-bound, bound))  # (d_model, d_model)
        bound = linear_bound(d_model, 1)  # as nn.Linear initialises it
        self.b_v = nn.Parameter(torch.empty(d_model).uniform_(-bound, bound))  # (d_model)
        bound = linear_bound(d_model, 2)  # as nn.Linear initialises it
        self.W_o = nn.Parameter(torch.empty(d_model, d_model).uniform_(-bound, bound))  # (d_model, d_model)
        bound = linear_bound(d_model, 1)  # as nn.Linear initialises it
        self.b_o = nn.Parameter(torch.empty(d_model).uniform_(-bound, bound))  # (d_model)

    def forward(self, x_q, x_kv, pad_mask):
        B, T_q, T_kv, d_model, H, Dh = self.B, self.T_q, self.T_kv, self.d_model, self.H, self.Dh  # dims
        q = F.linear(x_q, self.W_q, self.b_q)  # (B, T_q, d_model) q
        k = F.linear(x_kv, self.W_k, self.b_k)  # (B, T_kv, d_model) k
        v = F.linear(x_kv, self.W_v, self.b_v)  # (B, T_kv, d_model) v
        q_heads = q.view(B, T_q, H, Dh)  # (B, T_q, H, Dh) q_heads
        q_h = q_heads.transpose(1, 2)  # (B, H, T_q, Dh) q_h
        k_heads = k.view(B, T_kv, H, Dh)  # (B, T_kv, H, Dh) k_heads
        k_h = k_heads.transpose(1, 2)  # (B, H, T_kv, Dh) k_h
        v_heads = v.view(B, T_kv, H, Dh)  # (B, T_kv, H, Dh) v_heads
        v_h = v_heads.transpose(1, 2)  # (B, H, T_kv, Dh) v_h
        k_t = k_h.transpose(-2, -1)  # (B, H, Dh, T_kv) k_t
        scores = q_h @ k_t  # (B, H, T_q, T_kv) scores
        scaled = scores / math.sqrt(Dh)  # (B, H, T_q, T_kv) scaled
        masked = scaled.masked_fill(~pad_mask, -math.inf)  # (B, H, T_q, T_kv) masked
        weights = torch.softmax(masked, dim=-1)  # (B, H, T_q, T_kv) weights
        weights_d = F.dropout(weights, p=0.1, training=self.training)  # (B, H, T_q, T_kv) weights_d
        context = weights_d @ v_h  # (B, H, T_q, Dh) context
        merged = context.transpose(-3, -2).contiguous().view(B, T_q, d_model)  # (B, T_q, d_model) merged
        out = F.linear(merged, self.W_o, self.b_o)  # (B, T_q, d_model) out
        return out  # (B, T_q, d_model)
