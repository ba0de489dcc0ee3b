"""Elementwise math, comparisons, selections, running sums, reductions and ranges: the integer and
boolean arithmetic that position schemes compute inside a model (T5's relative buckets, Llama 4's
attention temperature, documents from padding masks). Result dtypes follow torch's type
promotion, a Python number included (``clamp(int64, max=2.5)`` is float32, as in torch)."""

from __future__ import annotations

import math
import operator
from typing import ClassVar, Literal

from pydantic import Field, StrictBool, StrictFloat, StrictInt, model_validator

from ..core.dtypes import FLOAT_DTYPES, promote, promote_number
from ..core.fields import DimText
from ..core.layout import fresh, pointwise, view
from ..core.pysource import py_float
from ..core.static import Static, binary, unary
from ..core.symbolic import Dim
from .contract import StepBase, register
from .operands import OPERAND_DESCRIPTION, Operand, _Binary, operand_kind, operand_source, operand_text, operand_value
from .pointwise import DType
from .rules import StepError, broadcast, norm_dim, require_number_fits, show

Number = StrictInt | StrictFloat


def py_number(value: int | float) -> str:
    """A number as Python source that keeps its type: ``2`` stays an int, ``2.0`` a float."""
    return repr(value) if isinstance(value, int) else py_float(value)


# ---------------------------------------------------------------- one tensor in, same shape out


class _Math(StepBase):
    """``torch.FN(x)``, with torch's result dtype for integer and bool inputs."""

    elementwise = True
    torch_name: ClassVar[str] = ""
    integers: ClassVar[str] = "float32"  # what an int tensor becomes: "float32" or "same"
    booleans: ClassVar[str] = "float32"  # what a bool tensor becomes: "float32", "int64", "same" or "refused"

    def result_dtype(self, dtype: str, name: str) -> str:
        if dtype in FLOAT_DTYPES:
            return dtype
        if dtype == "bool":
            if self.booleans == "refused":
                raise StepError("dtype", f"torch has no {self.op} of bool tensor '{name}'", "input", "cast it to int64 or float32 first")
            return dtype if self.booleans == "same" else self.booleans
        return dtype if self.integers == "same" else self.integers

    def infer(self, ins, ctx):
        x = ins[0]
        return pointwise([x], x.shape, self.result_dtype(x.dtype, ctx.input_ids[0]))

    def static(self, ins, sizes, value):
        fn = {"abs": abs, "floor": math.floor, "ceil": math.ceil}.get(self.torch_name)
        return None if fn is None else unary(ins[0], fn)

    def kernel(self, k):
        return getattr(k.torch, self.torch_name)

    def emit(self, e):
        return f"torch.{self.torch_name}({e.args[0]})"


def _math(op: str, doc: str, example_input: str, integers: str = "float32", booleans: str = "float32") -> type[_Math]:
    """One registered kind per torch function: ``op: log`` reads like the torch call it is."""
    fields = {"op": Literal[op]}  # type: ignore[valid-type]
    namespace = {
        "__doc__": doc,
        "__annotations__": fields,
        "op": op,
        "torch_name": op,
        "integers": integers,
        "booleans": booleans,
        "example": f"- id: {op}_x\n  op: {op}\n  input: {example_input}",
        "__module__": __name__,
    }
    return register(type(op.capitalize(), (_Math,), namespace))


