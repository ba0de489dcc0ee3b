# encoder_layer: written by `tracer export encoder_layer.yaml`.
# Transformer encoder layer (tutorial 000) — MHA, add & norm, feed-forward, add & norm.
# Shapes are symbolic, as in the trace: each line says which YAML step it is.

import math

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["EncoderLayer"]


def linear_bound(fan_in: int, ndim: int) -> float:
    """nn.Linear's reset_parameters, bit for bit: kaiming_uniform_(a=√5) for a weight, U(±1/√fan_in) for a bias."""
    if ndim >= 2:
        gain = math.sqrt(2.0 / (1 + 5))
        return math.sqrt(3.0) * gain / math.sqrt(fan_in) if fan_in else 0.0
    return 1 / math.sqrt(fan_in) if fan_in > 0 else 0.0


class EncoderLayer(nn.Module):
    # The pipeline 'encoder_layer', as PyTorch.

    def __init__(self, *, B=1, T=8, d_model=2, H=2, d_ff=4, seed=0):
        super().__init__()
        if H == 0:
            raise ValueError(f"dim Dh = d_model // H: division by zero in 'd_model // H' (H={H})")
        if d_model % H:
            raise ValueError(f"dim Dh = d_model // H: d_model={d_model} is not divisible by H={H}")
        Dh = d_model // H
        self.B, self.T, self.d_model, self.H, self.Dh, self.d_ff = B, T, d_model, H, Dh, d_ff
        if seed is not None:
            torch.manual_seed(seed)  # then every tensor in the order the file declares it
        torch.empty(B, T, d_model).normal_()  # input 'x' is drawn here in the traced run: same seed, same params
        bound = linear_bound(d_model, 2)  # as nn.Linear initialises it
        self.W_Q = nn.Parameter(torch.empty(d_model, d_model).uniform_(-bound, bound))  # (d_model, d_model)
        bound = linear_bound(d_model, 1)  # as nn.Linear initialises it
        self.b_Q = nn.Parameter(torch.empty(d_model).uniform_(-bound, bound))  # (d_model)
        bound = linear_bound(d_model, 2)  # as nn.Linear initialises it
        self.W_K = nn.Parameter(torch.empty(d_model, d_model).uniform_(-bound, bound))  # (d_model, d_model)
        bound = linear_bound(d_model, 1)  # as nn.Linear initialises it
        self.b_K = nn.Parameter(torch.empty(d_model).uniform_(-bound, bound))  # (d_model)
        bound = linear_bound(d_model, 2)  # as nn.Linear initialises it
        self.W_V = nn.Parameter(torch.empty(d_model, d_model).uniform_(-bound, bound))  # (d_model, d_model)
        bound = linear_bound(d_model, 1)  # as nn.Linear initialises it
        self.b_V = nn.Parameter(torch.empty(d_model).uniform_(-bound, bound))  # (d_model)
        bound = linear_bound(d_model, 2)  # as nn.Linear initialises it
        self.W_O = nn.Parameter(torch.empty(d_model, d_model).uniform_(-bound, bound))  # (d_model, d_model)
        bound = linear_bound(d_model, 1)  # as nn.Linear initialises it
        self.b_O = nn.Parameter(torch.empty(d_model).uniform_(-bound, bound))  # (d_model)
        self.ln1_w = nn.Parameter(torch.ones(d_model))  # (d_model)
        self.ln1_b = nn.Parameter(torch.zeros(d_model))  # (d_model)
        bound = linear_bound(d_model, 2)  # as nn.Linear initialises it
        self.W_1 = nn.Parameter(torch.empty(d_ff, d_model).uniform_(-bound, bound))  # (d_ff, d_model)
        bound = linear_bound(d_model, 1)  # as nn.Linear initialises it
        self.b_1 = nn.Parameter(torch.empty(d_ff).uniform_(-bound, bound))  # (d_ff)
        bound = linear_bound(d_ff, 2)  # as nn.Linear initialises it
        self.W_2 = nn.Parameter(torch.empty(d_model, d_ff).uniform_(-bound, bound))  # (d_model, d_ff)
        bound = linear_bound(d_ff, 1)  # as nn.Linear initialises it
        self.b_2 = nn.Parameter(torch.empty(d_model).uniform_(-bound, bound))  # (d_model)
        self.ln2_w = nn.Parameter(torch.ones(d_model))  # (d_model)
        self.ln2_b = nn.Parameter(torch.zeros(d_model))  # (d_model)

    def forward(self, x):
        B, T, d_model, H, Dh = self.B, self.T, self.d_model, self.H, self.Dh  # dims
        Q = F.linear(x, self.W_Q, self.b_Q)  # (B, T, d_model) Q
        K = F.linear(x, self.W_K, self.b_K)  # (B, T, d_model) K
        V = F.linear(x, self.W_V, self.b_V)  # (B, T, d_model) V
        Q_heads = Q.reshape(B, T, H, Dh)  # (B, T, H, Dh) Q_heads
        Q_h = Q_heads.transpose(1, 2)  # (B, H, T, Dh) Q_h
        K_heads = K.reshape(B, T, H, Dh)  # (B, T, H, Dh) K_heads
        K_h = K_heads.transpose(1, 2)  # (B, H, T, Dh) K_h
        V_heads = V.reshape(B, T, H, Dh)  # (B, T, H, Dh) V_heads
        V_h = V_heads.transpose(1, 2)  # (B, H, T, Dh) V_h
        K_t = K_h.transpose(-1, -2)  # (B, H, Dh, T) K_t
        scores = Q_h @ K_t  # (B, H, T, T) scores
        scaled = scores / math.sqrt(Dh)  # (B, H, T, T) scaled
        attn_weights = torch.softmax(scaled, dim=-1)  # (B, H, T, T) attn_weights
        context = attn_weights @ V_h  # (B, H, T, Dh) context
        context_t = context.transpose(1, 2)  # (B, T, H, Dh) context_t
        context_m = context_t.reshape(B, T, d_model)  # (B, T, d_model) context_m
        mha_out = F.linear(context_m, self.W_O, self.b_O)  # (B, T, d_model) mha_out
        residual_1 = x + mha_out  # (B, T, d_model) residual_1
        normed_1 = F.layer_norm(residual_1, (d_model,), self.ln1_w, self.ln1_b, eps=1e-05)  # (B, T, d_model) normed_1
        hidden = F.linear(normed_1, self.W_1, self.b_1)  # (B, T, d_ff) hidden
        hidden_act = torch.relu(hidden)  # (B, T, d_ff) hidden_act
        ffn_out = F.linear(hidden_act, self.W_2, self.b_2)  # (B, T, d_model) ffn_out
        residual_2 = normed_1 + ffn_out  # (B, T, d_model) residual_2
        out = F.layer_norm(residual_2, (d_model,), self.ln2_w, self.ln2_b, eps=1e-05)  # (B, T, d_model) out
        return out  # (B, T, d_model)
