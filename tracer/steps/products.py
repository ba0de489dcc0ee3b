"""Matrix products: ``matmul`` (torch.matmul, with broadcasting) and ``bmm``."""

from __future__ import annotations

from typing import Literal

from ..core.layout import fresh
from .contract import StepBase, register
from .rules import Mismatch, StepError, broadcast_dims, show


def _batch(a, b, ctx):
    """Broadcast the batch dims (all but the last two) of a matmul's operands, keeping the first one's names."""
    shape = broadcast_dims(a.shape[:-2], b.shape[:-2])
    if isinstance(shape, Mismatch):
        da, db = shape
        first, second = ctx.input_ids
        raise StepError(
            "matmul-batch",
            f"matmul's batch dims (all but the last two) do not broadcast: '{first}' {show(a)} @ '{second}' {show(b)} "
            f"pairs {da}={da.value} with {db}={db.value}",
            "inputs",
            "bring both operands to the same dim order first (e.g. transpose the heads into place before taking kᵀ)",
        )
    return shape


@register
class Matmul(StepBase):
    """``a @ b`` with torch.matmul's rules: (…, n, k) @ (…, k, m) → (…, n, m); 1-d operands allowed."""

    op: Literal["matmul"] = "matmul"
    makes_scores = True
    arity = 2
    example = """\
- id: scores
  op: matmul
  inputs: [q, k_t]         # (B, H, T, Dh) @ (B, H, Dh, T) -> (B, H, T, T)"""

    def infer(self, ins, ctx):
        a, b = ins
        if not a.shape or not b.shape:
            raise StepError("matmul-shape", "matmul needs tensors with at least one dim", "inputs")
        if a.dtype != b.dtype:
            raise StepError("dtype", f"matmul of {a.dtype} and {b.dtype}", "inputs")
        ka = a.shape[-1]
        kb = b.shape[-2] if len(b.shape) > 1 else b.shape[0]
        if ka.value != kb.value:
            names = ctx.input_ids
            hint = None
            if len(b.shape) > 1 and b.shape[-1].value == ka.value:
                hint = f"transpose '{names[1]}' over dims -2, -1?"
            raise StepError(
                "matmul-shape",
                f"matmul needs (…, n, {ka}) @ (…, {ka}, m), got '{names[0]}' {show(a)} @ '{names[1]}' {show(b)}",
                "inputs",
                hint,
            )
        ctx.warn_if_different(ka, kb, f"matmul contracts '{ctx.input_ids[0]}' over {ka} with '{ctx.input_ids[1]}' over {kb}", "inputs")
        rows = a.shape[-2:-1] if len(a.shape) > 1 else ()
        cols = b.shape[-1:] if len(b.shape) > 1 else ()
        batch = _batch(a, b, ctx)
        return fresh(batch + rows + cols, a.dtype)

    def kernel(self, k):
        return k.torch.matmul

    def emit(self, e):
        return f"{e.args[0]} @ {e.args[1]}"


@register
class Bmm(StepBase):
    """Batched matrix product of two 3-d tensors: (N, n, k) @ (N, k, m) → (N, n, m)."""

    op: Literal["bmm"] = "bmm"
    makes_scores = True
    arity = 2
    example = """\
- id: multihead_keys
  op: bmm
  inputs: [multihead_W_key, stacked_inputs]   # (h, d_k, d) @ (h, d, T) -> (h, d_k, T)"""

    def infer(self, ins, ctx):
        a, b = ins
        if len(a.shape) != 3 or len(b.shape) != 3:
            raise StepError("bmm-shape", f"bmm needs two 3-d tensors, got {show(a)} and {show(b)}", "inputs")
        if a.dtype != b.dtype:
            raise StepError("dtype", f"bmm of {a.dtype} and {b.dtype}", "inputs")
        if a.shape[0].value != b.shape[0].value or a.shape[2].value != b.shape[1].value:
            raise StepError("bmm-shape", f"bmm needs (N, n, k) @ (N, k, m), got {show(a)} @ {show(b)}", "inputs")
        return fresh((a.shape[0], a.shape[1], b.shape[2]), a.dtype)

    def kernel(self, k):
        return k.torch.bmm

    def emit(self, e):
        return f"torch.bmm({e.args[0]}, {e.args[1]})"
