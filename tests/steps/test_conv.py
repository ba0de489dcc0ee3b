"""Convolutions (conv1d, conv2d) against torch.nn.functional."""

from __future__ import annotations

import pytest
import torch.nn.functional as F

import tracer
from tests.conftest import assert_flops_as_counted, covers, pipeline_text
from tests.kinds import agrees, close, trace_of

PIXELS = "x: {shape: [B, 3, H, W], init: randn}"
PATCH = "w: {shape: [d, 3, P, P], init: randn}\nb: {shape: [d], init: randn}"
DIMS = "{B: 2, H: 8, W: 12, P: 4, d: 6}"


@covers("conv2d")
def test_conv2d_patch_embedding_counts_patches_symbolically():
    t = trace_of("- {id: y, op: conv2d, input: x, weight: w, bias: b, stride: P}", inputs=PIXELS, params=PATCH, dims=DIMS)
    x, w, b = t["x"].tensor, t["w"].tensor, t["b"].tensor
    assert close(t["y"].tensor, F.conv2d(x, w, b, stride=4), atol=1e-5)
    assert t["y"].symbolic == "(B, d, H // P, W // P)" and t["y"].shape == (2, 6, 2, 3)


@pytest.mark.parametrize(
    "fields, keywords",
    [
        ("padding: same", {"padding": "same"}),
        ("padding: [1, 2], dilation: [1, 2], stride: [2, 1]", {"padding": (1, 2), "dilation": (1, 2), "stride": (2, 1)}),
        ("padding: valid, stride: 3", {"stride": 3}),
    ],
)
def test_conv2d_stride_padding_and_dilation_as_torch(fields, keywords):
    t = trace_of(f"- {{id: y, op: conv2d, input: x, weight: w, {fields}}}", inputs=PIXELS, params=PATCH, dims=DIMS)
    assert close(t["y"].tensor, F.conv2d(t["x"].tensor, t["w"].tensor, **keywords), atol=1e-5)


@covers("conv1d")
def test_conv1d_whisper_front_end():
    """Whisper: conv (k3, p1) → gelu → conv (k3, s2, p1) → gelu, halving the frames."""
    t = trace_of(
        """
        - {id: c1, op: conv1d, input: mel, weight: w1, bias: b1, padding: 1}
        - {id: g1, op: gelu}
        - {id: c2, op: conv1d, weight: w2, bias: b2, stride: 2, padding: 1}
        """,
        inputs="mel: {shape: [B, M, L], init: randn}",
        params="w1: {shape: [d, M, 3], init: randn}\nb1: {shape: [d], init: randn}\n"
        "w2: {shape: [d, d, 3], init: randn}\nb2: {shape: [d], init: randn}",
        dims="{B: 2, M: 5, P: 5, L: 2 * P, d: 4}",
    )
    mel, w1, b1, w2, b2 = (t[n].tensor for n in ("mel", "w1", "b1", "w2", "b2"))
    expected = F.conv1d(F.gelu(F.conv1d(mel, w1, b1, padding=1)), w2, b2, stride=2, padding=1)
    assert close(t["c2"].tensor, expected, atol=1e-5)
    # (L + 2 - 3 + 2) // 2 = (2·P + 1) // 2: the floor is P for every P, and the shape says so
    assert t["c1"].symbolic == "(B, d, L)" and t["c2"].symbolic == "(B, d, P)" and t["c2"].shape == (2, 4, 5)


def test_conv1d_groups_dilation_and_unbatched_input():
    t = trace_of(
        "- {id: y, op: conv1d, input: x, weight: w, groups: 2, dilation: 2, padding: same}",
        inputs="x: {shape: [4, 9], init: randn}",
        params="w: {shape: [6, 2, 3], init: randn}",
    )
    assert close(t["y"].tensor, F.conv1d(t["x"].tensor, t["w"].tensor, groups=2, dilation=2, padding="same"), atol=1e-5)
    assert t["y"].shape == (6, 9)


@pytest.mark.parametrize("order", [[0, 3, 1, 2], [0, 1, 3, 2]])
def test_conv2d_output_layout_follows_a_channels_last_input(order):
    """An (B, H, W, C) image permuted to (B, C, H, W) is channels-last: torch's convolution then
    makes a channels-last output, and the shape rule says so."""
    trace = agrees(
        f"""
        - {{id: p, op: permute, input: x, dims: {order}}}
        - {{id: y, op: conv2d, input: p, weight: w, stride: 2}}
        """,
        "x: {shape: [2, 8, 8, 3], init: randn}\nw: {shape: [6, 3, 2, 2], init: randn}"
        if order[1] == 3
        else "x: {shape: [2, 3, 8, 8], init: randn}\nw: {shape: [6, 3, 2, 2], init: randn}",
    )
    assert trace["y"].contiguous == (order[1] != 3)


@pytest.mark.parametrize(
    "step, params, code, found",
    [
        ("{id: y, op: conv2d, input: x, weight: w}", "w: {shape: [6, 4, 2, 2], init: randn}", "conv-channels", "expects 4 input channels"),
        ("{id: y, op: conv2d, input: x, weight: w, groups: 2}", "w: {shape: [6, 3, 2, 2], init: randn}", "conv-groups", "groups=2"),
        ("{id: y, op: conv2d, input: x, weight: w}", "w: {shape: [6, 3, 9, 2], init: randn}", "conv-shape", "larger than"),
        (
            "{id: y, op: conv2d, input: x, weight: w, stride: 2, padding: same}",
            "w: {shape: [6, 3, 2, 2], init: randn}",
            "conv-field",
            "stride 1",
        ),
        ("{id: y, op: conv2d, input: x, weight: w, stride: [1, 2, 3]}", "w: {shape: [6, 3, 2, 2], init: randn}", "conv-field", "3 values"),
        ("{id: y, op: conv1d, input: x, weight: w}", "w: {shape: [6, 3, 2], init: randn}", "conv-shape", "(B, C_in, L)"),
        ("{id: y, op: conv2d, input: x, weight: w}", "w: {shape: [0, 3, 2, 2], init: randn}", "conv-channels", "no output channels"),
    ],
)
def test_conv_errors_are_located(step, params, code, found):
    text = pipeline_text(f"- {step}", inputs="x: {shape: [2, 3, 8, 8], init: randn}", params=params)
    with pytest.raises(tracer.TracerError) as info:
        tracer.loads(text, "c.yaml")
    assert info.value.code == code and found in str(info.value) and "c.yaml:" in str(info.value), str(info.value)


def test_conv_flops_count_each_group_once():
    assert_flops_as_counted(
        pipeline_text(
            "- {id: y, op: conv2d, input: x, weight: w, groups: 3, padding: 1}",
            inputs="x: {shape: [2, 6, 8, 8], init: randn}",
            params="w: {shape: [9, 2, 3, 3], init: randn}",
        )
    )
