# mask_polarity_fixed: written by `tracer export mask_polarity.yaml`.
# Tutorial 002's causal triu mask applied with block polarity.
# Shapes are symbolic, as in the trace: each line says which YAML step it is.

import torch
from torch import nn

__all__ = ["MaskPolarityFixed"]


class MaskPolarityFixed(nn.Module):
    # The pipeline 'mask_polarity_fixed', as PyTorch.

    def __init__(self, *, B=1, H=2, T=4, seed=0):
        super().__init__()
        self.B, self.H, self.T = B, H, T
        if seed is not None:
            torch.manual_seed(seed)  # then every tensor in the order the file declares it
        torch.empty(B, H, T, T).normal_()  # input 'attention_scores' is drawn here in the traced run: same seed, same params
        self.mask = nn.Parameter(torch.ones(T, T).triu(1))  # (T, T)

    def forward(self, attention_scores):
        masked = attention_scores.masked_fill(self.mask.bool(), -1000000000.0)  # (B, H, T, T) masked
        attention_weights = torch.softmax(masked, dim=-1)  # (B, H, T, T) attention_weights
        return attention_weights  # (B, H, T, T)
