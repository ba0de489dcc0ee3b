# 003_mha_step_by_step: written by `tracer export 003_mha_step_by_step.yaml`.
# Tutorial 003, multi-headed attention step by step with a boolean keep-mask.
# Shapes are symbolic, as in the trace: each line says which YAML step it is.

import math

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["Pipeline003MhaStepByStep"]


def linear_bound(fan_in: int, ndim: int) -> float:
    """nn.Linear's reset_parameters, bit for bit: kaiming_uniform_(a=√5) for a weight, U(±1/√fan_in) for a bias."""
    if ndim >= 2:
        gain = math.sqrt(2.0 / (1 + 5))
        return math.sqrt(3.0) * gain / math.sqrt(fan_in) if fan_in else 0.0
    return 1 / math.sqrt(fan_in) if fan_in > 0 else 0.0


class Pipeline003MhaStepByStep(nn.Module):
    # The pipeline '003_mha_step_by_step', as PyTorch.

    def __init__(self, *, batch_size=2, seq_len=3, d_model=8, num_heads=2, seed=3):
        super().__init__()
        if num_heads == 0:
            raise ValueError(f"dim d_k = d_model // num_heads: division by zero in 'd_model // num_heads' (num_heads={num_heads})")
        if d_model % num_heads:
            raise ValueError(f"dim d_k = d_model // num_heads: d_model={d_model} is not divisible by num_heads={num_heads}")
        d_k = d_model // num_heads
        self.batch_size, self.seq_len, self.d_model, self.num_heads, self.d_k = batch_size, seq_len, d_model, num_heads, d_k
        if seed is not None:
            torch.manual_seed(seed)  # then every tensor in the order the file declares it
        self.query_creator = nn.Module()  # holds 'query_creator.weight'
        bound = linear_bound(d_model, 2)  # as nn.Linear initialises it
        self.query_creator.weight = nn.Parameter(torch.empty(d_model, d_model).uniform_(-bound, bound))  # (d_model, d_model)
        bound = linear_bound(d_model, 1)  # as nn.Linear initialises it
        self.query_creator.bias = nn.Parameter(torch.empty(d_model).uniform_(-bound, bound))  # (d_model)
        self.key_creator = nn.Module()  # holds 'key_creator.weight'
        bound = linear_bound(d_model, 2)  # as nn.Linear initialises it
        self.key_creator.weight = nn.Parameter(torch.empty(d_model, d_model).uniform_(-bound, bound))  # (d_model, d_model)
        bound = linear_bound(d_model, 1)  # as nn.Linear initialises it
        self.key_creator.bias = nn.Parameter(torch.empty(d_model).uniform_(-bound, bound))  # (d_model)
        self.value_creator = nn.Module()  # holds 'value_creator.weight'
        bound = linear_bound(d_model, 2)  # as nn.Linear initialises it
        self.value_creator.weight = nn.Parameter(torch.empty(d_model, d_model).uniform_(-bound, bound))  # (d_model, d_model)
        bound = linear_bound(d_model, 1)  # as nn.Linear initialises it
        self.value_creator.bias = nn.Parameter(torch.empty(d_model).uniform_(-bound, bound))  # (d_model)
        self.output_creator = nn.Module()  # holds 'output_creator.weight'
        bound = linear_bound(d_model, 2)  # as nn.Linear initialises it
        self.output_creator.weight = nn.Parameter(torch.empty(d_model, d_model).uniform_(-bound, bound))  # (d_model, d_model)
        bound = linear_bound(d_model, 1)  # as nn.Linear initialises it
        self.output_creator.bias = nn.Parameter(torch.empty(d_model).uniform_(-bound, bound))  # (d_model)

    def forward(self, input, mask_random):
        batch_size, seq_len, d_model, num_heads, d_k = self.batch_size, self.seq_len, self.d_model, self.num_heads, self.d_k  # dims
        queries = F.linear(input, self.query_creator.weight, self.query_creator.bias)  # (batch_size, seq_len, d_model) queries
        keys = F.linear(input, self.key_creator.weight, self.key_creator.bias)  # (batch_size, seq_len, d_model) keys
        values = F.linear(input, self.value_creator.weight, self.value_creator.bias)  # (batch_size, seq_len, d_model) values
        queries_view = queries.view(batch_size, seq_len, num_heads, d_k)  # (batch_size, seq_len, num_heads, d_k) queries_view
        keys_view = keys.view(batch_size, seq_len, num_heads, d_k)  # (batch_size, seq_len, num_heads, d_k) keys_view
        values_view = values.view(batch_size, seq_len, num_heads, d_k)  # (batch_size, seq_len, num_heads, d_k) values_view
        queries_heads = queries_view.transpose(1, 2)  # (batch_size, num_heads, seq_len, d_k) queries_heads
        keys_heads = keys_view.transpose(1, 2)  # (batch_size, num_heads, seq_len, d_k) keys_heads
        values_heads = values_view.transpose(1, 2)  # (batch_size, num_heads, seq_len, d_k) values_heads
        keys_transposed = keys_heads.transpose(2, 3)  # (batch_size, num_heads, d_k, seq_len) keys_transposed
        attention_scores_raw = queries_heads @ keys_transposed  # (batch_size, num_heads, seq_len, seq_len) attention_scores_raw
        attention_scores = attention_scores_raw / math.sqrt(d_k)  # (batch_size, num_heads, seq_len, seq_len) attention_scores
        attention_scores_masked = attention_scores.masked_fill(~mask_random, -1000000000.0)  # (batch_size, num_heads, seq_len, seq_len) attention_scores_masked
        attention_weights = torch.softmax(attention_scores_masked, dim=-1)  # (batch_size, num_heads, seq_len, seq_len) attention_weights
        attention_heads = attention_weights @ values_heads  # (batch_size, num_heads, seq_len, d_k) attention_heads
        attention_heads_transposed = attention_heads.transpose(1, 2)  # (batch_size, seq_len, num_heads, d_k) attention_heads_transposed
        attention_heads_concat = attention_heads_transposed.reshape(batch_size, seq_len, d_model)  # (batch_size, seq_len, d_model) attention_heads_concat
        multi_head_attention_output = F.linear(attention_heads_concat, self.output_creator.weight, self.output_creator.bias)  # (batch_size, seq_len, d_model) multi_head_attention_output
        return attention_weights, multi_head_attention_output  # (batch_size, num_heads, seq_len, seq_len), (batch_size, seq_len, d_model)
