"""Lints: warnings about pipelines whose shapes are right, that run, and that are probably wrong.

A lint is one registered class (``@register``): its ``code``, a docstring that is its section of
docs/lints.md (what it finds, why it matters, the fix), the example that reproduces it
(``pipelines/lint_examples/NAME.yaml``) and the fixed twin that must check clean
(``pipelines/lint_examples/fixed/NAME.yaml``), and ``check(analysis)``, which reads the finished
static analysis (nodes, the attention core; no torch, nothing runs). ``python -m tracer.docgen
docs`` writes docs/lints.md from the registry.
"""

from __future__ import annotations

from ...core.errors import Diagnostic
from . import (
    axes,
    config,
    direction,
    heads,
    masks,
    norms,
    numerics,
    order,
    padding,
    parallel,
    patterns,
    positions,
    projections,
    scores,
    sequence,
    structure,
)
from .registry import REGISTERED, Lint

#: every lint by code, by subject (the docs' order)
MODULES = (
    structure,
    axes,
    scores,
    masks,
    padding,
    direction,
    heads,
    positions,
    sequence,
    config,
    patterns,
    projections,
    norms,
    numerics,
    order,
    parallel,
)
LINTS: dict[str, Lint] = {code: lint for module in MODULES for code, lint in REGISTERED.items() if type(lint).__module__ == module.__name__}


def run_lints(analysis) -> list[Diagnostic]:
    """Every lint's warnings (the caller runs lints on error-free analyses)."""
    return [d for lint in LINTS.values() for d in lint.check(analysis)]


__all__ = ["LINTS", "Lint", "run_lints"]
