"""Diagrams: what the DOT says (shapes on edges, layout marks, groups, folds, legend), deterministic
and snapshot-tested."""

import os
import re
import shutil
import subprocess
import xml.etree.ElementTree as ET
from pathlib import Path

import graphviz
import pytest

import tracer
from tests.conftest import PIPELINES, ROOT, bundled_pipelines, pipeline_text, shared_pipeline, tracer_cli
from tracer.core.errors import TracerError
from tracer.gallery import gallery_name, repeated_blocks
from tracer.presentation.diagram import dot_source

CAUSAL = PIPELINES / "causal_mha.yaml"


STACK = PIPELINES / "encoder_stack.yaml"


SNAPSHOTS = ROOT / "tests" / "snapshots"


needs_dot = pytest.mark.skipif(shutil.which("dot") is None, reason="Graphviz `dot` is not installed")


EDGE = re.compile(r'^\s*("[^"]+"|\S+) -> ("[^"]+"|\S+) \[(.*)\]$')


def causal_trace():
    return tracer.load(CAUSAL).run(device="meta")


def edges(dot: str) -> list[tuple[str, str, str]]:
    """The edges that carry a tensor (not the invisible ones that order siblings)."""
    return [(m[1].strip('"'), m[2].strip('"'), m[3]) for m in map(EDGE.match, dot.splitlines()) if m and m[3] != "style=invis"]


def node_line(dot: str, node: str) -> str:
    quoted = node if re.fullmatch(r"\w+", node) else f'"{node}"'
    return next(line for line in dot.splitlines() if line.strip().startswith(quoted + " ["))


def svg_texts(path: Path) -> list[str]:
    root = ET.parse(path).getroot()  # raises on invalid XML
    assert root.tag.endswith("svg")
    return ["".join(t.itertext()) for t in root.iter() if t.tag.endswith("text")]


@pytest.fixture(scope="module")
def stack_trace():
    return shared_pipeline(STACK).run(device="meta")


def _marker(dot: str, text: str) -> tuple[str, str]:
    """The node whose label holds ``text`` (a repeat marker): its name and its line."""
    line = next(line for line in dot.splitlines() if text in line and " [" in line)
    return line.strip().split(" [")[0].strip('"'), line


def legend(dot: str) -> str:
    return node_line(dot, "legend")


def test_every_edge_carries_symbolic_and_concrete_shape_and_dashes_mark_non_contiguous():
    trace = causal_trace()
    found = edges(dot_source(trace))
    assert found
    for tail, head, attrs in found:
        record = trace[re.search(r'tooltip="([^:]+):', attrs)[1]]
        assert record.symbolic in attrs and "[" + ", ".join(map(str, record.shape)) + "]" in attrs
        assert ("style=dashed" in attrs) == (not record.contiguous), (tail, head)
    strided = {t for t, _, a in found if "style=dashed" in a}
    assert {"q_h", "k_h", "v_h", "k_t", "merged/transpose"} <= strided


def test_step_nodes_show_op_arguments_notes_sizes_and_view_or_copy():
    dot = dot_source(causal_trace())
    assert "mask causal, fill=-inf" in node_line(dot, "masked") and "no token may look at a later one" in node_line(dot, "masked")
    assert "softmax dim=-1" in node_line(dot, "weights") and "576 B" in node_line(dot, "weights")
    assert "view of q" in node_line(dot, "q_h")
    assert "copy" in node_line(dot, "merged/contiguous") and "#fbd9a6" in node_line(dot, "merged/contiguous")
    param = node_line(dot, "W_q")
    assert "(d_model, d_model)" in param and "[4, 4]" in param and "init: linear" in param
    assert "output" in node_line(dot, "output@out")


def test_groups_are_clusters_and_the_composite_merge_shows_its_copy():
    dot = dot_source(causal_trace())
    for group in ("Q projection", "attention core", "merge heads"):
        assert f"<B>{group}</B>" in dot
    composite = dot[dot.index("subgraph cluster_step_") :]
    assert composite.index('"merged/transpose"') < composite.index('"merged/contiguous"') < composite.index('"merged/view"')
    assert ("merged/transpose", "merged/contiguous") in {(t, h) for t, h, _ in edges(dot)}


