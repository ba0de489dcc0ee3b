"""The modules behind the imported pipelines in this folder, each next to a hand-written one.

Regenerate a file with ``tracer import`` from this folder (the command is in the file's
first lines); ``tracer diff`` against the hand-written pipeline shows what differs (the gallery
prints it): for the Llama layer, names only.
"""

import math

import torch
from torch import nn
from torch.nn import functional as F


class CausalSelfAttention(nn.Module):
    """karpathy/nanoGPT model.py's attention, the path without flash attention (a tril buffer, masked_fill)."""

    def __init__(self, n_embd, n_head, block_size):
        super().__init__()
        self.c_attn = nn.Linear(n_embd, 3 * n_embd)
        self.c_proj = nn.Linear(n_embd, n_embd)
        self.attn_dropout, self.resid_dropout = nn.Dropout(0.1), nn.Dropout(0.1)
        self.n_head, self.n_embd = n_head, n_embd
        self.register_buffer("bias", torch.tril(torch.ones(block_size, block_size)).view(1, 1, block_size, block_size))

    def forward(self, x):
        B, T, C = x.size()
        q, k, v = self.c_attn(x).split(self.n_embd, dim=2)
        k = k.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        q = q.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        v = v.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
        att = att.masked_fill(self.bias[:, :, :T, :T] == 0, float("-inf"))
        att = F.softmax(att, dim=-1)
        att = self.attn_dropout(att)
        y = att @ v
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        return self.resid_dropout(self.c_proj(y))


class LlamaLayer(nn.Module):
    """One transformers ``LlamaDecoderLayer`` (eager attention), fed as ``LlamaModel`` feeds it: the
    rotary table for positions 0 .. T-1 and an additive causal mask."""

    def __init__(self, config):
        super().__init__()
        from transformers.models.llama import modeling_llama

        self.layer = modeling_llama.LlamaDecoderLayer(config, 0)
        self.rotary = modeling_llama.LlamaRotaryEmbedding(config)

    def forward(self, x):
        T = x.shape[1]
        cos_sin = self.rotary(x, torch.arange(T, device=x.device)[None])
        mask = torch.full((T, T), float("-inf"), device=x.device).triu(1)[None, None]
        return self.layer(x, attention_mask=mask, position_embeddings=cos_sin)


def nanogpt_attention():
    torch.manual_seed(0)
    return CausalSelfAttention(n_embd=8, n_head=2, block_size=12)


def llama_decoder_layer():
    """The sizes of ../models/llama_decoder_layer.yaml."""
    import transformers

    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2, rms_norm_eps=1e-6
    )
    config._attn_implementation = "eager"
    return LlamaLayer(config)
