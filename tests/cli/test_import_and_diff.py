"""`tracer import MODULE:FACTORY` and `tracer diff A B` from the command line."""

import json
import re
import textwrap

import pytest

from tests.conftest import PIPELINES, tracer_cli

MHA = PIPELINES / "causal_mha.yaml"

FACTORY = """
import torch
from torch import nn


class Attention(nn.Module):
    def __init__(self, d_model, heads):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.proj = nn.Linear(d_model, d_model)

    def forward(self, x):
        B, T, C = x.size()
        q, k, v = self.qkv(x).split(C, dim=2)
        q = q.view(B, T, self.heads, C // self.heads).transpose(1, 2)
        k = k.view(B, T, self.heads, C // self.heads).transpose(1, 2)
        v = v.view(B, T, self.heads, C // self.heads).transpose(1, 2)
        y = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).contiguous().view(B, T, C))


def make(d_model, heads):
    torch.manual_seed(0)
    return Attention(d_model, heads)
"""


def test_import_writes_a_pipeline_that_runs_as_the_module(tmp_path):
    (tmp_path / "mymodel.py").write_text(textwrap.dedent(FACTORY))
    done = tracer_cli("import", "mymodel:make", "--args", "[8, 2]", "--input", "x=2,5,8", "-o", "attention.yaml", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    last = done.stdout.strip().splitlines()[-1]
    assert last.startswith("max |pipeline - module| on the module's weights: ") and float(last.rsplit(" ", 1)[1]) <= 1e-5
    assert tracer_cli("check", "--strict", "attention.yaml", cwd=tmp_path).returncode == 0


def test_import_of_a_missing_factory_is_a_located_error(tmp_path):
    done = tracer_cli("import", "nowhere_to_be_found:make", "--input", "x=2,5,8", "-o", "a.yaml", cwd=tmp_path)
    assert done.returncode == 1 and done.stderr.startswith("nowhere_to_be_found:make: error[import-target]: cannot build the module")
    bad = tracer_cli("import", "m:f", "--input", "x=2,five", "-o", "a.yaml", cwd=tmp_path)
    assert bad.returncode == 2 and "expected NAME=SIZE,SIZE" in bad.stderr


HOSTILE_FACTORIES = """
def raises():
    raise RuntimeError("boom")


def not_a_module():
    return 3.0
"""


@pytest.mark.parametrize(
    "target, args, problem",
    [
        ("mymodel:make", "1", "--args must be a JSON list of arguments or an object of keywords, not 1"),
        ("mymodel:make", '"ab"', "--args must be a JSON list of arguments or an object of keywords"),
        ("mymodel:make", "[" * 5000 + "]" * 5000, "--args is not JSON"),
        ("mymodel:make", '{"d_model": "x", "heads": 2}', "cannot build the module: TypeError"),
        ("mymodel:make", "[1e400, 2]", "cannot build the module: TypeError"),
        ("hostile:raises", "[]", "cannot build the module: RuntimeError: boom"),
        ("hostile:not_a_module", "[]", "not_a_module returned float, not a torch.nn.Module"),
        ("..mymodel:make", "[]", "expected MODULE:FACTORY"),
        ("mymodel", "[]", "expected MODULE:FACTORY"),
        ("mymodel:make()", "[]", "expected MODULE:FACTORY"),
    ],
)
def test_a_bad_target_or_arguments_or_a_failing_factory_is_a_located_error(tmp_path, target, args, problem):
    """The factory is the user's own code: whatever it raises is reported as theirs, never as
    tracer's internal error (exit 3)."""
    (tmp_path / "mymodel.py").write_text(textwrap.dedent(FACTORY))
    (tmp_path / "hostile.py").write_text(HOSTILE_FACTORIES)
    done = tracer_cli("import", target, "--args", args, "--input", "x=2,5,8", "-o", "a.yaml", cwd=tmp_path)
    assert done.returncode == 1 and f"error[import-target]: {problem}" in done.stderr, done.stderr


@pytest.mark.parametrize(
    "spec, problem, code",
    [
        ("x=2,-5,8", "expected NAME=SIZE,SIZE", 2),
        ("x=100000000000,100000,8", "error[import-input]: [100000000000, 100000, 8] is over the memory budget", 1),
        ("x=0,99999999999999999999999,8", "error[import-input]: [0, 99999999999999999999999, 8] overflows torch's sizes", 1),
        ("x=0,4611686018427387904,8", "error[import-input]: [0, 4611686018427387904, 8] overflows torch's sizes", 1),
    ],
)
def test_an_example_input_of_no_size_or_too_large_a_size_is_refused_before_it_is_made(tmp_path, spec, problem, code):
    (tmp_path / "mymodel.py").write_text(textwrap.dedent(FACTORY))
    done = tracer_cli("import", "mymodel:make", "--args", "[8, 2]", "--input", spec, "-o", "a.yaml", cwd=tmp_path)
    assert done.returncode == code and problem in done.stderr, done.stderr


SOFTMAX_OF_INPUT = """
import torch


class Weights(torch.nn.Module):
    def forward(self, x):
        return torch.softmax(x, dim=-1)


def make():
    return Weights()
"""


def test_an_example_input_of_a_dtype_the_module_rejects_is_a_located_error(tmp_path):
    """torch.export captures on fake tensors, which accept a softmax of int64; the real example
    run that follows is where torch refuses it, and that is the input's fault, not tracer's."""
    (tmp_path / "weights.py").write_text(SOFTMAX_OF_INPUT)
    done = tracer_cli("import", "weights:make", "--input", "x=2,4,8:int", "-o", "a.yaml", cwd=tmp_path)
    assert done.returncode == 1 and "error[import-capture]: the module fails on the example inputs at File" in done.stderr, done.stderr
    assert 'weights.py", line 7, in forward' in done.stderr and "give --input the dtype its forward expects" in done.stderr
    assert tracer_cli("import", "weights:make", "--input", "x=2,4,8", "-o", "a.yaml", cwd=tmp_path).returncode == 0


def test_diff_names_changed_fields_shapes_params_and_the_first_divergent_tensor(tmp_path):
    changed = MHA.read_text().replace("{id: weights, op: softmax, dim: -1", "{id: weights, op: softmax, dim: -2")
    (tmp_path / "b.yaml").write_text(changed)
    done = tracer_cli("diff", str(MHA), str(tmp_path / "b.yaml"), "--values")
    assert done.returncode == 1, done.stderr  # as diff(1): 1 when they differ
    assert "~ step weights: dim -1 -> -2" in done.stdout and "values: the first tensor that differs is 'weights' (max abs " in done.stdout
    same = tracer_cli("diff", str(MHA), str(MHA), "--json")
    data = json.loads(same.stdout)
    assert same.returncode == 0 and data["same"] and data["totals"]["flops"][0] == data["totals"]["flops"][1] > 0


def test_diff_pairs_renamed_steps_and_params_by_structure_and_compares_values_through_the_pairs(tmp_path):
    renamed = MHA.read_text()
    for old, new in (("scores", "attn_scores"), ("W_q", "query_weight"), ("q_heads", "q_split")):
        renamed = re.sub(rf"\b{old}\b", new, renamed)
    (tmp_path / "renamed.yaml").write_text(renamed)
    done = tracer_cli("diff", str(MHA), str(tmp_path / "renamed.yaml"), "--values")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert {"= step scores -> attn_scores: matmul", "= param W_q -> query_weight", "= step q_heads -> q_split: view"} <= set(lines)
    assert not [line for line in lines[2:] if line[:1] in "-+~"] and lines[-2:] == [
        "values: every shared tensor agrees",
        "the same pipeline but for names",
    ]
    # a changed step keeps its partner: the change is a change, the name a rename
    (tmp_path / "changed.yaml").write_text(renamed.replace("{id: weights, op: softmax, dim: -1", "{id: probs, op: softmax, dim: -2"))
    data = json.loads(tracer_cli("diff", str(MHA), str(tmp_path / "changed.yaml"), "--json", "--values").stdout)
    assert data["changed_op"] == ["weights -> probs: dim -1 -> -2"] and data["added"] == data["removed"] == []
    assert data["diverges"] == "weights -> probs" and not data["same"]


K_T = "op: transpose, input: k_h, dims: [-2, -1]"


@pytest.mark.parametrize(
    ("old", "new"),
    [
        (K_T, "op: transpose, input: k_h, dims: [-1, -2]"),
        (K_T, "op: transpose, input: k_h, dims: [3, 2]"),
        (K_T, "op: permute, input: k_h, dims: [0, 1, 3, 2]"),  # a permute that swaps two axes is that transpose
        ("{id: weights, op: softmax, dim: -1", "{id: weights, op: softmax, dim: 3"),
    ],
)
def test_diff_reads_equivalent_spellings_of_axes_as_the_same_step(tmp_path, old, new):
    assert old in MHA.read_text()
    (tmp_path / "b.yaml").write_text(MHA.read_text().replace(old, new))
    data = json.loads(tracer_cli("diff", str(MHA), str(tmp_path / "b.yaml"), "--json").stdout)
    assert data["same"] and data["changed_op"] == [], data


def test_diff_still_reports_a_permute_that_moves_three_axes(tmp_path):
    (tmp_path / "b.yaml").write_text(MHA.read_text().replace(K_T, "op: permute, input: k_h, dims: [0, 3, 1, 2]"))
    data = json.loads(tracer_cli("diff", str(MHA), str(tmp_path / "b.yaml"), "--json").stdout)
    assert data["changed_op"] == ["k_t: transpose -> permute"] and data["removed"] == data["added"] == [] and not data["same"]


CONFIGURED = """
import types

import torch
from torch import nn


class Scaled(nn.Module):
    def __init__(self):
        super().__init__()
        self.config = types.SimpleNamespace(factor=1.0)

    def forward(self, x, negate=False):
        y = x * self.config.factor
        return -y if negate else y


def make():
    return Scaled()
"""


def test_import_sets_config_and_forward_keywords_from_json(tmp_path):
    (tmp_path / "configured.py").write_text(textwrap.dedent(CONFIGURED))
    given = ("--config", '{"factor": 3.0}', "--forward", '{"negate": true}', "--input", "x=2,5,8")
    done = tracer_cli("import", "configured:make", *given, "-o", "scaled.yaml", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    written = (tmp_path / "scaled.yaml").read_text()
    assert "multiply: 3.0" in written and "op: neg" in written
    bad = tracer_cli("import", "configured:make", "--config", "[1]", "--input", "x=2,5,8", "-o", "b.yaml", cwd=tmp_path)
    assert bad.returncode == 1 and "--config must be a JSON object of names" in bad.stderr


def test_an_exported_scaled_rope_pipeline_imports_back_from_the_command_line(tmp_path):
    exported = tracer_cli("export", str(PIPELINES / "models/llama31_decoder_layer.yaml"), "-o", "llama31.py", cwd=tmp_path)
    assert exported.returncode == 0, exported.stderr
    done = tracer_cli("import", "llama31:Llama31DecoderLayer", "--input", "x=2,6,32", "-o", "back.yaml", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert float(done.stdout.strip().splitlines()[-1].rsplit(" ", 1)[1]) <= 1e-5
    assert "rope_scaling: {type: llama3, factor: 8.0" in (tmp_path / "back.yaml").read_text()
    check = tracer_cli("check", "--strict", "back.yaml", cwd=tmp_path)
    assert check.returncode == 0, check.stdout + check.stderr
