"""Elementwise arithmetic and activations: mul, sub, div with broadcasting, of two tensors or of a
tensor and a number (``value``: a dim expression too); silu, sigmoid, tanh, exp, neg; cast. Result
dtypes follow torch's type promotion and result strides follow TensorIterator
(``_rules.pointwise``), so the static trace equals torch's."""

from __future__ import annotations

import math
import operator
from typing import ClassVar, Literal

from pydantic import Field

from ..core.layout import pointwise, preserve_format
from ..core.static import unary
from .contract import StepBase, register
from .operands import _Arithmetic
from .rules import StepError, require_float

_PYTHON = {"mul": operator.mul, "sub": operator.sub, "div": operator.truediv, "minimum": min, "maximum": max}
_CASTS = {"bool": bool, "int64": int, "int32": int}  # any other dtype is a float

DType = Literal["float32", "float64", "float16", "bfloat16", "int64", "int32", "bool"]


@register
class Mul(_Arithmetic):
    """``a * b`` with broadcasting: gates (SwiGLU's ``act(gate) * up``), RoPE's ``x * cos``, masks as numbers."""

    op: Literal["mul"] = "mul"
    symbol = "*"
    torch_name = "mul"
    multiplies = True
    example = """\
- id: gated
  op: mul
  inputs: [gate_act, up]   # (B, T, d_ff) * (B, T, d_ff)"""


@register
class Sub(_Arithmetic):
    """``a - b`` with broadcasting, or with a number on either side (BERT's ``1.0 - mask``)."""

    op: Literal["sub"] = "sub"
    symbol = "-"
    torch_name = "sub"
    example = """\
- id: inverted
  op: sub
  input: pad_mask          # (B, 1, 1, T)
  value: 1.0
  value_first: true        # 1.0 - pad_mask: 1 where a key is padding"""


@register
class Div(_Arithmetic):
    """``a / b`` with broadcasting: true division (integers divide to float32, as in torch)."""

    op: Literal["div"] = "div"
    symbol = "/"
    torch_name = "div"
    example = """\
- id: normalised
  op: div
  inputs: [x, norm]        # (B, T, D) / (B, T, 1)"""

    def result_dtype(self, dtype):
        return "float32" if dtype in ("bool", "int32", "int64") else dtype


class _Unary(StepBase):
    """``torch.FN(x)``: one float tensor in, the same shape out."""

    elementwise = True
    torch_name: ClassVar[str] = ""

    def infer(self, ins, ctx):
        x = ins[0]
        require_float(x, ctx.input_ids[0], self.op)
        return pointwise([x], x.shape, x.dtype)

    def kernel(self, k):
        return getattr(k.torch, self.torch_name)

    def emit(self, e):
        return f"torch.{self.torch_name}({e.args[0]})"


@register
class Silu(_Unary):
    """``F.silu(x) = x * sigmoid(x)``: the activation of Llama's and Mistral's gated MLP."""

    op: Literal["silu"] = "silu"
    example = """\
- id: gate_act
  op: silu
  input: gate              # (B, T, d_ff)"""

    def kernel(self, k):
        return k.F.silu

    def emit(self, e):
        return f"F.silu({e.args[0]})"


@register
class Sigmoid(_Unary):
    """``torch.sigmoid(x)``."""

    op: Literal["sigmoid"] = "sigmoid"
    torch_name = "sigmoid"
    example = """\
- id: gate_p
  op: sigmoid
  input: gate"""


@register
class Tanh(_Unary):
    """``torch.tanh(x)`` (also Gemma 2's logit soft-capping: ``tanh(s / c) * c``)."""

    op: Literal["tanh"] = "tanh"
    torch_name = "tanh"
    example = """\
- id: capped
  op: tanh
  input: scores_over_cap"""


@register
class Exp(_Unary):
    """``torch.exp(x)``."""

    op: Literal["exp"] = "exp"
    torch_name = "exp"
    example = """\
- id: e
  op: exp
  input: scores"""

    def static(self, ins, sizes, value):
        return unary(ins[0], math.exp)


@register
class Neg(StepBase):
    """``-x`` (any dtype but bool, which torch refuses)."""

    op: Literal["neg"] = "neg"
    elementwise = True
    example = """\
- id: minus_x2
  op: neg
  input: x2"""

    def infer(self, ins, ctx):
        x = ins[0]
        if x.dtype == "bool":
            raise StepError(
                "dtype",
                f"torch refuses to negate bool tensor '{ctx.input_ids[0]}'",
                "input",
                "use op: sub from a ones tensor, or cast first",
            )
        return pointwise([x], x.shape, x.dtype)

    def kernel(self, k):
        return k.torch.neg

    def static(self, ins, sizes, value):
        return unary(ins[0], operator.neg)

    def emit(self, e):
        return f"-{e.args[0]}"


@register
class Cast(StepBase):
    """``x.to(dtype)``: a copy in the new dtype laid out like ``x``; ``x`` itself when it already has it."""

    op: Literal["cast"] = "cast"
    keeps_values = True
    passes_scores = True  # scores upcast to float32 for the softmax (transformers' eager attention) are still scores
    dtype: DType = Field(description="the dtype to convert to")
    elementwise = True
    example = """\
- id: mask_f
  op: cast
  input: pad_mask          # bool or int64 (B, 1, 1, T)
  dtype: float32"""

    def args(self):
        return [self.dtype]

    def infer(self, ins, ctx):
        x = ins[0]
        return x if x.dtype == self.dtype else preserve_format(x, dtype=self.dtype)

    def kernel(self, k):
        dtype = getattr(k.torch, self.dtype)
        return lambda x: x.to(dtype)

    def static(self, ins, sizes, value):
        return unary(ins[0], _CASTS.get(self.dtype, float))

    def emit(self, e):
        return f"{e.args[0]}.to(torch.{self.dtype})"
