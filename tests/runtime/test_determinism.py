"""Runs repeat: values, JSON and DOT bitwise identical across processes; random steps repeat with the
seed."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import tracer
from tests.conftest import ROOT, bundled_pipelines, covering, shared_pipeline, two_copies_of_each_block
from tests.fingerprint import fingerprints


def _small(path: Path, limit: int = 8 * 1024 * 1024) -> bool:
    """Files whose tensors together fit in ``limit`` (their values are written to JSON twice)."""
    analysis = shared_pipeline(path).check()
    return sum(meta.nbytes for meta in analysis.metas.values()) <= limit


# every step kind with every field set the bundled files write, and causal_mha, which the CLI runs
FILES = sorted({"pipelines/causal_mha.yaml", *(str(p.relative_to(ROOT)) for p in covering([p for p in bundled_pipelines() if _small(p)]))})


def _other_hash_seed() -> str:
    return "2" if os.environ.get("PYTHONHASHSEED") == "1" else "1"


DROPOUT = """\
name: drop
dims: {T: 4, D: 8}
seed: 7
inputs:
  x: {shape: [T, D], init: randn}
steps:
  - {id: y, op: dropout, p: 0.5, training: true}
"""


@pytest.mark.long
def test_values_json_and_dot_are_bitwise_identical_across_processes(tmp_path):
    """This process (after every earlier test) and a fresh one under another hash seed write the same
    bytes: values, JSON, DOT, and the CLI's `run --json --values` and `render -o x.dot`."""
    (tmp_path / "here").mkdir()
    (tmp_path / "there").mkdir()
    written = ["pipelines/causal_mha.yaml", *(f for f in FILES if f != "pipelines/causal_mha.yaml")]
    files = [_two_copies(name, tmp_path / "copies" / str(i)) for i, name in enumerate(written)]
    there = subprocess.Popen(  # started first: it imports torch and computes while this process does
        [sys.executable, "-m", "tests.fingerprint", str(tmp_path / "there"), *files],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
        env=dict(os.environ, PYTHONHASHSEED=_other_hash_seed()),  # set iteration order must not leak
    )
    try:
        with contextlib.chdir(ROOT):
            here = fingerprints(tmp_path / "here", files)
        out, err = there.communicate(timeout=300)
    finally:
        there.kill()  # a no-op once it has exited
        there.wait()
    assert there.returncode == 0, err[-3000:]
    assert json.loads(out) == here
    assert sorted(here) == sorted(files + ["cli"]) and len(FILES) >= 15


def _two_copies(name: str, folder: Path) -> str:
    """The file, or where it repeats a block more than twice, a copy that repeats it twice: each copy
    writes as the others (encoder_stack's 48 were a second of each process's run)."""
    fewer = two_copies_of_each_block(ROOT / name, folder)
    return name if fewer == ROOT / name else str(fewer)


def test_random_steps_repeat_with_the_seed_in_process_and_across_runs():
    pipeline = tracer.loads(DROPOUT, "d.yaml")
    a = pipeline.run(keep_values=True)["y"].tensor
    b = pipeline.run(keep_values=True)["y"].tensor  # cached tensors: the RNG is restored too
    c = tracer.loads(DROPOUT, "d.yaml").run(keep_values=True)["y"].tensor  # a fresh pipeline
    assert a.eq(0).any() and not a.eq(0).all()
    assert a.tolist() == b.tolist() == c.tolist()
    assert pipeline.run(seed=8, keep_values=True)["y"].tensor.tolist() != a.tolist()
