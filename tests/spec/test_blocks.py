"""``op: block``: files included, repeated, bound to the including file's dims, and their errors
located in the right file."""

from __future__ import annotations

import math
import re
import textwrap
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

import tracer
from tests.conftest import PIPELINES, including, pipeline_text, shared_pipeline
from tracer.core.errors import TracerError


def chain(folder: Path, depth: int, repeat: int = 1) -> Path:
    """f0 includes f1 includes ... f{depth-1}; the deepest include repeats ``repeat`` times."""
    for i in range(depth):
        body = f"name: f{i}\ninputs: {{x: {{shape: [2, 3], init: randn}}}}\nsteps:\n  - {{id: a, op: softmax, dim: -1}}\n"
        if i < depth - 1:
            body += f"  - {{id: b, op: block, use: f{i + 1}.yaml, input: a, repeat: {repeat if i == depth - 2 else 1}}}\n"
        (folder / f"f{i}.yaml").write_text(body)
    return folder / "f0.yaml"


@pytest.mark.parametrize("use", ["a" * 280 + ".yaml", "a" * 256 + "/x.yaml"])
def test_a_use_path_component_over_255_bytes_is_a_located_error(tmp_path, use):
    (tmp_path / "inc.yaml").write_text(including(use))
    with pytest.raises(TracerError) as info:
        tracer.load(tmp_path / "inc.yaml")
    assert info.value.code == "block-use" and re.match(r".*inc\.yaml:4:\d+: error\[block-use\]", str(info.value))


def test_block_nesting_is_limited_with_the_chain_named(tmp_path):
    from tracer.spec.expand import MAX_BLOCK_DEPTH

    tracer.load(chain(tmp_path, MAX_BLOCK_DEPTH + 1)).check().raise_errors()
    with pytest.raises(TracerError) as info:
        tracer.load(chain(tmp_path, MAX_BLOCK_DEPTH + 3))
    first = info.value.diagnostics[0]
    assert first.code == "block-too-deep" and first.position is not None
    assert "f0.yaml -> f1.yaml -> f2.yaml" in first.message and "included at" in first.message


def test_step_copies_over_all_nesting_levels_are_capped(tmp_path, monkeypatch):
    import tracer.spec.expand as expand

    monkeypatch.setattr(expand, "MAX_STEP_COPIES", 200)
    with pytest.raises(TracerError) as info:
        tracer.load(chain(tmp_path, 6, repeat=30))  # 60 steps, copied once per level
    assert info.value.code == "block-too-large" and "nested blocks" in str(info.value)


X23 = "x: {shape: [2, 3], init: randn}"


def test_a_block_that_uses_a_directory_is_a_located_error(tmp_path):
    (tmp_path / "p.yaml").write_text(pipeline_text("- {id: b, op: block, use: ., dims: {}}", inputs=X23))
    with pytest.raises(TracerError) as info:
        tracer.load(tmp_path / "p.yaml")
    assert info.value.code == "block-use" and "is a folder" in str(info.value)
    assert all(line.startswith(f"{tmp_path / 'p.yaml'}:") for line in str(info.value).splitlines())


SMALL = {"B": 2, "T": 5, "d_model": 8, "H": 2}


STACK = PIPELINES / "encoder_stack.yaml"


def _layer(x, p, H):
    """Tutorial 000's encoder layer in plain torch (MHA, add & norm, feed-forward, add & norm)."""
    B, T, d = x.shape
    Dh = d // H

    def heads(t):
        return t.reshape(B, T, H, Dh).transpose(1, 2)

    q, k, v = (heads(F.linear(x, p[f"W_{n}"], p[f"b_{n}"])) for n in "QKV")
    weights = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(Dh), dim=-1)
    context = (weights @ v).transpose(1, 2).reshape(B, T, d)
    normed = F.layer_norm(x + F.linear(context, p["W_O"], p["b_O"]), (d,), p["ln1_w"], p["ln1_b"])
    ffn = F.linear(torch.relu(F.linear(normed, p["W_1"], p["b_1"])), p["W_2"], p["b_2"])
    return F.layer_norm(normed + ffn, (d,), p["ln2_w"], p["ln2_b"])


