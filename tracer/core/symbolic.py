"""Symbolic dims: exact algebra over the pipeline's dim names, with concrete values alongside.

A ``Dim`` pairs a canonical Laurent polynomial over the *base* dims (those declared as plain
ints) with its concrete value. Because ``//`` in a dim expression must divide exactly, it is
exact division, so ``d_model // H * H`` equals ``d_model`` and ``H * Dh`` prints as ``d_model``.
``%`` and division by a sum stay opaque atoms. No sympy, so ``tracer check`` starts fast.

A dim prints as the file's own words: the name of the declared dim it equals, else the
expression as the file wrote it (``H_kv * Dh``), else one built from the labels it was computed
from, never the polynomial over base dims (``H_kv*d_model // H``) that nobody wrote.

>>> alg = DimAlgebra({"d_model": "8", "H": "2", "H_kv": "1", "Dh": "d_model // H"})
>>> str(alg.mul(alg.dim("H"), alg.dim("Dh")))
'd_model'
>>> str(alg.dim("H_kv * Dh")), str(alg.mul(alg.dim("H_kv"), alg.dim("Dh")))
('H_kv * Dh', 'H_kv * Dh')
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from fractions import Fraction
from functools import lru_cache

from . import dimexpr as dimexpr
from .frozen import frozen

Monomial = tuple  # ((name, exponent), ...) sorted by name


@dataclass(frozen=True, eq=False)
class Poly:
    """An immutable sum of monomials with rational coefficients, in canonical order."""

    terms: tuple  # ((Monomial, Fraction), ...) sorted, no zero coefficients
    _hash: int = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        # polys key the algebra's caches, and hashing nested Fractions is slow: hash once
        object.__setattr__(self, "_hash", hash(self.terms))

    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other: object) -> bool:
        if self is other:
            return True
        return isinstance(other, Poly) and self._hash == other._hash and self.terms == other.terms

    @staticmethod
    @lru_cache(maxsize=1024)
    def const(value: int) -> Poly:
        return Poly((((), Fraction(value)),) if value else ())

    @staticmethod
    @lru_cache(maxsize=1024)
    def symbol(name: str) -> Poly:
        return Poly(((((name, 1),), Fraction(1)),))

    def __add__(self, other: Poly) -> Poly:
        return _plus(self, other)

    def __neg__(self) -> Poly:
        return Poly(tuple((m, -c) for m, c in self.terms))

    def __mul__(self, other: Poly) -> Poly:
        return _times(self, other)

    def divide(self, other: Poly) -> Poly | None:
        """Exact division by a single monomial; ``None`` when ``other`` is a sum."""
        return _over(self, other)

    @property
    def constant(self) -> Fraction | None:
        if not self.terms:
            return Fraction(0)
        if len(self.terms) == 1 and self.terms[0][0] == ():
            return self.terms[0][1]
        return None

    def __str__(self) -> str:
        return _format(self)


def substitute(poly: Poly, values: Mapping[str, Poly]) -> Poly | None:
    """``poly`` with each dim ``values`` names replaced by its poly (``past + T`` with T = 1 is
    ``past + 1``); None where a dim under a negative power becomes a sum, which does not divide exactly."""
    total = Poly.const(0)
    for mono, coeff in poly.terms:
        term: Poly | None = Poly((((), coeff),))
        for name, exp in mono:
            factor = values.get(name, Poly.symbol(name))
            for _ in range(abs(exp)):
                term = term * factor if exp > 0 else term.divide(factor)
                if term is None:
                    return None
        total = total + term
    return total


# A 48-layer stack repeats the same few products thousands of times, and a check of many files the
# same quotients (a view's lint divides its dims by each other); the polys are immutable, so each
# distinct sum, product, quotient and text is computed once per process.
@lru_cache(maxsize=8192)
def _plus(a: Poly, b: Poly) -> Poly:
    return _collect(list(a.terms) + list(b.terms))


@lru_cache(maxsize=8192)
def _times(a: Poly, b: Poly) -> Poly:
    return _collect([(_mono_mul(m1, m2), c1 * c2) for m1, c1 in a.terms for m2, c2 in b.terms])


@lru_cache(maxsize=8192)
def _over(a: Poly, b: Poly) -> Poly | None:
    if len(b.terms) != 1:
        return None
    mono, coeff = b.terms[0]
    inverse = tuple((name, -exp) for name, exp in mono)
    return _collect([(_mono_mul(m, inverse), c / coeff) for m, c in a.terms])


@lru_cache(maxsize=8192)
def _format(poly: Poly) -> str:
    if not poly.terms:
        return "0"
    whole = math.lcm(*(c.denominator for _, c in poly.terms))
    if whole != 1 and len(poly.terms) > 1:  # one division of the sum: (L - 1) // 4, never L // 4 - 1 // 4
        return f"({_format(Poly(tuple((m, c * whole) for m, c in poly.terms)))}) // {whole}"
    parts = [_format_term(m, c) for m, c in poly.terms]
    text = parts[0]
    for part in parts[1:]:
        text += f" - {part[1:]}" if part.startswith("-") else f" + {part}"
    return text


def _mono_mul(a: Monomial, b: Monomial) -> Monomial:
    exps: dict[str, int] = dict(a)
    for name, exp in b:
        exps[name] = exps.get(name, 0) + exp
    return tuple(sorted((n, e) for n, e in exps.items() if e))


def _collect(terms: list) -> Poly:
    sums: dict[Monomial, Fraction] = {}
    for mono, coeff in terms:
        sums[mono] = sums.get(mono, Fraction(0)) + coeff
    return Poly(tuple(sorted(((m, c) for m, c in sums.items() if c), key=lambda t: (-len(t[0]), t[0]))))


def _format_term(mono: Monomial, coeff: Fraction) -> str:
    num = [n if e == 1 else "*".join([n] * e) for n, e in mono if e > 0]
    den = [n if e == -1 else "*".join([n] * -e) for n, e in mono if e < 0]
    sign = "-" if coeff < 0 else ""
    coeff = abs(coeff)
    if coeff.numerator != 1 or not num:
        num.insert(0, str(coeff.numerator))
    if coeff.denominator != 1:
        den.insert(0, str(coeff.denominator))
    text = "*".join(num)
    if den:
        text += " // " + ("*".join(den) if len(den) == 1 else "(" + "*".join(den) + ")")
    return sign + text


@frozen
class Dim:
    """One symbolic dimension with its concrete value; prints nanoGPT-style (``T``, ``Dh``)."""

    poly: Poly
    value: int
    label: str = field(compare=False)  # how it prints; two spellings of one dim are the same dim

    def __str__(self) -> str:
        return self.label

    def same_symbol(self, other: Dim) -> bool:
        return self.poly == other.poly


class DimAlgebra:
    """The dims of one pipeline: parses, evaluates and combines them, and names the results."""

    def __init__(self, declared: Mapping[str, dimexpr.Expr | str | int], values: Mapping[str, int] | None = None):
        self.exprs = {name: dimexpr.parsed(expr) for name, expr in declared.items()}
        self.values = dict(values) if values is not None else resolve(self.exprs)
        self.polys: dict[str, Poly] = {}
        for name in dependency_order(self.exprs, missing_ok=True):  # a dim's poly is made of its dependencies'
            expr = self.exprs[name]
            self.polys[name] = Poly.symbol(name) if dimexpr.is_number(expr) else self._poly(expr)
        self.names = {}
        for name, poly in self.polys.items():
            self.names.setdefault(poly, name)
        self._texts: dict[tuple, Dim] = {}  # every copy of a block reads the same dim texts

    def _poly_of_name(self, name: str) -> Poly:
        return self.polys[name]

    def _poly(self, expr: dimexpr.Expr) -> Poly:
        return dimexpr.fold(expr, _Polys(self))

    def make(self, poly: Poly, value: int, spelling: str | None = None) -> Dim:
        """The dim ``poly``, labelled by the declared dim it equals, else a whole number, else
        ``spelling`` (the file's words for it), else the polynomial itself."""
        label = self.names.get(poly)
        if label is None:
            const = poly.constant
            label = str(const.numerator) if const is not None and const.denominator == 1 else spelling or str(poly)
        return Dim(poly, value, label)

    def dim(self, expr: dimexpr.Expr | str | int) -> Dim:
        """A Dim from a spec expression; raises ``DimError`` (not divisible, unknown name...)."""
        if isinstance(expr, (dimexpr.Num, dimexpr.Name, dimexpr.Neg, dimexpr.BinOp)):
            return self.make(self._poly(expr), dimexpr.evaluate(expr, self.values), dimexpr.text(expr))
        key = (type(expr), expr)  # (int, 1) and (bool, True) must not share an entry
        if key not in self._texts:
            parsed = dimexpr.parse(expr)
            self._texts[key] = self.make(self._poly(parsed), dimexpr.evaluate(parsed, self.values), dimexpr.text(parsed))
        return self._texts[key]

    def const(self, value: int) -> Dim:
        return self.make(Poly.const(value), value)

    def mul(self, a: Dim, b: Dim) -> Dim:
        if a.poly == _ONE or b.poly == _ONE:  # a product's running total starts at 1
            return b if a.poly == _ONE else a
        return self._computed(a.poly * b.poly, a.value * b.value, f"{_operand(a, '*')} * {_operand(b, '*')}")

    def add(self, a: Dim, b: Dim) -> Dim:
        return self._computed(a.poly + b.poly, a.value + b.value, f"{a} + {_operand(b, '+')}")

    def floordiv(self, a: Dim, b: Dim) -> Dim:
        quotient = a.poly.divide(b.poly)
        spelling = f"{_operand(a, '*')} // {_operand(b, '//')}"
        exact = quotient is not None and a.value % max(b.value, 1) == 0
        # an opaque quotient is named canonically, so that every spelling of it is the same dim
        poly = quotient if exact else Poly.symbol(f"({self._canonical(a)} // {self._canonical(b)})")
        return self._computed(poly, a.value // b.value if b.value else 0, spelling)

    def _computed(self, poly: Poly, value: int, spelling: str) -> Dim:
        """A dim computed from others, labelled by the labels it was computed from ('H_kv * Dh'),
        unless the polynomial says it shorter ('3*head_dim', not 'head_dim + head_dim + head_dim')."""
        return self.make(poly, value, spelling if len(spelling) <= len(str(poly)) else None)

    def _canonical(self, dim: Dim) -> str:
        return self.make(dim.poly, dim.value).label

    def product(self, dims: list[Dim]) -> Dim:
        result = self.const(1)
        for d in dims:
            result = self.mul(result, d)
        return result


_ONE = Poly.const(1)


def _operand(dim: Dim, op: str) -> str:
    """``dim``'s label as an operand of ``op``, in parentheses unless that changes nothing: a name
    or a number needs none anywhere, a product without ``//`` none as a factor of ``*`` (the left
    of ``//`` is passed as a factor: ``a * b // c`` is ``(a * b) // c``)."""
    label = dim.label
    if label.isidentifier() or label.isdigit():
        return label
    plain_product = " + " not in label and " - " not in label and " % " not in label and not label.startswith("-")
    return label if op == "*" and plain_product and " // " not in label else f"({label})"


class _Polys(dimexpr.Fold[Poly]):
    """A dim expression as a Laurent polynomial over the base dims: ``//`` is exact division by a
    monomial; ``%`` and division by a sum stay opaque symbols."""

    def __init__(self, alg: DimAlgebra):
        self.alg = alg

    def num(self, node):
        return Poly.const(node.value)

    def name(self, node):
        return self.alg.polys.get(node.name) or Poly.symbol(node.name)

    def neg(self, node, operand):
        return -operand

    def binop(self, node, left, right):
        if node.op == "+":
            return left + right
        if node.op == "-":
            return left + -right
        if node.op == "*":
            return left * right
        if node.op == "//":
            quotient = left.divide(right)
            if quotient is not None:
                return quotient
        return Poly.symbol(f"({node})")


def dependency_order(exprs: Mapping[str, dimexpr.Expr], leaves: frozenset = frozenset(), missing_ok: bool = False) -> list[str]:
    """Every dim after the dims it is computed from (a depth-first walk in the file's order, with
    an explicit stack: a chain of thousands of derived dims is no deeper than one). The deps of
    ``leaves`` (dims given a value) are not followed. A cycle or an unknown name raises
    ``DimError`` whose ``dim`` is the dim being computed; ``missing_ok`` skips unknown names."""
    order: list[str] = []
    done: set[str] = set()
    for root in exprs:
        if root in done:
            continue
        visiting, on_path = [root], {root}  # the path in order (to name a cycle), and as a set (to find one in O(1))
        frames = [(root, iter(_deps(exprs, root, leaves)))]
        while frames:
            name, deps = frames[-1]
            dep = next((d for d in deps if d not in done), None)
            if dep is None:
                frames.pop()
                on_path.discard(visiting.pop())
                done.add(name)
                order.append(name)
                continue
            try:
                if dep in on_path:
                    cycle = " -> ".join(visiting[visiting.index(dep) :] + [dep])
                    raise dimexpr.DimError(f"dims depend on each other in a cycle: {cycle}", "dim-cycle")
                if dep not in exprs:
                    if missing_ok:
                        continue
                    raise dimexpr.DimError(f"unknown dim '{dep}'", "unknown-dim")
            except dimexpr.DimError as exc:
                exc.dim = name
                raise
            visiting.append(dep)
            on_path.add(dep)
            frames.append((dep, iter(_deps(exprs, dep, leaves))))
    return order


def _deps(exprs: Mapping[str, dimexpr.Expr], name: str, leaves: frozenset) -> list[str]:
    return [] if name in leaves else sorted(dimexpr.names(exprs[name]))


def resolve(exprs: Mapping[str, dimexpr.Expr], overrides: Mapping[str, int] | None = None) -> dict[str, int]:
    """Evaluate every dim in dependency order (the dict's order); cycles and unknown names raise
    ``DimError`` whose ``dim`` names the dim being computed."""
    overrides = dict(overrides or {})
    values: dict[str, int] = {}
    for name in dependency_order(exprs, frozenset(overrides)):
        if name in overrides:
            values[name] = overrides[name]
            continue
        try:
            values[name] = dimexpr.evaluate(exprs[name], values)
        except dimexpr.DimError as exc:
            exc.dim = getattr(exc, "dim", name)
            raise
    return values
