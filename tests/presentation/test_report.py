"""The HTML report (`tracer render -o report.html`) and the heatmaps in diagrams."""

import base64
import json
import re
import struct
import zlib
from pathlib import Path

import pytest
import torch

import tracer
from tests.browser import Browser, find_chromium
from tests.conftest import PIPELINES, ROOT, pipeline_text
from tests.kinds import SDPA_CASES, SDPA_INPUTS, sdpa_step
from tracer.cli import main
from tracer.gallery import build
from tracer.presentation.diagram import dot_source
from tracer.presentation.report import LEVELS, MAX_CELLS, MAX_MAPS, MAX_SIDE, _Data, _stats, moved, report_data, script_json

CAUSAL = PIPELINES / "causal_mha.yaml"


SENTENCE = PIPELINES / "seeds" / "000_encoder_block.yaml"


HOSTILE = "</script><script>window.pwned=1</script><!--"


@pytest.fixture(scope="module")
def causal():
    return tracer.load(CAUSAL).run(keep_values=True)


@pytest.fixture(scope="module")
def reports(tmp_path_factory, causal):
    """The pages the browser opens: causal_mha with values, and one with hostile text everywhere."""
    folder = tmp_path_factory.mktemp("reports")
    hostile = pipeline_text(
        f"""\
        - {{id: s, op: softmax, input: x, dim: -1, group: '{HOSTILE}', note: '{HOSTILE} <img src=x onerror="window.pwned=2">'}}
        """,
        inputs=f"x: {{shape: [3, 3], init: randn, note: '{HOSTILE}'}}",
    ).replace("name: t", f"name: '{HOSTILE}'")
    return {
        "causal": causal.save(folder / "r.html"),
        "hostile": tracer.loads(hostile, "hostile.yaml").run(keep_values=True).save(folder / "hostile.html"),
    }


def decode(heatmap_map: dict) -> torch.Tensor:
    """A map as the page reads it: bytes 0..LEVELS of the map's largest weight (255: NaN)."""
    levels = torch.tensor(list(base64.b64decode(heatmap_map["cells"])), dtype=torch.float32)
    side = int(len(levels) ** 0.5)
    return torch.where(levels > LEVELS, torch.nan, levels / LEVELS * heatmap_map["max"]).reshape(side, -1)


@pytest.fixture(scope="module")
def browser():
    executable = find_chromium()
    if executable is None:
        pytest.skip("no Chromium on PATH: install Debian's chromium (`make install` does, as root with apt-get)")
    browser = Browser(executable)
    yield browser
    browser.close()


def panel(browser) -> str:
    return browser.evaluate("document.getElementById('panel').innerText")


def png_colours(png: bytes) -> set[tuple[int, int, int]]:
    """The distinct RGB colours of an 8-bit RGB(A) PNG (what Chromium writes), decoded with zlib alone."""
    width, height, depth, kind = struct.unpack(">IIBB", png[16:26])
    assert depth == 8 and kind in (2, 6)
    step = 3 if kind == 2 else 4
    chunks, pos = [], 8
    while pos < len(png):
        size, name = struct.unpack(">I4s", png[pos : pos + 8])
        if name == b"IDAT":
            chunks.append(png[pos + 8 : pos + 8 + size])
        pos += 12 + size
    raw, stride = zlib.decompress(b"".join(chunks)), width * step
    previous, colours = bytearray(stride), set()
    for y in range(height):
        kind_of_filter, line = raw[y * (stride + 1)], bytearray(raw[y * (stride + 1) + 1 : (y + 1) * (stride + 1)])
        for i in range(stride):
            left = line[i - step] if i >= step else 0
            up, corner = previous[i], previous[i - step] if i >= step else 0
            line[i] = (line[i] + _predict(kind_of_filter, left, up, corner)) & 0xFF
        colours.update(tuple(line[x : x + 3]) for x in range(0, stride, step * 7))  # every 7th pixel is plenty
        previous = line
    return colours


def _predict(kind: int, left: int, up: int, corner: int) -> int:
    if kind == 0:
        return 0
    if kind == 1:
        return left
    if kind == 2:
        return up
    if kind == 3:
        return (left + up) // 2
    estimate = left + up - corner
    distances = abs(estimate - left), abs(estimate - up), abs(estimate - corner)
    return (left, up, corner)[distances.index(min(distances))]


