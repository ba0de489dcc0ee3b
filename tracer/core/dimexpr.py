"""Dimension expressions: a tiny integer language parsed with an allow-list over ``ast``.

Grammar: int literals, dim names, ``+ - * // %``, unary minus and parentheses. Nothing else is
accepted, and nothing is ever evaluated by Python: we walk our own tree.

>>> e = parse("d_model // H")
>>> evaluate(e, {"d_model": 8, "H": 2})
4
>>> sorted(names(e))
['H', 'd_model']
"""

from __future__ import annotations

import ast
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from functools import lru_cache
from typing import Generic, TypeVar

MAX_TEXT = 200
T = TypeVar("T")
MAX_VALUE = 2**62  # far above any real tensor size, far below what overflows int64 strides


class DimError(ValueError):
    """A dim expression that cannot be parsed or evaluated; the caller adds the location."""

    def __init__(self, message: str, code: str = "dim-expr"):
        super().__init__(message)
        self.code = code


@dataclass(frozen=True)
class Num:
    value: int

    def __str__(self) -> str:
        return text(self)


@dataclass(frozen=True)
class Name:
    name: str

    def __str__(self) -> str:
        return text(self)


@dataclass(frozen=True)
class Neg:
    operand: Expr

    def __str__(self) -> str:
        return text(self)


@dataclass(frozen=True)
class BinOp:
    op: str  # one of + - * // %
    left: Expr
    right: Expr

    def __str__(self) -> str:
        return text(self)


Expr = Num | Name | Neg | BinOp


class Fold(Generic[T]):
    """What to make of each kind of node, bottom-up: :func:`fold` calls ``neg`` and ``binop`` with
    what it made of their operands. Evaluating, naming, printing, symbolic dims
    (``tracer.core.symbolic``) and exported source all fold the same trees."""

    def num(self, node: Num) -> T:
        raise NotImplementedError

    def name(self, node: Name) -> T:
        raise NotImplementedError

    def neg(self, node: Neg, operand: T) -> T:
        raise NotImplementedError

    def binop(self, node: BinOp, left: T, right: T) -> T:
        raise NotImplementedError


def fold(expr: Expr, visitor: Fold[T]) -> T:
    """The one walk over a dim expression: post-order with an explicit stack (no recursion, so
    no expression can reach Python's recursion limit)."""
    stack: list[tuple[Expr, bool]] = [(expr, False)]
    made: list[T] = []
    while stack:
        node, operands_done = stack.pop()
        if isinstance(node, Num):
            made.append(visitor.num(node))
        elif isinstance(node, Name):
            made.append(visitor.name(node))
        elif not operands_done:
            stack.append((node, True))
            stack.extend((child, False) for child in reversed(_operands(node)))
        elif isinstance(node, Neg):
            made.append(visitor.neg(node, made.pop()))
        else:
            right = made.pop()
            made.append(visitor.binop(node, made.pop(), right))
    return made[0]


def _operands(node: Neg | BinOp) -> tuple[Expr, ...]:
    return (node.operand,) if isinstance(node, Neg) else (node.left, node.right)


def is_number(expr: Expr) -> bool:
    """A literal int (a base dim's definition), not an expression over other dims."""
    return isinstance(expr, Num)


class _Evaluate(Fold[int]):
    def __init__(self, env: Mapping[str, int]):
        self.env = env

    def num(self, node):
        return node.value

    def name(self, node):
        try:
            return self.env[node.name]
        except KeyError:
            raise DimError(f"unknown dim '{node.name}'", "unknown-dim") from None

    def neg(self, node, operand):
        return -operand

    def binop(self, node, a, b):
        if node.op == "+":
            return _checked(a + b, node)
        if node.op == "-":
            return _checked(a - b, node)
        if node.op == "*":
            return _checked(a * b, node)
        if b == 0:
            raise DimError(f"division by zero in '{text(node)}' ({text(node.right)}=0)", "dim-divide")
        if node.op == "%":
            return a % b
        if a % b:
            raise DimError(f"{_describe(node.left, a)} is not divisible by {_describe(node.right, b)}", "dim-divide")
        return a // b


class _Names(Fold[frozenset]):
    def num(self, node):
        return frozenset()

    def name(self, node):
        return frozenset((node.name,))

    def neg(self, node, operand):
        return operand

    def binop(self, node, left, right):
        return left | right


class Source(Fold[str]):
    """The expression as text, each name written as ``names`` says (itself by default), operands
    that are not a name or a number in parentheses: ``d_model // H``, ``self.d_model // (H + 1)``."""

    def __init__(self, names: Mapping[str, str] | None = None):
        self.names = names or {}

    def num(self, node):
        return str(node.value)

    def name(self, node):
        return self.names.get(node.name, node.name)

    def neg(self, node, operand):
        return f"-{self.operand(node.operand, operand)}"

    def binop(self, node, left, right):
        return f"{self.operand(node.left, left)} {node.op} {self.operand(node.right, right)}"

    def operand(self, node: Expr, written: str) -> str:
        """An operand as written inside a larger expression."""
        return f"({written})" if isinstance(node, BinOp) else written