def _params(trace, prefix):
    names = ("W_Q", "b_Q", "W_K", "b_K", "W_V", "b_V", "W_O", "b_O", "ln1_w", "ln1_b", "W_1", "b_1", "W_2", "b_2", "ln2_w", "ln2_b")
    return {n: trace[f"{prefix}/{n}"].tensor for n in names}


def _tree(tmp_path, files: dict):
    for name, text in files.items():
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    return tmp_path


BLOCK = """\
name: blk
dims: {B: 1, d: 3}
inputs:
  x: {shape: [B, d], init: randn}
params:
  W: {shape: [d, d], init: linear}
steps:
  - {id: y, op: linear, input: x, weight: W}
"""


def _outer(use: str, extra: str = "", dims: str = "{B: 2, d: 4}", inputs: str = "input: x") -> str:
    return f"""\
name: outer
dims: {dims}
inputs:
  x: {{shape: [B, d], init: randn}}
steps:
  - id: b
    op: block
    use: {use}
    {inputs}
{extra}"""


def _error(path) -> TracerError:
    with pytest.raises(TracerError) as info:
        tracer.load(path).run()
    return info.value


TWICE = """\
name: top
dims: {D: 3, E: 5}
inputs:
  x: {shape: [D], init: randn}
  z: {shape: [E], init: randn}
steps:
  - {id: b1, op: block, use: b.yaml, input: x, dims: {N: D}}
  - {id: b2, op: block, use: b.yaml, input: z, dims: {N: E}}
outputs: [b1, b2]
"""


HALVES = "name: b\ndims: {N: 4, M: N * 2}\ninputs:\n  x: {shape: [N], init: randn}\nsteps:\n  - {id: y, op: relu}\n"


@pytest.mark.long
def test_stack_expanded_trace_equals_plain_torch():
    trace = shared_pipeline(STACK).run(dims=SMALL, keep_values=True)
    x = trace["x"].tensor
    for i in range(48):
        x = _layer(x, _params(trace, f"layers/{i}"), SMALL["H"])
        assert torch.allclose(trace[f"layers/{i}/out"].tensor, x, atol=1e-5), f"layer {i}"
    assert torch.allclose(trace["layers"].tensor, x, atol=1e-5)
    assert torch.equal(next(iter(trace.outputs.values())), trace["layers"].tensor)


def test_stack_ids_are_namespaced_per_copy_and_chained():
    trace = shared_pipeline(STACK).run(dims=SMALL)
    ids = [r.id for r in trace.records]
    assert ids[0] == "x"
    steps = [r.id for r in trace.records if r.op not in ("input", "param")]
    assert len(steps) == 48 * 25  # 24 steps and the bound input per layer
    assert all(i.startswith("layers/") and i.split("/")[1].isdigit() for i in steps)
    assert len({i.split("/")[1] for i in steps}) == 48
    assert trace["layers"].id == "layers/47/out"
    assert trace["layers/3"].id == "layers/3/out"
    assert trace["layers/0/x"].view_of == "x"  # the bound input shares the outer tensor's storage
    assert trace["layers/1/x"].view_of == "layers/0/out"  # copy 1 reads copy 0's output
    assert trace["layers/7/scores"].symbolic_shape == ("B", "H", "T", "T")
    assert trace["layers/7/hidden"].shape == (2, 5, 32)  # d_ff bound to 4 * d_model
    assert len([r for r in trace.records if r.op == "param"]) == 48 * 16  # every copy has its own params
    analysis = trace.analysis
    assert analysis.node("layers/3/scores").step.group == analysis.node("layers/3/out").step.group == "layers/3"  # one cluster per copy
    info = analysis.blocks["layers"]
    assert info.copies[0] == "layers/0" and len(info.copies) == 48 and info.output == "layers/47/out"
    assert info.dims["d_ff"] == 32


