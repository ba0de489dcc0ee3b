"""RMSNorm as Llama, Mistral, Qwen (and, with ``unit_offset``, Gemma) compute it."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, StrictBool

from ..core.dtypes import promote
from ..core.fields import TensorId
from ..core.layout import fresh, pointwise, preserve_format
from ..core.pysource import py_float
from .contract import ScaledNorm, StepBase, register
from .rules import StepError, require_float, trailing_weight


@register
class RMSNorm(StepBase):
    """Root-mean-square norm over the last dim, computed as transformers' ``LlamaRMSNorm``::

        h = x.to(float32)
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
        out = weight * h.to(x.dtype)

    ``unit_offset: true`` is Gemma's variant: ``(h * (1 + weight.float())).to(x.dtype)``.
    """

    op: Literal["rmsnorm"] = "rmsnorm"
    normalises_rows = True
    weight: TensorId | None = Field(None, description="(D,) scale param, or (H, D) per head on (B, T, H, D) (default: none, i.e. ones)")
    eps: float = Field(1e-6, gt=0, description="added to the mean square (LlamaRMSNorm's variance_epsilon; config.rms_norm_eps)")
    unit_offset: StrictBool = Field(False, description="scale by (1 + weight) in float32 before casting back, as GemmaRMSNorm does")
    param_fields = ("weight",)
    example = """\
- id: h_norm
  op: rmsnorm
  input: x                 # (B, T, d_model)
  weight: w_ln1            # (d_model,), init: ones
  eps: 1.0e-6"""

    def args(self):
        return [f"eps={self.eps:g}"] + (["1+w"] if self.unit_offset else [])

    def scaled_norm(self):
        return None if self.weight is None else ScaledNorm(self.weight, self.unit_offset)

    def infer(self, ins, ctx):
        x = ins[0]
        require_float(x, ctx.input_ids[0], "rmsnorm")
        if not x.shape:
            raise StepError("shape", "rmsnorm needs at least one dim", "input")
        if self.unit_offset and self.weight is None:
            raise StepError("rmsnorm-weight", "unit_offset scales by (1 + weight): give a weight", "unit_offset")
        # x.to(float32) is x itself for float32; the mean is a fresh (…, 1) tensor
        h = x if x.dtype == "float32" else preserve_format(x, dtype="float32")
        mean = fresh(x.shape[:-1] + (ctx.alg.const(1),), "float32")
        normed = pointwise([h, mean], x.shape, "float32")
        if self.weight is None:
            return normed if x.dtype == "float32" else preserve_format(normed, dtype=x.dtype)
        w = ins[1]
        trailing_weight(w, x, self.weight, "weight")
        if self.unit_offset:
            scale = pointwise([w], w.shape, "float32")
            scaled = pointwise([normed, scale], x.shape, "float32")
            return scaled if x.dtype == "float32" else preserve_format(scaled, dtype=x.dtype)
        back = normed if x.dtype == "float32" else preserve_format(normed, dtype=x.dtype)
        return pointwise([w, back], x.shape, promote([w, back]))

    def kernel(self, k):
        torch, eps, has_weight, unit_offset = k.torch, self.eps, self.weight is not None, self.unit_offset

        def rmsnorm(x, weight=None):
            h = x.to(torch.float32)
            h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
            if not has_weight:
                return h.to(x.dtype)
            if unit_offset:
                return (h * (1.0 + weight.float())).to(x.dtype)
            return weight * h.to(x.dtype)

        return rmsnorm

    def emit(self, e):
        x, h = e.args[0], e.local("h")
        lines = [
            f"{h} = {x}.to(torch.float32)",
            f"{h} = {h} * torch.rsqrt({h}.pow(2).mean(-1, keepdim=True) + {py_float(self.eps)})",
        ]
        if self.weight is None:
            return lines + [f"{e.targets[0]} = {h}.to({x}.dtype)"]
        if self.unit_offset:
            return lines + [f"{e.targets[0]} = ({h} * (1.0 + {e.args[1]}.float())).to({x}.dtype)"]
        return lines + [f"{e.targets[0]} = {e.args[1]} * {h}.to({x}.dtype)"]
