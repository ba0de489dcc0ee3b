# scale_mismatch_fixed: written by `tracer export scale_mismatch.yaml`.
# Tutorial 004's toy attention, scaled by sqrt(d) of its 3-dim keys.
# Shapes are symbolic, as in the trace: each line says which YAML step it is.

import math

import torch
from torch import nn

__all__ = ["ScaleMismatchFixed"]


class ScaleMismatchFixed(nn.Module):
    # The pipeline 'scale_mismatch_fixed', as PyTorch.

    def __init__(self, *, n_q=3, n_k=4, d=3, seed=None):
        super().__init__()
        self.n_q, self.n_k, self.d = n_q, n_k, d
        if seed is not None:
            torch.manual_seed(seed)  # then every tensor in the order the file declares it

    def forward(self, temp_q, temp_k, temp_v):
        d = self.d  # dims
        K_T = temp_k.transpose(0, 1)  # (d, n_k) K_T
        QK = temp_q @ K_T  # (n_q, n_k) QK
        matmul_scaled = QK / math.sqrt(d)  # (n_q, n_k) matmul_scaled
        attention_weights = torch.softmax(matmul_scaled, dim=-1)  # (n_q, n_k) attention_weights
        output = attention_weights @ temp_v  # (n_q, d) output
        return output  # (n_q, d)
