"""No command writes a file it was not asked to, or replaces one it did not write: an existing
file that is not tracer's own output of that kind needs --force (exit 2 without it), an input
(a file in a --weights folder, the imported module's source, a block file a diffed pipeline
includes) is refused even with --force, an import names its block files after its output (two
imports into one folder never share one), a class name never leads outside -o's folder, and
every written file is listed."""

from __future__ import annotations

import json
import shutil
import tempfile
import textwrap
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

import tracer
from tests.conftest import PIPELINES, tracer_cli
from tracer.importing import from_module

CAUSAL = PIPELINES / "causal_mha.yaml"

# (argv before -o, the output's name)
COMMANDS = {
    "run": (["run", CAUSAL, "-q"], "trace.txt"),
    "run --json": (["run", CAUSAL, "--json", "-q"], "trace.json"),
    "render .dot": (["render", CAUSAL, "-q"], "d.dot"),
    "render .html": (["render", CAUSAL, "-q"], "r.html"),
    "export": (["export", CAUSAL], "m.py"),
    "diff --html": (["diff", CAUSAL, CAUSAL], "d.html"),
}


def _argv(command: str, target: Path) -> list:
    argv, _ = COMMANDS[command]
    return [*argv, "--html" if command == "diff --html" else "-o", target]


@pytest.mark.parametrize("command", COMMANDS)
def test_a_file_tracer_did_not_write_is_replaced_only_with_force(tmp_path, command):
    target = tmp_path / COMMANDS[command][1]
    target.write_text("my own notes\n")
    refused = tracer_cli(*_argv(command, target))
    assert refused.returncode == 2 and "error[output-exists]" in refused.stderr and "--force" in refused.stderr
    assert target.read_text() == "my own notes\n"
    forced = tracer_cli(*_argv(command, target), "--force")
    assert forced.returncode == 0, forced.stderr
    assert f"wrote {target}" in forced.stdout + forced.stderr and target.read_text() != "my own notes\n"
    again = tracer_cli(*_argv(command, target))  # tracer's own output of that kind: rerunning replaces it
    assert again.returncode == 0, again.stderr


def test_an_output_of_another_kind_is_not_replaced(tmp_path):
    target = tmp_path / "out.json"
    assert tracer_cli("export", CAUSAL, "-o", tmp_path / "m.py").returncode == 0
    shutil.copy(tmp_path / "m.py", target)  # tracer wrote it, but as a module, not as a JSON trace
    assert tracer_cli("run", CAUSAL, "--json", "-q", "-o", target).returncode == 2


@pytest.fixture(scope="module")
def pretrained(tmp_path_factory):
    """A save_pretrained-style folder for causal_mha (its checkpoint: a section written here)."""
    folder = tmp_path_factory.mktemp("pretrained")
    state = tracer.load(CAUSAL).run(keep_values=True)
    save_file(
        {f"attn.{name}": state[name].tensor.contiguous() for name in ("W_q", "W_k", "W_v", "W_o", "b_o")}, folder / "model.safetensors"
    )
    (folder / "config.json").write_text(json.dumps({"model_type": "toy", "hidden_size": 4, "num_attention_heads": 2}))
    section = "checkpoint:\n  dims: {hidden_size: d_model, num_attention_heads: H}\n  prefix: attn.\n"
    section += "  params: {W_q: W_q, W_k: W_k, W_v: W_v, W_o: W_o, b_o: b_o}\n"
    pipeline = folder.parent / "with_checkpoint.yaml"
    pipeline.write_text(CAUSAL.read_text() + section)
    return pipeline, folder


@pytest.mark.parametrize("name", ["config.json", "model.safetensors"])
@pytest.mark.parametrize("force", [[], ["--force"]])
def test_no_output_lands_on_a_file_of_the_weights_folder(pretrained, name, force):
    pipeline, folder = pretrained
    assert tracer_cli("run", pipeline, "--weights", folder, "-q").returncode == 0
    before = (folder / name).read_bytes()
    done = tracer_cli("run", pipeline, "--weights", folder, "--json", "-q", "-o", folder / name, *force)
    assert done.returncode == 1 and "error[output-is-input]" in done.stderr, done.stderr
    assert (folder / name).read_bytes() == before


