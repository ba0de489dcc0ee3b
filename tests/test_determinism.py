"""Determinism and output files.

The same file, dims and seed give bitwise-identical values, JSON and DOT in two separate
processes; output files (``tracer run -o``, ``tracer render -o``) appear atomically: a failed or
interrupted run leaves no partial file and never replaces a good file.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import tracer
from tests.conftest import PIPELINES, ROOT
from tracer import render
from tracer.atomic import write_atomic
from tracer.errors import TracerError


def _small(path: Path, limit: int = 8 * 1024 * 1024) -> bool:
    """Files whose tensors together fit in ``limit`` (their values are written to JSON twice)."""
    try:
        analysis = tracer.load(path).check()
    except TracerError:
        return True  # its error must repeat too
    return sum(meta.nbytes for meta in analysis.metas.values()) <= limit


FILES = sorted(str(p.relative_to(ROOT)) for p in PIPELINES.rglob("*.yaml") if "lint_examples" not in p.parts and _small(p))

FINGERPRINT = r"""
import hashlib, json, sys
import tracer
from tracer.errors import TracerError
try:
    from tracer.render import dot_source
except ImportError:
    dot_source = None
out = {}
for name in sys.argv[1:]:
    try:
        trace = tracer.load(name).run(keep_values=True)
    except TracerError as exc:  # a file that does not run must fail the same way every time
        out[name] = {"error": str(exc)}
        continue
    raw = hashlib.sha256()
    for record in trace:
        t = record.tensor.detach().contiguous().cpu()
        raw.update(record.id.encode() + str(t.dtype).encode() + str(tuple(t.shape)).encode())
        raw.update(t.view(-1).view(torch_uint8).numpy().tobytes() if t.numel() else b"")
    out[name] = {"values": raw.hexdigest(), "json": hashlib.sha256(trace.to_json(values=True).encode()).hexdigest(),
                 "dot": hashlib.sha256(dot_source(trace).encode()).hexdigest() if dot_source else None}
print(json.dumps(out, sort_keys=True))
""".replace("torch_uint8", "__import__('torch').uint8")


def _fingerprints(files: list[str], env: dict | None = None) -> dict:
    done = subprocess.run([sys.executable, "-c", FINGERPRINT, *files], capture_output=True, text=True, timeout=300, cwd=ROOT, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout)


def test_values_json_and_dot_are_bitwise_identical_across_processes():
    first = _fingerprints(FILES)
    second = _fingerprints(FILES, env=dict(os.environ, PYTHONHASHSEED="12345"))  # set iteration order must not leak
    assert first == second
    assert sum("values" in v for v in first.values()) >= 3


def test_cli_json_is_byte_identical_across_processes(tmp_path):
    outputs = []
    for i in range(2):
        done = subprocess.run(
            [sys.executable, "-m", "tracer", "run", "pipelines/causal_mha.yaml", "--json", "--values"],
            capture_output=True,
            timeout=120,
            cwd=ROOT,
            env=dict(os.environ, PYTHONHASHSEED=str(i)),
        )
        assert done.returncode == 0, done.stderr
        outputs.append(done.stdout)
    assert outputs[0] == outputs[1]
    assert json.loads(outputs[0])["tensors"][0]["values"]


def test_cli_dot_is_byte_identical_across_processes(tmp_path):
    pytest.importorskip("tracer.render")
    written = []
    for i in range(2):
        out = tmp_path / f"run{i}.dot"
        done = subprocess.run(
            [sys.executable, "-m", "tracer", "render", "pipelines/causal_mha.yaml", "-o", str(out)],
            capture_output=True,
            text=True,
            timeout=120,
            cwd=ROOT,
            env=dict(os.environ, PYTHONHASHSEED=str(i)),
        )
        assert done.returncode == 0, done.stderr
        written.append(out.read_bytes())
    assert written[0] == written[1] and written[0].startswith(b"digraph")


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
    good = subprocess.run(
        [sys.executable, "-m", "tracer", "run", "pipelines/causal_mha.yaml", "--json", "-o", str(out)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert good.returncode == 0, good.stderr
    before = out.read_bytes()
    assert json.loads(before)["pipeline"] == "causal_mha"
    bad = subprocess.run(
        [sys.executable, "-m", "tracer", "run", "pipelines/causal_mha.yaml", "--json", "-o", str(out), "--dim", "H=3"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert bad.returncode == 1 and "dim-divide" in bad.stderr
    assert out.read_bytes() == before
    assert _leftovers(tmp_path) == []


def test_run_output_into_a_missing_folder_is_a_located_error(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "tracer", "run", "pipelines/causal_mha.yaml", "-o", str(tmp_path / "no" / "t.txt")],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
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
    render.render_file(pipeline.run(), out)
    before = out.read_bytes()
    with pytest.raises(TracerError):
        render.render_file(pipeline.run(dims={"H": 3}), out)
    assert out.read_bytes() == before
    assert _leftovers(tmp_path) == []
