"""Fused attention: one ``F.scaled_dot_product_attention`` step, whose (T_q, T_kv) scores and
weights never exist as tensors (so the memory estimate holds none)."""

from __future__ import annotations

import math
from typing import Literal

from pydantic import Field, StrictBool, StrictFloat, StrictInt, model_validator

from ..core.dtypes import DTYPE_BYTES
from ..core.fields import DimText, TensorId
from ..core.layout import fresh, preserve_format
from ..core.pysource import py_float
from .attention import causal_hidden, causal_source
from .contract import FusedAttention, Masking, StepBase, register
from .rules import StepError, broadcast, require_float, show


@register
class Sdpa(StepBase):
    """``F.scaled_dot_product_attention(q, k, v, …)`` on (…, H, T_q, Dh), (…, H_kv, T_kv, Dh), (…, H_kv, T_kv, Dv).

    ``causal``, ``window`` and ``align`` mean what they mean for ``op: mask`` (bottom-right by
    default: a decode query sees the whole cache); square, window-less causal attention is passed
    to torch as ``is_causal=True``, any other pattern as an explicit mask. A bool/int ``mask`` needs
    a ``polarity`` (keep: True attends, as SDPA's bool ``attn_mask``; block: True is hidden); a
    float mask is added to the scores (transformers' additive masks), and is float32 or the query's
    dtype, the two torch takes. ``gqa: true`` is
    ``enable_gqa=True``: kv head ``h`` serves query heads ``h*n_rep … h*n_rep+n_rep-1``.
    """

    op: Literal["sdpa"] = "sdpa"
    arity = 3
    causal: StrictBool = Field(False, description="hide keys after each query (bottom-right aligned unless align: top-left)")
    window: DimText | None = Field(None, description="with causal: each query sees only its last W keys (sliding window)")
    align: Literal["bottom-right", "top-left"] = Field("bottom-right", description="causal alignment when T_q != T_kv")
    mask: TensorId | None = Field(None, description="attn_mask: a bool/int mask (with polarity) or a float mask added to the scores")
    polarity: Literal["keep", "block"] | None = Field(None, description="for a bool/int mask: True means attend (keep) or hidden (block)")
    scale: StrictFloat | StrictInt | None = Field(None, description="multiplies q @ k^T (default: 1/sqrt(Dh), SDPA's default)")
    dropout: float = Field(0.0, ge=0.0, le=1.0, description="dropout_p on the attention weights (only with training: true)")
    training: StrictBool = Field(False, description="apply dropout (uses the RNG)")
    gqa: StrictBool = Field(False, description="enable_gqa: fewer kv heads than query heads, each shared by H // H_kv")
    param_fields = ("mask",)
    example = """\
- id: context
  op: sdpa
  inputs: [q_rot, k_rot, v_h]   # (B, H, T, Dh), (B, H_kv, T, Dh), (B, H_kv, T, Dh)
  causal: true
  gqa: true                     # -> (B, H, T, Dh); no (T, T) scores are stored"""

    @model_validator(mode="after")
    def _pattern(self):
        if not self.causal and (self.window is not None or self.align != "bottom-right"):
            raise ValueError("'window' and 'align' shape the causal mask: add 'causal: true'")
        if self.mask is None and self.polarity is not None:
            raise ValueError("'polarity' only applies to a mask tensor")
        return self

    def is_random(self) -> bool:
        return self.training and self.dropout > 0

    def args(self):
        shown = (["causal"] if self.causal else []) + ([f"window={self.window}"] if self.window is not None else [])
        shown += ["top-left"] if self.align == "top-left" else []
        shown += [self.polarity or "add"] if self.mask is not None else []
        shown += [f"scale={self.scale:g}"] if self.scale is not None else []
        return shown + (["gqa"] if self.gqa else []) + ([f"p={self.dropout:g}"] if self.training else [])

    def infer(self, ins, ctx):
        q, k, v = ins[:3]
        names = ctx.input_ids
        for name, meta in zip(names, (q, k, v)):
            require_float(meta, name, "sdpa")
            if len(meta.shape) < 2:
                raise StepError("sdpa-shape", f"sdpa needs (…, T, Dh) tensors, '{name}' is {show(meta)}", "inputs")
            if meta.dtype != q.dtype:
                raise StepError("dtype", f"sdpa of {q.dtype} '{names[0]}' and {meta.dtype} '{name}'", "inputs")
        if q.sizes[-1] != k.sizes[-1] or k.sizes[-2] != v.sizes[-2]:
            raise StepError(
                "sdpa-shape",
                f"sdpa needs q (…, T_q, Dh), k (…, T_kv, Dh), v (…, T_kv, Dv); got '{names[0]}' {show(q)}, '{names[1]}' {show(k)}, '{names[2]}' {show(v)}",
                "inputs",
            )
        self._check_heads(q, k, v, names)
        if self.window is not None and ctx.dim(self.window, "window").value < 1:
            raise StepError("mask-window", f"window {self.window} must be at least 1 (the query's own key)", "window")
        scores = q.shape[:-1] + (k.shape[-2],)
        if math.prod(d.value for d in scores) * max(4, DTYPE_BYTES[q.dtype]) > 2**62:  # check.MAX_TENSOR_BYTES
            raise StepError(
                "tensor-too-large",
                f"the scores ({', '.join(map(str, scores))}) [{', '.join(str(d.value) for d in scores)}] that torch's math path "
                "(and every meta run) builds would need more than 2**62 bytes; torch cannot describe them",
                "inputs",
            )
        if self.mask is not None:
            mask = ins[3]
            if mask.dtype in ("bool", "int32", "int64") and self.polarity is None:
                raise StepError(
                    "mask-polarity", f"a {mask.dtype} mask needs polarity: keep (True attends) or block (True is hidden)", "mask"
                )
            if mask.dtype not in ("bool", "int32", "int64") and self.polarity is not None:
                raise StepError("mask-polarity", f"a {mask.dtype} mask is added to the scores; polarity applies to bool masks", "polarity")
            if mask.dtype not in ("bool", "int32", "int64", "float32", q.dtype):  # torch takes float32 or the query's dtype
                raise StepError(
                    "dtype",
                    f"float mask '{self.mask}' is {mask.dtype}, query '{names[0]}' is {q.dtype}: torch adds a float mask only "
                    f"in float32 or in the query's dtype",
                    "mask",
                    f"cast the mask to {q.dtype} (op: cast) before the sdpa",
                )
            out = broadcast(fresh(scores, q.dtype), mask, f"mask '{self.mask}' against the scores", "mask", ctx)
            if tuple(d.value for d in out) != tuple(d.value for d in scores):
                raise StepError(
                    "broadcast", f"mask '{self.mask}' {show(mask)} would enlarge the scores ({', '.join(map(str, scores))})", "mask"
                )
        shape = q.shape[:-1] + v.shape[-1:]
        # the flash kernel lays its output out like q; the math path's is a fresh product (weights @ v)
        return fresh(shape, q.dtype) if self.takes_math_path(ins) else preserve_format(q, shape)

    def _check_heads(self, q, k, v, names):
        lead_q, lead_k, lead_v = q.sizes[:-2], k.sizes[:-2], v.sizes[:-2]
        if lead_k != lead_v:
            raise StepError(
                "sdpa-shape", f"keys '{names[1]}' {show(k)} and values '{names[2]}' {show(v)} need the same leading dims", "inputs"
            )
        if lead_q == lead_k:
            return
        grouped = self.gqa and len(lead_q) == len(lead_k) and lead_q[:-1] == lead_k[:-1] and lead_k and lead_k[-1]
        if grouped and lead_q[-1] % lead_k[-1] == 0:
            return
        hint = "set gqa: true (enable_gqa) when the query heads are a multiple of the kv heads" if not self.gqa else None
        raise StepError(
            "sdpa-shape",
            f"queries '{names[0]}' {show(q)} and keys '{names[1]}' {show(k)} differ in leading dims"
            + (" (the query heads must be a multiple of the kv heads)" if self.gqa else ""),
            "inputs",
            hint,
        )

    def masking(self):
        if not self.causal and self.mask is None:
            return None
        fill = float("-inf") if self.polarity is not None or self.causal else 0.0
        return Masking(self.causal, self.window, self.align, self.mask, self.polarity, fill)

    def fused_attention(self):
        return FusedAttention(None if self.scale is None else float(self.scale), self.masking(), self.gqa)

    def is_causal_flag(self, square: bool) -> bool:
        """Whether the causal pattern is torch's own ``is_causal=True`` (top-left, no window, no
        mask): for square scores (``square``: T_q and T_kv are the same) or with ``align: top-left``.
        Any other pattern becomes an explicit mask."""
        return self.causal and self.window is None and self.mask is None and (square or self.align == "top-left")

    def takes_math_path(self, ins) -> bool:
        """Whether torch leaves its CPU flash kernel for the math path (sdp_utils_cpp's
        use_flash_attention_cpp): training dropout, not 4-d, head dims or batches that differ, no
        queries or keys, rows whose last stride is not 1 (gqa's fewer kv heads stay flash), or a
        mask (after the causal pattern joins it) that is neither 2-d nor 4-d. The output's layout
        depends on it: the flash kernel lays it out like q, the math path row-major."""
        q, k, v = metas = ins[:3]
        mask_rank = len(ins[3].sizes) if len(ins) > 3 else None
        if self.causal and not self.is_causal_flag(q.sizes[-2] == k.sizes[-2]):
            mask_rank = max(mask_rank or 2, 2)
        return (
            mask_rank not in (None, 2, 4)
            or self.is_random()
            or any(len(m.sizes) != 4 or m.stride[-1] != 1 for m in metas)
            or not q.sizes[0] == k.sizes[0] == v.sizes[0]
            or not q.sizes[-1] == k.sizes[-1] == v.sizes[-1]
            or q.sizes[-2] == 0
            or k.sizes[-2] == 0
        )

    def _attn_mask(self, k):
        """``(q, mask) -> attn_mask``: what the kernel passes SDPA as ``attn_mask`` (a bool mask,
        True attends, or a float one added to the scores; None for none)."""
        torch = k.torch
        t_q, t_k = k.ins[0].sizes[-2], k.ins[1].sizes[-2]
        window = k.value(self.window) if self.window is not None else None
        top_left = self.align == "top-left"
        pattern = self.causal and not self.is_causal_flag(t_q == t_k)
        as_bool = self.mask is not None and k.ins[3].dtype in ("bool", "int32", "int64")
        keep = self.polarity == "keep"

        def attn_mask(q, mask):
            if mask is not None and as_bool:
                mask = mask.bool() if keep else ~mask.bool()  # SDPA's bool mask: True attends
            if pattern:  # built per call: workspace the memory estimate counts, no constant outliving the run
                hidden = causal_hidden(torch, t_q, t_k, window, top_left, q.device)
                if mask is None:
                    mask = ~hidden
                elif as_bool:
                    mask = mask & ~hidden
                else:
                    mask = torch.where(hidden, -math.inf, mask)  # broadcasts, as masked_fill would not
            return mask

        return attn_mask

    def kernel(self, k):
        F, attn_mask = k.F, self._attn_mask(k)
        plain = self.is_causal_flag(k.ins[0].sizes[-2] == k.ins[1].sizes[-2])
        scale = self.scale if self.scale is None else float(self.scale)
        p = self.dropout if (self.training if k.training is None else k.training) else 0.0
        gqa = self.gqa

        def sdpa(q, k, v, mask=None):
            mask = attn_mask(q, mask)
            return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=p, is_causal=plain, scale=scale, enable_gqa=gqa)

        return sdpa

    def fused_weights(self, k):
        """SDPA's reference semantics (its documented math path): the scores of q and the keys
        (each kv head repeated for its query heads with gqa), scaled, masked, softmaxed."""
        torch, attn_mask = k.torch, self._attn_mask(k)
        t_q, t_k = k.ins[0].sizes[-2], k.ins[1].sizes[-2]
        plain = self.is_causal_flag(t_q == t_k)  # torch's is_causal: top-left
        scale = self.scale

        def weights(q, key, v, mask=None):
            if self.gqa:
                key = key.repeat_interleave(q.shape[-3] // key.shape[-3], -3)
            scores = q @ key.transpose(-2, -1) * (1 / math.sqrt(q.shape[-1]) if scale is None else scale)
            mask = attn_mask(q, mask)
            if plain:
                mask = torch.ones(t_q, t_k, dtype=torch.bool, device=q.device).tril()
            if mask is not None:
                scores = scores.masked_fill(~mask, -math.inf) if mask.dtype == torch.bool else scores + mask
            return torch.softmax(scores, dim=-1)

        return weights

    def emit(self, e):
        q, k = e.ins[0], e.ins[1]
        t_q, t_k = q.shape[-2], k.shape[-2]
        top_left = self.align == "top-left"
        plain = self.is_causal_flag(t_q.same_symbol(t_k))
        lines, mask = [], None
        if self.mask is not None:
            mask = e.args[3]
            if e.ins[3].dtype in ("bool", "int32", "int64"):  # SDPA's bool mask: True attends
                mask = f"{mask}.bool()" if self.polarity == "keep" else f"~{mask}.bool()"
        if self.causal and not plain:
            hidden = e.local("hidden")
            lines.append(f"{hidden} = {causal_source(e, e.args[0], t_q, t_k, self.window, top_left)}")
            if mask is None:
                mask = f"~{hidden}"
            elif e.ins[3].dtype in ("bool", "int32", "int64"):
                mask = f"{mask} & ~{hidden}"
            else:
                mask = f"torch.where({hidden}, -math.inf, {mask})"
        options = [f"attn_mask={mask}"] if mask is not None else []
        options += [f"dropout_p={py_float(self.dropout)} if {e.training} else 0.0"] if self.dropout > 0 else []
        options += ["is_causal=True"] if plain else []
        options += [f"scale={py_float(self.scale)}"] if self.scale is not None else []
        options += ["enable_gqa=True"] if self.gqa else []
        call = f"F.scaled_dot_product_attention({', '.join(e.args[:3] + options)})"
        return lines + [f"{e.targets[0]} = {call}"] if lines else call
