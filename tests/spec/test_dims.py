"""Dim expressions: parsed by an allow-list, never evaluated by Python; cycles, overflow and overrides."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest

import tracer
from tests.conftest import PIPELINES
from tracer.core.errors import TracerError

GOOD = (PIPELINES / "causal_mha.yaml").read_text()


FAST = 3.0  # CPU seconds (not wall clock, so a loaded machine does not fail them); each case takes well under one


def refused(text: str | bytes, tmp_path: Path, code: str | None = None, name: str = "p.yaml") -> TracerError:
    """Load ``text`` from a file: it must raise a located TracerError, fast, one line per diagnostic."""
    path = tmp_path / name
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    started = time.process_time()
    with pytest.raises(TracerError) as info:
        tracer.load(path)
    elapsed = time.process_time() - started
    assert elapsed < FAST, f"took {elapsed:.1f} s to refuse"
    message = str(info.value)
    for line in message.splitlines():
        assert re.match(re.escape(str(path)) + r"(:\d+:\d+)?: error\[", line), line
    if code is not None:
        assert code in {d.code for d in info.value.diagnostics}, message
    return info.value


def with_dims(extra: str) -> str:
    return GOOD.replace("  Dh: d_model // H  # head width: each head sees Dh of the d_model features", f"  Dh: d_model // H\n{extra}")


HOSTILE_DIMS = [
    ("__import__('os').system('touch {marker}')", "a call"),
    ("open('{marker}', 'w')", "a call"),
    ("T.real", "attribute access"),
    ("T.__class__", "attribute access"),
    ("().__class__.__bases__", "attribute access"),
    ("T[0]", "a subscript"),
    ("__builtins__", "not allowed"),
    ("T ** 2", "'**'"),
    ("9 ** 9 ** 9 ** 9", "'**'"),
    ("lambda: 1", "Lambda"),
    ("[T for T in T]", "ListComp"),
    ("T if T else 1", "IfExp"),
    ("T / 2", "'/'"),
    ("1e308", "non-integer"),
    ("T << 70", "LShift"),
    ("99999999999999999999999", "too large"),
    ("2 * 4611686018427387904", "overflows"),
    ("T * 2305843009213693952 * 4", "overflows"),
]


@pytest.mark.parametrize("expr, says", HOSTILE_DIMS)
def test_hostile_dim_expressions_are_refused_and_never_evaluated(expr, says, tmp_path):
    marker = tmp_path / "pwned"
    error = refused(with_dims(f"  E: {json.dumps(expr.format(marker=marker))}"), tmp_path)  # a JSON string is YAML
    assert says in str(error), str(error)
    assert not marker.exists()


def test_dim_expression_length_is_capped(tmp_path):
    refused(with_dims('  E: "' + " + ".join(["T"] * 100) + '"'), tmp_path, "invalid-value")
    refused(with_dims('  E: "' + "(" * 150 + "1" + ")" * 150 + '"'), tmp_path, "invalid-value")


def test_dim_cycles_and_division_by_zero(tmp_path):
    refused(with_dims("  E: F + 1\n  F: E * 2"), tmp_path, "dim-cycle")
    refused(with_dims("  E: T // (H - 2)"), tmp_path, "dim-divide")
    refused(with_dims("  E: T % 0"), tmp_path, "dim-divide")


def test_dim_override_recomputes_dependent_dims_and_refuses_derived(tmp_path):
    import tracer

    pipeline = tracer.load(PIPELINES / "causal_mha.yaml")
    t = pipeline.run(dims={"d_model": 8, "T": 3})
    assert t.dims["Dh"] == 4 and t["scores"].shape == (2, 2, 3, 3)
    with pytest.raises(tracer.TracerError, match=r"'Dh' is derived \(d_model // H\)"):
        pipeline.run(dims={"Dh": 3})
    with pytest.raises(tracer.TracerError, match="d_model=6 is not divisible by H=4"):
        pipeline.run(dims={"d_model": 6, "H": 4})