FACTORY = """
import torch


class Layer(torch.nn.Module):
    def __init__(self, d, act):
        super().__init__()
        self.lin, self.act = torch.nn.Linear(d, d), act

    def forward(self, x):
        return self.act(self.lin(x))


class Model(torch.nn.Module):
    def __init__(self, d, act):
        super().__init__()
        self.layers = torch.nn.ModuleList(Layer(d, act) for _ in range(2))

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return x


def relu():
    torch.manual_seed(0)
    return Model(4, torch.relu)


def sigmoid():
    torch.manual_seed(0)
    return Model(4, torch.sigmoid)


def escaping():
    torch.manual_seed(0)
    return type("../../escape", (Model,), {})(4, torch.relu)
"""


@pytest.fixture
def factories(tmp_path):
    (tmp_path / "stacks.py").write_text(textwrap.dedent(FACTORY))
    return tmp_path


def _import(folder: Path, factory: str, output: str, *more):
    return tracer_cli("import", f"stacks:{factory}", "--input", "x=2,3,4", "-o", output, *more, cwd=folder)


def test_two_imports_into_one_folder_keep_their_own_block_files(factories):
    first, second = _import(factories, "relu", "a.yaml"), _import(factories, "sigmoid", "b.yaml")
    assert first.returncode == 0 and second.returncode == 0, first.stderr + second.stderr
    assert {p.name for p in factories.glob("*.yaml")} == {"a.yaml", "a_layers.yaml", "b.yaml", "b_layers.yaml"}
    assert "wrote a.yaml\nwrote a_layers.yaml\n" in first.stderr  # every file written, listed
    import sys

    sys.path.insert(0, str(factories))
    try:
        import stacks

        module = stacks.relu()
    finally:
        sys.path.remove(str(factories))
        sys.modules.pop("stacks", None)
    x = torch.randn(2, 3, 4)
    trace = tracer.load(factories / "a.yaml").run(params=module.state_dict(), inputs={"x": x}, keep_values=True)
    (output,) = trace.outputs.values()
    assert torch.allclose(output, module(x).detach(), atol=1e-6)  # the first module's layers, not the second's


def test_an_import_never_writes_onto_the_module_source(factories):
    source = factories / "stacks.py"
    before = source.read_bytes()
    for force in ([], ["--force"]):
        done = _import(factories, "relu", "stacks.py", *force)
        assert done.returncode == 1 and "error[output-is-input]" in done.stderr, done.stderr
    assert source.read_bytes() == before


def test_an_import_does_not_replace_a_block_file_it_did_not_write(factories):
    (factories / "a_layers.yaml").write_text("name: mine\n")
    done = _import(factories, "relu", "a.yaml")
    assert done.returncode == 2 and "a_layers.yaml" in done.stderr and "error[output-exists]" in done.stderr
    assert not (factories / "a.yaml").exists() and (factories / "a_layers.yaml").read_text() == "name: mine\n"
    assert _import(factories, "relu", "a.yaml", "--force").returncode == 0
    assert _import(factories, "relu", "a.yaml").returncode == 0  # its own files, written again


def test_a_class_name_that_is_a_path_writes_nothing_outside_the_output_folder(factories):
    done = _import(factories, "escaping", "out.yaml")
    assert done.returncode == 0, done.stderr
    assert {p.name for p in factories.iterdir() if p.suffix == ".yaml"} == {"out.yaml", "out_layers.yaml"}
    assert "name: ../../escape" in (factories / "out.yaml").read_text()  # the class's own name, as data
    escaped = [p for p in (factories.parent, factories.parent.parent, Path(tempfile.gettempdir()).parent) if (p / "escape.yaml").exists()]
    assert not escaped


def test_from_module_keeps_a_path_like_class_name_inside_its_own_folder(tmp_path):
    module = type("../escape_from_module", (torch.nn.Linear,), {})(4, 4)
    pipeline = from_module(module, torch.randn(2, 3, 4))
    assert all("/" not in name for name in pipeline.files)
    assert not (Path(tempfile.gettempdir()) / "escape_from_module.yaml").exists()
    pipeline.to_yaml(tmp_path / "p.yaml")
    assert [p.name for p in tmp_path.iterdir()] == ["p.yaml"]


def test_diff_html_never_lands_on_a_block_file_a_pipeline_includes(tmp_path):
    shutil.copytree(PIPELINES / "blocks", tmp_path / "blocks")
    stack = tmp_path / "stack.yaml"
    stack.write_text((PIPELINES / "encoder_stack.yaml").read_text().replace("repeat: 48", "repeat: 2"))
    block = tmp_path / "blocks" / "encoder_layer.yaml"
    before = block.read_bytes()
    for force in ([], ["--force"]):
        done = tracer_cli("diff", stack, stack, "--html", block, *force)
        assert done.returncode == 2 and "error[output-is-input]" in done.stderr, done.stderr  # diff's trouble
    assert block.read_bytes() == before
