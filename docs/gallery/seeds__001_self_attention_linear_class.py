# 001_self_attention_linear_class: written by `tracer export 001_self_attention_linear_class.yaml`.
# Tutorial 001, the SelfAttention class with nn.Linear projections, shapes only.
# Shapes are symbolic, as in the trace: each line says which YAML step it is.

import math

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["Pipeline001SelfAttentionLinearClass"]


def linear_bound(fan_in: int, ndim: int) -> float:
    """nn.Linear's reset_parameters, bit for bit: kaiming_uniform_(a=√5) for a weight, U(±1/√fan_in) for a bias."""
    if ndim >= 2:
        gain = math.sqrt(2.0 / (1 + 5))
        return math.sqrt(3.0) * gain / math.sqrt(fan_in) if fan_in else 0.0
    return 1 / math.sqrt(fan_in) if fan_in > 0 else 0.0


class Pipeline001SelfAttentionLinearClass(nn.Module):
    # The pipeline '001_self_attention_linear_class', as PyTorch.

    def __init__(self, *, T=4096, d_in=4608, d_out=4608, seed=143):
        super().__init__()
        self.T, self.d_in, self.d_out = T, d_in, d_out
        if seed is not None:
            torch.manual_seed(seed)  # then every tensor in the order the file declares it
        self.Wq = nn.Module()  # holds 'Wq.weight'
        bound = linear_bound(d_in, 2)  # as nn.Linear initialises it
        self.Wq.weight = nn.Parameter(torch.empty(d_out, d_in).uniform_(-bound, bound))  # (d_out, d_in)
        self.Wv = nn.Module()  # holds 'Wv.weight'
        bound = linear_bound(d_in, 2)  # as nn.Linear initialises it
        self.Wv.weight = nn.Parameter(torch.empty(d_out, d_in).uniform_(-bound, bound))  # (d_out, d_in)
        self.Wk = nn.Module()  # holds 'Wk.weight'
        bound = linear_bound(d_in, 2)  # as nn.Linear initialises it
        self.Wk.weight = nn.Parameter(torch.empty(d_out, d_in).uniform_(-bound, bound))  # (d_out, d_in)

    def forward(self, X):
        d_out = self.d_out  # dims
        queries = F.linear(X, self.Wq.weight)  # (T, d_out) queries
        keys = F.linear(X, self.Wk.weight)  # (T, d_out) keys
        values = F.linear(X, self.Wv.weight)  # (T, d_out) values
        keys_T = keys.transpose(0, 1)  # (d_out, T) keys_T
        attention_scores = queries @ keys_T  # (T, T) attention_scores
        scaled_scores = attention_scores / math.sqrt(d_out)  # (T, T) scaled_scores
        attention_weights = torch.softmax(scaled_scores, dim=1)  # (T, T) attention_weights
        Z = attention_weights @ values  # (T, d_out) Z
        return Z  # (T, d_out)