def test_encoder_block_includes_the_layer_once():
    trace = tracer.load(PIPELINES / "encoder_block.yaml").run()
    assert trace["encoder"].id == "encoder/out"
    assert trace["encoder/scores"].shape == (1, 2, 8, 8)
    assert trace["encoder/hidden"].shape == (1, 8, 4)
    standalone = tracer.load(PIPELINES / "blocks" / "encoder_layer.yaml").run()
    assert standalone["scores"].shape == trace["encoder/scores"].shape


@pytest.mark.long
def test_stack_meta_run_at_gpt2_size_keeps_strides():
    trace = shared_pipeline(STACK).run(dims={"B": 8, "T": 512, "d_model": 768, "H": 12}, device="meta")
    record = trace["layers/47/K_t"]
    assert record.shape == (8, 12, 64, 512) and not record.contiguous and record.view_of == "layers/47/K"
    assert trace["layers/47/context_m"].view_of is None  # the reshape of a transposed tensor copies


def test_block_binds_same_named_dims_and_runs(tmp_path):
    root = _tree(tmp_path, {"blocks/blk.yaml": BLOCK, "outer.yaml": _outer("blocks/blk.yaml", "    repeat: 3")})
    trace = tracer.load(root / "outer.yaml").run()
    assert [r.id for r in trace.records if r.op == "linear"] == ["b/0/y", "b/1/y", "b/2/y"]
    assert trace["b"].shape == (2, 4)


@pytest.mark.parametrize(
    "use, code",
    [
        ("../escape.yaml", "block-use"),
        ("/etc/passwd", "block-use"),
        ("blocks/missing.yaml", "block-missing"),
    ],
)
def test_include_path_errors_are_located_at_use(tmp_path, use, code):
    (tmp_path / "escape.yaml").write_text(BLOCK)
    root = _tree(tmp_path / "sub", {"blocks/blk.yaml": BLOCK, "outer.yaml": _outer(use)})
    error = _error(root / "outer.yaml")
    d = error.diagnostics[0]
    assert d.code == code and d.file.endswith("outer.yaml") and d.position.line == 8 and d.step == "b"


def test_include_cycle_is_an_error(tmp_path):
    a = _outer("b.yaml").replace("name: outer", "name: a")
    b = _outer("a.yaml").replace("name: outer", "name: b")
    root = _tree(tmp_path, {"a.yaml": a, "b.yaml": b})
    error = _error(root / "a.yaml")
    assert "block-cycle" in [d.code for d in error.diagnostics]
    assert "a.yaml -> b.yaml -> a.yaml" in str(error)


def test_wrong_number_of_inputs(tmp_path):
    root = _tree(tmp_path, {"blocks/blk.yaml": BLOCK, "outer.yaml": _outer("blocks/blk.yaml", inputs="inputs: [x, x]")})
    error = _error(root / "outer.yaml")
    assert error.code == "block-inputs" and "takes 1 input (x), got 2" in str(error)


def test_shape_mismatch_is_located_in_the_block_file(tmp_path):
    root = _tree(tmp_path, {"blocks/blk.yaml": BLOCK, "outer.yaml": _outer("blocks/blk.yaml", "    dims: {d: 5}")})
    error = _error(root / "outer.yaml")
    d = error.diagnostics[0]
    assert d.code == "block-input" and d.file.endswith("blk.yaml") and d.position.line == 4
    assert "in block 'b' included at" in d.message and "outer.yaml:6" in d.message


