# view_scrambles_dims_fixed: written by `tracer export view_scrambles_dims.yaml`.
# Heads merged by transposing (B, H, T, Dh) to (B, T, H, Dh), then reshaping.
# Shapes are symbolic, as in the trace: each line says which YAML step it is.

import torch
from torch import nn

__all__ = ["ViewScramblesDimsFixed"]


class ViewScramblesDimsFixed(nn.Module):
    # The pipeline 'view_scrambles_dims_fixed', as PyTorch.

    def __init__(self, *, B=2, T=6, d_model=8, H=2, seed=0):
        super().__init__()
        if H == 0:
            raise ValueError(f"dim Dh = d_model // H: division by zero in 'd_model // H' (H={H})")
        if d_model % H:
            raise ValueError(f"dim Dh = d_model // H: d_model={d_model} is not divisible by H={H}")
        Dh = d_model // H
        self.B, self.T, self.d_model, self.H, self.Dh = B, T, d_model, H, Dh
        if seed is not None:
            torch.manual_seed(seed)  # then every tensor in the order the file declares it

    def forward(self, context):
        B, T, d_model = self.B, self.T, self.d_model  # dims
        heads_last = context.transpose(1, 2)  # (B, T, H, Dh) heads_last
        merged = heads_last.reshape(B, T, d_model)  # (B, T, d_model) merged
        return merged  # (B, T, d_model)