Abs = _math("abs", "``torch.abs(x)`` (integers stay integers; T5's distance ``|j - i|``).", "relative", "same", "refused")
Floor = _math(
    "floor", "``torch.floor(x)`` (integers unchanged; Llama 4's ``floor((pos + 1) / floor_scale)``).", "scaled", "same", "refused"
)
Ceil = _math("ceil", "``torch.ceil(x)`` (integers unchanged).", "scaled", "same", "refused")
Trunc = _math(
    "trunc", "``torch.trunc(x)``: rounds toward zero, as a cast of a float to an integer dtype does.", "scaled", "same", "refused"
)
Square = _math("square", "``torch.square(x)`` (integers stay integers, bool becomes int64).", "x", "same", "int64")
Log = _math("log", "``torch.log(x)`` (integers and bool become float32; T5's logarithmic buckets).", "ratio")
Log1p = _math("log1p", "``torch.log1p(x) = log(1 + x)`` (Llama 4's attention temperature).", "steps")
Sqrt = _math("sqrt", "``torch.sqrt(x)`` (integers and bool become float32).", "variance")
Rsqrt = _math("rsqrt", "``torch.rsqrt(x) = 1 / sqrt(x)`` (integers and bool become float32).", "variance")
Sin = _math("sin", "``torch.sin(x)`` (integers and bool become float32; sinusoidal position tables).", "angles")
Cos = _math("cos", "``torch.cos(x)`` (integers and bool become float32; sinusoidal position tables).", "angles")
Reciprocal = _math("reciprocal", "``torch.reciprocal(x) = 1 / x`` (integers and bool become float32).", "x")
Sign = _math("sign", "``torch.sign(x)``: -1, 0 or 1 (integers stay integers, bool stays bool; Bloom's ALiBi slopes).", "x", "same", "same")
MATH_KINDS = (Abs, Floor, Ceil, Trunc, Square, Log, Log1p, Sqrt, Rsqrt, Sin, Cos, Reciprocal, Sign)


@register
class Pow(StepBase):
    """``x ** exponent`` with a number (a dim expression too): ``x ** 3`` (GELU's cubic term),
    ``positions ** 2``. The dtype is torch's promotion of the tensor and the number: an integer
    tensor to a float power is float32; torch refuses an integer tensor to a negative integer power."""

    op: Literal["pow"] = "pow"
    exponent: Operand = Field(description=f"the power: {OPERAND_DESCRIPTION}")
    elementwise = True
    example = """\
- id: cubed
  op: pow
  input: hidden            # (B, T, d_ff)
  exponent: 3"""

    def args(self):
        return [f"** {operand_text(self.exponent)}"]

    def infer(self, ins, ctx):
        x = ins[0]
        power = operand_value(self.exponent, lambda text: ctx.dim(text, "exponent").value)
        dtype = promote_number(x.dtype, operand_kind(self.exponent))
        if dtype not in FLOAT_DTYPES and power < 0:
            raise StepError(
                "dtype",
                f"torch refuses {x.dtype} '{ctx.input_ids[0]}' to the negative integer power {power}",
                "exponent",
                "cast it to float32 first",
            )
        return pointwise([x, fresh((), dtype)], x.shape, dtype)

    def kernel(self, k):
        power = operand_value(self.exponent, k.value)
        return lambda x: x**power

    def emit(self, e):
        return f"{e.args[0]} ** {operand_source(self.exponent, e.dim)}"


@register
class Clamp(StepBase):
    """``torch.clamp(x, min, max)`` with numbers; a float bound makes an integer tensor float32, as in torch.
    A bound the result cannot hold (``max: 1.0e+39`` on float32, an integer beyond int64) is refused, as torch refuses it."""

    op: Literal["clamp"] = "clamp"
    min: Number | None = Field(None, description="the lower bound (none: no lower bound)")
    max: Number | None = Field(None, description="the upper bound (none: no upper bound)")
    elementwise = True
    example = """\
- id: capped_bucket
  op: clamp
  input: large             # int64 (T, T)
  max: 31                  # num_buckets - 1"""

    @model_validator(mode="after")
    def _a_bound(self) -> Clamp:
        if self.min is None and self.max is None:
            raise ValueError("clamp needs 'min', 'max' or both")
        return self

    def args(self):
        return [f"{name}={py_number(v)}" for name, v in (("min", self.min), ("max", self.max)) if v is not None]

    def infer(self, ins, ctx):
        x = ins[0]
        dtype = x.dtype
        for bound in (self.min, self.max):
            dtype = dtype if bound is None else promote_number(dtype, bound)
        for field, bound in (("min", self.min), ("max", self.max)):
            if bound is not None:
                require_number_fits(bound, dtype, f"clamp's {field}", field)
        return pointwise([x], x.shape, dtype)

    def kernel(self, k):
        clamp, low, high = k.torch.clamp, self.min, self.max
        return lambda x: clamp(x, min=low, max=high)

    def emit(self, e):
        return f"torch.clamp({e.args[0]}, {', '.join(self.args())})"