def test_error_inside_a_block_step_points_into_the_block(tmp_path):
    broken = BLOCK.replace("weight: W}", "weight: W}\n  - {id: z, op: matmul, inputs: [y, x]}")
    root = _tree(
        tmp_path,
        {
            "blocks/blk.yaml": broken.replace("dims: {B: 1, d: 3}", "dims: {B: 2, d: 3}"),
            "outer.yaml": _outer("blocks/blk.yaml", dims="{B: 1, d: 3}"),
        },
    )
    error = _error(root / "outer.yaml")
    d = error.diagnostics[0]
    assert d.file.endswith("blk.yaml") and d.position.line == 9 and d.step == "b/z" and d.code == "matmul-shape"


@pytest.mark.parametrize("dims, code", [("{nope: 3}", "unknown-dim"), ("{d: B + }", "invalid-value")])
def test_bad_dim_bindings(tmp_path, dims, code):
    root = _tree(tmp_path, {"blocks/blk.yaml": BLOCK, "outer.yaml": _outer("blocks/blk.yaml", f"    dims: {dims}")})
    assert code in [d.code for d in _error(root / "outer.yaml").diagnostics]


def test_binding_a_derived_dim_is_refused(tmp_path):
    block = BLOCK.replace("dims: {B: 1, d: 3}", "dims: {B: 1, e: 3, d: e + 0}")
    root = _tree(tmp_path, {"blocks/blk.yaml": block, "outer.yaml": _outer("blocks/blk.yaml", "    dims: {d: 4}")})
    assert _error(root / "outer.yaml").code == "derived-dim"


def test_a_blocks_own_expect_is_checked_on_every_copy_in_its_own_dims(tmp_path):
    # the block's 'w' is bound to 2 * d, so its expectation must be read in the block's dims
    block = (
        BLOCK.replace("dims: {B: 1, d: 3}", "dims: {B: 1, d: 3, w: 6}")
        .replace("W: {shape: [d, d], init: linear}", "W1: {shape: [w, d], init: linear}\n  W2: {shape: [d, w], init: linear}")
        .replace(
            "- {id: y, op: linear, input: x, weight: W}", "- {id: h, op: linear, input: x, weight: W1}\n  - {id: y, op: linear, weight: W2}"
        )
    )
    outer = _outer("blocks/blk.yaml", "    dims: {w: 2 * d}\n    repeat: 3")
    good = _tree(tmp_path / "good", {"blocks/blk.yaml": block + "expect:\n  h: [B, w]\n", "outer.yaml": outer})
    pipeline = tracer.load(good / "outer.yaml")
    assert pipeline.check().pipeline.expect == {f"b/{i}/h": ["B", "w"] for i in range(3)}
    assert pipeline.run()["b/2/h"].shape == (2, 8)
    wrong = block + "expect:\n  h: [B, d]\n"
    bad = _tree(tmp_path / "bad", {"blocks/blk.yaml": wrong, "outer.yaml": outer})
    [d] = _error(bad / "outer.yaml").diagnostics
    assert d.code == "expect" and d.file.endswith("blk.yaml") and d.position.line == wrong.splitlines().index("  h: [B, d]") + 1
    assert "expected 'b/0/h' to be (B, d) [2, 4], found (B, w) [2, 8]" in d.message
    assert "copy 0 included at" in d.message and d.message.endswith("the same in 2 more copies of this block")
    # the including file's own entry for the same tensor wins
    _tree(bad, {"outer.yaml": outer + "\nexpect:\n  b/0/h: [B, 2 * d]\n"})
    with pytest.raises(TracerError) as info:
        tracer.load(bad / "outer.yaml")
    assert "'b/1/h'" in str(info.value) and "the same in 1 more copy" in str(info.value) and "'b/0/h'" not in str(info.value)


def test_bundled_block_expectations_hold_on_all_48_copies():
    analysis = shared_pipeline(STACK).check()
    # the file's own `layers: [B, T, d_model]` is the last copy's `out`
    assert len(analysis.pipeline.expect) == 48 * 3 and not analysis.errors


