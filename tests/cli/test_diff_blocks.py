"""`tracer diff` looks inside `use:` block files: the pipelines are compared expanded, copy by
copy, and a change in a block file is named by its step; the exit status is diff(1)'s."""

import json
import re

import pytest
import torch

import tracer
from tests.conftest import tracer_cli
from tracer.diff import diff, format_diff, value_difference

HEAD = """\
dims: {B: 1, T: 4, D: 4}
inputs:
  x: {shape: [B, T, D], init: randn}
"""

MAIN = (
    "name: stack\n"
    + HEAD
    + """\
steps:
  - {id: layers, op: block, use: blocks/layer.yaml, input: x, repeat: 2}
  - {id: y, op: tanh, input: layers}
"""
)

LAYER = (
    "name: layer\n"
    + HEAD
    + """\
params:
  W_q: {shape: [D, D], init: randn}
steps:
  - {id: self_attn.q, op: linear, input: x, weight: W_q}
  - {id: self_attn.k_t, op: transpose, input: x, dims: [-2, -1]}
  - {id: self_attn.scores, op: matmul, inputs: [self_attn.q, self_attn.k_t]}
  - {id: self_attn.scale, op: scale, input: self_attn.scores, divide: {sqrt: D}}
  - {id: self_attn.masked, op: mask, input: self_attn.scale, causal: true}
  - {id: self_attn.weights, op: softmax, input: self_attn.masked, dim: -1}
  - {id: self_attn.out, op: matmul, inputs: [self_attn.weights, x]}
  - {id: out, op: add, inputs: [x, self_attn.out]}
"""
)

EAGER = """\
  - {id: self_attn.scale, op: scale, input: self_attn.scores, divide: {sqrt: D}}
  - {id: self_attn.masked, op: mask, input: self_attn.scale, causal: true}
  - {id: self_attn.weights, op: softmax, input: self_attn.masked, dim: -1}
  - {id: self_attn.out, op: matmul, inputs: [self_attn.weights, x]}
"""
SDPA = "  - {id: self_attn.out, op: sdpa, inputs: [self_attn.q, x, x], causal: true}\n"


def _pair(tmp_path, layer_b: str = LAYER, main_b: str = MAIN):
    """Two copies of the stack, in folders a/ and b/, B's files as given."""
    paths = []
    for side, (main, layer) in {"a": (MAIN, LAYER), "b": (main_b, layer_b)}.items():
        (tmp_path / side / "blocks").mkdir(parents=True)
        (tmp_path / side / "blocks" / "layer.yaml").write_text(layer)
        (tmp_path / side / "stack.yaml").write_text(main)
        paths.append(str(tmp_path / side / "stack.yaml"))
    return paths


def test_identical_pipelines_with_blocks_are_the_same_and_exit_0(tmp_path):
    done = tracer_cli("diff", *_pair(tmp_path), "--values")
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-2:] == ["values: every shared tensor agrees", "the same pipeline"]


@pytest.mark.parametrize(
    ("old", "new", "line"),
    [
        ("divide: {sqrt: D}", "divide: 3.0", "~ step layers/{0,1}/self_attn.scale: divide {sqrt: D} ({sqrt: 4}) -> 3.0"),
        ("causal: true}", "causal: true, window: 2}", "~ step layers/{0,1}/self_attn.masked: window - -> 2"),
    ],
)
def test_a_change_inside_the_block_file_is_named_by_its_step_and_exits_1(tmp_path, old, new, line):
    """Before: 'the same pipeline', exit 0, --values too (only the block step was compared)."""
    assert old in LAYER
    done = tracer_cli("diff", *_pair(tmp_path, LAYER.replace(old, new)), "--values")
    assert done.returncode == 1, done.stderr
    lines = done.stdout.splitlines()
    assert line in lines, done.stdout
    assert "values: the first tensor that differs is 'layers/0/self_attn." in done.stdout
    assert lines[-1].startswith("the pipelines differ; the first tensor whose values differ is 'layers/0/self_attn.")


