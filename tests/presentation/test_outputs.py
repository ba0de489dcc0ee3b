"""Output files: formats by suffix, written atomically, nothing partial or clobbered on failure."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import tracer
from tests.conftest import PIPELINES, ROOT, tracer_cli
from tracer.cli import main
from tracer.core.errors import TracerError
from tracer.presentation.files import write_atomic

CAUSAL = PIPELINES / "causal_mha.yaml"


needs_dot = pytest.mark.skipif(shutil.which("dot") is None, reason="Graphviz `dot` not installed")


@needs_dot
def test_render_svg_never_touches_a_dot_beside_it(tmp_path, capsys):
    (tmp_path / "m.dot").write_text("the user's DOT")
    assert main(["render", str(CAUSAL), "-o", str(tmp_path / "m.svg")]) == 0
    assert (tmp_path / "m.dot").read_text() == "the user's DOT"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.dot", "m.svg"]


@pytest.mark.parametrize("output", [".", "/proc", "{tmp}", "{tmp}/missing/m.svg", "/proc/m.svg"])
def test_unwritable_render_outputs_are_user_errors(tmp_path, capsys, output):
    assert main(["render", str(CAUSAL), "--device", "meta", "-o", output.format(tmp=tmp_path)]) == 1
    err = capsys.readouterr().err
    assert "internal error" not in err and re.search(r"error\[output-(format|failed)\]", err)
    assert not (tmp_path / "missing").exists()  # like `run -o`: no folder is created


@pytest.mark.long
@needs_dot
def test_sigterm_during_render_leaves_no_temporary_file(tmp_path):
    bin_dir, out_dir, tmp = tmp_path / "bin", tmp_path / "out", tmp_path / "tmp"
    for d in (bin_dir, out_dir, tmp):
        d.mkdir()
    (bin_dir / "dot").write_text(f"#!/bin/sh\ntouch {tmp_path}/started\nexec sleep 30\n")
    (bin_dir / "dot").chmod(0o755)
    env = dict(os.environ, PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}", TMPDIR=str(tmp), PYTHONPATH=str(ROOT))
    proc = subprocess.Popen([sys.executable, "-m", "tracer", "render", str(CAUSAL), "-o", str(out_dir / "m.svg")], env=env)
    deadline = time.monotonic() + 60
    while not (tmp_path / "started").exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 143
    assert list(out_dir.iterdir()) == [] and list(tmp.iterdir()) == []


def _leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.startswith(".") or p.suffix == ".tmp")


def test_run_output_is_written_atomically_and_a_failed_run_keeps_the_good_file(tmp_path):
    out = tmp_path / "trace.json"
    good = tracer_cli("run", "pipelines/causal_mha.yaml", "--json", "-o", out, cwd=ROOT)
    assert good.returncode == 0, good.stderr
    before = out.read_bytes()
    assert json.loads(before)["pipeline"] == "causal_mha"
    bad = tracer_cli("run", "pipelines/causal_mha.yaml", "--json", "-o", out, "--dim", "H=3", cwd=ROOT)
    assert bad.returncode == 1 and "dim-divide" in bad.stderr
    assert out.read_bytes() == before
    assert _leftovers(tmp_path) == []


def test_run_output_into_a_missing_folder_is_a_located_error(tmp_path):
    done = tracer_cli("run", "pipelines/causal_mha.yaml", "-o", tmp_path / "no" / "t.txt", cwd=ROOT)
    assert done.returncode == 1
    assert done.stderr.startswith("pipelines/causal_mha.yaml: error[output-failed]")


def test_an_interrupted_write_leaves_no_partial_file_and_the_old_one_intact(tmp_path, monkeypatch):
    out = tmp_path / "trace.json"
    write_atomic(out, "good\n")

    def interrupted(src, dst):
        raise KeyboardInterrupt  # Ctrl-C between writing the temporary file and renaming it

    monkeypatch.setattr(os, "replace", interrupted)
    with pytest.raises(KeyboardInterrupt):
        write_atomic(out, "partial" * 1000)
    assert out.read_text() == "good\n"
    assert _leftovers(tmp_path) == []


def test_a_failed_write_is_a_tracer_error_and_leaves_nothing(tmp_path, monkeypatch):
    out = tmp_path / "trace.json"
    real_open = open

    def full_disk(path, mode="r", *args, **kwargs):
        handle = real_open(path, mode, *args, **kwargs)
        if "w" in mode:
            handle.close()
            raise OSError(28, "No space left on device")
        return handle

    monkeypatch.setattr("builtins.open", full_disk)
    with pytest.raises(TracerError, match="output-failed.*No space left"):
        write_atomic(out, "data", error_file="p.yaml")
    assert not out.exists() and _leftovers(tmp_path) == []


def test_atomic_files_get_ordinary_permissions(tmp_path):
    out = write_atomic(tmp_path / "t.json", b"{}")
    mask = os.umask(0)
    os.umask(mask)
    assert out.stat().st_mode & 0o777 == 0o666 & ~mask


def test_render_keeps_the_good_file_when_the_run_fails(tmp_path):
    out = tmp_path / "d.dot"
    pipeline = tracer.load(PIPELINES / "causal_mha.yaml")
    pipeline.run().save(out)
    before = out.read_bytes()
    with pytest.raises(TracerError):
        pipeline.run(dims={"H": 3}).save(out)
    assert out.read_bytes() == before
    assert _leftovers(tmp_path) == []


needs_dot = pytest.mark.skipif(shutil.which("dot") is None, reason="Graphviz `dot` is not installed")


@needs_dot
@pytest.mark.parametrize("suffix, magic", [(".png", b"\x89PNG"), (".pdf", b"%PDF")])
def test_format_comes_from_the_suffix(tmp_path, suffix, magic):
    out = tracer.load(CAUSAL).run(dims={"T": 3}).save(tmp_path / f"m{suffix}", collapse=["attention core"])
    assert out.read_bytes().startswith(magic)


def test_unknown_suffix_is_a_clear_error(tmp_path):
    with pytest.raises(TracerError) as info:
        tracer.load(CAUSAL).run().save(tmp_path / "m.jpeg")
    assert info.value.code == "output-format" and ".svg" in str(info.value)
    assert list(tmp_path.iterdir()) == []


def test_a_failing_renderer_leaves_no_partial_or_temporary_file(tmp_path, monkeypatch):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "dot"  # writes half a file to -o, then fails
    fake.write_text('#!/bin/sh\nfor a; do out="$a"; done\necho "<svg" > "$out"\necho "Error: syntax error" >&2\nexit 1\n')
    fake.chmod(0o755)
    trace = tracer.load(CAUSAL).run()
    monkeypatch.setenv("PATH", str(bin_dir))
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    (out_dir / "m.svg").write_text("old picture")
    (out_dir / "m.dot").write_text("the user's own DOT")
    with pytest.raises(TracerError) as info:
        trace.save(out_dir / "m.svg")
    assert info.value.code == "render-failed" and "syntax error" in str(info.value)
    assert sorted(p.name for p in out_dir.iterdir()) == ["m.dot", "m.svg"]
    assert (out_dir / "m.svg").read_text() == "old picture"
    assert (out_dir / "m.dot").read_text() == "the user's own DOT"