def test_collapse_draws_one_node_per_group_with_input_to_output_shapes():
    dot = dot_source(causal_trace(), collapse=["attention core", "Q projection"])
    collapsed = [line for line in dot.splitlines() if " collapsed</FONT>" in line]
    assert len(collapsed) == 2
    core = next(line for line in collapsed if "attention core" in line)
    assert "(B, H, T, Dh), (B, H, T, Dh), (B, H, T, Dh) → (B, H, T, Dh)" in core
    assert "[2, 2, 6, 2], [2, 2, 6, 2], [2, 2, 6, 2] → [2, 2, 6, 2]" in core
    names = {n for t, h, _ in edges(dot) for n in (t, h)}
    assert not names & {"scores", "masked", "weights", "q", "q_heads"}
    assert ("x", "group@0") in {(t, h) for t, h, _ in edges(dot)}  # the Q projection reads x once
    # a param only the collapsed group reads is folded into it, not left dangling outside
    projection = next(line for line in collapsed if "Q projection" in line)
    assert "3 steps and 1 param collapsed" in projection and "W_q" not in names and '"W_q" [' not in dot


def test_collapse_a_block_by_path_prefix_or_glob(stack_trace):
    def collapsed(*patterns):
        dot = dot_source(stack_trace, collapse=patterns, expand=True)
        return [line for line in dot.splitlines() if " collapsed</FONT>" in line], dot

    steps_per_layer = sum(1 for s in stack_trace.analysis.pipeline.steps if s.group == "layers/0")
    assert repeated_blocks(shared_pipeline(STACK)) == ["layers/*"]  # how the gallery draws it
    per_copy, dot = collapsed("layers/*")
    assert len(per_copy) == 48 and all(f"{steps_per_layer} steps and" in line for line in per_copy)
    assert not any("×" in line for line in per_copy)  # one copy each: none is 'layers ×48'
    assert "(B, T, d_model) → (B, T, d_model)" in per_copy[0] and "[2, 8, 16] → [2, 8, 16]" in per_copy[0]
    chain = {(t, h) for t, h, _ in edges(dot)}
    assert ("x", "group@0") in chain and ("group@0", "group@1") in chain and ("group@47", "output@layers/47/out") in chain
    whole, dot = collapsed("layers")
    assert len(whole) == 1 and f"{48 * steps_per_layer} steps" in whole[0]
    assert {(t, h) for t, h, _ in edges(dot)} == {("x", "group@48"), ("group@48", "output@layers/47/out")}
    assert "layers ×48" in whole[0]  # the copies it holds
    one, _ = collapsed("layers/3")
    assert len(one) == 1 and "layers/3" in one[0]
    with pytest.raises(TracerError) as info:
        dot_source(stack_trace, collapse=["layer/*"])
    assert info.value.code == "unknown-group" and "'layers'" in str(info.value) and "'layers/*'" in str(info.value)


def test_a_repeated_block_is_drawn_once_with_one_marker_for_the_other_copies(stack_trace, tmp_path):
    dot = dot_source(stack_trace)
    marker, line = _marker(dot, "×47")
    assert "layers/1 … layers/47" in line and "copies 1–47 of 48 of blocks/encoder_layer.yaml" in line
    assert "(B, T, d_model) → (B, T, d_model)" in line
    chain = {(t, h) for t, h, _ in edges(dot)}
    assert ("layers/0/out", marker) in chain and (marker, "output@layers/47/out") in chain
    assert not any(t.startswith("layers/1/") or h.startswith("layers/1/") for t, h in chain)
    # --collapse still applies to the copy drawn, and the marker stays
    per_copy = dot_source(stack_trace, collapse=["layers/*"])
    assert per_copy.count(" collapsed</FONT>") == 1 and "×47" in per_copy
    # the picture does not grow with the number of copies
    (tmp_path / "blocks").mkdir()
    shutil.copy(PIPELINES / "blocks" / "encoder_layer.yaml", tmp_path / "blocks")
    (tmp_path / "few.yaml").write_text(STACK.read_text().replace("repeat: 48", "repeat: 3"))
    few = dot_source(tracer.load(tmp_path / "few.yaml").run(device="meta"))
    assert "×2" in few and len(few.splitlines()) == len(dot.splitlines())


