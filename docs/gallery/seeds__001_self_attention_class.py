# 001_self_attention_class: written by `tracer export 001_self_attention_class.yaml`.
# Tutorial 001, the compact SelfAttention class (x @ W), shapes only.
# Shapes are symbolic, as in the trace: each line says which YAML step it is.

import math

import torch
from torch import nn

__all__ = ["Pipeline001SelfAttentionClass"]


class Pipeline001SelfAttentionClass(nn.Module):
    # The pipeline '001_self_attention_class', as PyTorch.

    def __init__(self, *, T=4096, d_in=4608, d_out=4608, seed=143):
        super().__init__()
        self.T, self.d_in, self.d_out = T, d_in, d_out
        if seed is not None:
            torch.manual_seed(seed)  # then every tensor in the order the file declares it
        self.Wq = nn.Parameter(torch.rand(d_in, d_out))  # (d_in, d_out)
        self.Wv = nn.Parameter(torch.rand(d_in, d_out))  # (d_in, d_out)
        self.Wk = nn.Parameter(torch.rand(d_in, d_out))  # (d_in, d_out)

    def forward(self, X):
        d_out = self.d_out  # dims
        queries = X @ self.Wq  # (T, d_out) queries
        keys = X @ self.Wk  # (T, d_out) keys
        values = X @ self.Wv  # (T, d_out) values
        keys_T = keys.transpose(0, 1)  # (d_out, T) keys_T
        attention_scores = queries @ keys_T  # (T, T) attention_scores
        scaled_scores = attention_scores / math.sqrt(d_out)  # (T, T) scaled_scores
        attention_weights = torch.softmax(scaled_scores, dim=1)  # (T, T) attention_weights
        Z = attention_weights @ values  # (T, d_out) Z
        return Z  # (T, d_out)
