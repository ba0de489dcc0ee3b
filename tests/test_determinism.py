"""Determinism and output files.

The same file, dims and seed give bitwise-identical values, JSON and DOT in two separate
processes; output files (``tracer run -o``, ``tracer render -o``) appear atomically: a failed or
interrupted run leaves no partial file and never replaces a good file.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import tracer
from tests.conftest import PIPELINES, ROOT, bundled_pipelines, shared_pipeline, tracer_cli
from tests.fingerprint import fingerprints
from tracer.core.errors import TracerError
from tracer.presentation.files import write_atomic


def _small(path: Path, limit: int = 8 * 1024 * 1024) -> bool:
    """Files whose tensors together fit in ``limit`` (their values are written to JSON twice)."""
    analysis = shared_pipeline(path).check()
    return sum(meta.nbytes for meta in analysis.metas.values()) <= limit


FILES = sorted(str(p.relative_to(ROOT)) for p in bundled_pipelines() if _small(p))


def _other_hash_seed() -> str:
    return "2" if os.environ.get("PYTHONHASHSEED") == "1" else "1"


def test_values_json_and_dot_are_bitwise_identical_across_processes(tmp_path):
    """This process (after every earlier test) and a fresh one under another hash seed write the same
    bytes: values, JSON, DOT, and the CLI's `run --json --values` and `render -o x.dot`."""
    (tmp_path / "here").mkdir()
    (tmp_path / "there").mkdir()
    files = ["pipelines/causal_mha.yaml", *(f for f in FILES if f != "pipelines/causal_mha.yaml")]
    with contextlib.chdir(ROOT):
        here = fingerprints(tmp_path / "here", files)
    done = subprocess.run(
        [sys.executable, "-m", "tests.fingerprint", str(tmp_path / "there"), *files],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
        env=dict(os.environ, PYTHONHASHSEED=_other_hash_seed()),  # set iteration order must not leak
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout) == here
    assert sorted(here) == sorted(FILES + ["cli"]) and len(FILES) >= 15


DROPOUT = """\
name: drop
dims: {T: 4, D: 8}
seed: 7
inputs:
  x: {shape: [T, D], init: randn}
steps:
  - {id: y, op: dropout, p: 0.5, training: true}
"""


def test_random_steps_repeat_with_the_seed_in_process_and_across_runs():
    pipeline = tracer.loads(DROPOUT, "d.yaml")
    a = pipeline.run(keep_values=True)["y"].tensor
    b = pipeline.run(keep_values=True)["y"].tensor  # cached tensors: the RNG is restored too
    c = tracer.loads(DROPOUT, "d.yaml").run(keep_values=True)["y"].tensor  # a fresh pipeline
    assert a.eq(0).any() and not a.eq(0).all()
    assert a.tolist() == b.tolist() == c.tolist()
    assert pipeline.run(seed=8, keep_values=True)["y"].tensor.tolist() != a.tolist()


# ------------------------------------------------------------------------------ atomic outputs


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