def test_block_expect_failures_at_other_dims_are_reported_apart_with_the_blocks_dims(tmp_path):
    root = _tree(tmp_path, {"b.yaml": HALVES + "expect:\n  y: [M]\n", "top.yaml": TWICE})
    first, second = _error(root / "top.yaml").diagnostics
    assert "found (N) [3] [N=3, M=6]" in first.message and "found (N) [5] [N=5, M=10]" in second.message
    assert "more cop" not in first.message + second.message


def test_top_level_expect_names_nested_tensors_once_each_and_is_located_at_its_key(tmp_path):
    mid = (
        "name: mid\ndims: {D: 2}\ninputs:\n  x: {shape: [D], init: randn}\nsteps:\n"
        "  - {id: sub, op: block, use: b.yaml, input: x, dims: {N: D}, repeat: 2}\n"
    )
    top = (
        "name: top\ndims: {D: 2}\ninputs:\n  x: {shape: [D], init: randn}\nsteps:\n"
        "  - {id: enc, op: block, use: mid.yaml, input: x, repeat: 3}\nexpect:\n  enc/1/sub: [D]\n  enc: [7]\n"
    )
    root = _tree(tmp_path, {"b.yaml": HALVES, "mid.yaml": mid, "top.yaml": top})
    [d] = _error(root / "top.yaml").diagnostics  # 'enc/1/sub' (a nested block's alias) holds
    assert d.code == "expect" and d.position.line == 9 and "'enc/2/sub/1/y'" in d.message
    _tree(root, {"top.yaml": top.replace("  enc: [7]\n", "  enc: [D]\n  enc/2/sub/1/y: [D]\n")})
    [d] = _error(root / "top.yaml").diagnostics
    assert d.code == "duplicate-expect" and d.position.line == 10
    assert "'enc/2/sub/1/y' and 'enc' both name the tensor 'enc/2/sub/1/y'" in d.message


def test_top_level_expect_in_block_dims_explains_whose_dims_apply(tmp_path):
    root = _tree(tmp_path, {"b.yaml": HALVES, "top.yaml": TWICE + "expect:\n  b1/y: [N]\n"})
    [d] = _error(root / "top.yaml").diagnostics
    assert d.file.endswith("top.yaml") and "unknown dim 'N'" in d.message and "whose dims are [N=3, M=6]" in d.message
    _tree(root, {"top.yaml": TWICE + "expect:\n  b1/y: [D]\n"})
    assert tracer.load(root / "top.yaml").run()["b1/y"].shape == (3,)


def test_outputs_may_name_a_copys_tensor_but_step_inputs_only_the_block(tmp_path):
    root = _tree(tmp_path, {"blocks/blk.yaml": BLOCK, "outer.yaml": _outer("blocks/blk.yaml", "    repeat: 3\noutputs: [b/1/y, b]")})
    trace = tracer.load(root / "outer.yaml").run()
    assert trace.analysis.outputs == ("b/1/y", "b/2/y")
    tapped = _outer("blocks/blk.yaml", "    repeat: 3\n  - {id: z, op: relu, input: b/1/y}")
    _tree(root, {"outer.yaml": tapped})
    [d] = _error(root / "outer.yaml").diagnostics
    assert d.code == "invalid-id" and d.position.line == 11
    assert "only expect: and outputs: can name a block's inner tensors; the block's own id ('b') names its output" in d.message


@pytest.mark.parametrize("clash", ["  - {id: b, op: relu, input: b}\n", "  - {id: b, op: block, use: blocks/blk.yaml, input: x}\n"])
def test_a_second_tensor_named_like_a_block_is_one_error_at_its_id(tmp_path, clash):
    root = _tree(tmp_path, {"blocks/blk.yaml": BLOCK, "outer.yaml": _outer("blocks/blk.yaml", "    repeat: 2\n" + clash)})
    [d] = _error(root / "outer.yaml").diagnostics
    assert d.code == "duplicate-id" and d.file.endswith("outer.yaml") and d.position.line == 11
    assert "id 'b' is already used (line 6)" in d.message


