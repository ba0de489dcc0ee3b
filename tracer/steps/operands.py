"""Binary arithmetic, and a number written where a tensor could be: ``2``, ``0.5``, a dim expression (``T - W``,
``2 * W - 1``), ``{sqrt: Dh}`` or ``{rsqrt: Dh}``. Binary arithmetic, comparisons and ``scale``
take one, so that ``x - 1`` or ``scores * head_dim ** -0.5`` is one step, as in the module.

``{rsqrt: Dh}`` is Python's ``Dh ** -0.5`` (transformers' ``self.scaling = head_dim ** -0.5``),
which rounds differently from ``1 / math.sqrt(Dh)``: a run multiplies by exactly that double."""

from __future__ import annotations

import math
import operator
from collections.abc import Callable
from typing import Annotated, ClassVar

from pydantic import AfterValidator, Field, StrictBool, StrictFloat, StrictInt, model_validator

from ..core.dtypes import promote, promote_number
from ..core.fields import DimText, Strict, _valid_dim
from ..core.layout import fresh, pointwise
from ..core.pysource import py_float
from ..core.static import binary, unary
from .contract import StepBase
from .rules import StepError, broadcast


class Sqrt(Strict):
    sqrt: DimText = Field(description="a dim expression, e.g. Dh: the number is math.sqrt(Dh)")


class Rsqrt(Strict):
    rsqrt: DimText = Field(description="a dim expression, e.g. Dh: the number is Dh ** -0.5, as Python computes it")


DimExpression = Annotated[str, AfterValidator(_valid_dim), Field(description="a dim expression such as 'T - W' (an int)")]
Operand = StrictInt | StrictFloat | Sqrt | Rsqrt | DimExpression
OPERAND_DESCRIPTION = "a number, a dim expression ('T - W'), {sqrt: DIM} or {rsqrt: DIM} (DIM ** -0.5)"


def operand_value(operand: Operand, value: Callable[[int | str], int]) -> int | float:
    """The Python number ``operand`` stands for; ``value`` evaluates a dim expression."""
    if isinstance(operand, Sqrt):
        return math.sqrt(value(operand.sqrt))
    if isinstance(operand, Rsqrt):
        return value(operand.rsqrt) ** -0.5
    if isinstance(operand, str):
        return value(operand)
    return operand


def operand_kind(operand: Operand) -> int | float:
    """A number of the operand's Python type (what decides torch's type promotion): dims are ints."""
    return operand if isinstance(operand, int | float) else 0.0 if isinstance(operand, Sqrt | Rsqrt) else 0


def operand_text(operand: Operand) -> str:
    """How a diagram or table shows it: ``√Dh``, ``Dh^-½``, ``T - W``, ``0.5``."""
    if isinstance(operand, Sqrt):
        return f"√{operand.sqrt}"
    if isinstance(operand, Rsqrt):
        return f"{operand.rsqrt}^-½"
    return operand if isinstance(operand, str) else f"{operand:g}" if isinstance(operand, float) else str(operand)


def operand_source(operand: Operand, dim: Callable[[int | str], str]) -> str:
    """The operand as Python source computing the same number; ``dim`` writes a dim expression."""
    if isinstance(operand, Sqrt):
        return f"math.sqrt({dim(operand.sqrt)})"
    if isinstance(operand, Rsqrt):
        return f"({dim(operand.rsqrt)}) ** -0.5"
    if isinstance(operand, str):
        return f"({dim(operand)})"
    return repr(operand) if isinstance(operand, int) else py_float(operand)


