"""Declared tensors: each ``init:`` creates what torch would, and bad declarations are located errors."""

import torch

from tests.conftest import tracer_cli
from tests.kinds import trace_of


def test_linear_init_matches_nn_linear_bit_for_bit():
    t = trace_of(
        "- {id: y, op: linear, weight: W, bias: b}",
        inputs="x: {shape: [2, 3], init: randn}",
        params="W: {shape: [5, 3], init: linear, seed: 7}\nb: {shape: [5], init: linear, fan_in: 3}",
    )
    torch.manual_seed(7)
    reference = torch.nn.Linear(3, 5)
    assert torch.equal(t["W"].tensor, reference.weight.detach())
    assert torch.equal(t["b"].tensor, reference.bias.detach())


def test_tokens_build_tutorial_000_dictionary():
    t = trace_of(
        "- {id: ids2, op: index, input: ids, dim: 0, start: 0, stop: 8}",
        inputs="ids: {shape: [8], tokens: {text: 'My shoes are small, my feet are big.', remove: [',']}}",
    )
    assert t["ids"].tensor.tolist() == [0, 6, 2, 7, 5, 4, 2, 3]


def test_fan_in_is_checked_statically(write):
    path = write(
        "name: t\ndims: {N: 3}\ninputs:\n  x: {shape: [N], init: randn}\nparams:\n"
        "  b: {shape: [N], init: linear, fan_in: nope}\nsteps:\n  - {id: y, op: add, inputs: [x, b]}\n"
    )
    for command in ("check", "run"):
        proc = tracer_cli(command, path)
        assert proc.returncode == 1 and proc.stderr.startswith(f"{path}:6:41: error[unknown-dim]: 'b': fan_in: unknown dim 'nope'")


def test_eye_is_torch_eye_and_only_two_dimensional(write):
    t = trace_of(
        "- {id: y, op: matmul, inputs: [x, I]}",
        inputs="x: {shape: [2, 3], init: randn}\nI: {shape: [3, 4], init: eye}\nmask: {shape: [3, 3], init: eye, dtype: bool}",
    )
    assert torch.equal(t["I"].tensor, torch.eye(3, 4)) and torch.equal(t["mask"].tensor, torch.eye(3, 3, dtype=torch.bool))
    assert torch.equal(t["y"].tensor, t["x"].tensor @ torch.eye(3, 4))
    path = write("name: t\ninputs:\n  e: {shape: [2, 3, 3], init: eye}\nsteps:\n  - {id: y, op: relu, input: e}\n")
    result = tracer_cli("check", str(path))
    assert result.returncode == 1 and "init: eye makes a 2-d (n, m) matrix, the shape has 3 dims" in result.stderr