class Divisions(Fold[list]):
    """Every ``//`` and ``%`` node, innermost first (where an exported module checks its divisor)."""

    def num(self, node):
        return []

    def name(self, node):
        return []

    def neg(self, node, operand):
        return operand

    def binop(self, node, left, right):
        return left + right + ([node] if node.op in ("//", "%") else [])


def evaluate(expr: Expr, env: Mapping[str, int]) -> int:
    return fold(expr, _Evaluate(env))


def names(expr: Expr) -> frozenset[str]:
    return fold(expr, _Names())


def text(expr: Expr) -> str:
    return fold(expr, Source())


_BINOPS = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.FloorDiv: "//", ast.Mod: "%"}


def parse(text: str | int) -> Expr:
    """Parse a dim expression (or pass an int through) into our own tree."""
    if isinstance(text, bool):
        raise DimError(f"expected a dim name, an int or an expression, found the boolean {text}")
    if isinstance(text, int):
        return Num(_checked_literal(text))
    if not isinstance(text, str):
        raise DimError(f"expected a dim name, an int or an expression, found {type(text).__name__}")
    if len(text) > MAX_TEXT:
        raise DimError(f"dim expression is {len(text)} characters long (the limit is {MAX_TEXT})")
    memo = _MEMO.get()
    if memo is None:
        return _parse_text(text)
    if text not in memo:
        memo[text] = _parse_text(text)
    return memo[text]


_MEMO: ContextVar[dict[str, Expr] | None] = ContextVar("tracer_dim_memo", default=None)


@contextmanager
def parsing_once() -> Iterator[None]:
    """Within it, each text is parsed once however often it is read (a file's validation parses
    every dim, its spec keeps them parsed; thousands of dims overflow any fixed-size cache). The
    memo goes when the outermost one ends, so nothing accumulates across files."""
    if _MEMO.get() is not None:
        yield
        return
    token = _MEMO.set({})
    try:
        yield
    finally:
        _MEMO.reset(token)


def parsed(value: Expr | str | int) -> Expr:
    """``value`` as an expression: parsed, unless it already is one."""
    return value if isinstance(value, (Num, Name, Neg, BinOp)) else parse(value)


@lru_cache(maxsize=4096)
def _parse_text(text: str) -> Expr:
    """Parsing costs ~10 us and pipelines repeat the same few texts; the trees are immutable."""
    try:
        tree = ast.parse(text.strip(), mode="eval")
    except (SyntaxError, ValueError):
        raise DimError(f"'{text}' is not a dim expression (allowed: ints, dim names, + - * // %, parentheses)") from None
    return _convert(tree.body, text)


def _convert(node: ast.AST, text: str) -> Expr:
    if isinstance(node, ast.Constant) and type(node.value) is int:
        return Num(_checked_literal(node.value))
    if isinstance(node, ast.Name):
        if node.id.startswith("__"):
            raise DimError(f"'{node.id}' is not allowed in a dim expression")
        return Name(node.id)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        return Neg(_convert(node.operand, text))
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.UAdd):
        return _convert(node.operand, text)
    if isinstance(node, ast.BinOp) and type(node.op) in _BINOPS:
        return BinOp(_BINOPS[type(node.op)], _convert(node.left, text), _convert(node.right, text))
    raise DimError(f"'{text}': {_forbidden(node)} is not allowed in a dim expression (allowed: ints, dim names, + - * // %, parentheses)")


def _forbidden(node: ast.AST) -> str:
    kinds = {
        ast.Call: "a call",
        ast.Attribute: "attribute access",
        ast.Subscript: "a subscript",
        ast.Pow: "'**'",
        ast.Div: "'/' (use '//')",
        ast.Constant: "a non-integer literal",
    }
    if isinstance(node, ast.BinOp):
        return kinds.get(type(node.op), f"the operator {type(node.op).__name__}")
    return kinds.get(type(node), type(node).__name__)


def _checked_literal(value: int) -> int:
    if abs(value) > MAX_VALUE:
        raise DimError(f"the integer {_short(value)} is too large (the limit is 2**62)", "dim-overflow")
    return value


def _checked(value: int, expr: BinOp) -> int:
    if abs(value) > MAX_VALUE:
        raise DimError(f"'{text(expr)}' evaluates to {_short(value)}, which overflows (the limit is 2**62)", "dim-overflow")
    return value


def _short(value: int) -> str:
    text = str(value)
    return text if len(text) <= 24 else f"{text[:10]}...({len(text)} digits)"


def _describe(expr: Expr, value: int) -> str:
    return str(value) if isinstance(expr, Num) else f"{text(expr)}={value}"
