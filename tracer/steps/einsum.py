"""``einsum`` with torch's equation syntax and a symbolic shape rule."""

from __future__ import annotations

import re
from typing import Literal

from pydantic import Field

from ..core.dtypes import FLOAT_DTYPES
from ..core.layout import fresh
from .contract import StepBase, register
from .rules import Mismatch, StepError, broadcast_dims, show

_TERM = re.compile(r"^(?:[A-Za-z]|\.\.\.)*$")


def parse_equation(equation: str, n_operands: int | None = None) -> tuple[list[str], str | None]:
    """Split ``'bhqd,bhkd->bhqk'`` into input terms and the output term (None: implicit).

    ``...`` is kept as the one-character marker ``.``. Raises ``StepError`` on malformed text.
    """
    text = equation.replace(" ", "")
    lhs, arrow, rhs = text.partition("->")
    terms = lhs.split(",")
    for term in terms + ([rhs] if arrow else []):
        if not _TERM.match(term) or term.count("...") > 1:
            raise StepError(
                "einsum-equation",
                f"einsum term '{term}' of '{equation}': use letters a-z, A-Z and at most one '...'",
                "equation",
            )
    if n_operands is not None and len(terms) != n_operands:
        raise StepError("einsum-equation", f"'{equation}' has {len(terms)} operand terms, the step has {n_operands} inputs", "equation")
    squeezed = [t.replace("...", ".") for t in terms]
    return squeezed, rhs.replace("...", ".") if arrow else None