def _chunk(name: bytes, body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + name + body + struct.pack(">I", zlib.crc32(name + body))


def test_the_record_of_the_softmax_output_has_shape_stride_location_stats_and_heatmap(causal):
    data = report_data(causal)
    weights = next(t for t in data["tensors"] if t["id"] == "weights")
    assert (weights["shape"], weights["stride"], weights["symbolic"]) == ([2, 2, 6, 6], [72, 36, 6, 1], "(B, H, T, T)")
    line = next(n for n, text in enumerate(CAUSAL.read_text().splitlines(), 1) if "{id: weights," in text)
    assert weights["where"] == f"{CAUSAL}:{line}" and weights["group"] == "attention core" and weights["users"] == ["weights_d"]
    tensor = causal["weights"].tensor
    stats = weights["stats"]
    assert stats["max"] == 1 and stats["nan"] == stats["posinf"] == 0 and stats["mean"] == pytest.approx(float(tensor.mean()), abs=1e-4)
    heat = weights["heatmap"]
    assert heat["lead_dims"] == ["B", "H"] and heat["lead"] == [[0, 0], [0, 1], [1, 0], [1, 1]]
    assert [decode(m).shape for m in heat["maps"]] == [(6, 6)] * 4
    assert decode(heat["maps"][3]).allclose(tensor[1, 1], atol=1 / LEVELS)
    assert decode(heat["maps"][0])[0, 1] == 0  # causal: the first query sees only itself
    masked = next(t for t in data["tensors"] if t["id"] == "masked")
    assert masked["stats"]["neginf"] == 2 * 2 * 15 and "heatmap" not in masked


def test_the_attention_core_is_described_and_each_of_its_tensors_knows_its_role(causal):
    data = report_data(causal)
    assert data["attention"] == [
        {
            "product": "scores",
            "fused": False,
            "query": "q_h",
            "keys": "k_t",
            "values": "v_h",
            "scores": "scores",
            "weights": "weights",
            "recomputed": None,  # only a fused kernel's weights are recomputed
            "context": "context",
            "scale": "1/√Dh (Dh=2)",
            "multiplier": 0.7071,
            "masks": [{"step": "masked", "pattern": "causal"}],
        }
    ]
    roles = {t["id"]: t.get("attention") for t in data["tensors"]}
    assert roles["q_h"] == [[0, "query"]] and roles["weights"] == [[0, "weights"]] and roles["x"] is None


def test_inputs_params_and_composite_parts_point_at_their_yaml_lines(causal):
    where = {t["id"]: t["where"] for t in report_data(causal)["tensors"]}
    lines = CAUSAL.read_text().splitlines()
    assert lines[int(where["x"].rsplit(":", 1)[1]) - 1].strip().startswith("x:")
    assert lines[int(where["W_q"].rsplit(":", 1)[1]) - 1].strip().startswith("W_q:")
    merged = next(n for n, text in enumerate(lines, 1) if "{id: merged," in text)
    assert where["merged/contiguous"] == where["merged/view"] == f"{CAUSAL}:{merged}"


def test_heatmaps_are_labelled_with_the_sentence_tokens():
    data = report_data(tracer.load(SENTENCE).run(keep_values=True))
    heat = next(t for t in data["tensors"] if t["id"] == "attn_weights")["heatmap"]
    words = "My shoes are small my feet are big.".split()
    assert heat["row_labels"] == heat["col_labels"] == words and len(heat["maps"]) == 2


def test_large_weights_are_pooled_and_capped():
    text = pipeline_text("- {id: w, op: softmax, input: x, dim: -1}", dims="{H: 40, T: 100}", inputs="x: {shape: [H, T, T], init: randn}")
    trace = tracer.loads(text).run(keep_values=True)
    heat = report_data(trace)["tensors"][-1]["heatmap"]
    assert heat["total"] == 40 and len(heat["maps"]) == MAX_MAPS and heat["row_labels"] is None
    assert (decode(heat["maps"][0]).shape, heat["side"], heat["rows"]) == ((MAX_SIDE, MAX_SIDE), [MAX_SIDE, MAX_SIDE], 100)
    pooled = torch.nn.functional.adaptive_avg_pool2d(trace["w"].tensor[:1], MAX_SIDE)[0]
    assert decode(heat["maps"][0]).allclose(pooled, atol=float(pooled.max()) / LEVELS)
    assert len(script_json(report_data(trace))) < 100_000  # 1.6 MB of weights, summarised


def test_a_page_embeds_at_most_max_cells():
    steps = "\n".join(f"- {{id: w{i}, op: softmax, input: x, dim: -1}}" for i in range(5))
    text = pipeline_text(steps, dims="{H: 16, T: 64}", inputs="x: {shape: [H, T, T], init: randn}")
    maps = [len(t["heatmap"]["maps"]) for t in report_data(tracer.loads(text).run(keep_values=True))["tensors"][1:]]
    assert MAX_CELLS == 4 * MAX_MAPS * 64 * 64 and maps == [MAX_MAPS] * 4 + [0]


def test_embedded_json_cannot_close_its_script_element():
    text = script_json({"name": HOSTILE, "x": "a\u2028b & <!-- -->"})
    assert "<" not in text and ">" not in text and "&" not in text and "\u2028" not in text
    assert json.loads(text) == {"name": HOSTILE, "x": "a\u2028b & <!-- -->"}


def test_hostile_names_stay_text_and_only_the_reports_own_scripts_exist(reports):
    page = reports["hostile"].read_text()
    assert page.count("<script") == 2 and page.count("</script>") == 2
    assert "<img" not in page and "<!--" not in page
    script = re.search(r"<script>(.*?)</script>", page, re.S)[1]
    assert "script-src 'sha256-" in page and "'unsafe-inline'" not in page.split("script-src")[1].split('"')[0]
    assert script.startswith('"use strict"')


def test_the_page_fetches_nothing(reports):
    page = reports["causal"].read_text()
    urls = set(re.findall(r"(?:https?:)?//[\w.-]+[^\s\"'<>)]*", page))
    assert urls <= {"http://www.w3.org/2000/svg", "http://www.w3.org/1999/xlink"}, urls
    assert "default-src 'none'" in page


def test_cli_writes_a_report_and_refuses_values_on_meta(tmp_path, capsys):
    out = tmp_path / "r.html"
    assert main(["render", str(CAUSAL), "--values", "-o", str(out)]) == 0
    assert '"values":true' in out.read_text() and '"stats"' in out.read_text()
    assert "stats" not in report_data(tracer.load(CAUSAL).run(device="meta"))["tensors"][0]
    assert main(["render", str(CAUSAL), "--values", "--device", "meta", "-o", str(tmp_path / "x.html")]) == 1
    assert "values-on-meta" in capsys.readouterr().err and not (tmp_path / "x.html").exists()


def test_diagrams_draw_a_heatmap_per_head_in_softmax_nodes_when_values_are_kept(causal):
    dot = dot_source(causal)
    node = next(line for line in dot.splitlines() if line.strip().startswith("weights ["))
    assert node.count("BGCOLOR=") == 2 * 6 * 6 and 'BGCOLOR="#ffffff"' in node and "weights per H, first B" in node
    assert "BGCOLOR=" not in dot.replace(node, "").split("legend [")[0]
    assert 'BGCOLOR="#' not in dot_source(tracer.load(CAUSAL).run(device="meta")).split("legend [")[0]


def test_no_heatmap_in_nodes_past_32_tokens():
    text = pipeline_text("- {id: w, op: softmax, input: x, dim: -1}", inputs="x: {shape: [33, 33], init: randn}")
    assert "FIXEDSIZE" not in dot_source(tracer.loads(text).run(keep_values=True))


def test_cli_render_values_draws_the_heatmap_into_the_svg(tmp_path):
    out = tmp_path / "w.svg"
    assert main(["render", str(CAUSAL), "--values", "-o", str(out)]) == 0
    assert out.read_text().count('fill="#08519c"') == 2  # one darkest cell in each head's map (the first query on itself)


def test_gallery_writes_reports_for_the_chosen_pipelines(tmp_path):
    src = tmp_path / "pipelines"
    src.mkdir()
    (src / "causal_mha.yaml").write_text(CAUSAL.read_text())
    (src / "other.yaml").write_text(CAUSAL.read_text().replace("name: causal_mha", "name: other"))
    out = tmp_path / "gallery"
    build(src, out)
    assert sorted(p.name for p in out.iterdir()) == [
        "README.md",
        "causal_mha.html",
        "causal_mha.py",
        "causal_mha.svg",
        "other.py",
        "other.svg",
    ]
    assert "(causal_mha.html)" in (out / "README.md").read_text()


def test_committed_gallery_links_existing_reports():
    gallery = ROOT / "docs" / "gallery"
    links = re.findall(r"\]\(([^)]+\.html)\)", (gallery / "README.md").read_text())
    assert "causal_mha.html" in links and "seeds__000_encoder_block.html" in links
    assert all((gallery / link).exists() for link in links)


def test_browser_deep_link_shows_the_record_and_a_heatmap(browser, reports):
    browser.open(reports["causal"].as_uri() + "#weights")
    text = panel(browser)
    assert "weights" in text and "[2, 2, 6, 6]" in text and "(72, 36, 6, 1)" in text and "causal_mha.yaml:" in text
    assert browser.evaluate("document.querySelectorAll('.node.selected').length") == 1
    assert browser.evaluate("document.querySelector('canvas.heatmap').width") > 0
    # the top-left cell is the first query's weight on itself: 1, drawn dark blue
    pixel = browser.evaluate(
        "(() => { const c = document.querySelector('canvas.heatmap'); const r = devicePixelRatio;"
        " return Array.from(c.getContext('2d').getImageData(8 * r, 8 * r, 1, 1).data); })()"
    )
    assert pixel == [8, 81, 156, 255]
    browser.evaluate(
        "(() => { const s = document.querySelector('select[data-dim=H]'); s.value = '1'; s.dispatchEvent(new Event('change')); })()"
    )
    assert browser.evaluate("document.querySelector('select[data-dim=H]').value") == "1"
    assert browser.problems() == [] and browser.evaluate("performance.getEntriesByType('resource').length") == 0


def test_browser_clicking_a_node_or_searching_changes_the_panel(browser, reports):
    browser.open(reports["causal"].as_uri() + "#weights")
    box = browser.evaluate(
        '(() => { const a = document.querySelector(\'a[href="#scaled"], a[*|href="#scaled"]\');'
        " const n = a.closest('g.node').getBoundingClientRect(); return [n.x + n.width / 2, n.y + n.height / 2]; })()"
    )
    browser.click(*box)
    browser.wait_for("document.getElementById('record-id')?.textContent === 'scaled'")
    assert "scale" in panel(browser) and browser.evaluate("location.hash") == "#scaled"
    edge = "document.querySelector('g.edge a[*|href=\"#masked\"]')"
    browser.evaluate(f"{edge}.dispatchEvent(new MouseEvent('click', {{bubbles: true}}))")
    browser.wait_for("document.getElementById('record-id')?.textContent === 'masked'")
    assert browser.evaluate("document.querySelectorAll('.edge.selected').length") >= 1
    browser.evaluate("document.getElementById('search').value = 'k_t'")
    browser.evaluate("document.getElementById('search-form').requestSubmit()")
    browser.wait_for("document.getElementById('record-id')?.textContent === 'k_t'")
    assert "(24, 2, 1, 4)" in panel(browser) and "no" in panel(browser)


def test_browser_screenshot_is_not_blank(browser, reports):
    browser.open(reports["causal"].as_uri() + "#weights")
    colours = png_colours(browser.screenshot(scale=0.25))
    assert len(colours) > 50  # diagram, panel text and heatmap: many distinct colours
    assert (8, 81, 156) in colours


def test_browser_hostile_text_never_runs_and_shows_as_written(browser, reports):
    browser.open(reports["hostile"].as_uri() + "#s")
    assert browser.evaluate("window.pwned") is None
    assert browser.evaluate("document.getElementById('title').textContent") == HOSTILE
    assert HOSTILE in panel(browser)
    assert browser.evaluate("document.querySelectorAll('script').length") == 2


def test_png_colours_reads_a_known_picture():
    rows = b"".join(b"\x00" + bytes([255, 0, 0, 0, 255, 0]) for _ in range(2))  # 2x2: red, green
    body = struct.pack(">IIBBBBB", 2, 2, 8, 2, 0, 0, 0)
    png = b"\x89PNG\r\n\x1a\n" + _chunk(b"IHDR", body) + _chunk(b"IDAT", zlib.compress(rows)) + _chunk(b"IEND", b"")
    assert png_colours(png) == {(255, 0, 0)}  # every 7th pixel of each row: the first


def test_report_module_constants_are_documented():
    doc = (ROOT / "docs" / "report.md").read_text()
    assert f"{MAX_SIDE} × {MAX_SIDE}" in doc and f"{MAX_MAPS} maps" in doc


@pytest.mark.parametrize("fragment", ["%E0%A4%A", "%", "%ZZ", "%C0%80"])
def test_browser_a_malformed_link_shows_the_summary(browser, reports, fragment):
    browser.open(reports["causal"].as_uri() + "#" + fragment)
    assert browser.evaluate("document.documentElement.dataset.ready") == "true"
    assert browser.evaluate("document.querySelector('#panel h2').textContent") == "causal_mha"
    browser.evaluate("location.hash = '#%E0%A4%A'")  # a later bad link too
    assert browser.problems() == []


def test_browser_summary_of_a_parallel_pipeline_shows_its_mesh_and_collectives(browser, tmp_path):
    page = tracer.load(PIPELINES / "parallel" / "llama_tp.yaml").run().save(tmp_path / "tp.html")
    browser.open(page.as_uri())
    assert browser.evaluate("document.documentElement.dataset.ready") == "true"
    text = panel(browser)
    assert "mesh\ttp=2 (2 ranks)" in text and "all_reduce over tp at attn_out: 512 B per rank" in text
    assert "communication per layer: 2 all_reduce (tp), 1.0 KiB per rank" in text
    assert browser.problems() == []


def test_a_pipeline_without_parallel_has_no_mesh_in_its_page_data(causal):
    assert "mesh" not in report_data(causal)


def stack_of(layers: int, folder) -> tracer.Pipeline:
    """encoder_stack with ``repeat: layers``, its block file beside it."""
    (folder / "blocks").mkdir(exist_ok=True)
    (folder / "blocks" / "encoder_layer.yaml").write_text((PIPELINES / "blocks" / "encoder_layer.yaml").read_text())
    path = folder / f"stack_{layers}.yaml"
    path.write_text((PIPELINES / "encoder_stack.yaml").read_text().replace("repeat: 48", f"repeat: {layers}"))
    return tracer.load(path)


@pytest.fixture(scope="module")
def stacks(tmp_path_factory):
    folder = tmp_path_factory.mktemp("stacks")
    traces = {n: stack_of(n, folder).run(device="meta") for n in (12, 48)}  # benchmarks/report_size.py: 48 and 192
    return {n: (trace, trace.save(folder / f"stack_{n}.html")) for n, trace in traces.items()}


def rebuilt(data: dict, record_id: str) -> dict:
    """A record as report.js's record() rebuilds it: copy 0's, its ids moved to the copy, plus the changes."""
    shown = {t["id"]: t for t in data["tensors"]}
    if record_id in shown:
        return shown[record_id]
    block = next(b for b in data["copies"] if any(record_id.startswith(c + "/") for c in b["hidden"]))
    copy = next(c for c in block["hidden"] if record_id.startswith(c + "/"))
    changes = block["changes"].get(record_id, {})
    out = {**moved(rebuilt(data, block["shown"] + record_id[len(copy) :]), block["shown"], copy), **changes}
    return {key: value for key, value in out.items() if key not in changes.get("-", []) + ["-"]}


def test_a_report_folds_repeated_blocks_and_every_folded_record_is_rebuilt_exactly(stacks):
    trace, page = stacks[48]
    size_12, size_48 = stacks[12][1].stat().st_size, page.stat().st_size
    assert size_48 < 2 * size_12  # 4x the layers; drawing every copy made the 48-layer page 4.7 MB
    data, svg = report_data(trace), page.read_text()
    assert svg.count('class="node"') < 60 and "×47" in svg and len(data["tensors"]) < 60 and data["count"] == len(trace.records)
    for record_id in ("layers/0/out", "layers/1/x", "layers/30/attn_weights", "layers/47/out", "layers/17/W_Q"):
        assert rebuilt(data, record_id) == _Data(trace).tensor(trace[record_id]), record_id
    assert rebuilt(data, "layers/1/x")["inputs"] == ["layers/0/out"]  # the copy reads the copy before


def test_browser_the_copy_selector_visits_layer_k_and_its_records(browser, stacks):
    browser.open(stacks[48][1].as_uri() + "#layers/5/attn_weights")
    assert "layers/5/attn_weights" == browser.evaluate("document.getElementById('record-id').textContent")
    assert browser.evaluate("document.getElementById('copy').value") == "layers/5" and "layers/5/scores" in panel(browser)
    assert browser.evaluate("document.querySelectorAll('.node.selected').length") == 1  # copy 0's node, drawn once
    browser.evaluate(
        "(() => { const s = document.getElementById('copy'); s.value = 'layers/47'; s.dispatchEvent(new Event('change')); })()"
    )
    browser.wait_for("document.getElementById('record-id')?.textContent === 'layers/47/attn_weights'")
    assert "layers/47/scores" in panel(browser) and browser.problems() == []


def test_browser_a_tall_diagram_opens_legible_with_its_inputs_in_view(browser, tmp_path):
    page = tracer.load(PIPELINES / "models" / "llama_decoder_layer.yaml").run(device="meta").save(tmp_path / "llama.html")
    browser.open(page.as_uri())
    node, view = browser.evaluate(
        "(() => { const a = document.querySelector('a[*|href=\"#x\"]').closest('g.node').getBoundingClientRect();"
        " const v = document.getElementById('viewport').getBoundingClientRect();"
        " return [[a.left, a.top, a.right, a.bottom, a.height], [v.left, v.top, v.right, v.bottom]]; })()"
    )
    assert view[0] <= node[0] and node[2] <= view[2] and view[1] <= node[1] and node[3] <= view[3]  # the input is in view
    text = browser.evaluate(
        "document.querySelector('a[*|href=\"#x\"]').closest('g.node').querySelector('text').getBoundingClientRect().height"
    )
    assert text >= 10  # fitting the whole layer drew 11 pt text at 3 px


def test_tokens_label_the_heatmaps_and_must_have_one_word_per_position(causal, tmp_path):
    words = "The cat sat on the mat".split()  # causal_mha: T = 6
    heat = next(t for t in report_data(causal, words)["tensors"] if t["id"] == "weights")["heatmap"]
    assert heat["row_labels"] == heat["col_labels"] == words
    with pytest.raises(tracer.TracerError, match=r"the tokens are 3 words; the attention weights have 6 positions"):
        report_data(causal, words[:3])
    assert main(["render", str(CAUSAL), "--values", "--tokens", " ".join(words), "-o", str(tmp_path / "r.html"), "-q"]) == 0
    assert '"tokens":["The","cat","sat","on","the","mat"]' in (tmp_path / "r.html").read_text()
    causal.save(tmp_path / "api.html", tokens="The cat sat on the mat")
    assert '"tokens":["The","cat"' in (tmp_path / "api.html").read_text()


def test_browser_the_summary_shows_a_layer_by_head_grid_of_attention_maps(browser, tmp_path):
    trace = stack_of(4, tmp_path).run(keep_values=True)  # encoder_stack's dims: H = 4, T = 8
    page = trace.save(tmp_path / "grid.html", tokens="a b c d e f g h")
    browser.open(page.as_uri())
    rows = browser.evaluate(
        "Array.from(document.querySelectorAll('#attention-grid .grid-row'), r => r.querySelectorAll('canvas.thumb').length)"
    )
    assert rows == [4, 4, 4, 4]  # four layers (three of them folded copies), four heads of batch item 0
    label = browser.evaluate("document.querySelectorAll('#attention-grid .grid-label')[3].textContent")
    assert label == "layers/3/attn_weights" and "tokens: a b c d e f g h" in panel(browser)
    # a row of a causal-free map has no white cell: each weight is some share of the row
    pixel = browser.evaluate("Array.from(document.querySelector('canvas.thumb').getContext('2d').getImageData(2, 2, 1, 1).data)")
    assert pixel != [255, 255, 255, 255] and browser.evaluate("document.getElementById('colour-scale').width") == 160
    browser.evaluate("document.querySelectorAll('#attention-grid canvas.thumb')[13].click()")
    browser.wait_for("document.getElementById('record-id')?.textContent === 'layers/3/attn_weights'")
    assert browser.problems() == []


def test_statistics_are_the_same_whatever_order_the_machine_summed_in():
    """A LayerNorm's output averages to 0 up to rounding; two machines (SIMD width, threads) round
    its values differently in the last place. The page shows the same numbers for both."""
    x = torch.randn(2, 8, 16, generator=torch.Generator().manual_seed(0)) * 3 + 1
    here = torch.nn.functional.layer_norm(x, (16,))
    there = torch.nn.functional.layer_norm(x.double(), (16,)).float()  # the same values, rounded another way
    assert not torch.equal(here, there) and here.double().mean() != there.double().mean()
    assert _stats(here) == _stats(there)
    assert _stats(here)["mean"] == 0.0 and _stats(here)["std"] == pytest.approx(1.0, abs=0.01)
    assert _stats(here + 0.5)["mean"] == pytest.approx(0.5)  # a mean above the noise is kept


@pytest.mark.parametrize("fields", SDPA_CASES)
def test_sdpa_weights_are_recomputed_for_the_page_and_are_what_sdpa_applied(fields):
    """sdpa never stores its weights: the page shows them recomputed from its q, k, mask and scale,
    labelled so, and they are the ones torch used: applied to the values they give sdpa's output."""
    text = pipeline_text(sdpa_step(fields), inputs=SDPA_INPUTS)
    trace = tracer.loads(text, "t.yaml").run(keep_values=True)
    data = _Data(trace)
    weights = data.recomputed_weights(trace.analysis.nodes["o"])
    values = trace["v"].tensor.repeat_interleave(2, -3)
    assert weights.shape == (2, 4, 3, 6) and torch.allclose(weights.sum(-1), torch.ones(2, 4, 3))
    assert torch.allclose(weights @ values, trace["o"].tensor, atol=1e-5)
    page = report_data(trace)
    heatmap = next(t for t in page["tensors"] if t["id"] == "o")["heatmap"]
    assert heatmap["recomputed"].startswith("recomputed from q, k, mask, scale") and heatmap["axes"] == ["3", "6"]
    assert heatmap["lead"] == [[b, h] for b in range(2) for h in range(4)] and page["attention"][0]["recomputed"] == "o"
    assert trace["o"].tensor is data.by_id["o"].tensor  # the run's records are left as they were


GEOMETRY = """(() => {
  const box = (e) => { const r = e.getBoundingClientRect(); return [r.left, r.top, r.right, r.bottom]; };
  const titled = (name) => [...document.querySelectorAll('g.node')].find((g) => g.querySelector('title')?.textContent === name);
  const panel = document.getElementById('panel'), style = getComputedStyle(panel);
  const inner = box(panel);
  inner[0] += parseFloat(style.paddingLeft); inner[2] -= parseFloat(style.paddingRight);
  return {
    view: box(document.getElementById('viewport')),
    legend: box(titled('legend')),
    clusters: [...document.querySelectorAll('g.cluster')].map(box),
    panel: inner,
    heatmap: document.querySelector('canvas.heatmap') && box(document.querySelector('canvas.heatmap')),
    scroller: document.querySelector('.heat-scroll') && [document.querySelector('.heat-scroll').scrollWidth, document.querySelector('.heat-scroll').clientWidth],
    labels: [...document.querySelectorAll('#attention-grid .grid-label')].map((l) => {
      const pen = document.createElement('canvas').getContext('2d');
      pen.font = getComputedStyle(l).font;
      return [pen.measureText(l.textContent).width, l.getBoundingClientRect().width, l.textContent];
    }),
  };
})()"""


def _inside(inner, outer) -> bool:
    return outer[0] <= inner[0] and inner[2] <= outer[2] and outer[1] <= inner[1] and inner[3] <= outer[3]


def test_browser_at_1400_by_900_opens_fitted_with_the_legend_clusters_heatmap_and_grid_labels_whole(tmp_path):
    """A 10-token causal_mha and a two-layer stack, as a laptop shows them: the first view holds
    the leftmost cluster and the legend (no part under the side panel), the 10 × 10 heatmap fits
    the panel with its last key column, and the layer × head grid prints its row labels whole."""
    executable = find_chromium()
    if executable is None:
        pytest.skip("no Chromium on PATH: install Debian's chromium (`make install` does, as root with apt-get)")
    words = "the quick brown fox jumps over the lazy dog again"
    mha = tracer.load(CAUSAL).run(dims={"T": 10}, keep_values=True).save(tmp_path / "mha.html", tokens=words)
    named = tmp_path / "named.yaml"  # a site id as long as a real model's
    named.write_text(Path(stack_of(2, tmp_path).source.file).read_text().replace("layers", "transformer_layers"))
    stack = tracer.load(named).run(keep_values=True).save(tmp_path / "stack.html")
    browser = Browser(executable, 1400, 900)
    try:
        browser.open(mha.as_uri())
        seen = browser.evaluate(GEOMETRY)
        assert _inside(seen["legend"], seen["view"]), seen
        assert seen["clusters"] and all(seen["view"][0] <= c[0] and c[2] <= seen["view"][2] for c in seen["clusters"]), seen
        browser.evaluate("location.hash = '#weights'")
        browser.wait_for("document.querySelector('canvas.heatmap') !== null")
        seen = browser.evaluate(GEOMETRY)
        assert seen["heatmap"][0] >= seen["panel"][0] and seen["heatmap"][2] <= seen["panel"][2] + 0.5, seen  # the last key column
        assert seen["scroller"][0] <= seen["scroller"][1], seen  # nothing to scroll to at 10 tokens
        browser.open(stack.as_uri())
        seen = browser.evaluate(GEOMETRY)
        assert len(seen["labels"]) == 2 and all(text <= shown for text, shown, _ in seen["labels"]), seen["labels"]
        assert browser.problems() == []
    finally:
        browser.close()


def _word_tokenizer(folder):
    """A save_pretrained tokenizer folder made here (no download): words, and [CLS] in front."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    vocab = {word: i for i, word in enumerate(["[UNK]", "[CLS]", "the", "cat", "sat", "on", "mat"])}
    core = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    core.pre_tokenizer = pre_tokenizers.Whitespace()
    core.post_processor = processors.TemplateProcessing(single="[CLS] $A", special_tokens=[("[CLS]", 1)])
    PreTrainedTokenizerFast(tokenizer_object=core, unk_token="[UNK]", cls_token="[CLS]").save_pretrained(folder)
    return folder


def test_tokenizer_splits_the_tokens_text_as_the_model_reads_it(tmp_path):
    folder = _word_tokenizer(tmp_path / "tok")
    out = tmp_path / "r.html"
    argv = ["render", str(CAUSAL), "--values", "--tokens", "the cat sat on mat", "--tokenizer", str(folder), "-o", str(out), "-q"]
    assert main(argv) == 0
    assert '"tokens":["[CLS]","the","cat","sat","on","mat"]' in out.read_text()  # 6 positions: T = 6


def test_tokenizer_problems_are_located_errors(tmp_path, capsys):
    base = ["render", str(CAUSAL), "--values", "-o", str(tmp_path / "r.html"), "-q"]
    assert main([*base, "--tokenizer", str(tmp_path)]) == 1  # tokens missing
    assert main([*base, "--tokens", "a b", "--tokenizer", str(tmp_path / "none")]) == 1
    (tmp_path / "empty").mkdir()
    assert main([*base, "--tokens", "a b", "--tokenizer", str(tmp_path / "empty")]) == 1
    err = capsys.readouterr().err.splitlines()
    assert err[0] == f'--tokenizer {tmp_path}: error[tokenizer]: give the text to split with --tokens "..."'
    assert err[1].startswith(f"--tokenizer {tmp_path / 'none'}: error[tokenizer]: not a folder")
    assert err[2].startswith(f"--tokenizer {tmp_path / 'empty'}: error[tokenizer]: transformers cannot read a tokenizer here: ")
    assert not (tmp_path / "r.html").exists()
