"""Per-step ``allow: {code: reason}``: a lint a step trips on purpose, reported as allowed, with its
reason, so that a review still sees it; never silently dropped.

An allow that names no lint is an error (a typo would otherwise silence nothing and look fine);
one whose lint does not fire at that step is a warning (the reason has gone stale).
"""

from __future__ import annotations

import difflib
from dataclasses import replace

from ...core.errors import Diagnostic
from .registry import REGISTERED

#: warnings from the shape pass that an allow may also name
SHAPE_WARNINGS = ("dim-mismatch",)


def apply_allows(analysis, found: list[Diagnostic]) -> list[Diagnostic]:
    """``found`` with each allowed warning turned into an ``allowed`` note carrying its reason,
    plus the allows that are unknown or unused."""
    allows = {node.id: (node, node.step.allow) for node in analysis.nodes.values() if node.step.allow}
    if not allows:
        return found
    used: set[tuple[str, str]] = set()
    result = []
    for d in found:
        node_allow = allows.get(d.step or "")
        if d.severity == "warning" and node_allow and d.code in node_allow[1]:
            used.add((d.step, d.code))
            d = replace(d, severity="allowed", message=f"{d.message} — allowed: {node_allow[1][d.code]}")
        result.append(d)
    return result + list(_stale(analysis, allows, used))


def _stale(analysis, allows: dict, used: set[tuple[str, str]]):
    known = sorted(REGISTERED) + list(SHAPE_WARNINGS)
    for step_id, (node, allow) in allows.items():
        for code in allow:
            if code not in known:
                close = difflib.get_close_matches(code, known, n=1)
                hint = f"; did you mean '{close[0]}'?" if close else f" (lints: {', '.join(known)})"
                yield analysis.error(node, "unknown-lint", f"allow: '{code}' is not a lint{hint}", "allow")
            elif (step_id, code) not in used:
                message = f"allow: '{code}' does not fire at this step any more; remove the allow (its reason: {allow[code]})"
                yield analysis.error(node, "unused-allow", message, "allow", severity="warning")