@register
class Einsum(StepBase):
    """``torch.einsum(equation, *inputs)``: ``'bhqd,bhkd->bhqk'`` are the attention scores.

    Letters name dims (size-1 dims broadcast), ``...`` stands for any leading dims, and without
    ``->`` the output is the letters used once, in alphabetical order. The result is a contiguous
    copy of torch's (whose strides, and whether it is a view of an input, depend on how torch plans
    the contraction), so its layout is known before running. Integer and bool operands get torch's
    dtype: int64 when a letter is summed out of one operand (torch.sum), and a contraction of
    bool operands (bmm has no bool kernel) is refused.
    """

    op: Literal["einsum"] = "einsum"
    arity = None
    equation: str = Field(max_length=200, description="torch.einsum's equation, e.g. 'bhqd,bhkd->bhqk'")
    makes_scores = True
    example = """\
- id: scores
  op: einsum
  inputs: [q, k]           # (B, H, T, Dh), (B, H, T, Dh)
  equation: bhqd,bhkd->bhqk"""

    def args(self):
        return [self.equation]

    def _letters(self, ins, ctx):
        """Every letter's dim (a non-1 one wins) and the broadcast ``...`` dims."""
        terms, output = parse_equation(self.equation, len(ins))
        letters, ellipsis = {}, []
        for name, term, meta in zip(ctx.input_ids, terms, ins):
            if meta.dtype != ins[0].dtype:
                raise StepError("dtype", f"einsum of {ins[0].dtype} '{ctx.input_ids[0]}' and {meta.dtype} '{name}'", "inputs")
            named = len(term) - term.count(".")
            if (len(meta.shape) != named) if "." not in term else (len(meta.shape) < named):
                raise StepError(
                    "einsum-shape", f"term '{term.replace('.', '...')}' names {named} dims, '{name}' is {show(meta)}", "equation"
                )
            cut = term.find(".")
            lead = len(meta.shape) - named
            dims = list(meta.shape)
            if cut >= 0:
                ellipsis = _broadcast(ellipsis, dims[cut : cut + lead], f"the '...' dims of '{name}' {show(meta)} and the others")
                dims = dims[:cut] + ["."] + dims[cut + lead :]
            for letter, dim in zip(term, dims):
                if letter == ".":
                    continue
                seen = letters.get(letter)
                what = f"einsum letter '{letter}' of '{name}' {show(meta)} and of an earlier operand"
                letters[letter] = dim if seen is None else _broadcast([seen], [dim], what)[0]
        return terms, output, letters, ellipsis

    def output_term(self, terms: list[str], output: str | None) -> str:
        if output is not None:
            return output
        counts = {}
        for term in terms:
            for letter in term.replace(".", ""):
                counts[letter] = counts.get(letter, 0) + 1
        return ("." if any("." in t for t in terms) else "") + "".join(sorted(c for c, n in counts.items() if n == 1))

    def infer(self, ins, ctx):
        terms, output, letters, ellipsis = self._letters(ins, ctx)
        out = self.output_term(terms, output)
        for letter in out.replace(".", ""):
            if letter not in letters:
                raise StepError("einsum-equation", f"output letter '{letter}' appears in no input term of '{self.equation}'", "equation")
            if out.count(letter) > 1:
                raise StepError("einsum-equation", f"output letter '{letter}' appears twice in '{self.equation}'", "equation")
        if "." in out and not any("." in t for t in terms):
            raise StepError("einsum-equation", f"output '...' of '{self.equation}' has no '...' in the inputs", "equation")
        shape = []
        for letter in out:
            shape.extend(ellipsis if letter == "." else [letters[letter]])
        return fresh(tuple(shape), self._dtype(terms, out, ins[0].dtype, ctx.input_ids[0]))

    def _dtype(self, terms: list[str], out: str, dtype: str, name: str) -> str:
        """torch's result dtype: a letter only one operand has and the output lacks is summed out
        of it first (torch.sum: integers and bool become int64); letters several share are then
        contracted by bmm, which has no bool kernel and refuses int64 with int32."""
        if dtype in FLOAT_DTYPES:
            return dtype
        gone = {c for t in terms for c in t if c != "." and c not in out}
        alone = [any(c in gone and sum(c in u for u in terms) == 1 for c in t) for t in terms]
        if any(sum(c in t for t in terms) > 1 for c in gone):
            mixed = dtype != "int64" and any(alone) and not all(alone)
            if mixed or (dtype == "bool" and not any(alone)):
                found = "int64 (summed) and " + dtype if mixed else "bool"
                raise StepError(
                    "dtype",
                    f"einsum '{self.equation}' contracts {found} operands with a matmul, which torch refuses",
                    "inputs",
                    f"cast '{name}' and the others to float32 (or int64) first",
                )
        return "int64" if any(alone) else dtype

    def score_axes(self, ndim: int) -> tuple[int | None, int | None]:
        """(query axis, key axis) of two-operand scores: the last output letter only the first
        operand has, and the last only the second has."""
        terms, output = parse_equation(self.equation)
        if len(terms) != 2:
            return None, None
        out = self.output_term(terms, output)
        lead = ndim - len(out.replace(".", ""))
        positions = {}
        at = 0
        for letter in out:
            positions[letter] = at
            at += lead if letter == "." else 1
        first = [positions[c] for c in out if c != "." and c in terms[0] and c not in terms[1]]
        second = [positions[c] for c in out if c != "." and c in terms[1] and c not in terms[0]]
        return (first[-1] if first else None), (second[-1] if second else None)

    def kernel(self, k):
        torch, equation = k.torch, self.equation
        planner = torch.backends.opt_einsum

        def einsum(*xs):
            # left to right, always: with opt_einsum installed torch would plan another path, with
            # other intermediates than the memory estimate counts. .contiguous() would keep torch's
            # result when it is already contiguous: a view of an input ('ij->ij'), or with size-1
            # dims strided as torch planned
            with planner.flags(enabled=False):
                return torch.einsum(equation, *xs).clone(memory_format=torch.contiguous_format)

        return einsum

    def emit(self, e):
        # a contiguous copy, as the trace records it: a later view must not depend on how torch planned the contraction
        return f"torch.einsum({self.equation!r}, {', '.join(e.args)}).clone(memory_format=torch.contiguous_format)"


def _broadcast(a: list, b: list, what: str) -> list:
    shape = broadcast_dims(a, b)
    if isinstance(shape, Mismatch):
        raise StepError("broadcast", f"{what} do not broadcast ({shape.a}={shape.a.value} vs {shape.b}={shape.b.value})", "equation")
    return list(shape)
