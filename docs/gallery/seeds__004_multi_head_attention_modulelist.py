# 004_multi_head_attention_modulelist: written by `tracer export 004_multi_head_attention_modulelist.yaml`.
# Tutorial 004, per-head ModuleList linears, cat of heads, stack + permute of weights.
# Shapes are symbolic, as in the trace: each line says which YAML step it is.

import math

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["Pipeline004MultiHeadAttentionModulelist"]


def linear_bound(fan_in: int, ndim: int) -> float:
    """nn.Linear's reset_parameters, bit for bit: kaiming_uniform_(a=√5) for a weight, U(±1/√fan_in) for a bias."""
    if ndim >= 2:
        gain = math.sqrt(2.0 / (1 + 5))
        return math.sqrt(3.0) * gain / math.sqrt(fan_in) if fan_in else 0.0
    return 1 / math.sqrt(fan_in) if fan_in > 0 else 0.0


class Pipeline004MultiHeadAttentionModulelist(nn.Module):
    # The pipeline '004_multi_head_attention_modulelist', as PyTorch.

    def __init__(self, *, batch_size=1, seq_len=3, d_model=4, num_heads=2, seed=4):
        super().__init__()
        if d_model % 2:
            raise ValueError(f"dim d_h = d_model // 2: d_model={d_model} is not divisible by 2")
        d_h = d_model // 2
        self.batch_size, self.seq_len, self.d_model, self.num_heads, self.d_h = batch_size, seq_len, d_model, num_heads, d_h
        if seed is not None:
            torch.manual_seed(seed)  # then every tensor in the order the file declares it
        self.linear_qs = nn.Module()  # holds 'linear_qs.0.weight'
        setattr(self.linear_qs, "0", nn.Module())  # holds 'linear_qs.0.weight'
        bound = linear_bound(d_model, 2)  # as nn.Linear initialises it
        getattr(self.linear_qs, "0").weight = nn.Parameter(torch.empty(d_h, d_model).uniform_(-bound, bound))  # (d_h, d_model)
        bound = linear_bound(d_model, 1)  # as nn.Linear initialises it
        getattr(self.linear_qs, "0").bias = nn.Parameter(torch.empty(d_h).uniform_(-bound, bound))  # (d_h)
        setattr(self.linear_qs, "1", nn.Module())  # holds 'linear_qs.1.weight'
        bound = linear_bound(d_model, 2)  # as nn.Linear initialises it
        getattr(self.linear_qs, "1").weight = nn.Parameter(torch.empty(d_h, d_model).uniform_(-bound, bound))  # (d_h, d_model)
        bound = linear_bound(d_model, 1)  # as nn.Linear initialises it
        getattr(self.linear_qs, "1").bias = nn.Parameter(torch.empty(d_h).uniform_(-bound, bound))  # (d_h)
        self.linear_ks = nn.Module()  # holds 'linear_ks.0.weight'
        setattr(self.linear_ks, "0", nn.Module())  # holds 'linear_ks.0.weight'
        bound = linear_bound(d_model, 2)  # as nn.Linear initialises it
        getattr(self.linear_ks, "0").weight = nn.Parameter(torch.empty(d_h, d_model).uniform_(-bound, bound))  # (d_h, d_model)
        bound = linear_bound(d_model, 1)  # as nn.Linear initialises it
        getattr(self.linear_ks, "0").bias = nn.Parameter(torch.empty(d_h).uniform_(-bound, bound))  # (d_h)
        setattr(self.linear_ks, "1", nn.Module())  # holds 'linear_ks.1.weight'
        bound = linear_bound(d_model, 2)  # as nn.Linear initialises it
        getattr(self.linear_ks, "1").weight = nn.Parameter(torch.empty(d_h, d_model).uniform_(-bound, bound))  # (d_h, d_model)
        bound = linear_bound(d_model, 1)  # as nn.Linear initialises it
        getattr(self.linear_ks, "1").bias = nn.Parameter(torch.empty(d_h).uniform_(-bound, bound))  # (d_h)
        self.linear_vs = nn.Module()  # holds 'linear_vs.0.weight'
        setattr(self.linear_vs, "0", nn.Module())  # holds 'linear_vs.0.weight'
        bound = linear_bound(d_model, 2)  # as nn.Linear initialises it
        getattr(self.linear_vs, "0").weight = nn.Parameter(torch.empty(d_h, d_model).uniform_(-bound, bound))  # (d_h, d_model)
        bound = linear_bound(d_model, 1)  # as nn.Linear initialises it
        getattr(self.linear_vs, "0").bias = nn.Parameter(torch.empty(d_h).uniform_(-bound, bound))  # (d_h)
        setattr(self.linear_vs, "1", nn.Module())  # holds 'linear_vs.1.weight'
        bound = linear_bound(d_model, 2)  # as nn.Linear initialises it
        getattr(self.linear_vs, "1").weight = nn.Parameter(torch.empty(d_h, d_model).uniform_(-bound, bound))  # (d_h, d_model)
        bound = linear_bound(d_model, 1)  # as nn.Linear initialises it
        getattr(self.linear_vs, "1").bias = nn.Parameter(torch.empty(d_h).uniform_(-bound, bound))  # (d_h)
        self.linear = nn.Module()  # holds 'linear.weight'
        bound = linear_bound(d_model, 2)  # as nn.Linear initialises it
        self.linear.weight = nn.Parameter(torch.empty(d_model, d_model).uniform_(-bound, bound))  # (d_model, d_model)
        bound = linear_bound(d_model, 1)  # as nn.Linear initialises it
        self.linear.bias = nn.Parameter(torch.empty(d_model).uniform_(-bound, bound))  # (d_model)

    def forward(self, toy_encodings):
        d_h = self.d_h  # dims
        Q_0 = F.linear(toy_encodings, getattr(self.linear_qs, "0").weight, getattr(self.linear_qs, "0").bias)  # (batch_size, seq_len, d_h) Q_0
        K_0 = F.linear(toy_encodings, getattr(self.linear_ks, "0").weight, getattr(self.linear_ks, "0").bias)  # (batch_size, seq_len, d_h) K_0
        V_0 = F.linear(toy_encodings, getattr(self.linear_vs, "0").weight, getattr(self.linear_vs, "0").bias)  # (batch_size, seq_len, d_h) V_0
        Q_1 = F.linear(toy_encodings, getattr(self.linear_qs, "1").weight, getattr(self.linear_qs, "1").bias)  # (batch_size, seq_len, d_h) Q_1
        K_1 = F.linear(toy_encodings, getattr(self.linear_ks, "1").weight, getattr(self.linear_ks, "1").bias)  # (batch_size, seq_len, d_h) K_1
        V_1 = F.linear(toy_encodings, getattr(self.linear_vs, "1").weight, getattr(self.linear_vs, "1").bias)  # (batch_size, seq_len, d_h) V_1
        K_0_permuted = K_0.permute(0, 2, 1)  # (batch_size, d_h, seq_len) K_0_permuted
        Q_K_matmul_0 = Q_0 @ K_0_permuted  # (batch_size, seq_len, seq_len) Q_K_matmul_0
        scores_0 = Q_K_matmul_0 / math.sqrt(d_h)  # (batch_size, seq_len, seq_len) scores_0
        attn_weights_0 = torch.softmax(scores_0, dim=-1)  # (batch_size, seq_len, seq_len) attn_weights_0
        output_0 = attn_weights_0 @ V_0  # (batch_size, seq_len, d_h) output_0
        K_1_permuted = K_1.permute(0, 2, 1)  # (batch_size, d_h, seq_len) K_1_permuted
        Q_K_matmul_1 = Q_1 @ K_1_permuted  # (batch_size, seq_len, seq_len) Q_K_matmul_1
        scores_1 = Q_K_matmul_1 / math.sqrt(d_h)  # (batch_size, seq_len, seq_len) scores_1
        attn_weights_1 = torch.softmax(scores_1, dim=-1)  # (batch_size, seq_len, seq_len) attn_weights_1
        output_1 = attn_weights_1 @ V_1  # (batch_size, seq_len, d_h) output_1
        output = torch.cat((output_0, output_1), dim=-1)  # (batch_size, seq_len, d_model) output
        attn_weights_stacked = torch.stack((attn_weights_0, attn_weights_1), dim=0)  # (2, batch_size, seq_len, seq_len) attn_weights_stacked
        attn_weights = attn_weights_stacked.permute(1, 0, 2, 3)  # (batch_size, 2, seq_len, seq_len) attn_weights
        linear_output = F.linear(output, self.linear.weight, self.linear.bias)  # (batch_size, seq_len, d_model) linear_output
        projection = F.dropout(linear_output, p=0.3, training=self.training)  # (batch_size, seq_len, d_model) projection
        return projection, attn_weights  # (batch_size, seq_len, d_model), (batch_size, 2, seq_len, seq_len)
