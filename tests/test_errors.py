"""Malformed pipelines: each gives one located error from `check` and `run`, exit 1, no traceback."""

import re
import signal
import subprocess
import sys

import pytest

from tests.conftest import PIPELINES, tracer_cli

GOOD = (PIPELINES / "causal_mha.yaml").read_text()

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


def test_check_reports_every_independent_error(write):
    text = GOOD.replace("inputs: [q_h, k_t]", "inputs: [q_h, k_h]").replace(
        "{id: v_heads, op: view, input: v, shape: [B, T, H, Dh]", "{id: v_heads, op: view, input: v, shape: [B, T, H, d_model]"
    )
    proc = tracer_cli("check", write(text))
    codes = re.findall(r"error\[([\w-]+)\]", proc.stderr)
    assert sorted(codes) == ["matmul-shape", "view-shape"], proc.stderr


def test_matmul_error_states_shapes_bindings_and_fix(write):
    text = GOOD.replace("inputs: [q_h, k_t]", "inputs: [q_h, k_h]")
    proc = tracer_cli("check", write(text))
    assert (
        "step 'scores': matmul needs (…, n, Dh) @ (…, Dh, m), got 'q_h' (B, H, T, Dh) [2, 2, 6, 2] @ 'k_h' (B, H, T, Dh) [2, 2, 6, 2]"
        in proc.stderr
    )
    assert "[B=2, T=6, d_model=4, H=2, Dh=2] — transpose 'k_h' over dims -2, -1?" in proc.stderr


def test_usage_errors_exit_2():
    proc = subprocess.run([sys.executable, "-m", "tracer", "run"], capture_output=True, text=True)  # the real entry point's exit code
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    proc = tracer_cli("run", "x.yaml", "--dim", "T")
    assert proc.returncode == 2 and "NAME=VALUE" in proc.stderr


def test_dim_override_recomputes_dependent_dims_and_refuses_derived(tmp_path):
    import tracer

    pipeline = tracer.load(PIPELINES / "causal_mha.yaml")
    t = pipeline.run(dims={"d_model": 8, "T": 3})
    assert t.dims["Dh"] == 4 and t["scores"].shape == (2, 2, 3, 3)
    with pytest.raises(tracer.TracerError, match=r"'Dh' is derived \(d_model // H\)"):
        pipeline.run(dims={"Dh": 3})
    with pytest.raises(tracer.TracerError, match="d_model=6 is not divisible by H=4"):
        pipeline.run(dims={"d_model": 6, "H": 4})


def test_fan_in_is_checked_statically(write):
    path = write(
        "name: t\ndims: {N: 3}\ninputs:\n  x: {shape: [N], init: randn}\nparams:\n"
        "  b: {shape: [N], init: linear, fan_in: nope}\nsteps:\n  - {id: y, op: add, inputs: [x, b]}\n"
    )
    for command in ("check", "run"):
        proc = tracer_cli(command, path)
        assert proc.returncode == 1 and proc.stderr.startswith(f"{path}:6:41: error[unknown-dim]: 'b': fan_in: unknown dim 'nope'")


def test_an_invalid_id_being_declared_gets_a_spelling_not_a_block_hint(write):
    path = write('name: t\ndims: {N: 3}\ninputs:\n  a/b: {shape: [N], init: randn}\nsteps:\n  - {id: out/x, op: relu, input: "/x"}\n')
    proc = tracer_cli("check", path)
    assert [line.rsplit(" — ", 1)[1] for line in proc.stderr.splitlines()] == ["e.g. 'a_b'", "e.g. 'out_x'", "e.g. '_x'"]


def test_the_cli_in_process_leaves_sigterm_as_it_found_it(tmp_path):
    """main() turns SIGTERM into a clean exit while it runs; afterwards the caller's handler is back
    (a test runner or notebook calling main() must still stop on SIGTERM)."""
    before = signal.getsignal(signal.SIGTERM)
    assert tracer_cli("check", tmp_path / "nope.yaml").returncode == 1
    assert signal.getsignal(signal.SIGTERM) is before