def test_sdpa_against_eager_attention_in_a_block_names_the_steps_and_finds_the_values_equal(tmp_path):
    a, b = _pair(tmp_path, LAYER.replace(EAGER, SDPA))
    found = diff(tracer.load(a), tracer.load(b), values=True)
    assert found.changed_op == ["layers/{0,1}/self_attn.out: matmul -> sdpa"] and found.added == []
    assert found.removed == [f"layers/{{0,1}}/self_attn.{s}" for s in ("scale: scale", "masked: mask", "weights: softmax")]
    assert found.values == [] and not found.same  # the same numbers, by another computation
    assert tracer_cli("diff", a, b).returncode == 1


def test_a_deeper_stack_is_one_repeat_line_not_every_step_of_the_new_copy(tmp_path):
    a, b = _pair(tmp_path, main_b=MAIN.replace("repeat: 2", "repeat: 3"))
    found = diff(tracer.load(a), tracer.load(b), values=True)
    assert found.blocks == ["layers: repeat 2 -> 3 (+ layers/2: 8 steps, 1 params)"]
    assert found.added == found.removed == found.changed_op == found.params == []  # 'y' reads the stack's output either way
    assert found.diverges == "y" and found.totals["steps"] == [17, 25]
    assert "~ block layers: repeat 2 -> 3" in format_diff(found)
    back = diff(tracer.load(b), tracer.load(a))
    assert back.blocks == ["layers: repeat 3 -> 2 (- layers/2: 8 steps, 1 params)"] and not back.removed


def test_dims_renamed_are_names_and_a_dim_of_another_size_is_a_change(tmp_path):
    a, b = _pair(tmp_path, re.sub(r"\bD\b", "d_model", LAYER))
    found = diff(tracer.load(a), tracer.load(b), values=True)
    assert found.same and found.diverges is None and found.dims == [["d_model", "-", "4"]]  # D is the main file's too
    assert "dim D -> d_model (as at layers/0/x)" in found.renamed
    assert format_diff(found).endswith("the same pipeline but for names")
    window = LAYER.replace("D: 4}", "D: 4, W: 2}").replace("causal: true}", "causal: true, window: W}")
    (tmp_path / "a" / "blocks" / "layer.yaml").write_text(window)
    (tmp_path / "b" / "blocks" / "layer.yaml").write_text(window.replace("W: 2}", "W: 3}"))
    found = diff(tracer.load(a), tracer.load(b))
    assert found.changed_op == ["layers/{0,1}/self_attn.masked: window W (2) -> W (3)"] and ["W", "2", "3"] in found.dims


def test_a_bad_file_is_trouble_exit_2_with_its_located_error(tmp_path):
    a, b = _pair(tmp_path, LAYER.replace("op: softmax", "op: softmaxx"))
    done = tracer_cli("diff", a, b)
    assert done.returncode == 2 and done.stdout == ""
    assert "layer.yaml:13:33: error[unknown-op]" in done.stderr and "softmaxx" in done.stderr, done.stderr
    missing = tracer_cli("diff", a, str(tmp_path / "nowhere.yaml"))
    assert missing.returncode == 2 and "nowhere.yaml" in missing.stderr
    assert tracer_cli("diff", a).returncode == 2  # a usage error, as argparse reports it


def test_json_says_same_and_lists_every_value_difference_with_its_size(tmp_path):
    a, b = _pair(tmp_path, LAYER.replace("divide: {sqrt: D}", "divide: 3.0"))
    done = tracer_cli("diff", a, b, "--values", "--json")
    data = json.loads(done.stdout)
    assert done.returncode == 1 and not data["same"]
    first = data["values"][0]
    assert first["tensor"] == "layers/0/self_attn.scale" and first["max_abs"] > first["tolerance"] > 0
    assert data["outputs"] == ["y"] and data["values"][-1]["tensor"] == "y"


