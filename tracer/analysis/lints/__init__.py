"""Lints: warnings about pipelines whose shapes are right, that run, and that are probably wrong.

A lint is one registered class (``@register``): its ``code``, a docstring that is its section of
docs/lints.md (what it finds, why it matters, the fix), the example that reproduces it
(``pipelines/lint_examples/NAME.yaml``) and the fixed twin that must check clean
(``pipelines/lint_examples/fixed/NAME.yaml``), and ``check(analysis)``, which reads the finished
static analysis (nodes, the attention core; no torch, nothing runs). ``python -m tracer.docgen
docs`` writes docs/lints.md from the registry.
"""

from __future__ import annotations

from . import heads, masks, scores, structure  # noqa: F401, I001  (registration order: the docs' order)
from .registry import LINTS, Lint, run_lints

__all__ = ["LINTS", "Lint", "run_lints"]
