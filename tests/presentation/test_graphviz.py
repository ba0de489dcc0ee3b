"""Drawing DOT with a Graphviz program: which one, its warnings, its failures and its time limit."""

from __future__ import annotations

import re
import shutil
import subprocess
import sysconfig
from collections import Counter

import pytest

import tracer
from tests.conftest import PIPELINES, ROOT, tracer_cli
from tracer.core.errors import TracerError
from tracer.gallery import main as gallery
from tracer.presentation.diagram import render_bytes
from tracer.presentation.graphviz import chosen_renderer, find_renderer

CAUSAL = PIPELINES / "causal_mha.yaml"


def test_a_dot_that_takes_too_long_is_stopped_with_a_hint_to_fold(tmp_path, monkeypatch):
    import tracer.presentation.graphviz as render

    def slow(*args, timeout=None, **kwargs):
        raise subprocess.TimeoutExpired(args[0], timeout)

    monkeypatch.setattr(render, "find_renderer", lambda pipeline_file, fmt: "/bin/dot")
    monkeypatch.setattr(render.subprocess, "run", slow)
    with pytest.raises(TracerError) as info:
        tracer.load(CAUSAL).run(device="meta").save(tmp_path / "m.svg", timeout=3)
    message = str(info.value)
    assert info.value.code == "render-timeout" and "--expand" in message and "--collapse" in message and "3 s" in message
    assert list(tmp_path.iterdir()) == []


def causal_trace():
    return tracer.load(CAUSAL).run(device="meta")


def test_graphviz_warnings_reach_stderr(tmp_path, monkeypatch, capsys):
    fake = tmp_path / "dot"  # says what dot says when a PNG is too large, and writes a picture
    fake.write_text(
        "#!/bin/sh\necho 'Warning: graph is too large for cairo-renderer bitmaps. Scaling by 0.25 to fit' >&2\n"
        'while [ $# -gt 1 ]; do if [ "$1" = -o ]; then echo picture > "$2"; fi; shift; done\n'
    )
    fake.chmod(0o755)
    monkeypatch.setenv("TRACER_DOT", str(fake))
    causal_trace().save(tmp_path / "x.png")
    err = capsys.readouterr().err
    assert "warning[dot-warning]: Graphviz: Warning: graph is too large" in err and "Scaling by 0.25" in err


def test_without_graphviz_dot_works_and_svg_fails_cleanly(tmp_path, no_renderer):
    assert shutil.which("dot") is None
    done = tracer_cli("render", CAUSAL, "-o", "m.dot", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "m.dot").read_text().startswith("digraph pipeline {")
    done = tracer_cli("render", CAUSAL, "-o", "g.svg", cwd=tmp_path)
    assert done.returncode == 1
    assert "no-renderer" in done.stderr and "-o NAME.dot" in done.stderr and "install graphviz" in done.stderr.lower()
    assert "Traceback" not in done.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.dot"]


DOT = shutil.which("dot")


PURE = shutil.which("graphviz-pure") or shutil.which("graphviz-pure", path=sysconfig.get_path("scripts"))


needs_both = pytest.mark.skipif(not (DOT and PURE), reason="needs Graphviz's dot and graphviz-pure")


def _drawing(svg: str) -> tuple:
    """What a reader sees, independent of layout coordinates: nodes, edges, clusters, every text."""
    texts = Counter(re.findall(r"<text[^>]*>([^<]*)</text>", svg))
    return tuple(svg.count(f'class="{kind}"') for kind in ("node", "edge", "cluster")), texts


@needs_both
def test_graphviz_pure_draws_what_dot_draws():
    source = (ROOT / "tests/snapshots/causal_mha.dot").read_text()  # the DOT tracer writes (a test keeps it current)
    pictures = {}
    for program in (DOT, PURE):
        with chosen_renderer(program):
            pictures[program] = render_bytes(source, "svg", str(CAUSAL)).decode()
    (counts, texts), (pure_counts, pure_texts) = (_drawing(pictures[DOT]), _drawing(pictures[PURE]))
    assert counts == pure_counts and counts[0] > 20
    assert texts == pure_texts


def test_the_environment_and_the_option_name_the_renderer(monkeypatch, no_renderer, tmp_path):
    if not PURE:
        pytest.skip("graphviz-pure is not installed")
    monkeypatch.setenv("TRACER_DOT", PURE)
    assert find_renderer("p.yaml", "svg") == PURE
    monkeypatch.delenv("TRACER_DOT")
    done = tracer_cli("render", CAUSAL, "-o", "m.svg", "--dot", PURE, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "m.svg").read_text().lstrip().startswith("<?xml")


def test_a_renderer_that_is_not_there_is_one_located_error(tmp_path):
    done = tracer_cli("render", CAUSAL, "-o", "m.svg", "--dot", str(tmp_path / "no-such-dot"), cwd=tmp_path)
    assert done.returncode == 1 and done.stderr.count("\n") == 1
    assert (
        "error[no-renderer]" in done.stderr and "no-such-dot" in done.stderr and "pip install 'attention-tracer[diagrams]'" in done.stderr
    )
    assert list(tmp_path.iterdir()) == []


def test_the_gallery_without_a_renderer_fails_in_one_line_and_changes_nothing(no_renderer, tmp_path, capsys):
    out = tmp_path / "gallery"
    out.mkdir()
    (out / "README.md").write_text("the index as it was\n")
    assert gallery([str(PIPELINES), str(out)]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "error[no-renderer]" in err
    assert [p.name for p in out.iterdir()] == ["README.md"] and (out / "README.md").read_text() == "the index as it was\n"


def test_pdf_from_a_renderer_without_pdf_says_so(tmp_path):
    if not PURE:
        pytest.skip("graphviz-pure is not installed")
    with chosen_renderer(PURE), pytest.raises(tracer.TracerError) as info:
        render_bytes("digraph g { a -> b }", "pdf", "p.yaml")
    assert info.value.code == "no-renderer" and "`graphviz-pure` cannot write pdf" in str(info.value)


FAILING_RENDERERS = {
    "killed": ("kill -SEGV $$", "`dot_fake -Tsvg` was killed by SIGSEGV and said nothing; write the DOT text with -o NAME.dot"),
    "odd bytes": ("printf 'bad \\377 byte\\n' >&2; exit 1", "`dot_fake -Tsvg` exited with status 1: bad \\xff byte; write the DOT"),
    "silent": ("exit 0", "`dot_fake -Tsvg` exited with status 0 but wrote no picture; write the DOT text"),
    "empty picture": ("printf 'warn \\377\\n' >&2; : > \"$4\"", "`dot_fake -Tsvg` exited with status 0 but wrote no picture"),
}


@pytest.mark.parametrize("script, said", FAILING_RENDERERS.values(), ids=FAILING_RENDERERS)
def test_a_renderer_that_fails_oddly_is_one_located_error(tmp_path, script, said):
    fake = tmp_path / "dot_fake"
    fake.write_text(f"#!/bin/sh\n{script}\n")
    fake.chmod(0o755)
    done = tracer_cli("render", CAUSAL, "--dot", fake, "-o", tmp_path / "d.svg")
    assert done.returncode == 1 and f"causal_mha.yaml: error[render-failed]: {said}" in done.stderr, done.stderr
    assert not (tmp_path / "d.svg").exists()