def test_value_difference_scales_the_tolerance_to_the_values_magnitude():
    """Imported params reach ~800: float32 rounding at that size (2e-6 relative) is no difference,
    a real one is sized absolutely and relative to the magnitude, as plain torch computes them."""
    torch.manual_seed(0)
    x = torch.randn(64, 64) * 800
    assert value_difference(x, x * (1 + 2e-6)) is None
    y = x.clone()
    y[3, 5] += 0.5
    found = value_difference(x, y)
    assert found["max_abs"] == pytest.approx(float((x.double() - y.double()).abs().max()))
    assert found["relative"] == pytest.approx(found["max_abs"] / float(x.abs().max()), rel=1e-3)
    assert found["tolerance"] == pytest.approx(1e-6 + 1e-5 * float(y.double().abs().max()))
    fill = torch.finfo(torch.float32).min
    masked = torch.tensor([[0.5, fill], [0.25, 0.75]])
    assert value_difference(masked, masked.clone()) is None  # equal fills are equal
    assert value_difference(masked, masked + torch.tensor([[1e-3, 0.0], [0.0, 0.0]])) is not None  # the fill hides nothing
    assert value_difference(torch.tensor([float("nan")]), torch.tensor([float("nan")])) is None
    assert value_difference(torch.tensor([float("nan")]), torch.tensor([1.0]))["max_abs"] == float("inf")


def test_values_after_a_step_that_draws_from_the_rng_are_not_compared(tmp_path):
    """B runs on A's inputs, so it draws less before its dropout: different masks are no difference."""
    text = "name: d\n" + HEAD + "steps:\n  - {id: drop, op: dropout, input: x, p: 0.5, training: true}\n  - {id: y, op: tanh}\n"
    (tmp_path / "a.yaml").write_text(text)
    (tmp_path / "b.yaml").write_text(text.replace("id: drop", "id: dropped"))
    done = tracer_cli("diff", str(tmp_path / "a.yaml"), str(tmp_path / "b.yaml"), "--values")
    assert done.returncode == 0, done.stdout
    assert done.stdout.splitlines()[-3:] == [
        "values: every shared tensor agrees before it",
        "values: not compared from 'drop' on (it draws from the RNG)",
        "the same pipeline but for names",
    ]


def test_other_outputs_are_a_change(tmp_path):
    a, b = _pair(tmp_path, main_b=MAIN + "outputs: [y, layers]\n")
    found = diff(tracer.load(a), tracer.load(b))
    assert found.changed_op == ["outputs: y -> y, layers/1/out"] and not found.same
    assert diff(tracer.load(a), tracer.load(a)).same


def test_the_page_shows_every_copy_of_a_changed_block_step(tmp_path):
    a, b = _pair(tmp_path, LAYER.replace("divide: {sqrt: D}", "divide: 3.0"), MAIN.replace("repeat: 2", "repeat: 3"))
    page = tmp_path / "diff.html"
    done = tracer_cli("diff", a, b, "--html", str(page))
    assert done.returncode == 1, done.stderr
    text = page.read_text()
    for copy in (0, 1):
        assert f'<tr class="changed"><td class="mark">~</td><td>layers/{copy}/self_attn.scale</td>' in text
    assert '<tr class="added"><td class="mark">+</td><td></td><td></td><td></td><td>layers/2/self_attn.scale</td>' in text
    assert "<li><code>block layers: repeat 2 -&gt; 3 (+ layers/2: 8 steps, 1 params)</code></li>" in text


def test_a_block_of_another_id_is_one_rename_and_its_changes_are_named_in_b_too(tmp_path):
    main = MAIN.replace("id: layers", "id: h").replace("input: layers", "input: h")
    assert "self_attn.masked, dim: -1" in LAYER
    a, b = _pair(tmp_path, LAYER.replace("self_attn.masked, dim: -1", "self_attn.masked, dim: -2"), main)
    found = diff(tracer.load(a), tracer.load(b))
    assert found.renamed == ["block layers -> h"]
    assert found.changed_op == ["layers/{0,1}/self_attn.weights -> h/{0,1}/self_attn.weights: dim -1 -> -2"]
    assert diff(tracer.load(a), tracer.load(a)).renamed == []


def test_a_dim_nothing_uses_is_listed_and_the_pipelines_are_the_same_but_for_names(tmp_path):
    a, b = _pair(tmp_path, main_b=MAIN.replace("D: 4}", "D: 4, V: 64}"))
    done = tracer_cli("diff", a, b)
    assert done.returncode == 0 and "~ dim V  -  ->  64" in done.stdout
    assert done.stdout.endswith("the same pipeline but for names\n")
