"""Projections: token embedding and linear layers."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from ..core.fields import TensorId
from ..core.layout import fresh
from .contract import Projection, StepBase, register
from .rules import StepError, require_float, show


@register
class Embed(StepBase):
    """Look up rows of an embedding table: ids (…) → (…, D), like ``nn.Embedding``."""

    op: Literal["embed"] = "embed"
    weight: TensorId = Field(description="the (V, D) table, a param")
    param_fields = ("weight",)
    looks_up = True
    example = """\
- id: embedded_sentence
  op: embed
  input: sentence_int      # (T,) int64 token ids
  weight: embedding        # (V, d) param, init: embedding"""

    def infer(self, ins, ctx):
        ids, table = ins
        if ids.dtype not in ("int64", "int32"):
            raise StepError(
                "dtype",
                f"embed needs integer token ids, '{ctx.input_ids[0]}' is {ids.dtype}",
                "input",
                hint=f"declare '{ctx.input_ids[0]}' with dtype: int64, or build it from tokens:",
            )
        if len(table.shape) != 2:
            raise StepError("shape", f"the embedding table '{self.weight}' must be 2-d (V, D), got {show(table)}", "weight")
        return fresh(ids.shape + (table.shape[1],), table.dtype)

    def kernel(self, k):
        embedding, rows, error, weight = k.F.embedding, k.ins[1].sizes[0], k.error, self.weight

        def embed(ids, table):  # torch would raise a bare IndexError for an id outside the table
            if ids.numel() and ids.device.type != "meta":
                low, high = int(ids.min()), int(ids.max())
                if low < 0 or high >= rows:
                    raise error(
                        "embed-range",
                        f"token id {low if low < 0 else high} is outside the table '{weight}' ({rows} rows: ids 0..{rows - 1})",
                        "input",
                    )
            return embedding(ids, table)

        return embed

    def emit(self, e):
        return f"F.embedding({e.args[0]}, {e.args[1]})"


@register
class Linear(StepBase):
    """``x @ W.T + b`` (``layout: out_in``, as nn.Linear stores W) or ``x @ W + b`` (``in_out``)."""

    op: Literal["linear"] = "linear"
    weight: TensorId = Field(description="the weight param")
    bias: TensorId | None = Field(None, description="optional (out,) bias param")
    layout: Literal["out_in", "in_out"] = Field(
        "out_in", description="out_in: W is (out, in) like nn.Linear; in_out: W is (in, out), computing x @ W"
    )
    param_fields = ("weight", "bias")
    example = """\
- id: q
  op: linear
  input: x                 # (B, T, d_model)
  weight: W_q              # (d_model, d_model) as nn.Linear stores it
  bias: b_q                # optional"""

    def args(self):
        return [] if self.layout == "out_in" else ["x @ W"]

    def projection(self):
        return Projection(self.weight, self.bias, self.layout == "in_out")

    def infer(self, ins, ctx):
        x, w = ins[0], ins[1]
        require_float(x, ctx.input_ids[0], "linear")
        if len(w.shape) != 2:
            raise StepError("shape", f"weight '{self.weight}' must be 2-d, got {show(w)}", "weight")
        for name, p, field in ((self.weight, w, "weight"), (self.bias, ins[2] if len(ins) > 2 else None, "bias")):
            if p is not None and p.dtype != x.dtype:  # torch refuses mixed dtypes here rather than promoting
                raise StepError("dtype", f"linear of {x.dtype} '{ctx.input_ids[0]}' with {p.dtype} '{name}'", field)
        d_in, d_out = (w.shape[1], w.shape[0]) if self.layout == "out_in" else (w.shape[0], w.shape[1])
        if not x.shape or x.shape[-1].value != d_in.value:
            form = "(out, in)" if self.layout == "out_in" else "(in, out)"
            raise StepError(
                "linear-width",
                f"weight '{self.weight}' {show(w)} read as {form} expects inputs (…, {d_in}), got '{ctx.input_ids[0]}' {show(x)}",
                "weight",
                hint=None
                if self.layout == "in_out" or not x.shape or x.shape[-1].value != d_out.value
                else "the weight looks (in, out): set layout: in_out?",
            )
        ctx.warn_if_different(
            x.shape[-1],
            d_in,
            f"linear feeds '{ctx.input_ids[0]}' (…, {x.shape[-1]}) into weight '{self.weight}' expecting (…, {d_in})",
            "weight",
        )
        if len(ins) > 2:
            b = ins[2]
            if [d.value for d in b.shape] != [d_out.value]:
                raise StepError("linear-width", f"bias '{self.bias}' must be ({d_out}) [{d_out.value}], got {show(b)}", "bias")
        return fresh(x.shape[:-1] + (d_out,), x.dtype)

    def kernel(self, k):
        if self.layout == "out_in":
            return k.F.linear  # (x, w[, b]): torch's builtin itself, no Python frame per call
        matmul = k.torch.matmul
        return lambda x, w, b=None: matmul(x, w) if b is None else matmul(x, w) + b

    def emit(self, e):
        x, w = e.args[:2]
        bias = e.args[2] if self.bias is not None else None
        if self.layout == "out_in":
            return f"F.linear({x}, {w})" if bias is None else f"F.linear({x}, {w}, {bias})"
        return f"{x} @ {w}" if bias is None else f"{x} @ {w} + {bias}"
