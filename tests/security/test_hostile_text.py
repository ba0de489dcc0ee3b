"""Hostile text (names, notes, file names) stays text: in DOT, SVG, notebooks, the gallery and the
terminal."""

from __future__ import annotations

import re
import shutil
import textwrap
import xml.etree.ElementTree as ET

import pytest

import tracer
from tests.conftest import PIPELINES
from tracer.cli import main
from tracer.presentation.diagram import dot_source

CAUSAL = PIPELINES / "causal_mha.yaml"


needs_dot = pytest.mark.skipif(shutil.which("dot") is None, reason="Graphviz `dot` not installed")


HOSTILE_TEXT = [
    '<x>{a[URL="javascript:alert(1)" label="click"]}digraph <y>',
    '<x>{stylesheet="data:text/css,x" href="javascript:1"}digraph <y>',
    '"];x[URL="javascript:alert(1)"];y[label="',
    "<script>alert(1)</script><a href='javascript:x' onload='y'>&amp;\\",
    '<B>bold</B></TD></TR></TABLE>>];z[URL="data:x"',
]


def hostile_pipeline(text: str) -> str:
    quoted = "'" + text.replace("'", "''") + "'"
    return textwrap.dedent(
        f"""\
        name: {quoted}
        description: {quoted}
        dims: {{B: 2, T: 3}}
        inputs:
          x: {{shape: [B, T], init: randn, note: {quoted}}}
        steps:
          - {{id: y, op: softmax, dim: -1, group: {quoted}, note: {quoted}}}
          - {{id: z, op: transpose, dims: [0, 1], note: {quoted}}}
        """
    )


def assert_inert_svg(svg: bytes) -> None:
    """No script, no event handler, no javascript:/data: URL, no stylesheet instruction: only text."""
    assert b"<?xml-stylesheet" not in svg
    root = ET.fromstring(svg)
    for element in root.iter():
        assert not element.tag.endswith("}script") and element.tag != "script"
        for name, value in element.attrib.items():
            local = name.rsplit("}", 1)[-1].lower()
            assert not local.startswith("on"), (name, value)
            assert not re.match(r"\s*(javascript|data|vbscript):", value, re.I), (name, value)
            if local == "href":
                raise AssertionError(f"a link in the diagram: {value}")


def test_hostile_text_stays_text_in_dot():
    for text in HOSTILE_TEXT:
        pipeline = tracer.loads(hostile_pipeline(text))
        dot = dot_source(pipeline.run(device="meta"))
        assert dot.startswith("digraph pipeline {") and len(re.findall(r"^\S", dot, re.M)) == 2  # one graph: its head and its '}'
        assert not re.search(r"\b(URL|href|stylesheet)=[\"<\w]", dot)


@needs_dot
def test_hostile_text_renders_inert_svg_in_files_notebooks_and_the_gallery(tmp_path):
    src = tmp_path / "pipelines"
    src.mkdir()
    for i, text in enumerate(HOSTILE_TEXT):
        (src / f"h{i}.yaml").write_text(hostile_pipeline(text))
    out = tracer.load(src / "h0.yaml").run(device="meta").save(tmp_path / "h0.svg")
    assert_inert_svg(out.read_bytes())
    assert_inert_svg(tracer.load(src / "h1.yaml").run(device="meta")._repr_html_().encode())
    from tracer.gallery import build

    assert build(src, tmp_path / "gallery").failed == 0
    for svg in (tmp_path / "gallery").glob("*.svg"):
        assert_inert_svg(svg.read_bytes())
    readme = (tmp_path / "gallery" / "README.md").read_text()
    assert "<script" not in readme and "<x>" not in readme and "](javascript" not in readme


def test_file_names_and_arguments_reach_the_terminal_escaped(tmp_path, capsys):
    evil = tmp_path / "evil\x1b[31m\nforged.yaml: error[x]: fake"
    evil.write_text("name: x\n")
    assert main(["check", str(evil)]) == 1
    err = capsys.readouterr().err
    assert "\x1b" not in err and all(line.startswith(f"{tmp_path}/evil\\x1b[31m\\nforged") for line in err.splitlines())
    with pytest.raises(SystemExit):
        main(["run", str(CAUSAL), "--dim", "\x1b[2J=x"])
    assert "\x1b" not in capsys.readouterr().err
