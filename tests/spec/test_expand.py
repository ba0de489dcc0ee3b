"""Block expansion on its own (a spec -> spec pass): namespaced steps and params, explicit inputs,
each step's block copy and dims, aliases for a block's output, and shared params."""

import textwrap

from tracer.core.symbolic import DimAlgebra
from tracer.spec.expand import expand_blocks
from tracer.spec.load import load_spec

BLOCK = """\
name: layer
dims: {D: 4, E: 2 * D}
inputs:
  x: {shape: [D], init: randn}
params:
  W: {shape: [E, D], init: randn}
steps:
  - {id: h, op: linear, weight: W}
  - {id: out, op: relu}
"""


def expanded(tmp_path, block_step: str, dims: str = "{D: 4}"):
    (tmp_path / "blocks").mkdir(exist_ok=True)
    (tmp_path / "blocks" / "layer.yaml").write_text(BLOCK)
    body = f"""\
    name: outer
    dims: {dims}
    inputs:
      x: {{shape: [D], init: randn}}
    steps:
      - {block_step}
      - {{id: y, op: softmax, input: stack}}
    """
    (tmp_path / "outer.yaml").write_text(textwrap.dedent(body))
    spec, source = load_spec(tmp_path / "outer.yaml")
    return expand_blocks(spec, source, DimAlgebra(spec.dims))


def test_each_copy_is_namespaced_and_chained_with_explicit_inputs(tmp_path):
    result = expanded(tmp_path, "{id: stack, op: block, use: blocks/layer.yaml, repeat: 2}")
    steps = result.pipeline.steps
    assert [s.id for s in steps] == ["stack/0/x", "stack/0/h", "stack/0/out", "stack/1/x", "stack/1/h", "stack/1/out", "y"]
    assert [s.data_inputs() for s in steps] == [
        ["x"],
        ["stack/0/x"],
        ["stack/0/h"],
        ["stack/0/out"],
        ["stack/1/x"],
        ["stack/1/h"],
        ["stack/1/out"],
    ]
    assert steps[1].weight == "stack/0/W" and steps[4].weight == "stack/1/W" and list(result.pipeline.params) == ["stack/0/W", "stack/1/W"]
    assert result.aliases["stack"] == "stack/1/out" and result.pipeline.outputs == ["y"]
    assert result.copies == {s.id: s.id.rsplit("/", 1)[0] for s in steps[:-1]}
    assert steps[0].block == "stack/0" and steps[3].block == "stack/1"  # a block input knows its copy


def test_a_block_keeps_its_own_dims_bound_to_the_including_files(tmp_path):
    result = expanded(tmp_path, "{id: stack, op: block, use: blocks/layer.yaml, dims: {D: 2 * D}}", dims="{D: 3}")
    inner = result.algs["stack/h"]
    assert inner.values == {"D": 6, "E": 12} and result.algs["stack/W"] is inner
    assert "y" not in result.algs  # the including file's steps read its own dims


def test_shared_params_are_one_set_for_every_copy(tmp_path):
    result = expanded(tmp_path, "{id: stack, op: block, use: blocks/layer.yaml, repeat: 3, share_params: true}")
    assert list(result.pipeline.params) == ["stack/W"]
    assert {s.weight for s in result.pipeline.steps if s.op == "linear"} == {"stack/W"}


def test_errors_inside_a_copy_point_into_the_block_file(tmp_path):
    result = expanded(tmp_path, "{id: stack, op: block, use: blocks/layer.yaml, repeat: 2}")
    d = result.source.error(("steps", 4), "x", "problem")
    assert d.file.endswith("layer.yaml") and d.position.line == 8 and "copy 1 included at" in d.message
