# mistral_sliding_window: written by `tracer export mistral_sliding_window.yaml`.
# Mistral attention: GQA with RoPE and a causal sliding-window mask.
# Shapes are symbolic, as in the trace: each line says which YAML step it is.

import math

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["MistralSlidingWindow"]


def linear_bound(fan_in: int, ndim: int) -> float:
    """nn.Linear's reset_parameters, bit for bit: kaiming_uniform_(a=√5) for a weight, U(±1/√fan_in) for a bias."""
    if ndim >= 2:
        gain = math.sqrt(2.0 / (1 + 5))
        return math.sqrt(3.0) * gain / math.sqrt(fan_in) if fan_in else 0.0
    return 1 / math.sqrt(fan_in) if fan_in > 0 else 0.0


def _rotate_half(torch, x):
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class MistralSlidingWindow(nn.Module):
    # The pipeline 'mistral_sliding_window', as PyTorch.

    def __init__(self, *, B=2, T=8, W=3, d_model=16, H=4, H_kv=2, seed=0):
        super().__init__()
        if H_kv == 0:
            raise ValueError(f"dim n_rep = H // H_kv: division by zero in 'H // H_kv' (H_kv={H_kv})")
        if H % H_kv:
            raise ValueError(f"dim n_rep = H // H_kv: H={H} is not divisible by H_kv={H_kv}")
        n_rep = H // H_kv
        if H == 0:
            raise ValueError(f"dim Dh = d_model // H: division by zero in 'd_model // H' (H={H})")
        if d_model % H:
            raise ValueError(f"dim Dh = d_model // H: d_model={d_model} is not divisible by H={H}")
        Dh = d_model // H
        self.B, self.T, self.W, self.d_model, self.H, self.H_kv, self.n_rep, self.Dh = B, T, W, d_model, H, H_kv, n_rep, Dh
        if seed is not None:
            torch.manual_seed(seed)  # then every tensor in the order the file declares it
        torch.empty(B, T, d_model).normal_()  # input 'x' is drawn here in the traced run: same seed, same params
        bound = linear_bound(d_model, 2)  # as nn.Linear initialises it
        self.W_q = nn.Parameter(torch.empty(H * Dh, d_model).uniform_(-bound, bound))  # (H * Dh, d_model)
        bound = linear_bound(d_model, 2)  # as nn.Linear initialises it
        self.W_k = nn.Parameter(torch.empty(H_kv * Dh, d_model).uniform_(-bound, bound))  # (H_kv * Dh, d_model)
        bound = linear_bound(d_model, 2)  # as nn.Linear initialises it
        self.W_v = nn.Parameter(torch.empty(H_kv * Dh, d_model).uniform_(-bound, bound))  # (H_kv * Dh, d_model)
        bound = linear_bound(H * Dh, 2)  # as nn.Linear initialises it
        self.W_o = nn.Parameter(torch.empty(d_model, H * Dh).uniform_(-bound, bound))  # (d_model, H * Dh)

    def forward(self, x):
        B, T, W, d_model, H, H_kv, n_rep, Dh = self.B, self.T, self.W, self.d_model, self.H, self.H_kv, self.n_rep, self.Dh  # dims
        q = F.linear(x, self.W_q)  # (B, T, d_model) q
        q_heads = q.view(B, T, H, Dh)  # (B, T, H, Dh) q_heads
        q_h = q_heads.transpose(1, 2)  # (B, H, T, Dh) q_h
        k = F.linear(x, self.W_k)  # (B, T, H_kv*d_model // H) k
        k_heads = k.view(B, T, H_kv, Dh)  # (B, T, H_kv, Dh) k_heads
        k_h = k_heads.transpose(1, 2)  # (B, H_kv, T, Dh) k_h
        v = F.linear(x, self.W_v)  # (B, T, H_kv*d_model // H) v
        v_heads = v.view(B, T, H_kv, Dh)  # (B, T, H_kv, Dh) v_heads
        v_h = v_heads.transpose(1, 2)  # (B, H_kv, T, Dh) v_h
        q_rot_inv_freq = 1.0 / (10000.0 ** (torch.arange(0, Dh, 2, dtype=torch.int64, device=q_h.device).float() / Dh))  # q_rot
        q_rot_freqs = torch.arange(T, device=q_h.device).float()[:, None] * q_rot_inv_freq  # q_rot
        q_rot_emb = torch.cat((q_rot_freqs, q_rot_freqs), dim=-1)  # q_rot
        q_rot_cos, q_rot_sin = q_rot_emb.cos().to(q_h.dtype), q_rot_emb.sin().to(q_h.dtype)  # q_rot
        q_rot = q_h * q_rot_cos + _rotate_half(torch, q_h) * q_rot_sin  # (B, H, T, Dh) q_rot
        k_rot_inv_freq = 1.0 / (10000.0 ** (torch.arange(0, Dh, 2, dtype=torch.int64, device=k_h.device).float() / Dh))  # k_rot
        k_rot_freqs = torch.arange(T, device=k_h.device).float()[:, None] * k_rot_inv_freq  # k_rot
        k_rot_emb = torch.cat((k_rot_freqs, k_rot_freqs), dim=-1)  # k_rot
        k_rot_cos, k_rot_sin = k_rot_emb.cos().to(k_h.dtype), k_rot_emb.sin().to(k_h.dtype)  # k_rot
        k_rot = k_h * k_rot_cos + _rotate_half(torch, k_h) * k_rot_sin  # (B, H_kv, T, Dh) k_rot
        k_rep = torch.repeat_interleave(k_rot, n_rep, dim=1)  # (B, H, T, Dh) k_rep
        v_rep = torch.repeat_interleave(v_h, n_rep, dim=1)  # (B, H, T, Dh) v_rep
        k_t = k_rep.transpose(2, 3)  # (B, H, Dh, T) k_t
        scores = q_rot @ k_t  # (B, H, T, T) scores
        scaled = scores / math.sqrt(Dh)  # (B, H, T, T) scaled
        masked = scaled.masked_fill((torch.ones(T, T, dtype=torch.bool, device=scaled.device).triu(1) | torch.ones(T, T, dtype=torch.bool, device=scaled.device).tril(-W)), -math.inf)  # (B, H, T, T) masked
        weights = torch.softmax(masked, dim=-1)  # (B, H, T, T) weights
        context = weights @ v_rep  # (B, H, T, Dh) context
        merged = context.transpose(-3, -2).contiguous().view(B, T, d_model)  # (B, T, d_model) merged
        out = F.linear(merged, self.W_o)  # (B, T, d_model) out
        return out  # (B, T, d_model)
