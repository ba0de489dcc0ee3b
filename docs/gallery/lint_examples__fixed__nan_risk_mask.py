# nan_risk_mask_fixed: written by `tracer export nan_risk_mask.yaml`.
# Tutorial 003's keep-mask filled with -1e9, as the tutorial does.
# Shapes are symbolic, as in the trace: each line says which YAML step it is.

import torch
from torch import nn

__all__ = ["NanRiskMaskFixed"]


class NanRiskMaskFixed(nn.Module):
    # The pipeline 'nan_risk_mask_fixed', as PyTorch.

    def __init__(self, *, batch_size=2, num_heads=2, seq_len=3, seed=0):
        super().__init__()
        self.batch_size, self.num_heads, self.seq_len = batch_size, num_heads, seq_len
        if seed is not None:
            torch.manual_seed(seed)  # then every tensor in the order the file declares it

    def forward(self, attention_scores, mask_random):
        attention_scores_masked = attention_scores.masked_fill(~mask_random, -1000000000.0)  # (batch_size, num_heads, seq_len, seq_len) attention_scores_masked
        attention_weights = torch.softmax(attention_scores_masked, dim=-1)  # (batch_size, num_heads, seq_len, seq_len) attention_weights
        return attention_weights  # (batch_size, num_heads, seq_len, seq_len)