class _Binary(StepBase):
    """``a OP b`` with numpy/torch broadcasting and torch's type promotion."""

    arity = 2
    elementwise = True
    symbol: ClassVar[str] = ""
    torch_name: ClassVar[str] = ""

    def result_dtype(self, dtype: str) -> str:
        return dtype

    def infer(self, ins, ctx):
        a, b = ins
        names = ctx.input_ids
        shape = broadcast(a, b, f"{self.op} '{names[0]}' {self.symbol} '{names[1]}'", "inputs", ctx)
        self.refuse(ins, names)
        return pointwise([a, b], shape, self.result_dtype(promote([a, b])))

    def refuse(self, ins, names) -> None:
        """torch's refusals of a dtype: none, but for sub of a bool tensor (whatever the other operand)."""
        bools = [name for meta, name in zip(ins, names) if meta.dtype == "bool"]
        if bools and self.op == "sub":
            raise StepError(
                "dtype", f"torch refuses to subtract with bool tensor '{bools[0]}'", "inputs", "cast it to int64 or float32 first"
            )

    def kernel(self, k):
        return getattr(k.torch, self.torch_name)

    def static(self, ins, sizes, value):
        fn = _PYTHON.get(self.torch_name)
        try:
            return None if fn is None else binary(ins[0], ins[1], fn)
        except ZeroDivisionError:
            return None

    def emit(self, e):
        if self.symbol.isidentifier():  # minimum, maximum: a function, not an operator
            return f"torch.{self.torch_name}({e.args[0]}, {e.args[1]})"
        return f"{e.args[0]} {self.symbol} {e.args[1]}"


OPERATORS = {"+": operator.add, "-": operator.sub, "*": operator.mul, "/": operator.truediv}
_PYTHON = {"add": operator.add, "mul": operator.mul, "sub": operator.sub, "div": operator.truediv, "minimum": min, "maximum": max}


class _Arithmetic(_Binary):
    """``a OP b`` of two tensors, or of a tensor and a number (``value``: ``x - 1``, ``T - W``,
    ``{rsqrt: Dh}``); ``value_first`` puts the number on the left (``1 - mask``). A number
    promotes as torch's Python scalars do: a float makes an integer tensor float32."""

    arity: ClassVar[int | None] = None
    value: Operand | None = Field(None, description=f"the second operand as a number instead of a tensor: {OPERAND_DESCRIPTION}")
    value_first: StrictBool = Field(False, description="the number is the left operand: value OP input (1 - mask)")

    @model_validator(mode="after")
    def _value_for_first(self):
        if self.value_first and self.value is None:
            raise ValueError("'value_first' needs a 'value'")
        return self

    def args(self):
        if self.value is None:
            return []
        number = operand_text(self.value)
        return [f"{number} {self.symbol} x" if self.value_first else f"x {self.symbol} {number}"]

    def infer(self, ins, ctx):
        wanted = 2 if self.value is None else 1
        if len(ins) != wanted:
            given = "two tensors (or one and 'value')" if self.value is None else "one tensor and 'value'"
            raise StepError("arity", f"{self.op} takes {given}, got {len(ins)} input{'s' if len(ins) != 1 else ''}", "inputs")
        if self.value is None:
            return super().infer(ins, ctx)
        operand_value(self.value, lambda text: ctx.dim(text, "value").value)  # a bad dim expression is located here
        dtype = promote_number(ins[0].dtype, operand_kind(self.value))
        self.refuse(ins, ctx.input_ids)
        # a Python number is a 0-d operand to TensorIterator: strides follow the tensor's order, size-1 dims too
        return pointwise([ins[0], fresh((), dtype)], ins[0].shape, self.result_dtype(dtype))

    def kernel(self, k):
        if self.value is None:
            return super().kernel(k)
        fn, number = OPERATORS[self.symbol], operand_value(self.value, k.value)
        return (lambda x: fn(number, x)) if self.value_first else (lambda x: fn(x, number))

    def static(self, ins, sizes, value):
        if self.value is None:
            return super().static(ins, sizes, value)
        fn, number = OPERATORS[self.symbol], operand_value(self.value, value)
        try:
            return unary(ins[0], (lambda x: fn(number, x)) if self.value_first else (lambda x: fn(x, number)))
        except ZeroDivisionError:
            return None

    def emit(self, e):
        if self.value is None:
            return super().emit(e)
        number = operand_source(self.value, e.dim)
        return f"{number} {self.symbol} {e.args[0]}" if self.value_first else f"{e.args[0]} {self.symbol} {number}"
