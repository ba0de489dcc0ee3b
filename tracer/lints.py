"""Attention lints: warnings about pipelines that run but are probably wrong."""

from __future__ import annotations

from .errors import Diagnostic


def dead_steps(analysis) -> list[Diagnostic]:
    """A step whose output nobody reads and that is not an output (tutorial 003's dropout)."""
    graph, outputs = analysis.graph.graph, set(analysis.outputs)
    found = []
    for step_id, i in analysis.graph.index.items():
        if step_id in outputs or step_id not in graph or graph.out_degree(step_id):
            continue
        found.append(analysis.source.error(("steps", i), "dead-step", "its output is never used and it is not an output; "
                                           "was its result meant to replace its input (e.g. `x = dropout(x)`)?", step_id,
                                           prefer_key=True, severity="warning"))
    return found


LINTS = [dead_steps]


def run_lints(analysis) -> list[Diagnostic]:
    if analysis.errors:
        return []
    return [d for lint in LINTS for d in lint(analysis)]
