"""Checking a pipeline's text for lint warnings, for the lint tests."""

import tracer


def check(text: str, dims: dict | None = None):
    return tracer.loads(text, "t.yaml").check(dims)


def codes(text: str, dims: dict | None = None) -> set[str]:
    return {d.code for d in check(text, dims).warnings}


def one_warning(text: str, code: str, at: str, dims: dict | None = None):
    """The single warning of ``text``: ``code``, on the line holding ``at``."""
    [d] = check(text, dims).warnings
    line = next(i for i, row in enumerate(text.splitlines(), 1) if at in row)
    assert (d.code, d.position.line) == (code, line), str(d)
    return d
