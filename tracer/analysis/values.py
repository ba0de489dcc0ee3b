"""Values known before running: the tensors a pipeline computes from dims alone (arange, compare,
logical, …, the kinds whose ``static`` says what they compute), folded as plain Python numbers
(``tracer.core.static``). Lints read a hand-built mask or position bias through them."""

from __future__ import annotations

from ..core.static import Static

MAX_DEPTH = 48  # steps followed back from a tensor


def static_value(analysis, tensor_id: str, memo: dict | None = None, depth: int = 0) -> Static | None:
    """The value of ``tensor_id`` when every step it comes from is known before running, else None."""
    memo = {} if memo is None else memo
    if tensor_id in memo:
        return memo[tensor_id]
    memo[tensor_id] = None  # a cycle cannot happen in a graph, but a bound on the walk can
    node = analysis.producer(tensor_id)
    if node is None or depth > MAX_DEPTH or len(node.outs) != 1 or 0 in node.outs[0].meta.sizes:
        return None  # an empty tensor holds no pattern to read
    ins = [static_value(analysis, name, memo, depth + 1) for name in node.inputs]
    if any(value is None for value in ins):
        return None
    try:
        value = node.step.static(ins, tuple(node.outs[0].meta.sizes), lambda text, node=node: node.dims.dim(text).value)
    except (OverflowError, ValueError, TypeError):
        value = None  # too large to fold, or a value Python's arithmetic refuses
    memo[tensor_id] = value
    return value
