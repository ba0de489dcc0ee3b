"""The package as a user installs it: the wheel built from this tree, installed into a fresh venv in a
folder outside the repository, used from there.

The fresh venv reuses the project venv's packages (torch is gigabytes) through a path file, which
adds that folder without running its own path files: the project's editable install of tracer
stays invisible, so what runs is the wheel's copy. Marked ``dist``: a plain ``pytest`` leaves it out,
`make test` runs it beside the rest of the suite, ``pytest -m dist`` alone. One test, so that
pytest-xdist builds the wheel once.
"""

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from tests.conftest import PIPELINES, ROOT, expected_exit
from tracer.docgen import PACKAGED_SCHEMA

pytestmark = pytest.mark.dist

ENV = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # nothing of the checkout on the path


def _run(*argv, cwd: Path) -> subprocess.CompletedProcess:
    done = subprocess.run([str(a) for a in argv], cwd=cwd, env=ENV, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, f"{argv}: {done.stderr[-2000:]}"
    return done


def _source_tree(dest: Path) -> Path:
    """The files a fresh clone has (tracked, plus new files not ignored), without build leftovers."""
    names = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT, capture_output=True, check=True
    ).stdout.decode()
    for name in filter(None, names.split("\0")):
        if (ROOT / name).is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, dest / name)
    return dest


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    """The fresh venv's bin folder, with the wheel installed."""
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("needs the git checkout to know its files")
    work = tmp_path_factory.mktemp("dist")
    source = _source_tree(work / "src")
    _run(sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", work / "wheels", source, cwd=work)
    (wheel,) = (work / "wheels").glob("attention_tracer-*.whl")
    venv = work / "venv"
    _run(sys.executable, "-m", "venv", "--without-pip", venv, cwd=work)
    purelib = Path(_run(venv / "bin/python", "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])", cwd=work).stdout.strip())
    (purelib / "_project_venv.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    _run(sys.executable, "-m", "pip", "--python", venv / "bin/python", "install", "-q", "--no-deps", "--no-index", wheel, cwd=work)
    return venv / "bin"


def test_the_wheel_installs_works_outside_the_repo_and_carries_license_types_and_assets(installed, tmp_path):
    where = _run(installed / "python", "-c", "import tracer; print(tracer.__file__)", cwd=tmp_path).stdout
    assert Path(where).is_relative_to(installed.parent), where
    assert _run(installed / "tracer", "--version", cwd=tmp_path).stdout.startswith("tracer 0.")
    assert _run(installed / "tracer", "check", "causal_mha", "llama_decoder_layer", "--strict", cwd=tmp_path).stderr == ""
    _run(installed / "tracer", "render", "causal_mha", "-o", "x.dot", cwd=tmp_path)
    assert (tmp_path / "x.dot").read_text().startswith("digraph pipeline")
    _run(installed / "tracer", "render", "causal_mha", "--values", "-o", "x.html", cwd=tmp_path)
    assert "attentionSection" in (tmp_path / "x.html").read_text()  # the report's script came from the wheel
    assert _run(installed / "tracer", "schema", cwd=tmp_path).stdout == PACKAGED_SCHEMA.read_text()
    shipped = Path(_run(installed / "tracer", "schema", "--path", cwd=tmp_path).stdout.strip())
    assert shipped.is_relative_to(installed.parent) and shipped.read_text() == PACKAGED_SCHEMA.read_text()
    _carries_license_types_and_assets(Path(where).parent)
    _runs_every_help_example(installed, tmp_path / "examples")
    _runs_a_bundled_model_by_name_on_a_saved_checkpoint(installed, tmp_path / "checkpoint")
    _runs_the_pytest_plugin(installed, tmp_path / "plugin")


# Runs the examples in one process of the fresh venv (one torch import, not one per example):
# each as `tracer ARGS`, with a `> FILE` redirection written as the shell would.
_EXAMPLES = """
import contextlib, io, json, sys
from tracer.cli import main
for words, expected in json.loads(sys.argv[1]):
    target = words[words.index(">") + 1] if ">" in words else None
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = main(words[1 : words.index(">") if target else None])
    assert code == expected, (words, code)
    if target:
        open(target, "w").write(out.getvalue())
"""


def _runs_every_help_example(installed: Path, folder: Path) -> None:
    """Each example of `tracer help COMMAND`, as the installed command prints it, in an empty folder."""
    folder.mkdir()
    overview = _run(installed / "tracer", "help", cwd=folder).stdout
    listing = overview.partition("COMMAND\n")[2].partition("\noptions:")[0]
    commands = re.findall(r"^    (\w+) ", listing, re.M)
    assert "run" in commands and "models" in commands, overview
    examples = []
    for command in commands:
        text = _run(installed / "tracer", "help", command, cwd=folder).stdout
        lines = text.partition("\nexamples:\n")[2].splitlines()
        examples += [(shlex.split(line, comments=True), expected_exit(line)) for line in lines]
    assert {words[1] for words, _ in examples} == set(commands)  # every command shows an example
    _run(installed / "python", "-c", _EXAMPLES, json.dumps(examples), cwd=folder)
    assert (folder / "nanogpt.yaml").is_file() and (folder / "report.html").is_file()


def _runs_a_bundled_model_by_name_on_a_saved_checkpoint(installed: Path, folder: Path) -> None:
    """README's `tracer run llama_decoder_layer --weights ./my-llama --layer 3`, as written."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        hidden_size=32, num_attention_heads=4, num_key_value_heads=2, intermediate_size=24, num_hidden_layers=4, vocab_size=16
    )
    LlamaForCausalLM(config).save_pretrained(folder / "my-llama")
    done = _run(installed / "tracer", "run", "llama_decoder_layer", "--weights", "./my-llama", "--layer", "3", "-q", cwd=folder)
    assert "W_q" in done.stdout and "[32, 32]" in done.stdout, done.stdout  # the config's size, not the file's 16


def _runs_the_pytest_plugin(installed: Path, folder: Path) -> None:
    """The pytest11 entry point of the wheel: a pipeline file as a test item, and the fixture."""
    folder.mkdir()
    (folder / "attention.yaml").write_text((PIPELINES / "causal_mha.yaml").read_text())
    (folder / "test_shapes.py").write_text(
        "def test_scores(trace_pipeline):\n    assert trace_pipeline('causal_mha')['scores'].symbolic == '(B, H, T, T)'\n"
    )
    done = _run(installed / "python", "-m", "pytest", "-q", "-p", "no:cacheprovider", "--tracer-pipelines=*.yaml", cwd=folder)
    assert "2 passed" in done.stdout, done.stdout


def _carries_license_types_and_assets(package: Path) -> None:
    assets = package / "presentation" / "report_assets"
    assert (package / "py.typed").exists() and {"report.js", "report.css"} <= {f.name for f in assets.iterdir()}
    (info,) = package.parent.glob("attention_tracer-*.dist-info")
    assert "MIT License" in (info / "licenses/LICENSE").read_text()
    assert "License-Expression: MIT" in (info / "METADATA").read_text()
