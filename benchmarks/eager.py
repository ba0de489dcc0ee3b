"""Tutorial 002's hand-written multi-head attention (verbatim forward), the baseline every ratio divides by."""

from __future__ import annotations

import torch
import torch.nn as nn


class MultiHeadAttention(nn.Module):
    def __init__(self, d_in, d_out, context_size, num_heads, dropout_prob):
        super().__init__()
        assert d_out % num_heads == 0, "d_out must be divisible by num_heads"
        self.d_out = d_out
        self.num_heads = num_heads
        self.head_dim = d_out // num_heads
        self.Wq = nn.Linear(d_in, d_out, bias=False)
        self.Wk = nn.Linear(d_in, d_out, bias=False)
        self.Wv = nn.Linear(d_in, d_out, bias=False)
        self.dropout = nn.Dropout(dropout_prob)
        self.register_buffer("mask", torch.triu(torch.ones(context_size, context_size), diagonal=1))
        self.out_proj = nn.Linear(d_out, d_out)

    def forward(self, input_embeddings):
        B, T, d_in = input_embeddings.shape
        Q = self.Wq(input_embeddings)  # (B, T, D_out)
        K = self.Wk(input_embeddings)
        V = self.Wv(input_embeddings)
        Q = Q.view(B, T, self.num_heads, self.head_dim).transpose(1, 2)  # (B, H, T, Dhead)
        K = K.view(B, T, self.num_heads, self.head_dim).transpose(1, 2)
        V = V.view(B, T, self.num_heads, self.head_dim).transpose(1, 2)
        attention_scores = Q @ K.transpose(-2, -1)  # (B, H, T, T)
        attention_scores = attention_scores.masked_fill(self.mask.bool(), -torch.inf)
        attention_weights = torch.softmax(attention_scores / (self.head_dim**0.5), dim=-1)
        attention_weights = self.dropout(attention_weights)
        context_vectors = attention_weights @ V  # (B, H, T, Dhead)
        context_vectors = context_vectors.transpose(1, 2).contiguous().view(B, T, self.d_out)
        return self.out_proj(context_vectors)


def eager_module(B: int, T: int, d: int, H: int, seed: int = 0) -> tuple[nn.Module, torch.Tensor]:
    """The module in eval mode (dropout off, as the pipeline's default) and an input x of (B, T, d)."""
    torch.manual_seed(seed)
    x = torch.randn(B, T, d)
    module = MultiHeadAttention(d, d, T, H, dropout_prob=0.2).eval()
    return module, x
