"""Assertions for ordinary pytest tests, in symbolic or concrete terms.

>>> t = tracer.run("pipelines/causal_mha.yaml")      # doctest: +SKIP
>>> assert_shape(t, "scores", "B H T T")              # doctest: +SKIP
>>> assert_shape(t, "scores", (2, 2, 6, 6))           # doctest: +SKIP
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from .core import dimexpr
from .core.errors import Diagnostic, ExpectationError

if TYPE_CHECKING:
    from .presentation.trace import Trace


def assert_shape(trace: Trace, tensor_id: str, expected: str | Sequence[int | str]) -> None:
    """``expected`` is symbolic (``"B H T T"``, ``"B, T, d_model // H"``) bound against the run's
    dims, or a tuple of ints."""
    __tracebackhide__ = True
    record = trace[tensor_id]
    parts = _parts(expected)
    try:
        want = tuple(dimexpr.evaluate(dimexpr.parse(p), trace.dims) for p in parts)
    except dimexpr.DimError as exc:
        raise _failure(trace, tensor_id, f"cannot read the expected shape {expected!r}: {exc}") from None
    if want != record.shape:
        symbolic = "(" + ", ".join(map(str, parts)) + ")"
        raise _failure(
            trace, tensor_id, f"expected {symbolic} {list(want)}, found {record.symbolic} {list(record.shape)} {_bindings(trace)}"
        )


def assert_contiguous(trace: Trace, tensor_id: str, contiguous: bool = True) -> None:
    """The rule of ``expect: {contiguous: ...}``: torch's ``is_contiguous()``, and a layout that is
    row-major only because of size-1 dims meets both (a transposed (B, H, T, Dh) at T = 1)."""
    __tracebackhide__ = True  # a failure shows the test's line, not this helper's source
    from .analysis.expect import contiguity_problem  # the file format: not imported by every pytest run

    problem = contiguity_problem(tensor_id, trace.layout(tensor_id), contiguous)
    if problem:
        raise _failure(trace, tensor_id, problem)


def assert_view_of(trace: Trace, tensor_id: str, source_id: str | None) -> None:
    """``source_id`` is the tensor whose storage it must share; ``None`` asserts a fresh copy."""
    __tracebackhide__ = True
    record = trace[tensor_id]
    if record.view_of != source_id:
        want = f"a view of '{source_id}'" if source_id else "its own storage (a copy)"
        found = f"a view of '{record.view_of}'" if record.view_of else "its own storage"
        raise _failure(trace, tensor_id, f"expected {want}, found {found}")


def _parts(expected) -> list:
    """``"B H T T"`` splits on spaces, ``"(B, T, d_model // H)"`` on commas; tuples pass through."""
    if not isinstance(expected, str):
        return list(expected)
    text = expected.strip("()[] ")
    return [p.strip() for p in text.split(",")] if "," in text else text.split()


def _bindings(trace: Trace) -> str:
    return "[" + ", ".join(f"{k}={v}" for k, v in trace.dims.items()) + "]"


def _failure(trace: Trace, tensor_id: str, message: str) -> ExpectationError:
    """An assertion's failure, located at the step (or the declaration) that makes the tensor."""
    analysis = trace.analysis
    node = analysis.producer(analysis.record_of(tensor_id))
    if node is not None:
        return ExpectationError(analysis.error(node, "assert", f"'{tensor_id}': {message}"))
    section = "inputs" if tensor_id in analysis.pipeline.inputs else "params"
    return ExpectationError(analysis.source.error((section, tensor_id), "assert", f"'{tensor_id}': {message}", prefer_key=True))


@pytest.fixture
def trace_pipeline():
    """``trace_pipeline("pipelines/causal_mha.yaml", dims={"T": 8})`` → a Trace (values kept)."""

    def _trace(path: str | Path, dims: Mapping[str, int] | None = None, **kwargs) -> Trace:
        from .api import load  # the file format: not imported by every pytest run

        kwargs.setdefault("keep_values", True)
        return load(path).run(dims=dims, **kwargs)

    return _trace


__all__ = ["Diagnostic", "assert_contiguous", "assert_shape", "assert_view_of", "trace_pipeline"]
