# 001_self_attention_trainable: written by `tracer export 001_self_attention_trainable.yaml`.
# Tutorial 001, self-attention with trainable weights, x @ W.
# Shapes are symbolic, as in the trace: each line says which YAML step it is.

import math

import torch
from torch import nn

__all__ = ["Pipeline001SelfAttentionTrainable"]


class Pipeline001SelfAttentionTrainable(nn.Module):
    # The pipeline '001_self_attention_trainable', as PyTorch.

    def __init__(self, *, T=6, d_in=3, d_out=3, seed=None):
        super().__init__()
        d_k = d_out
        self.T, self.d_in, self.d_out, self.d_k = T, d_in, d_out, d_k
        if seed is not None:
            torch.manual_seed(seed)  # then every tensor in the order the file declares it
        torch.manual_seed(123)
        self.Wq = nn.Parameter(torch.rand(d_in, d_out))  # (d_in, d_out)
        self.Wk = nn.Parameter(torch.rand(d_in, d_out))  # (d_in, d_out)
        self.Wv = nn.Parameter(torch.rand(d_in, d_out))  # (d_in, d_out)

    def forward(self, inputs):
        d_k = self.d_k  # dims
        queries = inputs @ self.Wq  # (T, d_out) queries
        keys = inputs @ self.Wk  # (T, d_out) keys
        values = inputs @ self.Wv  # (T, d_out) values
        keys_T = keys.transpose(0, 1)  # (d_out, T) keys_T
        attention_scores = queries @ keys_T  # (T, T) attention_scores
        scaled_scores = attention_scores / math.sqrt(d_k)  # (T, T) scaled_scores
        attention_weights = torch.softmax(scaled_scores, dim=-1)  # (T, T) attention_weights
        alpha_2 = attention_weights.select(0, 2)  # (T) alpha_2
        z_2 = alpha_2 @ values  # (d_out) z_2
        Z = attention_weights @ values  # (T, d_out) Z
        return values, attention_weights, z_2, Z  # (T, d_out), (T, T), (d_out), (T, d_out)