@register
class Minimum(_Binary):
    """``torch.minimum(a, b)``: the smaller element of two tensors, with broadcasting and promotion."""

    op: Literal["minimum"] = "minimum"
    symbol = "min"
    torch_name = "minimum"
    example = """\
- id: nearer
  op: minimum
  inputs: [relative, zeros]"""


@register
class Maximum(_Binary):
    """``torch.maximum(a, b)``: the larger element of two tensors, with broadcasting and promotion."""

    op: Literal["maximum"] = "maximum"
    symbol = "max"
    torch_name = "maximum"
    example = """\
- id: farther
  op: maximum
  inputs: [a, b]"""


# ---------------------------------------------------------------- comparisons, selection, logic

_COMPARISONS = {"eq": "==", "ne": "!=", "lt": "<", "le": "<=", "gt": ">", "ge": ">="}


@register
class Compare(StepBase):
    """``a OP b`` as a bool tensor, OP one of ``eq ne lt le gt ge``: two tensors (broadcast), or one
    tensor and a number (``value``: a dim expression too, ``T - W``; an integer must lie within
    int64, beyond which torch overflows or compares wrongly)."""

    op: Literal["compare"] = "compare"
    cmp: Literal["eq", "ne", "lt", "le", "gt", "ge"] = Field(description="==, !=, <, <=, >, >=")
    value: Operand | None = Field(None, description=f"compare the one input with this instead of a second tensor: {OPERAND_DESCRIPTION}")
    arity: ClassVar[int | None] = None
    elementwise = True
    example = """\
- id: after_query
  op: compare
  input: relative          # int64 (T, T): j - i
  cmp: gt
  value: 0"""

    def args(self):
        return [self.cmp] + ([operand_text(self.value)] if self.value is not None else [])

    def infer(self, ins, ctx):
        wanted = 1 if self.value is not None else 2
        if len(ins) != wanted:
            given = "a tensor and 'value'" if self.value is not None else "two tensors (or one and 'value')"
            raise StepError("arity", f"compare takes {given}, got {len(ins)} input{'s' if len(ins) != 1 else ''}", "inputs")
        if wanted == 1:
            number = operand_value(self.value, lambda text: ctx.dim(text, "value").value)  # a bad dim expression is located here
            require_number_fits(number, None, "compare's value", "value")  # compared as is: no dtype to fit
            return pointwise(ins, ins[0].shape, "bool")
        a, b = ins
        return pointwise(ins, broadcast(a, b, f"compare '{ctx.input_ids[0]}' {self.cmp} '{ctx.input_ids[1]}'", "inputs"), "bool")

    def kernel(self, k):
        compare = getattr(k.torch, self.cmp)
        if self.value is None:
            return compare
        value = operand_value(self.value, k.value)
        return lambda a: compare(a, value)

    def static(self, ins, sizes, value):
        fn = getattr(operator, self.cmp)
        if self.value is not None:
            number = operand_value(self.value, value)
            return unary(ins[0], lambda a: fn(a, number))
        return binary(ins[0], ins[1], fn)

    def emit(self, e):
        right = operand_source(self.value, e.dim) if self.value is not None else e.args[1]
        return f"{e.args[0]} {_COMPARISONS[self.cmp]} {right}"

    def on_binary(self):
        if not isinstance(self.value, int | float) or isinstance(self.value, bool):
            return None  # a second tensor, or a dim expression: no fixed number to judge a 0/1 mask by
        compare = getattr(operator, self.cmp)
        return {(False, True): "same", (True, False): "not"}.get((compare(0, self.value), compare(1, self.value)))


