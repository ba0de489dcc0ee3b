"""Dim expressions: parsed by an allow-list, never evaluated by Python; cycles, overflow and overrides."""

from __future__ import annotations

import json
from collections import Counter

import pytest

import tracer
from tests.conftest import PIPELINES, refused
from tracer.core import dimexpr
from tracer.core.symbolic import DimAlgebra, resolve
from tracer.presentation.export import export_source

GOOD = (PIPELINES / "causal_mha.yaml").read_text()


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

    pipeline = tracer.load(PIPELINES / "causal_mha.yaml")
    t = pipeline.run(dims={"d_model": 8, "T": 3})
    assert t.dims["Dh"] == 4 and t["scores"].shape == (2, 2, 3, 3)
    with pytest.raises(tracer.TracerError, match=r"'Dh' is derived \(d_model // H\)"):
        pipeline.run(dims={"Dh": 3})
    with pytest.raises(tracer.TracerError, match="d_model=6 is not divisible by H=4"):
        pipeline.run(dims={"d_model": 6, "H": 4})


# ---------------------------------------------------------------- the dim algebra on its own


def test_one_walker_evaluates_names_and_prints_every_expression():
    expr = dimexpr.parse("-(d_model // H) + 3 * (T % 2)")
    assert dimexpr.evaluate(expr, {"d_model": 8, "H": 2, "T": 5}) == -1
    assert dimexpr.names(expr) == {"d_model", "H", "T"}
    assert str(expr) == "-(d_model // H) + (3 * (T % 2))" and dimexpr.parse(str(expr)) == expr
    assert dimexpr.fold(expr, dimexpr.Source({"H": "self.H"})) == "-(d_model // self.H) + (3 * (T % 2))"
    assert [str(node) for node in dimexpr.fold(expr, dimexpr.Divisions())] == ["d_model // H", "T % 2"]


def test_symbolic_dims_reduce_exactly_and_print_as_declared_names():
    alg = DimAlgebra({"d_model": 8, "H": 2, "Dh": "d_model // H", "T": 6, "pair": "2 * T"})
    assert str(alg.mul(alg.dim("H"), alg.dim("Dh"))) == "d_model" and alg.dim("H * Dh").value == 8
    assert str(alg.dim("T + T")) == "pair" and str(alg.dim("d_model // H * H")) == "d_model"
    assert alg.dim("T % 4").poly == alg.dim("(T) % 4").poly and alg.dim("T % 4").value == 2  # % stays an opaque symbol
    assert not alg.dim("T").same_symbol(alg.dim("6")) and alg.dim("T").value == alg.dim("6").value


def test_a_dim_no_declared_name_equals_prints_as_the_file_wrote_it():
    alg = DimAlgebra({"d_model": 8, "H": 4, "H_kv": 2, "Dh": "d_model // H", "T": 6})
    written = alg.dim("H_kv * Dh")
    assert str(written) == "H_kv * Dh" and str(alg.dim("T % 4")) == "T % 4"
    # computed, not written (a merge of (H_kv, Dh)): built from the labels, not from the base dims
    merged = alg.mul(alg.dim("H_kv"), alg.dim("Dh"))
    assert str(merged) == "H_kv * Dh" and merged == written and merged.poly == alg.dim("H_kv*d_model // H").poly
    assert str(alg.add(alg.dim("T"), alg.dim("Dh - 1"))) == "T + (Dh - 1)"
    assert str(alg.add(alg.dim("T"), alg.dim("T - 1"))) == "2*T - 1"  # unless the polynomial says it shorter
    assert str(alg.mul(alg.dim("T - 1"), alg.dim("Dh"))) == "(T - 1) * Dh"
    # one opaque quotient, however its operands are spelled
    assert alg.floordiv(merged, alg.dim("3")).same_symbol(alg.floordiv(alg.dim("H_kv*d_model // H"), alg.dim("3")))


@pytest.mark.parametrize("length", [9, 10, 13, 16])
def test_strided_convolutions_print_one_division_that_holds_at_other_lengths(length, tmp_path):
    """Two stride-2 convs: ((L + 1) // 2 - 3) // 2 + 1 is the Laurent polynomial L/4 - 1/4,
    printed as one division of a sum, (L - 1) // 4, not as L // 4 - 1 // 4."""
    (tmp_path / "c.yaml").write_text(
        f"name: c\ndims: {{C: 4, L: {length}}}\ninputs:\n  x: {{shape: [1, C, L], init: randn}}\nparams:\n"
        "  w: {shape: [C, C, 3], init: randn}\nsteps:\n  - {id: y, op: conv1d, input: x, weight: w, stride: 2, padding: 1}\n"
        "  - {id: z, op: conv1d, input: y, weight: w, stride: 2}\n"
    )
    trace = tracer.load(tmp_path / "c.yaml").run()
    assert trace["y"].shape[-1] == (length + 1) // 2 and trace["z"].shape[-1] == ((length + 1) // 2 - 3) // 2 + 1
    if length % 2:  # the algebra keeps the exact quotients: (L + 1) // 2, then (L - 1) // 4
        assert trace["z"].symbolic == "(1, C, (L - 1) // 4)" and (length - 1) // 4 == trace["z"].shape[-1]


def test_dims_resolve_in_dependency_order_however_the_file_orders_them():
    exprs = {name: dimexpr.parse(text) for name, text in {"c": "b + 1", "b": "a * 2", "a": "3"}.items()}
    assert list(resolve(exprs)) == ["a", "b", "c"] and resolve(exprs) == {"a": 3, "b": 6, "c": 7}
    assert resolve(exprs, {"a": 10}) == {"a": 10, "b": 20, "c": 21}


def test_a_chain_of_thousands_of_derived_dims_needs_no_recursion():
    count = 2000  # each dim the one after it plus one, declared last-first: the deepest walk there is
    exprs = {f"d{i}": dimexpr.parse(f"d{i + 1} + 1") for i in range(count)} | {f"d{count}": dimexpr.parse("1")}
    values = resolve(exprs)
    assert values["d0"] == count + 1 and DimAlgebra({k: str(v) for k, v in exprs.items()}).dim("d0").value == count + 1


def test_each_dim_is_parsed_once_by_load_check_and_export(monkeypatch):
    """Thousands of derived dims overflow any fixed-size parse cache, so every layer that reads a
    dim must take it from the spec, parsed once: counted here without the cache."""
    parses = Counter()
    uncached = dimexpr._parse_text.__wrapped__

    def counted(text):
        parses[text] += 1
        return uncached(text)

    monkeypatch.setattr(dimexpr, "_parse_text", counted)
    dims = "\n".join([f"  d{i}: d{i - 1} + 1" for i in range(49, 0, -1)] + ["  d0: 1"])
    pipeline = tracer.loads(f"name: n\ndims:\n{dims}\ninputs:\n  x: {{shape: [d49], init: randn}}\nsteps:\n  - {{id: y, op: tanh}}\n")
    export_source(pipeline)
    assert {parses[f"d{i - 1} + 1"] for i in range(1, 50)} == {1}
