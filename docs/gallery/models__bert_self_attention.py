# bert_self_attention: written by `tracer export bert_self_attention.yaml`.
# BERT self-attention: padding mask as an additive bias, BertSelfOutput residual + LayerNorm.
# Shapes are symbolic, as in the trace: each line says which YAML step it is.

import math

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["BertSelfAttention"]


def linear_bound(fan_in: int, ndim: int) -> float:
    """nn.Linear's reset_parameters, bit for bit: kaiming_uniform_(a=√5) for a weight, U(±1/√fan_in) for a bias."""
    if ndim >= 2:
        gain = math.sqrt(2.0 / (1 + 5))
        return math.sqrt(3.0) * gain / math.sqrt(fan_in) if fan_in else 0.0
    return 1 / math.sqrt(fan_in) if fan_in > 0 else 0.0


class BertSelfAttention(nn.Module):
    # The pipeline 'bert_self_attention', as PyTorch.

    def __init__(self, *, B=2, T=6, d_model=8, H=2, seed=0):
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
        self.one = nn.Parameter(torch.full((), 1.0))  # ()
        self.min_value = nn.Parameter(torch.full((), -3.4028234663852886e+38))  # ()
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
        self.ln_w = nn.Parameter(torch.ones(d_model))  # (d_model)
        self.ln_b = nn.Parameter(torch.zeros(d_model))  # (d_model)

    def forward(self, x, attention_mask):
        B, T, d_model, H, Dh = self.B, self.T, self.d_model, self.H, self.Dh  # dims
        mask_b = attention_mask.unsqueeze(1)  # (B, 1, T) mask_b
        mask_bh = mask_b.unsqueeze(1)  # (B, 1, 1, T) mask_bh
        mask_f = mask_bh.to(torch.float32)  # (B, 1, 1, T) mask_f
        padding = self.one - mask_f  # (B, 1, 1, T) padding
        bias = padding * self.min_value  # (B, 1, 1, T) bias
        q = F.linear(x, self.W_q, self.b_q)  # (B, T, d_model) q
        q_heads = q.view(B, T, H, Dh)  # (B, T, H, Dh) q_heads
        q_h = q_heads.transpose(1, 2)  # (B, H, T, Dh) q_h
        k = F.linear(x, self.W_k, self.b_k)  # (B, T, d_model) k
        k_heads = k.view(B, T, H, Dh)  # (B, T, H, Dh) k_heads
        k_h = k_heads.transpose(1, 2)  # (B, H, T, Dh) k_h
        v = F.linear(x, self.W_v, self.b_v)  # (B, T, d_model) v
        v_heads = v.view(B, T, H, Dh)  # (B, T, H, Dh) v_heads
        v_h = v_heads.transpose(1, 2)  # (B, H, T, Dh) v_h
        k_t = k_h.transpose(2, 3)  # (B, H, Dh, T) k_t
        scores = q_h @ k_t  # (B, H, T, T) scores
        scaled = scores / math.sqrt(Dh)  # (B, H, T, T) scaled
        masked = scaled + bias  # (B, H, T, T) masked
        weights = torch.softmax(masked, dim=-1)  # (B, H, T, T) weights
        weights_d = F.dropout(weights, p=0.1, training=self.training)  # (B, H, T, T) weights_d
        context = weights_d @ v_h  # (B, H, T, Dh) context
        merged = context.transpose(-3, -2).contiguous().view(B, T, d_model)  # (B, T, d_model) merged
        dense = F.linear(merged, self.W_o, self.b_o)  # (B, T, d_model) dense
        dense_d = F.dropout(dense, p=0.1, training=self.training)  # (B, T, d_model) dense_d
        resid = dense_d + x  # (B, T, d_model) resid
        out = F.layer_norm(resid, (d_model,), self.ln_w, self.ln_b, eps=1e-12)  # (B, T, d_model) out
        return out  # (B, T, d_model)