def test_shared_params_are_created_once_and_read_by_every_copy(tmp_path):
    (tmp_path / "blocks").mkdir()
    (tmp_path / "blocks" / "encoder_layer.yaml").write_text((PIPELINES / "blocks" / "encoder_layer.yaml").read_text())
    text = (PIPELINES / "encoder_stack.yaml").read_text().replace("    repeat: 48\n", "    repeat: 4\n    share_params: true\n")
    (tmp_path / "tied.yaml").write_text(text)
    trace = tracer.load(tmp_path / "tied.yaml").run(dims=SMALL, keep_values=True)
    params = [r.id for r in trace.records if r.op == "param"]
    assert len(params) == 16 and all(p.count("/") == 1 for p in params)  # layers/W_Q, not layers/3/W_Q
    x, shared = trace["x"].tensor, _params(trace, "layers")
    for i in range(4):
        x = _layer(x, shared, SMALL["H"])
        assert torch.allclose(trace[f"layers/{i}/out"].tensor, x, atol=1e-5), f"layer {i}"
    assert trace.analysis.node("layers/3/Q").step.weight == "layers/W_Q"
    with pytest.raises(TracerError) as info:
        tracer.loads(text.replace("    repeat: 4\n", ""), str(tmp_path / "t.yaml"))
    assert info.value.code == "invalid-value" and "add 'repeat: N'" in str(info.value)


def test_a_problem_in_a_repeated_block_is_reported_once_per_use_with_a_count(tmp_path):
    block = BLOCK.replace("weight: W}", "weight: W}\n  - {id: w, op: relu}\n  - {id: w, op: relu}") + "expect:\n  zz: [B, d]\n"
    outer = _outer("blocks/blk.yaml", "    repeat: 3\n  - {id: c, op: block, use: blocks/blk.yaml, input: b}")
    root = _tree(tmp_path, {"blocks/blk.yaml": block, "outer.yaml": outer})
    lines = [str(d) for d in _error(root / "outer.yaml").diagnostics if d.code == "duplicate-id"]
    assert len(lines) == 2 and all("blk.yaml:10:" in line for line in lines)  # the duplicate id, once per use of the block
    assert "'b/0/w' is already used" in lines[0] and lines[0].endswith("the same in 2 more copies of this block")
    assert "'c/w' is already used" in lines[1] and "more cop" not in lines[1]
    fixed = _tree(tmp_path, {"blocks/blk.yaml": block.replace("  - {id: w, op: relu}\n  - {id: w, op: relu}", "")})
    [unknown, other] = _error(fixed / "outer.yaml").diagnostics
    assert unknown.code == "unknown-ref" and str(unknown).endswith("the same in 2 more copies of this block")
    assert other.code == "unknown-ref" and "'c/zz'" in other.message


def test_an_error_raised_inside_a_nested_block_file_names_every_include(tmp_path):
    inner = BLOCK + "  - {id: z, op: block, use: nope.yaml, input: y}\n"
    mid = BLOCK.replace("name: blk", "name: mid").replace(
        "- {id: y, op: linear, input: x, weight: W}", "- {id: s, op: block, use: inner.yaml, input: x}"
    )
    root = _tree(tmp_path, {"blocks/inner.yaml": inner, "blocks/mid.yaml": mid, "outer.yaml": _outer("blocks/mid.yaml", "    repeat: 2")})
    [d] = _error(root / "outer.yaml").diagnostics
    assert d.code == "block-missing" and d.file.endswith("inner.yaml")
    assert d.message.endswith(
        f"(in block 's' included at {root / 'blocks' / 'mid.yaml'}:8, in block 'b' included at {root / 'outer.yaml'}:6)"
    )
