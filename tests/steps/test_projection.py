"""Projections (embed, linear) against nn.Embedding and nn.Linear."""

import pytest
import torch
import torch.nn.functional as F

from tests.conftest import covers
from tests.kinds import X, close, trace_of


@covers("embed")
def test_embed_looks_up_rows():
    t = trace_of(
        "- {id: e, op: embed, input: ids, weight: E}",
        inputs="ids: {shape: [5], values: [0, 3, 1, 3, 2], dtype: int64}",
        params="E: {shape: [4, 2], init: embedding}",
    )
    assert close(t["e"].tensor, t["E"].tensor[torch.tensor([0, 3, 1, 3, 2])])
    assert t["e"].symbolic_shape == ("5", "2")


@covers("linear")
@pytest.mark.parametrize("layout", ["out_in", "in_out"])
def test_linear_both_weight_layouts_with_bias(layout):
    shape = "[5, 4]" if layout == "out_in" else "[4, 5]"
    t = trace_of(
        f"- {{id: y, op: linear, weight: W, bias: b, layout: {layout}}}",
        inputs=X,
        params=f"W: {{shape: {shape}, init: randn}}\nb: {{shape: [5], init: randn}}",
    )
    x, w, b = t["x"].tensor, t["W"].tensor, t["b"].tensor
    expected = F.linear(x, w, b) if layout == "out_in" else x @ w + b
    assert close(t["y"].tensor, expected)
