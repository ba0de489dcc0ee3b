"""`tracer import MODULE:FACTORY` and `tracer diff A B` from the command line."""

import json
import re
import textwrap

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


def test_diff_names_changed_fields_shapes_params_and_the_first_divergent_tensor(tmp_path):
    changed = MHA.read_text().replace("{id: weights, op: softmax, dim: -1", "{id: weights, op: softmax, dim: -2")
    (tmp_path / "b.yaml").write_text(changed)
    done = tracer_cli("diff", str(MHA), str(tmp_path / "b.yaml"), "--values")
    assert done.returncode == 0, done.stderr
    assert "~ step weights: dim -1 -> -2" in done.stdout and "values: the first tensor that differs is 'weights'" in done.stdout
    data = json.loads(tracer_cli("diff", str(MHA), str(MHA), "--json").stdout)
    assert data["same"] and data["totals"]["flops"][0] == data["totals"]["flops"][1] > 0


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
