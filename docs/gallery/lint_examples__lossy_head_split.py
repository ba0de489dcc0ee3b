# lossy_head_split: written by `tracer export lossy_head_split.yaml`.
# Tutorial 000's 3-head split of a 4-dim value.
# Shapes are symbolic, as in the trace: each line says which YAML step it is.

import torch
from torch import nn

__all__ = ["LossyHeadSplit"]


class LossyHeadSplit(nn.Module):
    # The pipeline 'lossy_head_split', as PyTorch.

    def __init__(self, *, T=8, d_v=4, num_heads=3, head_dim=1, seed=0):
        super().__init__()
        self.T, self.d_v, self.num_heads, self.head_dim = T, d_v, num_heads, head_dim
        if seed is not None:
            torch.manual_seed(seed)  # then every tensor in the order the file declares it

    def forward(self, attention_scores, values):
        head_dim = self.head_dim  # dims
        head_0 = values[:, 0:head_dim]  # (T, head_dim) head_0
        head_1 = values[:, head_dim:2 * head_dim]  # (T, head_dim) head_1
        head_2 = values[:, 2 * head_dim:3 * head_dim]  # (T, head_dim) head_2
        context_vector_0 = attention_scores @ head_0  # (1, head_dim) context_vector_0
        context_vector_1 = attention_scores @ head_1  # (1, head_dim) context_vector_1
        context_vector_2 = attention_scores @ head_2  # (1, head_dim) context_vector_2
        combined_context = torch.cat((context_vector_0, context_vector_1, context_vector_2), dim=1)  # (1, 3*head_dim) combined_context
        return combined_context  # (1, 3*head_dim)