@register
class Where(StepBase):
    """``torch.where(cond, a, b)``: ``a`` where the bool ``cond`` is True, else ``b``. ``then`` and
    ``otherwise`` give a branch as a number instead of a tensor; ``inputs`` lists ``cond`` and then
    the branches that are tensors, in order. The dtype is torch's promotion of the branches; a
    number branch must fit it (torch refuses ``otherwise: 70000`` for float16)."""

    op: Literal["where"] = "where"
    then: Number | None = Field(None, description="the value where cond is True, as a number (else the second input)")
    otherwise: Number | None = Field(None, description="the value where cond is False, as a number (else the last input)")
    arity: ClassVar[int | None] = None
    elementwise = True
    example = """\
- id: bucket
  op: where
  inputs: [is_small, distance, large]   # bool, int64, int64 (T, T)"""

    def infer(self, ins, ctx):
        numbers = [v for v in (self.then, self.otherwise) if v is not None]
        if len(ins) != 3 - len(numbers):
            raise StepError(
                "arity",
                f"where takes cond and {3 - len(numbers) - 1} tensor branch{'es' if len(numbers) == 0 else ''} here, got {len(ins)} inputs",
                "inputs",
                "list [cond, a, b]; give 'then' or 'otherwise' for a branch that is a number",
            )
        cond, branches = ins[0], ins[1:]
        if cond.dtype != "bool":
            raise StepError(
                "dtype", f"where needs a bool condition, '{ctx.input_ids[0]}' is {cond.dtype}", "inputs", "op: compare makes one"
            )
        shape = cond.shape
        for meta, name in zip(branches, ctx.input_ids[1:]):
            shape = broadcast(fresh(shape, "bool"), meta, f"where '{ctx.input_ids[0]}' with '{name}'", "inputs")
        dtype = self._dtype(branches)
        for field in ("then", "otherwise"):
            if getattr(self, field) is not None:
                require_number_fits(getattr(self, field), dtype, f"where's {field}", field)
        return pointwise(ins, shape, dtype)

    def _dtype(self, branches) -> str:
        numbers = [v for v in (self.then, self.otherwise) if v is not None]
        if not branches:  # two numbers: torch's default dtype of the widest
            return "float32" if any(isinstance(v, float) for v in numbers) else "int64"
        dtype = promote(branches)
        for v in numbers:
            dtype = promote_number(dtype, v)
        return dtype

    def kernel(self, k):
        where, then, otherwise = k.torch.where, self.then, self.otherwise

        def select(cond, *tensors):
            rest = list(tensors)
            a = then if then is not None else rest.pop(0)
            b = otherwise if otherwise is not None else rest.pop(0)
            return where(cond, a, b)

        return select

    def static(self, ins, sizes, value):
        rest = list(ins[1:])
        a = Static((), (self.then,)) if self.then is not None else rest.pop(0)
        b = Static((), (self.otherwise,)) if self.otherwise is not None else rest.pop(0)
        chosen = binary(ins[0], a, lambda cond, x: (cond, x))
        return None if chosen is None else binary(chosen, b, lambda pair, y: pair[1] if pair[0] else y)

    def emit(self, e):
        rest = e.args[1:]
        a = py_number(self.then) if self.then is not None else rest.pop(0)
        b = py_number(self.otherwise) if self.otherwise is not None else rest.pop(0)
        return f"torch.where({e.args[0]}, {a}, {b})"


