"""The command line: exit codes, usage errors, signals, devices, folded tables."""

from __future__ import annotations

import shutil
import signal
import subprocess
import sys

import pytest

from tests.conftest import PIPELINES, tracer_cli
from tracer.cli import main

CAUSAL = PIPELINES / "causal_mha.yaml"


@pytest.mark.parametrize("device", ["bogus", "cuda:99", "nonsense:1"])
def test_a_device_torch_cannot_use_is_a_usage_error(capsys, device):
    with pytest.raises(SystemExit) as info:
        main(["run", str(CAUSAL), "--device", device])
    assert info.value.code == 2
    assert "not a device torch can use here" in capsys.readouterr().err


def test_usage_errors_exit_2():
    proc = subprocess.run([sys.executable, "-m", "tracer", "run"], capture_output=True, text=True)  # the real entry point's exit code
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    proc = tracer_cli("run", "x.yaml", "--dim", "T")
    assert proc.returncode == 2 and "NAME=VALUE" in proc.stderr


def test_the_cli_in_process_leaves_sigterm_as_it_found_it(tmp_path):
    """main() turns SIGTERM into a clean exit while it runs; afterwards the caller's handler is back
    (a test runner or notebook calling main() must still stop on SIGTERM)."""
    before = signal.getsignal(signal.SIGTERM)
    assert tracer_cli("check", tmp_path / "nope.yaml").returncode == 1
    assert signal.getsignal(signal.SIGTERM) is before


STACK = PIPELINES / "encoder_stack.yaml"


def test_the_cli_folds_repeats_by_default_and_expands_on_request(tmp_path):
    (tmp_path / "blocks").mkdir()
    shutil.copy(PIPELINES / "blocks" / "encoder_layer.yaml", tmp_path / "blocks")
    (tmp_path / "s.yaml").write_text(STACK.read_text().replace("repeat: 48", "repeat: 3"))
    assert tracer_cli("render", tmp_path / "s.yaml", "-o", tmp_path / "s.dot", "-q").returncode == 0
    assert "×2" in (tmp_path / "s.dot").read_text()
    listed = tracer_cli("run", tmp_path / "s.yaml", "--expand", "-q").stdout
    assert "layers/2/out " in listed and "×2" not in listed
