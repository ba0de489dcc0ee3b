# 001_self_attention_no_weights: written by `tracer export 001_self_attention_no_weights.yaml`.
# Tutorial 001, basic self-attention without trainable weights.
# Shapes are symbolic, as in the trace: each line says which YAML step it is.

import torch
from torch import nn

__all__ = ["Pipeline001SelfAttentionNoWeights"]


class Pipeline001SelfAttentionNoWeights(nn.Module):
    # The pipeline '001_self_attention_no_weights', as PyTorch.

    def __init__(self, *, T=6, d_in=3, query_input_idx=1, seed=None):
        super().__init__()
        self.T, self.d_in, self.query_input_idx = T, d_in, query_input_idx
        if seed is not None:
            torch.manual_seed(seed)  # then every tensor in the order the file declares it

    def forward(self, inputs):
        query_input_idx = self.query_input_idx  # dims
        inputs_T = inputs.transpose(0, 1)  # (d_in, T) inputs_T
        attention_scores = inputs @ inputs_T  # (T, T) attention_scores
        attention_weights = torch.softmax(attention_scores, dim=1)  # (T, T) attention_weights
        attention_weights_2 = attention_weights.select(0, query_input_idx)  # (T) attention_weights_2
        z_2 = attention_weights_2 @ inputs  # (d_in) z_2
        Z = attention_weights @ inputs  # (T, d_in) Z
        return attention_scores, attention_weights, z_2, Z  # (T, T), (T, T), (d_in), (T, d_in)