@register
class Logical(StepBase):
    """``torch.logical_FN``: ``and``, ``or``, ``xor`` of two tensors (broadcast), or ``not`` of one;
    any dtype in (nonzero is True), bool out. Combines masks."""

    op: Literal["logical"] = "logical"
    fn: Literal["and", "or", "xor", "not"]
    arity: ClassVar[int | None] = None
    elementwise = True
    example = """\
- id: same_chunk_and_causal
  op: logical
  fn: and
  inputs: [same_chunk, causal]"""

    def args(self):
        return [self.fn]

    def infer(self, ins, ctx):
        wanted = 1 if self.fn == "not" else 2
        if len(ins) != wanted:
            raise StepError("arity", f"logical {self.fn} takes {wanted} input{'s' if wanted > 1 else ''}, got {len(ins)}", "inputs")
        if wanted == 1:
            return pointwise(ins, ins[0].shape, "bool")
        shape = broadcast(ins[0], ins[1], f"logical {self.fn} of '{ctx.input_ids[0]}' and '{ctx.input_ids[1]}'", "inputs")
        return pointwise(ins, shape, "bool")

    def kernel(self, k):
        return getattr(k.torch, f"logical_{self.fn}")

    def on_binary(self):
        return "not" if self.fn == "not" else None

    def static(self, ins, sizes, value):
        if self.fn == "not":
            return unary(ins[0], operator.not_)
        fn = {"and": lambda a, b: bool(a) and bool(b), "or": lambda a, b: bool(a) or bool(b), "xor": lambda a, b: bool(a) != bool(b)}
        return binary(ins[0], ins[1], fn[self.fn])

    def emit(self, e):
        return f"torch.logical_{self.fn}({', '.join(e.args)})"


# ---------------------------------------------------------------- along dims


def _sum_dtype(dtype: str) -> str:
    """torch sums integers and bools in int64."""
    return dtype if dtype in FLOAT_DTYPES else "int64"


@register
class Cumsum(StepBase):
    """``torch.cumsum(x, dim, dtype)``: running sums along ``dim`` (integers and bool sum in int64,
    as in torch; torch cannot sum in ``dtype: bool``). Positions from a padding mask: ``cumsum(mask) - 1``."""

    op: Literal["cumsum"] = "cumsum"
    dim: StrictInt = -1
    dtype: DType | None = Field(None, description="the dtype to sum in and return (torch's dtype=)")
    example = """\
- id: positions_plus_one
  op: cumsum
  input: attention_mask    # int64 (B, T)
  dim: -1"""

    def args(self):
        return [f"dim={self.dim}"] + ([self.dtype] if self.dtype else [])

    def infer(self, ins, ctx):
        x = ins[0]
        norm_dim(self.dim, max(len(x.shape), 1))
        if self.dtype == "bool":
            raise StepError("dtype", "torch's cumsum cannot sum in bool", "dtype", "leave 'dtype' out: bool tensors sum in int64")
        return fresh(x.shape, self.dtype or _sum_dtype(x.dtype))

    def kernel(self, k):
        cumsum, d = k.torch.cumsum, self.dim
        dtype = getattr(k.torch, self.dtype) if self.dtype else None
        if k.device.type == "meta":  # torch's meta cumsum builds an (n, n) mask along dim: overflows for a huge dim
            empty, result = k.torch.empty, getattr(k.torch, k.out.dtype)
            return lambda x: empty(x.shape, dtype=result, device=x.device)
        return lambda x: cumsum(x, d, dtype=dtype)

    def emit(self, e):
        dtype = f", dtype=torch.{self.dtype}" if self.dtype else ""
        return f"torch.cumsum({e.args[0]}, {self.dim}{dtype})"


