"""Inputs at the edges never reach an internal error (exit 3): attention over zero queries, keys or
batch rows, and pipeline files (or their folders) whose names are not valid UTF-8."""

from __future__ import annotations

import re
import shutil

import pytest

import tracer
from tests.conftest import PIPELINES, bundled_pipelines, covering, shared_pipeline, tracer_cli, two_copies_of_each_block
from tracer.presentation.notebook import pipeline_html


@pytest.mark.parametrize("pipeline, dim", [("causal_mha.yaml", "T=0"), ("cross_attention.yaml", "T_q=0"), ("causal_mha.yaml", "B=0")])
@pytest.mark.parametrize("suffix", [".svg", ".html", ".dot"])
def test_render_values_with_empty_attention_maps(tmp_path, pipeline, dim, suffix):
    done = tracer_cli("render", PIPELINES / pipeline, "--values", "--dim", dim, "-o", tmp_path / f"r{suffix}", "-q")
    assert done.returncode == 0, done.stderr
    assert not re.search(r"<TABLE[^>]*></TABLE>", (tmp_path / f"r{suffix}").read_text())  # dot rejects an empty table


def _zero_dims(path) -> list[str]:
    return [f"{name}=0" for name, value in shared_pipeline(path).check().dims.items() if isinstance(value, int)]


def _small(path) -> bool:
    """Runnable here with --values (several bundled pipelines are sized for --device meta)."""
    return shared_pipeline(path).check().memory.peak_bytes < 16 << 20


# every step kind with every set of fields the bundled files write (27 of 86 files; the fuzzer's
# hostile shapes put zeros everywhere else)
@pytest.mark.long
@pytest.mark.parametrize("path", covering([p for p in bundled_pipelines() if _small(p)]), ids=lambda p: p.relative_to(PIPELINES).as_posix())
def test_every_dim_at_zero_renders_with_values_or_is_refused(tmp_path, path):
    run = two_copies_of_each_block(path, tmp_path / "pipelines")  # a zero dim takes the same path through every copy
    for dim in _zero_dims(path):
        for argv in (["render", "--values", "-o", tmp_path / "r.dot"], ["run", "--values", "--json", "-o", tmp_path / "r.json"]):
            done = tracer_cli(argv[0], run, "--dim", dim, *argv[1:], "-q")
            assert done.returncode in (0, 1) and "internal error" not in done.stderr, (dim, argv, done.stderr)


@pytest.fixture(params=["in\udcff.yaml", "dir\udcff/p.yaml"], ids=["file", "folder"])
def odd_name(request, tmp_path):
    """causal_mha.yaml under a name whose byte 0xff is no UTF-8 (Python keeps it as a lone surrogate)."""
    path = tmp_path / request.param
    path.parent.mkdir(exist_ok=True)
    shutil.copy(PIPELINES / "causal_mha.yaml", path)
    return path


@pytest.mark.parametrize(
    "argv, output",
    [
        (["export"], "out.py"),
        (["render"], "r.html"),
        (["render", "--values"], "r.html"),
        (["render"], "r.dot"),
        (["run", "--json"], "r.json"),
    ],
)
def test_a_file_name_that_is_not_utf8_is_written_escaped(tmp_path, odd_name, argv, output):
    done = tracer_cli(argv[0], odd_name, *argv[1:], "-o", tmp_path / output)
    assert done.returncode == 0, done.stderr
    written = (tmp_path / output).read_bytes().decode("utf-8")  # strict: no lone surrogate reached the file
    if output == "r.html":  # the report names its file: the byte is shown as an escape
        assert "\\xff" in written


def test_a_notebook_shows_a_file_name_that_is_not_utf8_escaped(odd_name):
    shown = pipeline_html(tracer.load(odd_name))
    assert "\\xff" in shown and shown.encode("utf-8")
