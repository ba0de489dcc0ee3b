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

pytestmark = [pytest.mark.dist, pytest.mark.long]

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
    _run(sys.executable, "-c", _BUILD, work / "wheels", cwd=source)
    (wheel,) = (work / "wheels").glob("attention_tracer-*.whl")
    venv = work / "venv"
    _run(sys.executable, "-m", "venv", "--without-pip", venv, cwd=work)
    purelib = Path(_run(venv / "bin/python", "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])", cwd=work).stdout.strip())
    (purelib / "_project_venv.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    _install(wheel, venv / "bin/python", cwd=work)
    return venv / "bin"


# The wheel from the build backend pyproject.toml names, called as PEP 517 says (what `pip wheel
# --no-build-isolation` does, less pip's start-up and its separate run for the metadata).
_BUILD = """
import importlib, sys, tomllib
backend = tomllib.load(open("pyproject.toml", "rb"))["build-system"]["build-backend"]
importlib.import_module(backend).build_wheel(sys.argv[1])
"""


def _install(wheel: Path, python: Path, cwd: Path) -> None:
    """The wheel installed, its bytecode compiled, by uv where `make install` put it beside this
    Python (a tenth of a second), or else by pip (two seconds)."""
    uv = Path(sys.executable).with_name("uv")
    if uv.exists():
        _run(uv, "pip", "install", "-q", "--offline", "--no-deps", "--compile-bytecode", "--python", python, wheel, cwd=cwd)
    else:
        _run(sys.executable, "-m", "pip", "--python", python, "install", "-q", "--no-deps", "--no-index", wheel, cwd=cwd)


def test_the_wheel_installs_works_outside_the_repo_and_carries_license_types_and_assets(installed, tmp_path):
    where = _run(installed / "python", "-c", "import tracer; print(tracer.__file__)", cwd=tmp_path).stdout
    assert Path(where).is_relative_to(installed.parent), where
    assert _run(installed / "tracer", "--version", cwd=tmp_path).stdout.startswith("tracer 0.")
    assert _run(installed / "tracer", "check", "causal_mha", "llama_decoder_layer", "--strict", cwd=tmp_path).stderr == ""
    _carries_license_types_and_assets(Path(where).parent)
    examples = _help_examples(installed, tmp_path / "examples")
    checkpoint = _saved_checkpoint(tmp_path / "checkpoint")
    plugin = _plugin_project(tmp_path / "plugin")
    _commands(
        installed,
        [
            (tmp_path, "tracer render causal_mha -o x.dot"),
            (tmp_path, "tracer render causal_mha --values -o x.html"),
            (tmp_path, "tracer schema > schema.json"),
            (tmp_path, "tracer schema --path > schema_path.txt"),
            *examples,
            # README's `tracer run llama_decoder_layer --weights ./my-llama --layer 3`, as written
            (checkpoint, "tracer run llama_decoder_layer --weights ./my-llama --layer 3 -q > run.txt"),
            # the pytest11 entry point of the wheel: a pipeline file as a test item, and the fixture
            (plugin, "pytest -q -p no:cacheprovider --tracer-pipelines=*.yaml > pytest.txt"),
        ],
    )
    assert (tmp_path / "x.dot").read_text().startswith("digraph pipeline")
    assert "attentionSection" in (tmp_path / "x.html").read_text()  # the report's script came from the wheel
    assert (tmp_path / "schema.json").read_text() == PACKAGED_SCHEMA.read_text()
    shipped = Path((tmp_path / "schema_path.txt").read_text().strip())
    assert shipped.is_relative_to(installed.parent) and shipped.read_text() == PACKAGED_SCHEMA.read_text()
    assert (tmp_path / "examples" / "nanogpt.yaml").is_file() and (tmp_path / "examples" / "report.html").is_file()
    done = (checkpoint / "run.txt").read_text()
    assert "W_q" in done and "[32, 32]" in done, done  # the config's size, not the file's 16
    assert "2 passed" in (plugin / "pytest.txt").read_text(), (plugin / "pytest.txt").read_text()


# Runs `tracer ARGS` and `pytest ARGS` command lines in one process of the fresh venv (one torch
# import, not one per command; the console script itself runs above): each in its folder, with a
# `> FILE` redirection written as the shell would, and the exit status its line documents.
_COMMANDS = """
import contextlib, io, json, os, sys
import pytest
from tracer.cli import main
for folder, words, expected in json.loads(sys.argv[1]):
    os.chdir(folder)
    target = words[words.index(">") + 1] if ">" in words else None
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = (main if words[0] == "tracer" else pytest.main)(words[1 : words.index(">") if target else None])
    assert code == expected, (words, code)
    if target:
        open(target, "w").write(out.getvalue())
"""


def _commands(installed: Path, lines: list[tuple[Path, str]]) -> None:
    """Each ``(folder, command line)`` through tracer's CLI in one process of the fresh venv."""
    runs = [(str(folder), shlex.split(line, comments=True), expected_exit(line)) for folder, line in lines]
    _run(installed / "python", "-c", _COMMANDS, json.dumps(runs), cwd=lines[0][0])


def _help_examples(installed: Path, folder: Path) -> list[tuple[Path, str]]:
    """Each example of `tracer help COMMAND`, as the installed package prints it, to run in an empty folder."""
    folder.mkdir()
    overview = _run(installed / "tracer", "help", cwd=folder).stdout
    listing = overview.partition("COMMAND\n")[2].partition("\noptions:")[0]
    commands = re.findall(r"^    (\w+) ", listing, re.M)
    assert "run" in commands and "models" in commands, overview
    _commands(installed, [(folder, f"tracer help {command} > help_{command}.txt") for command in commands])
    examples = []
    for command in commands:
        text = (folder / f"help_{command}.txt").read_text()
        (folder / f"help_{command}.txt").unlink()  # the folder the examples run in starts empty
        examples += [line.strip() for line in text.partition("\nexamples:\n")[2].splitlines()]
    assert {shlex.split(line, comments=True)[1] for line in examples} == set(commands)  # every command shows an example
    return [(folder, line) for line in examples]


def _saved_checkpoint(folder: Path) -> Path:
    """A folder holding ``my-llama``, a 4-layer LlamaForCausalLM saved with save_pretrained."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        hidden_size=32, num_attention_heads=4, num_key_value_heads=2, intermediate_size=24, num_hidden_layers=4, vocab_size=16
    )
    LlamaForCausalLM(config).save_pretrained(folder / "my-llama")
    return folder


def _plugin_project(folder: Path) -> Path:
    """A folder of a user's tests: a pipeline file (a test item of the plugin) and a test that reads the fixture."""
    folder.mkdir()
    (folder / "attention.yaml").write_text((PIPELINES / "causal_mha.yaml").read_text())
    (folder / "test_shapes.py").write_text(
        "def test_scores(trace_pipeline):\n    assert trace_pipeline('causal_mha')['scores'].symbolic == '(B, H, T, T)'\n"
    )
    return folder


def _carries_license_types_and_assets(package: Path) -> None:
    assets = package / "presentation" / "report_assets"
    assert (package / "py.typed").exists() and {"report.js", "report.css"} <= {f.name for f in assets.iterdir()}
    (info,) = package.parent.glob("attention_tracer-*.dist-info")
    assert "MIT License" in (info / "licenses/LICENSE").read_text()
    assert "License-Expression: MIT" in (info / "METADATA").read_text()