@register
class Diff(StepBase):
    """``torch.diff(x, n, dim)``: differences of neighbours along ``dim``, ``n`` times; the dim
    shrinks by ``n``. bool tensors differ by xor, as in torch (where a padding mask changes)."""

    op: Literal["diff"] = "diff"
    dim: StrictInt = -1
    n: StrictInt = Field(1, ge=1, le=64, description="how many times to take differences")
    example = """\
- id: steps
  op: diff
  input: positions         # (B, T) -> (B, T - 1)
  dim: -1"""

    def args(self):
        return [f"dim={self.dim}"] + ([f"n={self.n}"] if self.n != 1 else [])

    def infer(self, ins, ctx):
        x = ins[0]
        if not x.shape:
            raise StepError("shape", f"diff needs a tensor with dims, '{ctx.input_ids[0]}' is 0-d", "input")
        d = norm_dim(self.dim, len(x.shape))
        if x.shape[d].value < self.n:
            raise StepError("shape", f"diff {self.n} times along dim {self.dim} of '{ctx.input_ids[0]}' {show(x)}: too short", "n")
        for _ in range(self.n):  # torch: x.narrow(d, 1, len - 1) - x.narrow(d, 0, len - 1), n times
            shape = x.shape[:d] + (ctx.alg.add(x.shape[d], ctx.alg.const(-1)),) + x.shape[d + 1 :]
            x = pointwise([view(x, shape, x.stride)] * 2, shape, x.dtype)
        return x

    def kernel(self, k):
        diff, n, d = k.torch.diff, self.n, self.dim
        return lambda x: diff(x, n=n, dim=d)

    def emit(self, e):
        return f"torch.diff({e.args[0]}, n={self.n}, dim={self.dim})"


_REDUCED_DTYPE = {
    "sum": _sum_dtype,
    "prod": _sum_dtype,
    "any": lambda d: "bool",
    "all": lambda d: "bool",
    "argmax": lambda d: "int64",
    "argmin": lambda d: "int64",
}
ONE_DIM = ("prod", "argmax", "argmin")  # torch's own take one dim


@register
class Reduce(StepBase):
    """``x.FN(dim, keepdim)``, FN one of ``sum mean prod amax amin any all argmax argmin``, over one dim or
    several; a dim is an int or the NAME of one of the input's dims (``dim: [H, T]``), resolved
    against its symbolic shape. No ``dim``: over every dim (``dim: []`` is refused: torch reads it
    as every dim too). Integers sum in int64; ``mean`` needs
    floats; ``amax``/``amin`` are torch's values-only max and min; ``prod`` takes one dim, and so
    do ``argmax``/``argmin``, the int64 position of the first largest or smallest value along it
    (CLIP's pooler finds each sequence's end-of-text token with ``input_ids.argmax(-1)``)."""

    op: Literal["reduce"] = "reduce"
    fn: Literal["sum", "mean", "prod", "amax", "amin", "any", "all", "argmax", "argmin"]
    dim: StrictInt | str | list[StrictInt | str] | None = Field(None, description="an int, a dim name, or a list of them (none: all)")
    keepdim: StrictBool = False
    example = """\
- id: tokens_per_expert
  op: reduce
  fn: sum
  input: routed            # (B, T, E)
  dim: [B, T]              # -> (E,)"""

    def args(self):
        return [self.fn, f"dim={self.dim}"] + (["keepdim"] if self.keepdim else [])

    def infer(self, ins, ctx):
        x, name = ins[0], ctx.input_ids[0]
        if not x.shape:
            raise StepError("shape", f"reduce needs a tensor with dims, '{name}' is 0-d", "input")
        axes = self.axes(x.shape, name)
        if self.fn in ONE_DIM and (len(axes) != 1 or self.dim is None and len(x.shape) != 1):
            raise StepError("dim", f"torch's {self.fn} reduces one dim, got {len(axes)}", "dim", "reduce in steps, one dim each")
        if self.fn == "mean" and x.dtype not in FLOAT_DTYPES:
            raise StepError("dtype", f"mean needs a floating-point tensor, '{name}' is {x.dtype}", "input", "op: cast to float32 first")
        empty = [i for i in axes if x.shape[i].value == 0]
        if empty and self.fn in ("amax", "amin", "argmax", "argmin"):  # no identity: the max of nothing does not exist
            raise StepError(
                "reduce-empty",
                f"{self.fn} over dim {empty[0]} of '{name}' {show(x)}, which has size 0: the {self.fn[1:]} of no values does not exist",
                "dim",
            )
        kept = [ctx.alg.const(1) if i in axes else d for i, d in enumerate(x.shape)] if self.keepdim else None
        shape = kept if kept is not None else [d for i, d in enumerate(x.shape) if i not in axes]
        return fresh(tuple(shape), _REDUCED_DTYPE.get(self.fn, lambda d: d)(x.dtype))

    def axes(self, shape: tuple[Dim, ...], name: str) -> tuple[int, ...]:
        if self.dim == []:  # torch reduces over every dim for an empty list: the opposite of what it reads as
            raise StepError(
                "dim", "dim: [] names no dim, and torch reduces over every dim for it", "dim", "leave 'dim' out to reduce over every dim"
            )
        written = list(range(len(shape))) if self.dim is None else self.dim if isinstance(self.dim, list) else [self.dim]
        axes = [self._axis(d, shape, name) for d in written]
        if len(set(axes)) != len(axes):
            raise StepError("dim", f"reduce over the same dim twice: {self.dim}", "dim")
        return tuple(sorted(axes))

    def _axis(self, dim: int | str, shape: tuple[Dim, ...], name: str) -> int:
        if isinstance(dim, int):
            return norm_dim(dim, len(shape))
        found = [i for i, d in enumerate(shape) if str(d) == dim]
        if len(found) != 1:
            labels = ", ".join(str(d) for d in shape)
            problem = "has no dim named" if not found else "has more than one dim named"
            raise StepError("dim", f"'{name}' ({labels}) {problem} {dim}", "dim", "give the dim's index instead")
        return found[0]

    def kernel(self, k):
        axes, keepdim, fn = self.axes(k.ins[0].shape, ""), self.keepdim, self.fn
        if fn in ONE_DIM:
            return lambda x: getattr(x, fn)(axes[0], keepdim=keepdim)
        return lambda x: getattr(x, fn)(dim=axes, keepdim=keepdim)

    def emit(self, e):
        axes = self.axes(e.ins[0].shape, "")
        dims = str(axes[0]) if self.fn in ONE_DIM else repr(axes)
        return f"{e.args[0]}.{self.fn}(dim={dims}, keepdim={self.keepdim})"


