"""The gallery (`make demo`): every bundled pipeline drawn and exported, stable, with links that exist."""

import re
import shutil
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

import tracer
from tests.conftest import PIPELINES, ROOT
from tracer.gallery import build, repeated_blocks
from tracer.gallery import main as gallery_main
from tracer.presentation.diagram import dot_source

CAUSAL = PIPELINES / "causal_mha.yaml"


needs_dot = pytest.mark.skipif(shutil.which("dot") is None, reason="Graphviz `dot` is not installed")


def svg_texts(path: Path) -> list[str]:
    root = ET.parse(path).getroot()  # raises on invalid XML
    assert root.tag.endswith("svg")
    return ["".join(t.itertext()) for t in root.iter() if t.tag.endswith("text")]


@needs_dot
def test_gallery_renders_every_pipeline_skips_broken_ones_and_is_stable(tmp_path, capsys):
    src = tmp_path / "pipelines"
    (src / "seeds").mkdir(parents=True)
    shutil.copy(CAUSAL, src / "seeds" / "mha.yaml")
    (src / "broken.yaml").write_text("name: broken\nsteps: []\n")
    out = tmp_path / "gallery"
    assert build(src, out) == (1, 1, 0, 0, 1)
    assert f"skipped {src / 'broken.yaml'} (an error):" in capsys.readouterr().err
    assert sorted(p.name for p in out.iterdir()) == ["README.md", "seeds__mha.py", "seeds__mha.svg"]
    assert "(seeds__mha.svg)" in (out / "README.md").read_text() and "[PyTorch module](seeds__mha.py)" in (out / "README.md").read_text()
    assert "(B, H, T, T)" in svg_texts(out / "seeds__mha.svg")
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    build(src, out)
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before


def test_committed_gallery_links_only_existing_pictures():
    gallery = ROOT / "docs" / "gallery"
    links = re.findall(r"\]\(([^)]+\.(?:svg|py))\)", (gallery / "README.md").read_text())
    assert "causal_mha.svg" in links and "causal_mha.py" in links
    assert all((gallery / link).exists() for link in links)


def test_gallery_collapse_patterns_escape_group_names(tmp_path):
    (tmp_path / "blk.yaml").write_text("name: blk\ndims: {D: 2}\ninputs:\n  x: {shape: [D], init: randn}\nsteps:\n  - {id: y, op: relu}\n")
    (tmp_path / "top.yaml").write_text(
        "name: top\ndims: {D: 2}\ninputs:\n  x: {shape: [D], init: randn}\nsteps:\n"
        "  - {id: s, op: block, use: blk.yaml, input: x, repeat: 3, group: 'stack [A]'}\n"
    )
    pipeline = tracer.load(tmp_path / "top.yaml")
    assert repeated_blocks(pipeline) == ["stack [[]A]/s/*"]
    assert dot_source(pipeline.run(device="meta"), repeated_blocks(pipeline), expand=True).count(" collapsed</FONT>") == 3


@needs_dot
def test_make_demo_labels_the_deliberate_error_and_ends_with_one_summary_line_naming_the_index(tmp_path, capsys):
    src = tmp_path / "pipelines"
    (src / "lint_examples").mkdir(parents=True)
    shutil.copy(CAUSAL, src / "causal_mha.yaml")
    shutil.copy(PIPELINES / "lint_examples" / "view_non_contiguous.yaml", src / "lint_examples")
    out = tmp_path / "gallery"
    assert gallery_main([str(src), str(out)]) == 0
    printed = capsys.readouterr()
    assert printed.out.splitlines() == [
        f"gallery: 1 diagram, 1 PyTorch module, 1 report, 1 deliberate error shown — see {out / 'README.md'}"
    ]
    deliberate = f"skipped {src / 'lint_examples' / 'view_non_contiguous.yaml'} — a deliberate error, what tracer reports for it"
    assert printed.err.startswith(deliberate) and "error[view-non-contiguous]" in printed.err
