# gpt2_attention: written by `tracer export gpt2_attention.yaml`.
# GPT-2 self-attention (GPT2Attention): fused c_attn + split, causal heads, c_proj.
# Shapes are symbolic, as in the trace: each line says which YAML step it is.

import math

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["Gpt2Attention"]


class Gpt2Attention(nn.Module):
    # The pipeline 'gpt2_attention', as PyTorch.

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
        self.W_attn = nn.Parameter(torch.empty(d_model, 3 * d_model).normal_())  # (d_model, 3 * d_model)
        self.b_attn = nn.Parameter(torch.empty(3 * d_model).normal_())  # (3 * d_model)
        self.W_proj = nn.Parameter(torch.empty(d_model, d_model).normal_())  # (d_model, d_model)
        self.b_proj = nn.Parameter(torch.empty(d_model).normal_())  # (d_model)

    def forward(self, x):
        B, T, d_model, H, Dh = self.B, self.T, self.d_model, self.H, self.Dh  # dims
        qkv = x @ self.W_attn + self.b_attn  # (B, T, 3*d_model) qkv
        q, k, v = qkv.split(d_model, dim=2)  # (B, T, d_model), (B, T, d_model), (B, T, d_model) qkv_split
        q_heads = q.view(B, T, H, Dh)  # (B, T, H, Dh) q_heads
        q_h = q_heads.transpose(1, 2)  # (B, H, T, Dh) q_h
        k_heads = k.view(B, T, H, Dh)  # (B, T, H, Dh) k_heads
        k_h = k_heads.transpose(1, 2)  # (B, H, T, Dh) k_h
        v_heads = v.view(B, T, H, Dh)  # (B, T, H, Dh) v_heads
        v_h = v_heads.transpose(1, 2)  # (B, H, T, Dh) v_h
        k_t = k_h.transpose(-1, -2)  # (B, H, Dh, T) k_t
        scores = q_h @ k_t  # (B, H, T, T) scores
        scaled = scores / math.sqrt(Dh)  # (B, H, T, T) scaled
        masked = scaled.masked_fill(torch.ones(T, T, dtype=torch.bool, device=scaled.device).triu(1), -math.inf)  # (B, H, T, T) masked
        weights = torch.softmax(masked, dim=-1)  # (B, H, T, T) weights
        weights_d = F.dropout(weights, p=0.1, training=self.training)  # (B, H, T, T) weights_d
        context = weights_d @ v_h  # (B, H, T, Dh) context
        merged = context.transpose(-3, -2).contiguous().view(B, T, d_model)  # (B, T, d_model) merged
        out = merged @ self.W_proj + self.b_proj  # (B, T, d_model) out
        return out  # (B, T, d_model)