# ---------------------------------------------------------------- made from dims alone


@register
class Arange(StepBase):
    """``torch.arange(start, stop)`` from dim expressions, with no input, in any dtype but bool: positions inside the
    graph (``start: past, stop: past + T`` is a decode step's query positions)."""

    op: Literal["arange"] = "arange"
    start: DimText = Field(0, description="a dim expression: the first value")
    stop: DimText = Field(description="a dim expression: the end (excluded)")
    dtype: DType = "int64"
    arity: ClassVar[int | None] = 0
    example = """\
- id: query_positions
  op: arange
  start: past
  stop: past + T"""

    def args(self):
        return [f"{self.start}..{self.stop}", self.dtype]

    def counts(self):
        return self.start

    def infer(self, ins, ctx):
        if self.dtype == "bool":
            raise StepError("dtype", "torch has no arange of bool", "dtype", "count in int64 and compare (op: compare) for a bool tensor")
        start, stop = ctx.dim(self.start, "start"), ctx.dim(self.stop, "stop")
        if stop.value < start.value:
            raise StepError("value", f"arange from {start} = {start.value} to {stop} = {stop.value} counts down", "stop", "stop >= start")
        return fresh((ctx.dim(f"({self.stop}) - ({self.start})", "stop"),), self.dtype)

    def kernel(self, k):
        arange, device, dtype = k.torch.arange, k.device, getattr(k.torch, self.dtype)
        start, stop = k.value(self.start), k.value(self.stop)
        return lambda: arange(start, stop, dtype=dtype, device=device)

    def static(self, ins, sizes, value):
        kind = int if self.dtype.startswith("int") else float
        return Static(tuple(sizes), tuple(kind(v) for v in range(value(self.start), value(self.stop))))

    def emit(self, e):
        return f"torch.arange({e.dim(self.start)}, {e.dim(self.stop)}, dtype=torch.{self.dtype}, device={e.device})"
