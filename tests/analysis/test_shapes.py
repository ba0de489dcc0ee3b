"""The shape pass: every independent error located, with the shapes, the bindings and the fix."""

from __future__ import annotations

import re

import pytest

import tracer
from tests.conftest import PIPELINES, tracer_cli
from tracer.core.errors import TracerError


def test_a_batch_mismatch_names_both_operands_and_their_shapes():
    text = """\
name: kt
dims: {B: 2, T: 5, H: 3, Dh: 4}
inputs:
  q: {shape: [B, H, T, Dh], init: randn}
  k: {shape: [B, T, H, Dh], init: randn}
steps:
  - {id: k_t, op: transpose, input: k, dims: [-2, -1]}
  - {id: scores, op: matmul, inputs: [q, k_t]}
"""
    with pytest.raises(TracerError) as info:
        tracer.loads(text)
    message = str(info.value)
    assert info.value.code == "matmul-batch"
    for part in ("'q' (B, H, T, Dh) [2, 3, 5, 4]", "'k_t' (B, T, Dh, H) [2, 5, 4, 3]", "H=3", "T=5", "transpose"):
        assert part in message, message


@pytest.mark.parametrize(
    "text, code",
    [
        (
            "dtype: float16\ninputs: {x: {shape: [2, 2], init: randn}}\nsteps: [{id: y, op: mask, input: x, causal: true, fill: -1.0e9}]",
            "mask-fill",
        ),
        ("inputs: {x: {shape: [2], init: full, value: 1.0e+9, dtype: float16}}\nsteps: [{id: y, op: relu, input: x}]", "tensor-source"),
    ],
)
def test_a_number_the_dtype_cannot_hold_is_a_located_error(text, code):
    with pytest.raises(TracerError) as info:
        tracer.loads("name: t\n" + text, "t.yaml").run()
    assert (
        info.value.code == code
        and "overflows" in str(info.value)
        and "float16" in str(info.value)
        and str(info.value).startswith("t.yaml:")
    )


GOOD = (PIPELINES / "causal_mha.yaml").read_text()


def test_check_reports_every_independent_error(write):
    text = GOOD.replace("inputs: [q_h, k_t]", "inputs: [q_h, k_h]").replace(
        "{id: v_heads, op: view, input: v, shape: [B, T, H, Dh]", "{id: v_heads, op: view, input: v, shape: [B, T, H, d_model]"
    )
    proc = tracer_cli("check", write(text))
    codes = re.findall(r"error\[([\w-]+)\]", proc.stderr)
    assert sorted(codes) == ["matmul-shape", "view-shape"], proc.stderr


def test_matmul_error_states_shapes_bindings_and_fix(write):
    text = GOOD.replace("inputs: [q_h, k_t]", "inputs: [q_h, k_h]")
    proc = tracer_cli("check", write(text))
    assert (
        "step 'scores': matmul needs (…, n, Dh) @ (…, Dh, m), got 'q_h' (B, H, T, Dh) [2, 2, 6, 2] @ 'k_h' (B, H, T, Dh) [2, 2, 6, 2]"
        in proc.stderr
    )
    assert "[B=2, T=6, d_model=4, H=2, Dh=2] — transpose 'k_h' over dims -2, -1?" in proc.stderr
