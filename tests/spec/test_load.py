"""Loading a file: YAML and pydantic errors, one located line each, and every independent error
reported."""

from __future__ import annotations

import re

import pytest

import tracer
from tests.conftest import PIPELINES, refused, tracer_cli
from tracer.core.errors import TracerError

CAUSAL = PIPELINES / "causal_mha.yaml"


@pytest.mark.parametrize("odd", ["\u2028", "\x85", "\u2029", "\r", "\x0c"])
def test_odd_line_breaks_do_not_shift_line_numbers(tmp_path, odd):
    text = CAUSAL.read_text().replace("name: causal_mha", f"name: causal_mha  # {odd} here", 1)
    line = next(i for i, t in enumerate(text.split("\n"), 1) if t.startswith("name:"))
    path = tmp_path / "p.yaml"
    path.write_bytes(text.encode())
    with pytest.raises(TracerError) as info:
        tracer.load(path)
    assert str(info.value).startswith(f"{path}:{line}:"), str(info.value)


def test_a_dim_error_is_reported_beside_an_invalid_section():
    with pytest.raises(TracerError) as info:
        tracer.loads("name: x\ndims: {d_model: 10, H: 3, Dh: d_model // H}\nsteps: []\n")
    codes = [d.code for d in info.value.diagnostics]
    assert "dim-divide" in codes and "invalid-value" in codes


@pytest.mark.parametrize("where", ["value", "key", "comment"])
def test_a_lone_surrogate_in_the_text_is_a_located_error(where):
    """Only a str can hold one (no UTF-8 file can): libyaml's encoder raised UnicodeEncodeError."""
    line = {"value": 'note: "a\ud800b"', "key": "\udcff: 1", "comment": "# \udcff"}[where]
    with pytest.raises(TracerError) as info:
        tracer.loads(f"name: x\n{line}\nsteps: []\n", "t.yaml")
    (problem,) = info.value.diagnostics
    column = next(i for i, c in enumerate(line, 1) if "\ud800" <= c <= "\udfff")
    assert (problem.code, problem.position.line, problem.position.col) == ("file-binary", 2, column)
    assert "lone surrogate U+D" in problem.message


GOOD = (PIPELINES / "causal_mha.yaml").read_text()


def test_seed_out_of_torch_range(tmp_path):
    refused(GOOD.replace("seed: 0", "seed: 18446744073709551616"), tmp_path, "invalid-value")
    with pytest.raises(TracerError, match="seed-range"):
        tracer.load(PIPELINES / "causal_mha.yaml").run(seed=-(2**63) - 1, device="meta")


CASES = {
    # name: (file text, expected code, expected line)
    "yaml-syntax": ("name: x\nsteps: [1, 2\n", "yaml-syntax", 3),
    "duplicate-key": ("name: x\nname: y\nsteps: []\n", "duplicate-key", 2),
    "unknown-top-key": (GOOD.replace("seed: 0", "sead: 0"), "unknown-key", None),
    "unknown-op": (GOOD.replace("op: softmax", "op: softmaxx"), "unknown-op", None),
    "unknown-ref": (GOOD.replace("inputs: [q_h, k_t]", "inputs: [q_h, k_tt]"), "unknown-ref", None),
    "cycle": (GOOD.replace("{id: q, op: linear, input: x,", "{id: q, op: linear, input: out,"), "cycle", None),
    "python-tag": ("name: !!python/object/apply:os.system ['touch pwned']\nsteps: []\n", "yaml-tag", 1),
    "dim-expr-call": (GOOD.replace("Dh: d_model // H", "Dh: __import__('os').system('touch pwned')"), "invalid-value", None),
    "not-divisible": (GOOD.replace("d_model: 4 ", "d_model: 5 "), "dim-divide", None),
    "view-non-contiguous": (
        GOOD.replace(
            "{id: merged, op: merge, input: context, group: merge heads}",
            "{id: ctx_t, op: transpose, input: context, dims: [1, 2]}\n  - {id: merged, op: view, shape: [B, T, d_model]}",
        ),
        "view-non-contiguous",
        None,
    ),
    "invalid-id": (GOOD.replace("{id: scores, op: matmul", "{id: 'attention scores', op: matmul"), "invalid-id", None),
    "empty": ("", "empty-file", 1),
    "binary": (b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR", "file-binary", 1),
}


def line_of(text, needle):
    return next(i for i, line in enumerate(text.splitlines(), 1) if needle in line)


EXPECTED_LINES = {
    "unknown-top-key": line_of(CASES["unknown-top-key"][0], "sead"),
    "unknown-op": line_of(CASES["unknown-op"][0], "softmaxx"),
    "unknown-ref": line_of(CASES["unknown-ref"][0], "k_tt"),
    "cycle": line_of(GOOD, "{id: q, op: linear"),
    "dim-expr-call": line_of(CASES["dim-expr-call"][0], "__import__"),
    "not-divisible": line_of(GOOD, "Dh: d_model // H"),
    "view-non-contiguous": line_of(CASES["view-non-contiguous"][0], "id: merged, op: view"),
    "invalid-id": line_of(CASES["invalid-id"][0], "attention scores"),
}


@pytest.mark.parametrize("command", ["check", "run"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_malformed_file_is_one_located_error(case, command, tmp_path):
    text, code, line = CASES[case]
    path = tmp_path / "bad.yaml"
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    marker = tmp_path / "pwned"  # where the payloads' `touch pwned` would land
    proc = tracer_cli(command, path, cwd=tmp_path)
    assert proc.returncode == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    first = proc.stderr.strip().splitlines()[0]
    match = re.match(rf"{re.escape(str(path))}:(\d+):(\d+): error\[([\w-]+)\]: ", first)
    assert match, first
    assert match.group(3) == code, first
    assert int(match.group(1)) == (line or EXPECTED_LINES[case]), first
    assert not marker.exists()


def test_missing_file_names_the_file(tmp_path):
    proc = tracer_cli("check", tmp_path / "nope.yaml")
    assert proc.returncode == 1 and proc.stderr.startswith(f"{tmp_path / 'nope.yaml'}: error[file-missing]")


def test_an_invalid_id_being_declared_gets_a_spelling_not_a_block_hint(write):
    path = write('name: t\ndims: {N: 3}\ninputs:\n  a/b: {shape: [N], init: randn}\nsteps:\n  - {id: out/x, op: relu, input: "/x"}\n')
    proc = tracer_cli("check", path)
    assert [line.rsplit(" — ", 1)[1] for line in proc.stderr.splitlines()] == ["e.g. 'a_b'", "e.g. 'out_x'", "e.g. '_x'"]
