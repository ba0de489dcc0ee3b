# 000_multihead_stacked: written by `tracer export 000_multihead_stacked.yaml`.
# Tutorial 000, multi-head attention with stacked weights, repeat + bmm + permute.
# Shapes are symbolic, as in the trace: each line says which YAML step it is.

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["Pipeline000MultiheadStacked"]


class Pipeline000MultiheadStacked(nn.Module):
    # The pipeline '000_multihead_stacked', as PyTorch.

    def __init__(self, *, T=8, vocab=8, d=2, d_q=3, d_v=4, h=3, seed=None):
        super().__init__()
        d_k = d_q
        self.T, self.vocab, self.d, self.d_q, self.d_k, self.d_v, self.h = T, vocab, d, d_q, d_k, d_v, h
        if seed is not None:
            torch.manual_seed(seed)  # then every tensor in the order the file declares it
        torch.manual_seed(123)
        self.embed = nn.Parameter(torch.empty(vocab, d).normal_())  # (vocab, d)
        torch.manual_seed(123)
        self.W_query = nn.Parameter(torch.rand(d_q, d))  # (d_q, d)
        self.W_key = nn.Parameter(torch.rand(d_k, d))  # (d_k, d)
        self.W_value = nn.Parameter(torch.rand(d_v, d))  # (d_v, d)
        self.multihead_W_query = nn.Parameter(torch.rand(h, d_q, d))  # (h, d_q, d)
        self.multihead_W_key = nn.Parameter(torch.rand(h, d_k, d))  # (h, d_k, d)
        self.multihead_W_value = nn.Parameter(torch.rand(h, d_v, d))  # (h, d_v, d)

    def forward(self, sentence_int):
        h = self.h  # dims
        embedded_sentence = F.embedding(sentence_int, self.embed)  # (T, d) embedded_sentence
        x_2 = embedded_sentence.select(0, 1)  # (d) x_2
        multihead_query_2 = self.multihead_W_query @ x_2  # (h, d_q) multihead_query_2
        multihead_key_2 = self.multihead_W_key @ x_2  # (h, d_q) multihead_key_2
        multihead_value_2 = self.multihead_W_value @ x_2  # (h, d_v) multihead_value_2
        embedded_sentence_T = embedded_sentence.transpose(0, 1)  # (d, T) embedded_sentence_T
        stacked_inputs = embedded_sentence_T.repeat(h, 1, 1)  # (h, d, T) stacked_inputs
        multihead_keys_bmm = torch.bmm(self.multihead_W_key, stacked_inputs)  # (h, d_q, T) multihead_keys_bmm
        multihead_values_bmm = torch.bmm(self.multihead_W_value, stacked_inputs)  # (h, d_v, T) multihead_values_bmm
        multihead_keys = multihead_keys_bmm.permute(0, 2, 1)  # (h, T, d_q) multihead_keys
        multihead_values = multihead_values_bmm.permute(0, 2, 1)  # (h, T, d_v) multihead_values
        return multihead_query_2, multihead_key_2, multihead_value_2, multihead_keys, multihead_values  # (h, d_q), (h, d_q), (h, d_v), (h, T, d_q), (h, T, d_v)
