"""Jupyter: the trace, record and pipeline views, and the quickstart notebook executed in a real kernel."""

import xml.etree.ElementTree as ET

import nbformat
import pytest
from nbclient import NotebookClient

import tracer
import tracer.presentation.notebook
from tests.browser import Browser, find_chromium
from tests.conftest import PIPELINES, ROOT, shared_pipeline
from tracer.core.formatting import human_bytes

NOTEBOOK = ROOT / "docs" / "notebooks" / "quickstart.ipynb"


@pytest.fixture(scope="module")
def causal():
    return shared_pipeline(PIPELINES / "causal_mha.yaml").run()


def test_a_trace_shows_its_totals_its_table_and_its_diagram(causal):
    page = causal._repr_html_()
    root = ET.fromstring(page)  # well-formed: one element, every tag closed
    assert root.get("class") == "tracer trace"
    assert "68 parameters (272 B)" in page and "2.69K FLOPs (2,688)" in page
    assert f"estimated peak {human_bytes(causal.peak_bytes)}" in page
    assert "<td>scores</td><td>matmul</td><td>(B, H, T, T)</td>" in page
    assert "<svg" in page and page.count("<svg") == 1


def test_without_a_renderer_the_table_and_one_line_say_how_to_get_diagrams(causal, monkeypatch):
    monkeypatch.setenv("TRACER_DOT", "/nonexistent/dot")
    page = causal._repr_html_()
    assert "<svg" not in page and "<td>scores</td>" in page
    assert page.count('class="note"') == 1 and "pip install graphviz-pure" in page and "Traceback" not in page


def test_a_diagram_over_the_size_cap_is_a_note(causal, monkeypatch):
    monkeypatch.setattr(tracer.presentation.notebook, "MAX_NODES", 5)
    page = causal._repr_html_()
    assert "<svg" not in page and "No inline diagram" in page and "tracer render FILE" in page


def test_records_and_pipelines_have_concise_views(causal):
    assert repr(causal["scores"]) == (
        "<TensorRecord 'scores': matmul (B, H, T, T) [2, 2, 6, 6] float32, stride (72, 36, 6, 1), 576 B, 576 FLOPs>"
    )
    assert repr(causal["q_h"]).endswith("stride (24, 2, 4, 1), non-contiguous, view of q>")
    record = ET.fromstring(causal["scores"]._repr_html_())
    assert "".join(record.itertext()).count("scores") >= 1
    page = shared_pipeline(PIPELINES / "encoder_stack.yaml")._repr_html_()
    ET.fromstring(page)
    assert "B=2, T=8, d_model=16" in page and "1 (1,200 once blocks are expanded)" in page


@pytest.mark.long
def test_the_quickstart_notebook_runs_in_a_kernel():
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    NotebookClient(notebook, timeout=60, kernel_name="python3", resources={"metadata": {"path": str(NOTEBOOK.parent)}}).execute()
    outputs = [o for cell in notebook.cells if cell.cell_type == "code" for o in cell.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    html = [o["data"]["text/html"] for o in outputs if "text/html" in o.get("data", {})]
    assert len(html) == 4 and sum("<svg" in h for h in html) == 2
    assert any("×47" in h for h in html)  # the stack's copies 1-47 as one node


def test_the_diagram_fits_the_cell_width_with_its_proportions(causal, tmp_path):
    executable = find_chromium()
    if executable is None:
        pytest.skip("no Chromium on PATH")
    page = tmp_path / "cell.html"
    page.write_text(f'<!DOCTYPE html><meta charset="utf-8"><body style="margin:0"><div style="width:600px">{causal._repr_html_()}</div>')
    browser = Browser(executable, 1000, 700)
    try:
        browser.open(page.as_uri(), ready="document.readyState === 'complete'")
        width, height, scroll = browser.evaluate(
            "(() => { const box = document.querySelector('.diagram svg').getBoundingClientRect();"
            " return [box.width, box.height, document.querySelector('.diagram').scrollWidth]; })()"
        )
    finally:
        browser.close()
    view = [float(v) for v in ET.fromstring(causal._repr_html_()).find(".//{*}svg").get("viewBox").split()]
    assert view[2] > 600 and width == pytest.approx(600, abs=1) and scroll <= 601  # drawn wider than the cell: scaled down
    assert height / width == pytest.approx(view[3] / view[2], rel=0.02)
