# dead_step_fixed: written by `tracer export dead_step.yaml`.
# Tutorial 003's attention with its dropout used.
# Shapes are symbolic, as in the trace: each line says which YAML step it is.

import math

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["DeadStepFixed"]


class DeadStepFixed(nn.Module):
    # The pipeline 'dead_step_fixed', as PyTorch.

    def __init__(self, *, batch_size=2, num_heads=2, seq_len=3, d_k=4, seed=0):
        super().__init__()
        self.batch_size, self.num_heads, self.seq_len, self.d_k = batch_size, num_heads, seq_len, d_k
        if seed is not None:
            torch.manual_seed(seed)  # then every tensor in the order the file declares it

    def forward(self, queries, keys, values):
        d_k = self.d_k  # dims
        keys_transposed = keys.transpose(2, 3)  # (batch_size, num_heads, d_k, seq_len) keys_transposed
        scores = queries @ keys_transposed  # (batch_size, num_heads, seq_len, seq_len) scores
        attention_scores = scores / math.sqrt(d_k)  # (batch_size, num_heads, seq_len, seq_len) attention_scores
        attention_weights = torch.softmax(attention_scores, dim=-1)  # (batch_size, num_heads, seq_len, seq_len) attention_weights
        attention_scores_dropout = F.dropout(attention_weights, p=0.1, training=self.training)  # (batch_size, num_heads, seq_len, seq_len) attention_scores_dropout
        attention_heads = attention_scores_dropout @ values  # (batch_size, num_heads, seq_len, d_k) attention_heads
        return attention_heads  # (batch_size, num_heads, seq_len, d_k)
