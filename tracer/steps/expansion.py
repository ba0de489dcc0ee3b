"""Sharing key/value heads among query heads: ``repeat_interleave`` (a copy) and ``expand`` (a view).

transformers' ``repeat_kv`` is ``x[:, :, None].expand(B, H_kv, n_rep, T, Dh).reshape(B, H, T, Dh)``,
which equals ``repeat_interleave(x, n_rep, dim=1)``: each kv head is used by ``n_rep`` consecutive
query heads. ``repeat`` would tile them instead (lint ``gqa-head-order``).
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, StrictInt

from ..core.fields import DimText
from ..core.layout import fresh, view
from .contract import StepBase, register
from .rules import StepError, norm_dim, py_shape, show


@register
class RepeatInterleave(StepBase):
    """``torch.repeat_interleave(x, repeats, dim)``: each entry along ``dim`` repeated in place (a copy)."""

    op: Literal["repeat_interleave"] = "repeat_interleave"
    keeps_values = True
    repeats: DimText = Field(description="how many times each entry repeats, e.g. n_rep = H // H_kv")
    dim: StrictInt = Field(description="the dim to repeat along, e.g. 1 for the heads of (B, H_kv, T, Dh)")
    copies_data = True
    example = """\
- id: k_rep
  op: repeat_interleave
  input: k_rot             # (B, H_kv, T, Dh)
  repeats: n_rep           # H // H_kv
  dim: 1                   # -> (B, H, T, Dh): kv head h serves query heads h*n_rep .. h*n_rep+n_rep-1"""

    def args(self):
        return [f"{self.repeats}", f"dim={self.dim}"]

    def infer(self, ins, ctx):
        x = ins[0]
        d = norm_dim(self.dim, len(x.shape))
        reps = ctx.dim(self.repeats, "repeats")
        if reps.value < 0:
            raise StepError("repeat-dims", f"repeats {reps}={reps.value} must not be negative", "repeats")
        size = x.shape[d] if reps.value == 1 else ctx.alg.mul(x.shape[d], reps)
        return fresh(x.shape[:d] + (size,) + x.shape[d + 1 :], x.dtype)

    def kernel(self, k):
        repeat_interleave, reps, d = k.torch.repeat_interleave, k.value(self.repeats), self.dim
        return lambda x: repeat_interleave(x, reps, dim=d)

    def emit(self, e):
        return f"torch.repeat_interleave({e.args[0]}, {e.dim(self.repeats)}, dim={self.dim})"


@register
class Expand(StepBase):
    """``x.expand(*shape)``: size-1 dims (and new leading dims) broadcast to ``shape`` without copying
    (stride 0); ``-1`` keeps a dim's size."""

    op: Literal["expand"] = "expand"
    keeps_values = True
    shape: list[DimText] = Field(max_length=16, description="target shape; -1 keeps the input's size")
    example = """\
- id: k_exp
  op: expand
  input: k_5d              # (B, H_kv, 1, T, Dh)
  shape: [-1, -1, n_rep, -1, -1]   # -> (B, H_kv, n_rep, T, Dh), a view with stride 0"""

    def args(self):
        return ["(" + ", ".join(str(s) for s in self.shape) + ")"]

    def infer(self, ins, ctx):
        x = ins[0]
        new = len(self.shape) - len(x.shape)
        if new < 0:
            raise StepError("expand-shape", f"expand to {len(self.shape)} dims cannot drop dims of {show(x)}", "shape")
        shape, stride = [], []
        for i, text in enumerate(self.shape):
            old = x.shape[i - new] if i >= new else None
            if text == -1:
                if old is None:
                    raise StepError("expand-shape", f"-1 at position {i} names a new leading dim, which needs a size", "shape")
                shape.append(old)
                stride.append(x.stride[i - new])
                continue
            target = ctx.dim(text, "shape")
            if old is not None and old.value == target.value:
                shape.append(target)
                stride.append(x.stride[i - new])
            elif old is None or old.value == 1:
                shape.append(target)
                stride.append(0)
            else:
                raise StepError(
                    "expand-shape",
                    f"expand cannot turn dim {i - new} of '{ctx.input_ids[0]}' {show(x)} ({old}={old.value}) into {target}={target.value}: "
                    "only size-1 dims expand",
                    "shape",
                    "insert a size-1 dim first (op: unsqueeze), or use repeat_interleave to copy",
                )
        for i in reversed(range(new)):  # a new leading dim of size 1 gets the stride torch's inferExpandGeometry gives it
            if shape[i].value == 1:
                stride[i] = shape[i + 1].value * stride[i + 1] if i + 1 < len(shape) else 0
        return view(x, tuple(shape), tuple(stride))

    def kernel(self, k):
        sizes = k.out.sizes
        return lambda x: x.expand(sizes)

    def emit(self, e):
        return f"{e.args[0]}.expand({py_shape(e, self.shape)})"
