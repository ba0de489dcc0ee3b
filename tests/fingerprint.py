"""Fingerprints of everything tracer writes for some pipeline files: values, JSON, DOT, and the CLI's
``run --json --values`` and ``render -o x.dot`` output.

``python -m tests.fingerprint OUT_FOLDER FILE...`` prints them as JSON; tests/runtime/test_determinism.py
compares a fresh process's (under another hash seed) with its own, computed in the test process.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import sys
from pathlib import Path

import torch

import tracer
from tracer.cli import main
from tracer.presentation.diagram import dot_source


def _sha(data: str | bytes) -> str:
    return hashlib.sha256(data.encode() if isinstance(data, str) else data).hexdigest()


def _values(trace) -> str:
    raw = hashlib.sha256()
    for record in trace:
        t = record.tensor.detach().contiguous().cpu()
        raw.update(record.id.encode() + str(t.dtype).encode() + str(tuple(t.shape)).encode())
        raw.update(t.view(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return raw.hexdigest()


def _cli(folder: Path, file: str) -> dict[str, str]:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["run", file, "--json", "--values"]) == 0
    with contextlib.redirect_stdout(io.StringIO()):  # "wrote d.dot"
        assert main(["render", file, "-o", str(folder / "d.dot")]) == 0
    return {"cli_json": _sha(out.getvalue()), "cli_dot": _sha((folder / "d.dot").read_bytes())}


JSON_VALUES_BYTES = 1 << 20  # past this the values' JSON text is tens of MB: the raw bytes are hashed instead


def fingerprints(folder: Path, files: list[str]) -> dict:
    found = {}
    for name in files:
        trace = tracer.load(name).run(keep_values=True)
        with_values = sum(r.nbytes for r in trace) <= JSON_VALUES_BYTES
        found[name] = {"values": _values(trace), "json": _sha(trace.to_json(values=with_values)), "dot": _sha(dot_source(trace))}
    found["cli"] = _cli(folder, files[0])
    return found


if __name__ == "__main__":
    print(json.dumps(fingerprints(Path(sys.argv[1]), sys.argv[2:]), sort_keys=True))
