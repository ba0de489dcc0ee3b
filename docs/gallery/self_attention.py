# self_attention: written by `tracer export self_attention.yaml`.
# Single-head scaled dot-product self-attention, x @ W projections.
# Shapes are symbolic, as in the trace: each line says which YAML step it is.

import math

import torch
from torch import nn

__all__ = ["SelfAttention"]


class SelfAttention(nn.Module):
    # The pipeline 'self_attention', as PyTorch.

    def __init__(self, *, T=6, d_in=3, d_out=2, seed=123):
        super().__init__()
        self.T, self.d_in, self.d_out = T, d_in, d_out
        if seed is not None:
            torch.manual_seed(seed)  # then every tensor in the order the file declares it
        torch.rand(T, d_in)  # input 'x' is drawn here in the traced run: same seed, same params
        self.W_query = nn.Parameter(torch.rand(d_in, d_out))  # (d_in, d_out)
        self.W_key = nn.Parameter(torch.rand(d_in, d_out))  # (d_in, d_out)
        self.W_value = nn.Parameter(torch.rand(d_in, d_out))  # (d_in, d_out)

    def forward(self, x):
        d_out = self.d_out  # dims
        queries = x @ self.W_query  # (T, d_out) queries
        keys = x @ self.W_key  # (T, d_out) keys
        values = x @ self.W_value  # (T, d_out) values
        keys_T = keys.transpose(0, 1)  # (d_out, T) keys_T
        scores = queries @ keys_T  # (T, T) scores
        scaled = scores / math.sqrt(d_out)  # (T, T) scaled
        weights = torch.softmax(scaled, dim=-1)  # (T, T) weights
        context = weights @ values  # (T, d_out) context
        return context  # (T, d_out)
