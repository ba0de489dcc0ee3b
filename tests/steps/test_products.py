"""Matrix products (matmul, bmm, einsum) against plain torch."""

from __future__ import annotations

import pytest
import torch

import tracer
from tests.conftest import covers, pipeline_text
from tests.kinds import X, agrees, close, trace_of


@covers("matmul")
def test_matmul_broadcasts_like_torch():
    t = trace_of("- {id: y, op: matmul, inputs: [x, w]}", inputs=X + "\nw: {shape: [4, 6], init: randn}")
    assert close(t["y"].tensor, torch.matmul(t["x"].tensor, t["w"].tensor))
    assert t["y"].shape == (2, 3, 6)


def test_matmul_vector_operands():
    t = trace_of("- {id: y, op: matmul, inputs: [m, v]}", inputs="m: {shape: [3, 4], init: randn}\nv: {shape: [4], init: randn}")
    assert close(t["y"].tensor, t["m"].tensor @ t["v"].tensor)


@covers("bmm")
def test_bmm():
    t = trace_of("- {id: y, op: bmm, inputs: [a, b]}", inputs="a: {shape: [3, 2, 4], init: randn}\nb: {shape: [3, 4, 5], init: randn}")
    assert close(t["y"].tensor, torch.bmm(t["a"].tensor, t["b"].tensor))


@covers("einsum")
def test_einsum_shapes_values_and_errors():
    t = trace_of(
        """
        - {id: scores, op: einsum, inputs: [q, k], equation: 'bqhd,bkhd->bhqk'}
        - {id: implicit, op: einsum, inputs: [q, k], equation: 'bqhd,bkhd'}
        - {id: batched, op: einsum, inputs: [q, w], equation: '...d,de->...e'}
        """,
        inputs="q: {shape: [B, T, H, Dh], init: randn}\nk: {shape: [B, S, H, Dh], init: randn}\nw: {shape: [Dh, E], init: randn}",
        dims="{B: 2, T: 3, S: 5, H: 2, Dh: 4, E: 6}",
    )
    q, k, w = t["q"].tensor, t["k"].tensor, t["w"].tensor
    assert close(t["scores"].tensor, torch.einsum("bqhd,bkhd->bhqk", q, k), atol=1e-5)
    assert t["scores"].symbolic == "(B, H, T, S)"
    assert close(t["implicit"].tensor, torch.einsum("bqhd,bkhd", q, k), atol=1e-5) and t["implicit"].symbolic == "(S, T)"
    assert close(t["batched"].tensor, torch.einsum("...d,de->...e", q, w), atol=1e-5) and t["batched"].symbolic == "(B, T, H, E)"
    bad = pipeline_text(
        "- {id: s, op: einsum, inputs: [q, k], equation: 'bhqd,bhkd->bhqk'}",
        inputs="q: {shape: [2, 2, 3, 4], init: randn}\nk: {shape: [2, 2, 3, 5], init: randn}",
    )
    with pytest.raises(tracer.TracerError) as info:
        tracer.loads(bad, "e.yaml")
    assert info.value.code == "broadcast" and "einsum letter 'd'" in str(info.value) and "e.yaml:6:51" in str(info.value)


X23 = "x: {shape: [2, 3], init: randn}"


@pytest.mark.parametrize("equation", ["ij->ij", "ij->ji", "ij", "ij->i"])
def test_einsum_is_always_a_fresh_contiguous_tensor(equation):
    trace = agrees(f"- {{id: e, op: einsum, inputs: [x], equation: '{equation}'}}", X23)
    assert trace["e"].view_of is None and trace["e"].contiguous
