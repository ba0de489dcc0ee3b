"""Python source text for generated code (``emit``, exported modules): numbers that read back bit
for bit, tuples, operands."""

from __future__ import annotations


def py_float(value: float) -> str:
    """A float as Python source that reads back bit for bit: ``0.2``, ``-1000000000.0``, ``-math.inf``."""
    value = float(value)
    if value != value:
        return "math.nan"
    if value in (float("inf"), float("-inf")):
        return "math.inf" if value > 0 else "-math.inf"
    return repr(value)


def py_tuple(items: list[str]) -> str:
    """``(a, b)``, and ``(a,)`` for one item."""
    return "(" + ", ".join(items) + ("," if len(items) == 1 else "") + ")"


def atom(text: str) -> str:
    """Source text safe as an operand: a name or an int as is, anything else in parentheses."""
    return text if text.isidentifier() or text.lstrip("-").isdigit() else f"({text})"
