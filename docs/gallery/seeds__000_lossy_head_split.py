# 000_lossy_head_split: written by `tracer export 000_lossy_head_split.yaml`.
# Tutorial 000, a 3-head split of the 4-dim values that drops a column (a bug).
# Shapes are symbolic, as in the trace: each line says which YAML step it is.

import math

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["Pipeline000LossyHeadSplit"]


class Pipeline000LossyHeadSplit(nn.Module):
    # The pipeline '000_lossy_head_split', as PyTorch.

    def __init__(self, *, T=8, vocab=8, d=2, d_q=3, d_v=4, num_heads=3, head_dim=1, seed=None):
        super().__init__()
        d_k = d_q
        self.T, self.vocab, self.d, self.d_q, self.d_k, self.d_v, self.num_heads, self.head_dim = T, vocab, d, d_q, d_k, d_v, num_heads, head_dim
        if seed is not None:
            torch.manual_seed(seed)  # then every tensor in the order the file declares it
        torch.manual_seed(123)
        self.embed = nn.Parameter(torch.empty(vocab, d).normal_())  # (vocab, d)
        torch.manual_seed(123)
        self.W_query = nn.Parameter(torch.rand(d_q, d))  # (d_q, d)
        self.W_key = nn.Parameter(torch.rand(d_k, d))  # (d_k, d)
        self.W_value = nn.Parameter(torch.rand(d_v, d))  # (d_v, d)

    def forward(self, sentence_int):
        d_k, head_dim = self.d_k, self.head_dim  # dims
        embedded_sentence = F.embedding(sentence_int, self.embed)  # (T, d) embedded_sentence
        embedded_sentence_T = embedded_sentence.transpose(0, 1)  # (d, T) embedded_sentence_T
        queries_T = self.W_query @ embedded_sentence_T  # (d_q, T) queries_T
        queries = queries_T.transpose(0, 1)  # (T, d_q) queries
        keys_T = self.W_key @ embedded_sentence_T  # (d_q, T) keys_T
        values_T = self.W_value @ embedded_sentence_T  # (d_v, T) values_T
        values = values_T.transpose(0, 1)  # (T, d_v) values
        queries_1 = queries.select(0, 1)  # (d_q) queries_1
        query_2 = queries_1.unsqueeze(0)  # (1, d_q) query_2
        omega_2 = query_2 @ keys_T  # (1, T) omega_2
        omega_2_scaled = omega_2 / math.sqrt(d_k)  # (1, T) omega_2_scaled
        attention_scores = torch.softmax(omega_2_scaled, dim=1)  # (1, T) attention_scores
        head_0 = values[:, 0:head_dim]  # (T, head_dim) head_0
        head_1 = values[:, head_dim:2 * head_dim]  # (T, head_dim) head_1
        head_2 = values[:, 2 * head_dim:3 * head_dim]  # (T, head_dim) head_2
        context_vector_0 = attention_scores @ head_0  # (1, head_dim) context_vector_0
        context_vector_1 = attention_scores @ head_1  # (1, head_dim) context_vector_1
        context_vector_2 = attention_scores @ head_2  # (1, head_dim) context_vector_2
        combined_context = torch.cat((context_vector_0, context_vector_1, context_vector_2), dim=1)  # (1, 3*head_dim) combined_context
        return combined_context  # (1, 3*head_dim)
