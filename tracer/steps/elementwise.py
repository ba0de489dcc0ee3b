"""Elementwise steps and normalisation: add (residuals), layernorm, relu, gelu."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, StrictBool

from ..core.fields import TensorId
from ..core.layout import fresh, same_layout
from ..core.pysource import py_float
from .contract import StepBase, register
from .operands import _Arithmetic
from .rules import StepError, require_float, show, trailing_weight


@register
class Add(_Arithmetic):
    """``a + b`` with broadcasting and torch's type promotion (residual connections, biases,
    additive attention masks), or ``x + value``: a number or a dim expression (``x + 1``)."""

    op: Literal["add"] = "add"
    symbol = "+"
    torch_name = "add"
    passes_scores = True  # scores + an additive mask or position bias (BERT, T5, ALiBi) are still scores
    sums_inputs = True
    example = """\
- id: residual_1
  op: add
  inputs: [x_in, mha_out]  # (B, T, d) + (B, T, d)"""


@register
class LayerNorm(StepBase):
    """``F.layer_norm`` over the last dim, with optional weight and bias params (nn.LayerNorm).

    A weight (and bias) of shape (H, D) on a (B, T, H, D) tensor is one per head (Cohere's
    ``CohereLayerNorm((num_heads, head_dim))`` on its queries and keys): the rows are normalised
    over D, then multiplied by the weight and shifted by the bias, broadcast over (B, T).

    ``unit_offset: true`` scales by ``1 + weight`` (Nemotron's ``LayerNorm1P``: ``F.layer_norm(x,
    shape, self.weight + 1, self.bias, eps)``), the weight stored as an offset from one."""

    op: Literal["layernorm"] = "layernorm"
    normalises_rows = True
    weight: TensorId | None = Field(None, description="(D,) scale param, or (H, D) per head (default: ones, as nn.LayerNorm starts)")
    bias: TensorId | None = Field(None, description="shift param of the weight's shape (default: zeros)")
    eps: float = Field(1e-5, gt=0)
    unit_offset: StrictBool = Field(False, description="scale by (weight + 1), as Nemotron's LayerNorm1P does")
    param_fields = ("weight", "bias")
    example = """\
- id: normed_1
  op: layernorm
  input: residual_1        # (B, T, d), normalised over d"""

    def args(self):
        return ["1+w"] if self.unit_offset else []

    def infer(self, ins, ctx):
        x = ins[0]
        require_float(x, ctx.input_ids[0], "layernorm")
        if not x.shape:
            raise StepError("shape", "layernorm needs at least one dim", "input")
        if self.unit_offset and self.weight is None:
            raise StepError("layernorm-weight", "unit_offset scales by (weight + 1): give a weight", "unit_offset")
        params = ins[1:]
        for name, field, p in zip(self.param_refs(), [f for f in self.param_fields if getattr(self, f)], params):
            trailing_weight(p, x, name, field)
            if p.sizes != params[0].sizes:
                raise StepError("shape", f"'{name}' {show(p)} must have the shape of '{self.param_refs()[0]}' {show(params[0])}", field)
            if p.dtype != x.dtype:
                raise StepError("dtype", f"layernorm of {x.dtype} '{ctx.input_ids[0]}' with {p.dtype} '{name}'", "weight")
        return fresh(x.shape, x.dtype)

    def per_head(self, ins) -> bool:
        """Its params cover more than the last dim: F.layer_norm takes only (D,) ones, so they apply after it."""
        return len(ins) > 1 and len(ins[1].shape) > 1

    def kernel(self, k):
        layer_norm, eps = k.F.layer_norm, self.eps
        last = (k.ins[0].sizes[-1],)
        has_weight, has_bias, per_head = self.weight is not None, self.bias is not None, self.per_head(k.ins)
        offset = self.unit_offset

        def norm(x, *params):
            params = list(params)
            weight = params.pop(0) if has_weight else None
            weight = weight + 1 if offset else weight
            bias = params.pop(0) if has_bias else None
            if not per_head:
                return layer_norm(x, last, weight, bias, eps)
            y = layer_norm(x, last, None, None, eps)
            y = y * weight if weight is not None else y
            return y + bias if bias is not None else y

        return norm

    def emit(self, e):
        x, eps = e.args[0], py_float(self.eps)
        weight = e.args[1] if self.weight is not None else None
        weight = f"({weight} + 1)" if self.unit_offset else weight
        bias = e.args[-1] if self.bias is not None else None
        last = f"({e.size(e.ins[0].shape[-1])},)"
        if not self.per_head(e.ins):
            return f"F.layer_norm({x}, {last}, {weight or 'None'}, {bias or 'None'}, eps={eps})"
        return f"F.layer_norm({x}, {last}, eps={eps})" + (f" * {weight}" if weight else "") + (f" + {bias}" if bias else "")


@register
class Relu(StepBase):
    """``torch.relu(x)``."""

    op: Literal["relu"] = "relu"
    elementwise = True
    example = """\
- id: hidden_act
  op: relu
  input: hidden"""

    def infer(self, ins, ctx):
        return same_layout(ins[0])

    def kernel(self, k):
        return k.torch.relu

    def emit(self, e):
        return f"torch.relu({e.args[0]})"


@register
class Gelu(StepBase):
    """``F.gelu(x)`` (exact, or ``approximate: tanh`` as GPT-2 uses)."""

    op: Literal["gelu"] = "gelu"
    elementwise = True
    approximate: Literal["none", "tanh"] = "none"
    example = """\
- id: hidden_act
  op: gelu
  input: hidden
  approximate: tanh"""

    def args(self):
        return [] if self.approximate == "none" else ["tanh"]

    def infer(self, ins, ctx):
        require_float(ins[0], ctx.input_ids[0], "gelu")
        return same_layout(ins[0])

    def kernel(self, k):
        gelu, approximate = k.F.gelu, self.approximate
        return lambda x: gelu(x, approximate=approximate)

    def emit(self, e):
        return f"F.gelu({e.args[0]})" if self.approximate == "none" else f'F.gelu({e.args[0]}, approximate="tanh")'
