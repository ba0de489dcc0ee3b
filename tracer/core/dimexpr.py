"""Dimension expressions: a tiny integer language parsed with an allow-list over ``ast``.

Grammar: int literals, dim names, ``+ - * // %``, unary minus and parentheses. Nothing else is
accepted, and nothing is ever evaluated by Python: we walk our own tree.

>>> e = parse("d_model // H")
>>> e.evaluate({"d_model": 8, "H": 2})
4
>>> sorted(e.names())
['H', 'd_model']
"""

from __future__ import annotations

import ast
from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache

MAX_TEXT = 200
MAX_VALUE = 2**62  # far above any real tensor size, far below what overflows int64 strides


class DimError(ValueError):
    """A dim expression that cannot be parsed or evaluated; the caller adds the location."""

    def __init__(self, message: str, code: str = "dim-expr"):
        super().__init__(message)
        self.code = code


@dataclass(frozen=True)
class Num:
    value: int

    def evaluate(self, env: Mapping[str, int]) -> int:
        return self.value

    def names(self) -> set[str]:
        return set()

    def __str__(self) -> str:
        return str(self.value)


@dataclass(frozen=True)
class Name:
    name: str

    def evaluate(self, env: Mapping[str, int]) -> int:
        try:
            return env[self.name]
        except KeyError:
            raise DimError(f"unknown dim '{self.name}'", "unknown-dim") from None

    def names(self) -> set[str]:
        return {self.name}

    def __str__(self) -> str:
        return self.name


@dataclass(frozen=True)
class Neg:
    operand: Expr

    def evaluate(self, env: Mapping[str, int]) -> int:
        return -self.operand.evaluate(env)

    def names(self) -> set[str]:
        return self.operand.names()

    def __str__(self) -> str:
        return f"-{_wrap(self.operand)}"


@dataclass(frozen=True)
class BinOp:
    op: str  # one of + - * // %
    left: Expr
    right: Expr

    def evaluate(self, env: Mapping[str, int]) -> int:
        a, b = self.left.evaluate(env), self.right.evaluate(env)
        if self.op == "+":
            return _checked(a + b, self)
        if self.op == "-":
            return _checked(a - b, self)
        if self.op == "*":
            return _checked(a * b, self)
        if b == 0:
            raise DimError(f"division by zero in '{self}' ({self.right}=0)", "dim-divide")
        if self.op == "%":
            return a % b
        if a % b:
            raise DimError(f"{_describe(self.left, a)} is not divisible by {_describe(self.right, b)}", "dim-divide")
        return a // b

    def names(self) -> set[str]:
        return self.left.names() | self.right.names()

    def __str__(self) -> str:
        return f"{_wrap(self.left)} {self.op} {_wrap(self.right)}"


Expr = Num | Name | Neg | BinOp

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
    return _parse_text(text)


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
        raise DimError(f"'{expr}' evaluates to {_short(value)}, which overflows (the limit is 2**62)", "dim-overflow")
    return value


def _short(value: int) -> str:
    text = str(value)
    return text if len(text) <= 24 else f"{text[:10]}...({len(text)} digits)"


def _describe(expr: Expr, value: int) -> str:
    return str(value) if isinstance(expr, Num) else f"{expr}={value}"


def _wrap(expr: Expr) -> str:
    return f"({expr})" if isinstance(expr, BinOp) else str(expr)
