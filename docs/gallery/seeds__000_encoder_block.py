# 000_encoder_block: written by `tracer export 000_encoder_block.yaml`.
# Tutorial 000, MHA + add & norm + feed-forward + add & norm (one encoder block).
# Shapes are symbolic, as in the trace: each line says which YAML step it is.

import math

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["Pipeline000EncoderBlock"]


def linear_bound(fan_in: int, ndim: int) -> float:
    """nn.Linear's reset_parameters, bit for bit: kaiming_uniform_(a=√5) for a weight, U(±1/√fan_in) for a bias."""
    if ndim >= 2:
        gain = math.sqrt(2.0 / (1 + 5))
        return math.sqrt(3.0) * gain / math.sqrt(fan_in) if fan_in else 0.0
    return 1 / math.sqrt(fan_in) if fan_in > 0 else 0.0


class Pipeline000EncoderBlock(nn.Module):
    # The pipeline '000_encoder_block', as PyTorch.

    def __init__(self, *, batch_size=1, seq_len=8, vocab=8, d_model=2, num_heads=2, hidden_dim=4, seed=123):
        super().__init__()
        if num_heads == 0:
            raise ValueError(f"dim head_dim = d_model // num_heads: division by zero in 'd_model // num_heads' (num_heads={num_heads})")
        if d_model % num_heads:
            raise ValueError(f"dim head_dim = d_model // num_heads: d_model={d_model} is not divisible by num_heads={num_heads}")
        head_dim = d_model // num_heads
        self.batch_size, self.seq_len, self.vocab, self.d_model, self.num_heads, self.head_dim, self.hidden_dim = batch_size, seq_len, vocab, d_model, num_heads, head_dim, hidden_dim
        if seed is not None:
            torch.manual_seed(seed)  # then every tensor in the order the file declares it
        self.embed = nn.Parameter(torch.empty(vocab, d_model).normal_())  # (vocab, d_model)
        self.W_Q = nn.Module()  # holds 'W_Q.weight'
        bound = linear_bound(d_model, 2)  # as nn.Linear initialises it
        self.W_Q.weight = nn.Parameter(torch.empty(d_model, d_model).uniform_(-bound, bound))  # (d_model, d_model)
        bound = linear_bound(d_model, 1)  # as nn.Linear initialises it
        self.W_Q.bias = nn.Parameter(torch.empty(d_model).uniform_(-bound, bound))  # (d_model)
        self.W_K = nn.Module()  # holds 'W_K.weight'
        bound = linear_bound(d_model, 2)  # as nn.Linear initialises it
        self.W_K.weight = nn.Parameter(torch.empty(d_model, d_model).uniform_(-bound, bound))  # (d_model, d_model)
        bound = linear_bound(d_model, 1)  # as nn.Linear initialises it
        self.W_K.bias = nn.Parameter(torch.empty(d_model).uniform_(-bound, bound))  # (d_model)
        self.W_V = nn.Module()  # holds 'W_V.weight'
        bound = linear_bound(d_model, 2)  # as nn.Linear initialises it
        self.W_V.weight = nn.Parameter(torch.empty(d_model, d_model).uniform_(-bound, bound))  # (d_model, d_model)
        bound = linear_bound(d_model, 1)  # as nn.Linear initialises it
        self.W_V.bias = nn.Parameter(torch.empty(d_model).uniform_(-bound, bound))  # (d_model)
        self.out_proj = nn.Module()  # holds 'out_proj.weight'
        bound = linear_bound(d_model, 2)  # as nn.Linear initialises it
        self.out_proj.weight = nn.Parameter(torch.empty(d_model, d_model).uniform_(-bound, bound))  # (d_model, d_model)
        bound = linear_bound(d_model, 1)  # as nn.Linear initialises it
        self.out_proj.bias = nn.Parameter(torch.empty(d_model).uniform_(-bound, bound))  # (d_model)
        self.linear1 = nn.Module()  # holds 'linear1.weight'
        bound = linear_bound(d_model, 2)  # as nn.Linear initialises it
        self.linear1.weight = nn.Parameter(torch.empty(hidden_dim, d_model).uniform_(-bound, bound))  # (hidden_dim, d_model)
        bound = linear_bound(d_model, 1)  # as nn.Linear initialises it
        self.linear1.bias = nn.Parameter(torch.empty(hidden_dim).uniform_(-bound, bound))  # (hidden_dim)
        self.linear2 = nn.Module()  # holds 'linear2.weight'
        bound = linear_bound(hidden_dim, 2)  # as nn.Linear initialises it
        self.linear2.weight = nn.Parameter(torch.empty(d_model, hidden_dim).uniform_(-bound, bound))  # (d_model, hidden_dim)
        bound = linear_bound(hidden_dim, 1)  # as nn.Linear initialises it
        self.linear2.bias = nn.Parameter(torch.empty(d_model).uniform_(-bound, bound))  # (d_model)

    def forward(self, sentence_int):
        batch_size, seq_len, d_model, num_heads, head_dim = self.batch_size, self.seq_len, self.d_model, self.num_heads, self.head_dim  # dims
        embedded_sentence = F.embedding(sentence_int, self.embed)  # (seq_len, d_model) embedded_sentence
        x_in = embedded_sentence.unsqueeze(0)  # (1, seq_len, d_model) x_in
        Q = F.linear(x_in, self.W_Q.weight, self.W_Q.bias)  # (1, seq_len, d_model) Q
        K = F.linear(x_in, self.W_K.weight, self.W_K.bias)  # (1, seq_len, d_model) K
        V = F.linear(x_in, self.W_V.weight, self.W_V.bias)  # (1, seq_len, d_model) V
        Q_reshaped = Q.reshape(batch_size, seq_len, num_heads, head_dim)  # (batch_size, seq_len, num_heads, head_dim) Q_reshaped
        Q_heads = Q_reshaped.transpose(1, 2)  # (batch_size, num_heads, seq_len, head_dim) Q_heads
        K_reshaped = K.reshape(batch_size, seq_len, num_heads, head_dim)  # (batch_size, seq_len, num_heads, head_dim) K_reshaped
        K_heads = K_reshaped.transpose(1, 2)  # (batch_size, num_heads, seq_len, head_dim) K_heads
        V_reshaped = V.reshape(batch_size, seq_len, num_heads, head_dim)  # (batch_size, seq_len, num_heads, head_dim) V_reshaped
        V_heads = V_reshaped.transpose(1, 2)  # (batch_size, num_heads, seq_len, head_dim) V_heads
        K_T = K_heads.transpose(-1, -2)  # (batch_size, num_heads, head_dim, seq_len) K_T
        QK = Q_heads @ K_T  # (batch_size, num_heads, seq_len, seq_len) QK
        scores = QK / math.sqrt(head_dim)  # (batch_size, num_heads, seq_len, seq_len) scores
        attn_weights = torch.softmax(scores, dim=-1)  # (batch_size, num_heads, seq_len, seq_len) attn_weights
        context = attn_weights @ V_heads  # (batch_size, num_heads, seq_len, head_dim) context
        context_transposed = context.transpose(1, 2)  # (batch_size, seq_len, num_heads, head_dim) context_transposed
        context_merged = context_transposed.reshape(batch_size, seq_len, d_model)  # (batch_size, seq_len, d_model) context_merged
        mha_out = F.linear(context_merged, self.out_proj.weight, self.out_proj.bias)  # (batch_size, seq_len, d_model) mha_out
        residual_1 = x_in + mha_out  # (1, seq_len, d_model) residual_1
        normed_1 = F.layer_norm(residual_1, (d_model,), None, None, eps=1e-05)  # (1, seq_len, d_model) normed_1
        hidden = F.linear(normed_1, self.linear1.weight, self.linear1.bias)  # (1, seq_len, hidden_dim) hidden
        hidden_act = torch.relu(hidden)  # (1, seq_len, hidden_dim) hidden_act
        ffn_out = F.linear(hidden_act, self.linear2.weight, self.linear2.bias)  # (1, seq_len, d_model) ffn_out
        residual_2 = normed_1 + ffn_out  # (1, seq_len, d_model) residual_2
        encoder_out = F.layer_norm(residual_2, (d_model,), None, None, eps=1e-05)  # (1, seq_len, d_model) encoder_out
        return encoder_out  # (1, seq_len, d_model)
