# 000_self_attention_x2: written by `tracer export 000_self_attention_x2.yaml`.
# Tutorial 000: embedding of 'My shoes are small, my feet are big.', projections W @ x.T, and the scaled dot-product attention of the second token.
# Shapes are symbolic, as in the trace: each line says which YAML step it is.

import math

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["Pipeline000SelfAttentionX2"]


class Pipeline000SelfAttentionX2(nn.Module):
    # The pipeline '000_self_attention_x2', as PyTorch.

    def __init__(self, *, T=8, vocab=8, d=2, d_q=3, d_v=4, seed=None):
        super().__init__()
        d_k = d_q
        self.T, self.vocab, self.d, self.d_q, self.d_k, self.d_v = T, vocab, d, d_q, d_k, d_v
        if seed is not None:
            torch.manual_seed(seed)  # then every tensor in the order the file declares it
        torch.manual_seed(123)
        self.embed = nn.Parameter(torch.empty(vocab, d).normal_())  # (vocab, d)
        torch.manual_seed(123)
        self.W_query = nn.Parameter(torch.rand(d_q, d))  # (d_q, d)
        self.W_key = nn.Parameter(torch.rand(d_k, d))  # (d_k, d)
        self.W_value = nn.Parameter(torch.rand(d_v, d))  # (d_v, d)

    def forward(self, sentence_int):
        d_k = self.d_k  # dims
        embedded_sentence = F.embedding(sentence_int, self.embed)  # (T, d) embedded_sentence
        x_2 = embedded_sentence.select(0, 1)  # (d) x_2
        query_2 = self.W_query @ x_2  # (d_q) query_2
        key_2 = self.W_key @ x_2  # (d_q) key_2
        value_2 = self.W_value @ x_2  # (d_v) value_2
        embedded_sentence_T = embedded_sentence.transpose(0, 1)  # (d, T) embedded_sentence_T
        queries_T = self.W_query @ embedded_sentence_T  # (d_q, T) queries_T
        queries = queries_T.transpose(0, 1)  # (T, d_q) queries
        keys_T = self.W_key @ embedded_sentence_T  # (d_q, T) keys_T
        keys = keys_T.transpose(0, 1)  # (T, d_q) keys
        values_T = self.W_value @ embedded_sentence_T  # (d_v, T) values_T
        values = values_T.transpose(0, 1)  # (T, d_v) values
        keys_4 = keys.select(0, 4)  # (d_q) keys_4
        omega_24 = query_2 @ keys_4  # () omega_24
        omega_2 = query_2 @ keys_T  # (T) omega_2
        queries_1 = queries.select(0, 1)  # (d_q) queries_1
        query_2_row = queries_1.unsqueeze(0)  # (1, d_q) query_2_row
        omega_2_row = query_2_row @ keys_T  # (1, T) omega_2_row
        omega_2_scaled = omega_2_row / math.sqrt(d_k)  # (1, T) omega_2_scaled
        attention_weights_2 = torch.softmax(omega_2_scaled, dim=1)  # (1, T) attention_weights_2
        context_vector_2 = attention_weights_2 @ values  # (1, d_v) context_vector_2
        return embedded_sentence, key_2, value_2, omega_24, omega_2, attention_weights_2, context_vector_2  # (T, d), (d_q), (d_v), (), (T), (1, T), (1, d_v)
