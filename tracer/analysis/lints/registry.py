"""The lint registry: what a lint is, and how it is registered and run."""

from __future__ import annotations

import inspect
from collections.abc import Iterable
from typing import ClassVar

from ...core.errors import Diagnostic

LINTS: dict[str, Lint] = {}


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
    LINTS[cls.code] = cls()
    return cls


def warning(analysis, node, code: str, message: str, field: str | None = None) -> Diagnostic:
    """A lint's warning at a step (or one of its fields)."""
    return analysis.error(node, code, message, field, severity="warning")


def run_lints(analysis) -> list[Diagnostic]:
    """Every lint's warnings, in registration order (the caller runs lints on error-free analyses)."""
    return [d for lint in LINTS.values() for d in lint.check(analysis)]
