# 002_weight_split_step_by_step: written by `tracer export 002_weight_split_step_by_step.yaml`.
# Tutorial 002, causal MHA with weight split, step by step on the printed tensors.
# Shapes are symbolic, as in the trace: each line says which YAML step it is.

import math

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["Pipeline002WeightSplitStepByStep"]


class Pipeline002WeightSplitStepByStep(nn.Module):
    # The pipeline '002_weight_split_step_by_step', as PyTorch.

    def __init__(self, *, NUM_BATCH=1, NUM_TOKENS=6, CONTEXT_SIZE=6, D_IN=4, D_OUT=4, NUM_HEADS=2, seed=None):
        super().__init__()
        if NUM_HEADS == 0:
            raise ValueError(f"dim HEAD_DIM = D_OUT // NUM_HEADS: division by zero in 'D_OUT // NUM_HEADS' (NUM_HEADS={NUM_HEADS})")
        if D_OUT % NUM_HEADS:
            raise ValueError(f"dim HEAD_DIM = D_OUT // NUM_HEADS: D_OUT={D_OUT} is not divisible by NUM_HEADS={NUM_HEADS}")
        HEAD_DIM = D_OUT // NUM_HEADS
        self.NUM_BATCH, self.NUM_TOKENS, self.CONTEXT_SIZE, self.D_IN, self.D_OUT, self.NUM_HEADS, self.HEAD_DIM = NUM_BATCH, NUM_TOKENS, CONTEXT_SIZE, D_IN, D_OUT, NUM_HEADS, HEAD_DIM
        if seed is not None:
            torch.manual_seed(seed)  # then every tensor in the order the file declares it
        self.Wq = nn.Parameter(torch.tensor([[0.1118, -0.4581, -0.281, -0.0504], [0.4673, 0.0952, -0.1767, 0.3812], [-0.1484, -0.0739, 0.4602, 0.3879], [0.2999, 0.3496, -0.2486, -0.0946]], dtype=torch.float32))  # (D_OUT, D_IN)
        self.Wk = nn.Parameter(torch.tensor([[-0.3001, -0.4434, -0.082, -0.1382], [0.4897, -0.3804, 0.1761, 0.3176], [0.4293, -0.1651, -0.0434, 0.4178], [0.2808, 0.0722, 0.2693, 0.4605]], dtype=torch.float32))  # (D_OUT, D_IN)
        self.Wv = nn.Parameter(torch.tensor([[-0.1242, -0.0797, 0.1834, -0.4971], [-0.4361, -0.2864, 0.2599, 0.0864], [0.3415, -0.187, 0.0523, 0.214], [0.0108, 0.3178, -0.4126, 0.1115]], dtype=torch.float32))  # (D_OUT, D_IN)
        self.mask = nn.Parameter(torch.ones(CONTEXT_SIZE, CONTEXT_SIZE).triu(1))  # (CONTEXT_SIZE, CONTEXT_SIZE)

    def forward(self, input_embeddings):
        NUM_BATCH, NUM_TOKENS, D_OUT, NUM_HEADS, HEAD_DIM = self.NUM_BATCH, self.NUM_TOKENS, self.D_OUT, self.NUM_HEADS, self.HEAD_DIM  # dims
        Q = F.linear(input_embeddings, self.Wq)  # (NUM_BATCH, NUM_TOKENS, D_OUT) Q
        K = F.linear(input_embeddings, self.Wk)  # (NUM_BATCH, NUM_TOKENS, D_OUT) K
        V = F.linear(input_embeddings, self.Wv)  # (NUM_BATCH, NUM_TOKENS, D_OUT) V
        Q_reshaped = Q.view(NUM_BATCH, NUM_TOKENS, NUM_HEADS, HEAD_DIM)  # (NUM_BATCH, NUM_TOKENS, NUM_HEADS, HEAD_DIM) Q_reshaped
        K_reshaped = K.view(NUM_BATCH, NUM_TOKENS, NUM_HEADS, HEAD_DIM)  # (NUM_BATCH, NUM_TOKENS, NUM_HEADS, HEAD_DIM) K_reshaped
        V_reshaped = V.view(NUM_BATCH, NUM_TOKENS, NUM_HEADS, HEAD_DIM)  # (NUM_BATCH, NUM_TOKENS, NUM_HEADS, HEAD_DIM) V_reshaped
        Q_regrouped = Q_reshaped.transpose(1, 2)  # (NUM_BATCH, NUM_HEADS, NUM_TOKENS, HEAD_DIM) Q_regrouped
        K_regrouped = K_reshaped.transpose(1, 2)  # (NUM_BATCH, NUM_HEADS, NUM_TOKENS, HEAD_DIM) K_regrouped
        V_regrouped = V_reshaped.transpose(1, 2)  # (NUM_BATCH, NUM_HEADS, NUM_TOKENS, HEAD_DIM) V_regrouped
        K_T = K_regrouped.transpose(-2, -1)  # (NUM_BATCH, NUM_HEADS, HEAD_DIM, NUM_TOKENS) K_T
        attention_scores = Q_regrouped @ K_T  # (NUM_BATCH, NUM_HEADS, NUM_TOKENS, NUM_TOKENS) attention_scores
        neg_inf_masked_attention_scores = attention_scores.masked_fill(self.mask.bool(), -math.inf)  # (NUM_BATCH, NUM_HEADS, NUM_TOKENS, NUM_TOKENS) neg_inf_masked_attention_scores
        scaled_attention_scores = neg_inf_masked_attention_scores / math.sqrt(HEAD_DIM)  # (NUM_BATCH, NUM_HEADS, NUM_TOKENS, NUM_TOKENS) scaled_attention_scores
        attention_weights = torch.softmax(scaled_attention_scores, dim=-1)  # (NUM_BATCH, NUM_HEADS, NUM_TOKENS, NUM_TOKENS) attention_weights
        attention_weights_dropout = F.dropout(attention_weights, p=0.2, training=self.training)  # (NUM_BATCH, NUM_HEADS, NUM_TOKENS, NUM_TOKENS) attention_weights_dropout
        context_vectors = attention_weights_dropout @ V_regrouped  # (NUM_BATCH, NUM_HEADS, NUM_TOKENS, HEAD_DIM) context_vectors
        context_vectors_regrouped = context_vectors.transpose(1, 2)  # (NUM_BATCH, NUM_TOKENS, NUM_HEADS, HEAD_DIM) context_vectors_regrouped
        context_vectors_contiguous = context_vectors_regrouped.contiguous()  # (NUM_BATCH, NUM_TOKENS, NUM_HEADS, HEAD_DIM) context_vectors_contiguous
        context_vectors_reshaped = context_vectors_contiguous.view(NUM_BATCH, NUM_TOKENS, D_OUT)  # (NUM_BATCH, NUM_TOKENS, D_OUT) context_vectors_reshaped
        return Q, K, V, attention_scores, neg_inf_masked_attention_scores, attention_weights, context_vectors_reshaped  # (NUM_BATCH, NUM_TOKENS, D_OUT), (NUM_BATCH, NUM_TOKENS, D_OUT), (NUM_BATCH, NUM_TOKENS, D_OUT), (NUM_BATCH, NUM_HEADS, NUM_TOKENS, NUM_TOKENS), (NUM_BATCH, NUM_HEADS, NUM_TOKENS, NUM_TOKENS), (NUM_BATCH, NUM_HEADS, NUM_TOKENS, NUM_TOKENS), (NUM_BATCH, NUM_TOKENS, D_OUT)
