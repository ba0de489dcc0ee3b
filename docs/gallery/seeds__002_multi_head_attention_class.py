# 002_multi_head_attention_class: written by `tracer export 002_multi_head_attention_class.yaml`.
# Tutorial 002, the MultiHeadAttention class, batch of 2.
# Shapes are symbolic, as in the trace: each line says which YAML step it is.

import math

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["Pipeline002MultiHeadAttentionClass"]


def linear_bound(fan_in: int, ndim: int) -> float:
    """nn.Linear's reset_parameters, bit for bit: kaiming_uniform_(a=√5) for a weight, U(±1/√fan_in) for a bias."""
    if ndim >= 2:
        gain = math.sqrt(2.0 / (1 + 5))
        return math.sqrt(3.0) * gain / math.sqrt(fan_in) if fan_in else 0.0
    return 1 / math.sqrt(fan_in) if fan_in > 0 else 0.0


class Pipeline002MultiHeadAttentionClass(nn.Module):
    # The pipeline '002_multi_head_attention_class', as PyTorch.

    def __init__(self, *, B=2, T=6, context_size=6, d_in=4, d_out=4, num_heads=2, seed=0):
        super().__init__()
        if num_heads == 0:
            raise ValueError(f"dim head_dim = d_out // num_heads: division by zero in 'd_out // num_heads' (num_heads={num_heads})")
        if d_out % num_heads:
            raise ValueError(f"dim head_dim = d_out // num_heads: d_out={d_out} is not divisible by num_heads={num_heads}")
        head_dim = d_out // num_heads
        self.B, self.T, self.context_size, self.d_in, self.d_out, self.num_heads, self.head_dim = B, T, context_size, d_in, d_out, num_heads, head_dim
        if seed is not None:
            torch.manual_seed(seed)  # then every tensor in the order the file declares it
        torch.empty(B, T, d_in).normal_()  # input 'input_embeddings' is drawn here in the traced run: same seed, same params
        self.Wq = nn.Module()  # holds 'Wq.weight'
        bound = linear_bound(d_in, 2)  # as nn.Linear initialises it
        self.Wq.weight = nn.Parameter(torch.empty(d_out, d_in).uniform_(-bound, bound))  # (d_out, d_in)
        self.Wk = nn.Module()  # holds 'Wk.weight'
        bound = linear_bound(d_in, 2)  # as nn.Linear initialises it
        self.Wk.weight = nn.Parameter(torch.empty(d_out, d_in).uniform_(-bound, bound))  # (d_out, d_in)
        self.Wv = nn.Module()  # holds 'Wv.weight'
        bound = linear_bound(d_in, 2)  # as nn.Linear initialises it
        self.Wv.weight = nn.Parameter(torch.empty(d_out, d_in).uniform_(-bound, bound))  # (d_out, d_in)
        self.mask = nn.Parameter(torch.ones(context_size, context_size).triu(1))  # (context_size, context_size)
        self.out_proj = nn.Module()  # holds 'out_proj.weight'
        bound = linear_bound(d_out, 2)  # as nn.Linear initialises it
        self.out_proj.weight = nn.Parameter(torch.empty(d_out, d_out).uniform_(-bound, bound))  # (d_out, d_out)
        bound = linear_bound(d_out, 1)  # as nn.Linear initialises it
        self.out_proj.bias = nn.Parameter(torch.empty(d_out).uniform_(-bound, bound))  # (d_out)

    def forward(self, input_embeddings):
        B, T, d_out, num_heads, head_dim = self.B, self.T, self.d_out, self.num_heads, self.head_dim  # dims
        Q = F.linear(input_embeddings, self.Wq.weight)  # (B, T, d_out) Q
        K = F.linear(input_embeddings, self.Wk.weight)  # (B, T, d_out) K
        V = F.linear(input_embeddings, self.Wv.weight)  # (B, T, d_out) V
        Q_view = Q.view(B, T, num_heads, head_dim)  # (B, T, num_heads, head_dim) Q_view
        Q_heads = Q_view.transpose(1, 2)  # (B, num_heads, T, head_dim) Q_heads
        K_view = K.view(B, T, num_heads, head_dim)  # (B, T, num_heads, head_dim) K_view
        K_heads = K_view.transpose(1, 2)  # (B, num_heads, T, head_dim) K_heads
        V_view = V.view(B, T, num_heads, head_dim)  # (B, T, num_heads, head_dim) V_view
        V_heads = V_view.transpose(1, 2)  # (B, num_heads, T, head_dim) V_heads
        K_T = K_heads.transpose(-2, -1)  # (B, num_heads, head_dim, T) K_T
        attention_scores = Q_heads @ K_T  # (B, num_heads, T, T) attention_scores
        mask_rows = self.mask[:T]  # (T, context_size) mask_rows
        mask_T = mask_rows[:, :T]  # (T, T) mask_T
        attention_scores_masked = attention_scores.masked_fill(mask_T.bool(), -math.inf)  # (B, num_heads, T, T) attention_scores_masked
        attention_scores_scaled = attention_scores_masked / math.sqrt(head_dim)  # (B, num_heads, T, T) attention_scores_scaled
        attention_weights = torch.softmax(attention_scores_scaled, dim=-1)  # (B, num_heads, T, T) attention_weights
        attention_weights_dropout = F.dropout(attention_weights, p=0.2, training=self.training)  # (B, num_heads, T, T) attention_weights_dropout
        context_vectors = attention_weights_dropout @ V_heads  # (B, num_heads, T, head_dim) context_vectors
        context_vectors_merged = context_vectors.transpose(-3, -2).contiguous().view(B, T, d_out)  # (B, T, d_out) context_vectors_merged
        output = F.linear(context_vectors_merged, self.out_proj.weight, self.out_proj.bias)  # (B, T, d_out) output
        return output  # (B, T, d_out)
