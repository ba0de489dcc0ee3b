# gqa_head_order_fixed: written by `tracer export gqa_head_order.yaml`.
# Key heads shared by grouped-query attention's rule, as transformers' repeat_kv does.
# Shapes are symbolic, as in the trace: each line says which YAML step it is.

import torch
from torch import nn

__all__ = ["GqaHeadOrderFixed"]


class GqaHeadOrderFixed(nn.Module):
    # The pipeline 'gqa_head_order_fixed', as PyTorch.

    def __init__(self, *, B=1, H=4, H_kv=2, T=4, Dh=2, seed=0):
        super().__init__()
        if H_kv == 0:
            raise ValueError(f"dim n_rep = H // H_kv: division by zero in 'H // H_kv' (H_kv={H_kv})")
        if H % H_kv:
            raise ValueError(f"dim n_rep = H // H_kv: H={H} is not divisible by H_kv={H_kv}")
        n_rep = H // H_kv
        self.B, self.H, self.H_kv, self.n_rep, self.T, self.Dh = B, H, H_kv, n_rep, T, Dh
        if seed is not None:
            torch.manual_seed(seed)  # then every tensor in the order the file declares it

    def forward(self, q, k):
        n_rep = self.n_rep  # dims
        k_rep = torch.repeat_interleave(k, n_rep, dim=1)  # (B, H, T, Dh) k_rep
        k_t = k_rep.transpose(-2, -1)  # (B, H, Dh, T) k_t
        scores = q @ k_t  # (B, H, T, T) scores
        return scores  # (B, H, T, T)