def _stack_of_four(folder: Path) -> Path:
    """A file whose only group is a block at the top level, repeated 4 times."""
    (folder / "blocks").mkdir()
    shutil.copy(PIPELINES / "blocks" / "encoder_layer.yaml", folder / "blocks")
    path = folder / "stack4.yaml"
    path.write_text(
        "name: stack4\ndims: {B: 1, T: 4, d_model: 8, H: 2}\ninputs:\n  x: {shape: [B, T, d_model], init: randn}\n"
        "steps:\n  - {id: layers, op: block, use: blocks/encoder_layer.yaml, input: x, dims: {d_ff: 2 * d_model}, repeat: 4}\n"
    )
    return path


def _nodes(dot: str) -> list[str]:
    """Each drawn node's title and what it says, as text."""
    return [re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", line)).strip() for line in dot.splitlines() if "[label=<<TABLE" in line]


def test_render_depth_draws_each_group_that_deep_as_one_node_with_its_shapes(tmp_path):
    path = _stack_of_four(tmp_path)
    shapes = "(B, T, d_model) → (B, T, d_model) [1, 4, 8] → [1, 4, 8]"

    def drawn(*options):
        done = tracer_cli("render", path, "-o", tmp_path / "d.dot", "--force", "-q", *options)
        assert done.returncode == 0, done.stderr
        return _nodes((tmp_path / "d.dot").read_text())

    assert (
        drawn("--depth", "1")[1]
        == f'"group@4" [label= layers 100 steps and 64 params collapsed layers ×4 {shapes} > color="#333333" fillcolor="#f4f1e0" shape=box3d style=filled]'
    )
    assert drawn("--depth", "1") == drawn("--collapse", "*")
    per_copy = [node.split(" [label= ")[1].split(" > ")[0] for node in drawn("--depth", "2", "--no-legend")]
    assert per_copy[1:3] == [
        f"layers/0 25 steps and 16 params collapsed {shapes}",  # one copy: not 'layers ×4'
        f"×3 layers/1 … layers/3 copies 1–3 of 4 of blocks/encoder_layer.yaml, each like layers/0 75 steps and 48 params folded {shapes}",
    ]
    assert len(drawn("--depth", "3")) > 25  # no group is 3 levels deep: every step drawn, and no error
    flat = tracer_cli(
        "render", PIPELINES / "models" / "llama_decoder_layer.yaml", "-o", tmp_path / "l.dot", "--depth", "1", "-q", "--no-legend"
    )
    assert flat.returncode == 0, flat.stderr
    titles = [node.split(" [label= ")[1].split()[0] for node in _nodes((tmp_path / "l.dot").read_text()) if "collapsed" in node]
    assert titles == ["self_attn", "mlp"]


def test_collapse_of_an_unknown_group_names_the_groups():
    with pytest.raises(TracerError) as info:
        dot_source(causal_trace(), collapse=["attention"])
    assert info.value.code == "unknown-group" and "'attention core'" in str(info.value)


def test_legend_lists_only_marks_the_diagram_uses():
    full = legend(dot_source(causal_trace()))
    for text in ("non-contiguous", "view: shares storage", "copy:", "composite step", "group of steps", "input tensor"):
        assert text in full
    assert "dtype" not in full and "collapsed group" not in full
    plain = tracer.loads(pipeline_text("- {id: y, op: softmax, input: x, dim: -1}", inputs="x: {shape: [2, 3], init: randn}"))
    small = legend(dot_source(plain.run(device="meta")))
    assert "step: id" in small and "contiguous tensor" in small
    for text in ("non-contiguous", "view:", "copy:", "composite", "group", "parameter", "dtype"):
        assert text not in small
    ints = tracer.loads(
        pipeline_text(
            "- {id: y, op: transpose, input: x, dims: [0, 1]}", inputs="x: {shape: [2, 3], values: [[1, 2, 3], [4, 5, 6]], dtype: int64}"
        )
    )
    dot = dot_source(ints.run(device="meta"))
    assert "dtype, when not float32" in legend(dot) and "<B>int64</B>" in dot


def test_labels_are_escaped_and_odd_ids_stay_valid_dot(tmp_path):
    text = pipeline_text(
        '- {id: node, op: softmax, input: x, dim: -1, group: "a:b \\"c\\" <d>", note: "<b>&amp; \\\\l"}',
        inputs="x: {shape: [2], init: randn}",
    )
    trace = tracer.loads(text).run(device="meta")
    dot = dot_source(trace)
    assert "&lt;b&gt;&amp;amp;" in dot and "&quot;c&quot; &lt;d&gt;" in dot
    if shutil.which("dot"):
        subprocess.run(["dot", "-Tsvg"], input=dot, text=True, check=True, capture_output=True)
        collapsed = dot_source(trace, collapse=['a:b "c" <d>'])
        subprocess.run(["dot", "-Tsvg"], input=collapsed, text=True, check=True, capture_output=True)


def test_dot_is_deterministic_and_independent_of_device():
    first = dot_source(tracer.load(CAUSAL).run(device="meta"))
    assert dot_source(tracer.load(CAUSAL).run(device="meta")) == first
    assert dot_source(tracer.load(CAUSAL).run(device="cpu", seed=1)) == first


def test_diagram_is_a_digraph_for_notebooks():
    graph = causal_trace().diagram()
    assert isinstance(graph, graphviz.Digraph) and hasattr(graph, "_repr_mimebundle_")


@pytest.mark.parametrize("path", bundled_pipelines(), ids=lambda p: gallery_name(p, PIPELINES))
def test_dot_snapshot(path):
    """TRACER_UPDATE_SNAPSHOTS=1 rewrites tests/snapshots/ after an intended change."""
    dot = dot_source(shared_pipeline(path).run(device="meta"))
    snapshot = SNAPSHOTS / f"{gallery_name(path, PIPELINES)}.dot"
    if os.environ.get("TRACER_UPDATE_SNAPSHOTS") == "1":
        SNAPSHOTS.mkdir(exist_ok=True)
        snapshot.write_text(dot)
    assert snapshot.exists(), f"no snapshot {snapshot}; create it with TRACER_UPDATE_SNAPSHOTS=1 pytest {__file__}"
    assert dot == snapshot.read_text(), f"{snapshot} is out of date; if the change is intended, rerun with TRACER_UPDATE_SNAPSHOTS=1"


@needs_dot
def test_cli_render_svg_is_valid_and_shows_both_shapes_and_dashes(tmp_path, capsys):
    from tracer.cli import main

    out = tmp_path / "m.svg"
    assert main(["render", str(CAUSAL), "-o", str(out)]) == 0
    assert f"wrote {out}" in capsys.readouterr().out
    texts = svg_texts(out)
    assert "(B, H, T, T)" in texts
    assert any(re.fullmatch(r"\[\d+, \d+, \d+, \d+\]", t) for t in texts)
    root = ET.parse(out).getroot()
    dashed = [g for g in root.iter() if g.get("class") == "edge" and any(p.get("stroke-dasharray") for p in g.iter())]
    assert len(dashed) == 5
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.svg"]  # the DOT stays in a temporary folder


def test_collapse_folds_composite_steps_and_keeps_outputs_outside():
    dot = dot_source(causal_trace(), collapse=["merge heads"])
    [node] = [line for line in dot.splitlines() if " collapsed</FONT>" in line]
    assert "1 step collapsed" in node and "(B, H, T, Dh) → (B, T, d_model)" in node
    assert not {"merged/transpose", "merged/contiguous", "merged/view"} & {n for t, h, _ in edges(dot) for n in (t, h)}


def test_collapse_matches_a_literal_group_first_then_a_glob_per_path_segment():
    text = pipeline_text(
        """\
        - {id: a, op: relu, input: x, group: "a[1]"}
        - {id: b, op: relu, group: "enc/dec"}
        - {id: c, op: relu, group: enc}
        """,
        inputs="x: {shape: [2], init: randn}",
    )
    trace = tracer.loads(text).run(device="meta")

    def folded(*patterns):
        dot = dot_source(trace, collapse=patterns)
        return sorted(re.findall(r"<B>([^<]+)</B></TD></TR><TR><TD><FONT COLOR=\"#666666\">(\d+) step", dot))

    assert folded("a[1]") == [("a[1]", "1")]  # a group name with glob characters is taken as written
    assert folded("enc") == [("enc", "2")]  # groups are paths: 'enc/dec' is inside 'enc'
    assert folded("enc/*") == [("enc/dec", "1")]
    assert folded("e*") == [("enc", "2")]  # '*' stays within one path segment
    stack = shared_pipeline(STACK).run(device="meta")
    assert dot_source(stack, collapse=["lay*"]).count(" collapsed</FONT>") == 1


def _text_x(svg: str, node: str) -> float:
    """Where Graphviz put a node's label, left to right."""
    titles = {
        "".join(g.find("{http://www.w3.org/2000/svg}title").itertext()): g for g in ET.fromstring(svg).iter() if g.get("class") == "node"
    }
    return float(next(titles[node].iter("{http://www.w3.org/2000/svg}text")).get("x"))


@needs_dot
@pytest.mark.parametrize("name", ["llama_decoder_layer", "gemma2_decoder_layer"])
def test_q_k_v_and_gate_up_are_drawn_in_the_order_the_file_writes_them(name):
    trace = shared_pipeline(PIPELINES / "models" / f"{name}.yaml").run(device="meta")
    svg = trace.diagram()._repr_image_svg_xml()  # left to right by themselves, Graphviz drew these v, k, q and up, gate
    xs = {node: _text_x(svg, node) for node in ("q", "k", "v", "gate", "up")}
    assert xs["q"] < xs["k"] < xs["v"] and xs["gate"] < xs["up"]


def test_rankdir_and_no_legend_for_slides(tmp_path, capsys):
    from tracer.cli import main

    trace = causal_trace()
    wide = dot_source(trace, rankdir="LR", legend=False)
    assert "rankdir=LR" in wide and "legend" not in wide and "rankdir=TB" in dot_source(trace) and "legend" in dot_source(trace)
    with pytest.raises(TracerError, match="rankdir 'sideways' is not a direction Graphviz knows: use one of TB, LR"):
        trace.diagram(rankdir="sideways")
    assert main(["render", str(CAUSAL), "-o", str(tmp_path / "slide.dot"), "--rankdir", "LR", "--no-legend", "-q"]) == 0
    assert (tmp_path / "slide.dot").read_text() == wide
    trace.save(tmp_path / "api.dot", rankdir="LR", legend=False)
    assert (tmp_path / "api.dot").read_text() == wide


def _slide_scale(svg: str, width_px: int = 1920, height_px: int = 1080) -> float:
    """The size a 16:9 slide shows the whole drawing at (1 = as drawn; Graphviz's pt are 4/3 px)."""
    root = ET.fromstring(svg)
    width, height = (float(root.get(side).removesuffix("pt")) * 4 / 3 for side in ("width", "height"))
    return min(width_px / width, height_px / height)


@needs_dot
def test_collapse_star_draws_a_30_step_layer_as_one_node_per_group_that_fits_a_slide():
    """`--collapse '*'`, the first nesting level: llama_decoder_layer's self_attn and mlp each one
    box with its in → out shapes, the layer legible on a 1920 × 1080 slide (the report's legible
    zoom, 0.75), where the full drawing would be shown at a quarter of its size."""
    trace = shared_pipeline(PIPELINES / "models" / "llama_decoder_layer.yaml").run(device="meta")
    assert len(trace.analysis.nodes) == 30
    compact = trace.diagram(collapse=["*"], legend=False)
    boxes = re.findall(r"<B>([^<]+)</B></TD></TR><TR><TD><FONT COLOR=\"#666666\">(\d+) steps", compact.source)
    assert sorted(boxes) == [("mlp", "5"), ("self_attn", "21")]
    assert compact.source.count("(B, T, d_model) → (B, T, d_model)") == 2
    nodes = {end for tail, head, _ in edges(compact.source) for end in (tail, head)}
    assert len(nodes) <= 10, nodes
    assert _slide_scale(compact._repr_image_svg_xml()) >= 0.75
    assert _slide_scale(trace.diagram(legend=False)._repr_image_svg_xml()) < 0.3
