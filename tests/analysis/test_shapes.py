"""The shape pass: every independent error located, with the shapes, the bindings and the fix."""

from __future__ import annotations

import json
import re

import pytest
import torch

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


def test_a_wrong_head_dim_is_also_an_error_at_the_dims_line_that_defines_it():
    """nanoGPT's `hs: C // 2` where it meant `C // n_head`: the three views that split heads fail,
    and the line to fix is the dim's, which names the expression that fits."""
    text = """\
name: heads
dims:
  B: 2
  T: 6
  C: 8
  n_head: 4
  hs: C // 2
inputs:
  x: {shape: [B, T, C], init: randn}
steps:
  - {id: q, op: view, input: x, shape: [B, T, n_head, hs]}
  - {id: k, op: view, input: x, shape: [B, T, n_head, hs]}
  - {id: v, op: reshape, input: x, shape: [B, T, n_head, hs]}
"""
    with pytest.raises(TracerError) as info:
        tracer.loads(text, "heads.yaml")
    lines = str(info.value).splitlines()
    assert [line.split(": ")[1] for line in lines] == ["error[view-shape]"] * 3 + ["error[dim-value]"]
    assert lines[-1] == "heads.yaml:7:3: error[dim-value]: hs: C // 2 is 4, but steps 'q', 'k', 'v' need hs = 2: write `hs: C // n_head`"
    fixed = tracer.loads(text.replace("hs: C // 2", "hs: C // n_head")).run()
    assert fixed["q"].shape == (2, 6, 4, 2)  # the expression the error wrote is the one that fits


def test_a_view_that_fails_for_a_base_dim_blames_no_dims_line():
    text = """\
name: base
dims: {B: 2, T: 6, C: 8, n_head: 3}
inputs:
  x: {shape: [B, T, C], init: randn}
steps:
  - {id: q, op: view, input: x, shape: [B, T, n_head, 2]}
"""
    with pytest.raises(TracerError) as info:
        tracer.loads(text)
    assert [d.code for d in info.value.diagnostics] == ["view-shape"]


@pytest.mark.parametrize(
    "step", ["{id: masked, op: mask, input: scores, mask: pad, polarity: keep}", "{id: masked, op: add, inputs: [scores, pad]}"]
)
def test_a_padding_mask_that_does_not_broadcast_against_scores_gets_the_reshape_that_does(step):
    dtype = "bool" if "op: mask" in step else "float32"
    values = [[True] * 4 + [False] * 2, [True] * 6] if dtype == "bool" else [[0.0] * 4 + [-1.0] * 2, [0.0] * 6]
    text = f"""\
name: padding
dims: {{B: 2, H: 4, T: 6}}
inputs:
  scores: {{shape: [B, H, T, T], init: randn}}
  pad: {{shape: [B, T], dtype: {dtype}, values: {json.dumps(values)}}}  # padding: the last keys of the first sequence
steps:
  - {step}
"""
    with pytest.raises(TracerError) as info:
        tracer.loads(text)
    [d] = info.value.diagnostics
    assert d.code == "broadcast" and d.message.endswith("(B, T) -> (B, 1, 1, T), e.g. a view step with shape: [B, 1, 1, T]"), d.message
    view = "  - {id: pad4, op: view, input: pad, shape: [B, 1, 1, T]}\n"
    fixed = tracer.loads(text.replace("steps:\n", "steps:\n" + view).replace("pad]", "pad4]").replace("mask: pad,", "mask: pad4,"))
    trace = fixed.run(keep_values=True)
    pad = trace["pad"].tensor
    expected = (
        trace["scores"].tensor + pad[:, None, None, :]
        if dtype == "float32"
        else trace["scores"].tensor.masked_fill(~pad[:, None, None, :], float("-inf"))
    )
    assert torch.equal(trace["masked"].tensor, expected)


def test_operands_whose_dims_cannot_line_up_get_no_reshape_hint():
    text = """\
name: apart
dims: {T: 3, D: 5}
inputs:
  a: {shape: [T, D], init: randn}
  b: {shape: [D, T], init: randn}
steps:
  - {id: c, op: add, inputs: [a, b]}
"""
    with pytest.raises(TracerError) as info:
        tracer.loads(text)
    assert info.value.code == "broadcast" and " — " not in str(info.value)
