"""The bundled pipelines by name, from any folder: `tracer run llama_decoder_layer`,
`tracer.load("causal_mha")`, `tracer models`. A file of that name where the command runs wins."""

from __future__ import annotations

import importlib

import pytest
import yaml

import tracer
from tests.conftest import PIPELINES, tracer_cli
from tracer import checkpoints
from tracer.spec.bundled import find, folder, locate, models

MODEL_FILES = sorted((PIPELINES / "models").glob("*.yaml"))


def test_a_name_finds_the_bundled_file_from_an_empty_folder(tmp_path, monkeypatch):
    by_name = tracer_cli("run", "llama_decoder_layer", "-q", "--width", "200", cwd=tmp_path)
    by_path = tracer_cli("run", PIPELINES / "models/llama_decoder_layer.yaml", "-q", "--width", "200")
    assert by_name.returncode == 0 and by_name.stdout == by_path.stdout, by_name.stderr
    monkeypatch.chdir(tmp_path)
    assert locate("causal_mha") == folder() / "causal_mha.yaml"
    assert locate("lint_examples/fixed/scale_mismatch") == folder() / "lint_examples/fixed/scale_mismatch.yaml"
    assert locate("pipelines/causal_mha.yaml") == folder() / "causal_mha.yaml"  # the docs' paths, outside the checkout
    assert tracer.load("causal_mha").spec.name == "causal_mha"


def test_a_file_where_the_command_runs_wins_over_the_bundled_name(tmp_path):
    (tmp_path / "causal_mha").write_text("name: mine\nsteps: [{id: a, op: arange, stop: 3}]\n")
    assert locate(tmp_path / "causal_mha") == tmp_path / "causal_mha"
    done = tracer_cli("run", "causal_mha", "-q", cwd=tmp_path)
    assert done.returncode == 0 and done.stdout.startswith("mine"), done.stderr


def test_an_unknown_name_is_a_missing_file_and_no_name_leaves_the_bundled_folder(tmp_path):
    done = tracer_cli("check", "llama_decodr_layer", cwd=tmp_path)
    assert (done.returncode, done.stderr) == (
        1,
        "llama_decodr_layer: error[file-missing]: no such file, nor a bundled pipeline of that name; "
        "did you mean 'llama_decoder_layer'? (`tracer models` lists the bundled models)\n",
    )
    assert find("../README.md") is None and find("models/../../README.md") is None
    assert find("models") is None  # a folder is no pipeline


def test_a_missing_file_argument_points_to_the_bundled_names_from_every_entry(tmp_path, monkeypatch):
    """run, render, export and diff take FILE as check does; so do tracer.load and --weights' bind."""
    hint = "no such file, nor a bundled pipeline of that name (`tracer models` lists the bundled models)"
    commands = {"run": 1, "render": 1, "export": 1, "diff": 2}  # diff's trouble is exit 2, as diff(1)'s
    for command, status in commands.items():
        argv = [command, "zzz.yaml"] + {"render": ["-o", "z.svg"], "diff": ["causal_mha"]}.get(command, [])
        done = tracer_cli(*argv, cwd=tmp_path)
        assert (done.returncode, done.stderr) == (status, f"zzz.yaml: error[file-missing]: {hint}\n"), argv
    monkeypatch.chdir(tmp_path)
    with pytest.raises(tracer.TracerError, match="tracer models"):
        checkpoints.bind("zzz.yaml", tmp_path)
    with pytest.raises(tracer.TracerError, match="did you mean 'lint_examples/scale_mismatch'"):
        tracer.load("lint_examples/scale_mismatc")
    assert "did you mean 'causal_mha'?" in str(pytest.raises(tracer.TracerError, tracer.load, "pipelines/causal_mhaa.yaml").value)
    block = tmp_path / "uses.yaml"  # a missing block file is the including file's error, without the hint
    block.write_text("name: b\ninputs: {x: {shape: [2], init: randn}}\nsteps: [{id: b, op: block, use: gone.yaml}]\n")
    assert "tracer models" not in tracer_cli("check", block).stderr


def test_tracer_models_lists_every_bundled_model_with_its_classes():
    done = tracer_cli("models")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert [line.split()[0] for line in lines[::2]] == [p.stem for p in MODEL_FILES]
    assert lines[lines.index(next(x for x in lines if x.startswith("llama_decoder_layer ")))].split()[1:] == [
        "LlamaDecoderLayer",
        "(--weights",
        "FOLDER)",
    ]
    assert "BertSelfAttention, BertSelfOutput" in done.stdout


def test_every_bundled_model_names_the_transformers_modules_it_matches():
    """`matches:` is what `tracer models` shows: each is a real class of the installed transformers."""
    for model in models():
        data = yaml.safe_load((PIPELINES / "models" / f"{model.name}.yaml").read_text())
        assert model.matches == data["matches"] and model.matches, model.name
        assert model.takes_checkpoint == ("checkpoint" in data)
        for path in model.matches:
            module, _, name = path.rpartition(".")
            assert isinstance(getattr(importlib.import_module(module), name), type), path
