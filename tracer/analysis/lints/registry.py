"""The lint registry: what a lint is, and how it is registered and run."""

from __future__ import annotations

import inspect
from collections.abc import Iterable
from typing import ClassVar

from ...core.errors import Diagnostic

REGISTERED: dict[str, Lint] = {}


class Lint:
    """One lint (a subclass per code)."""

    code: ClassVar[str]
    example: ClassVar[str]  # the file stem of its example and of its fixed twin
    origin: ClassVar[str]  # where the bug comes from: "tutorial 003", "grouped-query attention (Llama)"

    def check(self, analysis) -> Iterable[Diagnostic]:  # pragma: no cover - every lint overrides
        raise NotImplementedError

    @classmethod
    def doc(cls) -> str:
        return inspect.cleandoc(cls.__doc__ or "")


def register(cls: type[Lint]) -> type[Lint]:
    REGISTERED[cls.code] = cls()
    return cls


def warning(analysis, node, code: str, message: str, field: str | None = None) -> Diagnostic:
    """A lint's warning at a step (or one of its fields)."""
    return analysis.error(node, code, message, field, severity="warning")


def show(analysis, tensor_id: str) -> str:
    """``(B, H, T, T) [2, 2, 6, 6]``: a tensor as messages name it."""
    meta = analysis.meta(tensor_id)  # a composite's id names its last record
    return f"{meta.symbolic} {meta.concrete}"
