# lossy_head_split_fixed: written by `tracer export lossy_head_split.yaml`.
# Tutorial 000's head split with a head count that divides the value dim.
# Shapes are symbolic, as in the trace: each line says which YAML step it is.

import torch
from torch import nn

__all__ = ["LossyHeadSplitFixed"]


class LossyHeadSplitFixed(nn.Module):
    # The pipeline 'lossy_head_split_fixed', as PyTorch.

    def __init__(self, *, T=8, d_v=4, num_heads=2, seed=0):
        super().__init__()
        if num_heads == 0:
            raise ValueError(f"dim head_dim = d_v // num_heads: division by zero in 'd_v // num_heads' (num_heads={num_heads})")
        if d_v % num_heads:
            raise ValueError(f"dim head_dim = d_v // num_heads: d_v={d_v} is not divisible by num_heads={num_heads}")
        head_dim = d_v // num_heads
        self.T, self.d_v, self.num_heads, self.head_dim = T, d_v, num_heads, head_dim
        if seed is not None:
            torch.manual_seed(seed)  # then every tensor in the order the file declares it

    def forward(self, attention_scores, values):
        head_dim = self.head_dim  # dims
        head_0 = values[:, 0:head_dim]  # (T, head_dim) head_0
        head_1 = values[:, head_dim:2 * head_dim]  # (T, head_dim) head_1
        context_vector_0 = attention_scores @ head_0  # (1, head_dim) context_vector_0
        context_vector_1 = attention_scores @ head_1  # (1, head_dim) context_vector_1
        combined_context = torch.cat((context_vector_0, context_vector_1), dim=1)  # (1, 2*d_v // num_heads) combined_context
        return combined_context  # (1, 2*d_v // num_heads)
