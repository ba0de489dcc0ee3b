# softmax_over_queries_fixed: written by `tracer export softmax_over_queries.yaml`.
# Attention weights normalised over the keys (dim -1).
# Shapes are symbolic, as in the trace: each line says which YAML step it is.

import math

import torch
from torch import nn

__all__ = ["SoftmaxOverQueriesFixed"]


class SoftmaxOverQueriesFixed(nn.Module):
    # The pipeline 'softmax_over_queries_fixed', as PyTorch.

    def __init__(self, *, T=4, d=3, seed=0):
        super().__init__()
        self.T, self.d = T, d
        if seed is not None:
            torch.manual_seed(seed)  # then every tensor in the order the file declares it

    def forward(self, q, k):
        d = self.d  # dims
        k_t = k.transpose(0, 1)  # (d, T) k_t
        scores = q @ k_t  # (T, T) scores
        scaled = scores / math.sqrt(d)  # (T, T) scaled
        weights = torch.softmax(scaled, dim=-1)  # (T, T) weights
        return weights  # (T, T)
