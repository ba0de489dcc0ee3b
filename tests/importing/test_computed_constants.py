"""Constant tensors the module computes that no step names (a rotary table of frequencies no
``rope_scaling`` reproduces) import as params holding their values at the example (``values:``,
``buffer: true``), with a ``note`` saying which module and op computed them: never a refusal."""

import importlib.util
import textwrap

import pytest
import torch

import tracer
from tests.conftest import tracer_cli
from tracer.importing import difference, from_module

transformers = pytest.importorskip("transformers")

ROTATED = """
import torch

import tracer


class Rotated(torch.nn.Module):
    # frequencies of no rope_type: a table made up by hand, a non-persistent buffer
    def __init__(self):
        super().__init__()
        self.register_buffer("inv_freq", torch.tensor([1.0, 0.3, 0.05, 0.001]), persistent=False)

    def forward(self, x):
        freqs = torch.arange(x.shape[-2]).float()[:, None] * self.inv_freq
        emb = torch.cat((freqs, freqs), -1)
        half = x.shape[-1] // 2
        table = emb.cos()
        return x * table + torch.cat((-x[..., half:], x[..., :half]), -1) * emb.sin()


class Cached(torch.nn.Module):
    # a perturbed table held as non-persistent buffers: no state_dict entry, no frequencies at all
    def __init__(self):
        super().__init__()
        generator = torch.Generator().manual_seed(0)
        self.register_buffer("cos_cached", torch.randn(16, 8, generator=generator), persistent=False)
        self.register_buffer("sin_cached", torch.randn(16, 8, generator=generator), persistent=False)

    def forward(self, x):
        cos, sin = self.cos_cached[: x.shape[1]], self.sin_cached[: x.shape[1]]
        half = x.shape[-1] // 2
        return x * cos + torch.cat((-x[..., half:], x[..., :half]), -1) * sin
"""


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    path = tmp_path_factory.mktemp("rotated") / "rotated.py"  # a file: the steps' comments quote its lines
    path.write_text(textwrap.dedent(ROTATED))
    spec = importlib.util.spec_from_file_location("rotated", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def rotated(written):
    return written.Rotated()


def strict_problems(pipeline) -> list[str]:
    return [f"{d.code}: {d.message}" for d in pipeline.check().diagnostics]


def test_a_rotary_table_no_config_explains_imports_as_its_values_and_runs_equal(rotated):
    x = torch.randn(2, 3, 7, 8)
    pipeline = from_module(rotated, x)
    assert not strict_problems(pipeline)
    assert difference(pipeline, rotated, x) <= 1e-5
    tables = {name: decl for name, decl in pipeline.spec.params.items() if decl.values is not None}
    assert set(tables) == {"table", "sin"}  # named as the line assigns it, else after the op
    assert all(decl.buffer and decl.shape == [7, 8] for decl in tables.values())  # x.shape[-2]: no batch or sequence axis
    freqs = torch.arange(7).float()[:, None] * rotated.inv_freq
    assert torch.equal(torch.tensor(tables["table"].values), torch.cat((freqs, freqs), -1).cos())
    assert "torch.ops.aten.cos.default" in tables["table"].note and "table = emb.cos()" in tables["table"].note
    # x * table + rotate_half(x) * sin, as the module writes it: no rope step computes this table
    assert "rope" not in {s.op for s in pipeline.spec.steps} and {"mul", "neg", "cat", "add"} <= {s.op for s in pipeline.spec.steps}


def test_a_table_held_as_non_persistent_buffers_is_declared_with_their_values(written):
    module, x = written.Cached(), torch.randn(2, 7, 8)
    pipeline = from_module(module, x)
    assert not strict_problems(pipeline)
    assert difference(pipeline, module, x) <= 1e-5
    cos = pipeline.spec.params["cos_cached"]
    assert cos.buffer and cos.shape == [16, 8] and torch.equal(torch.tensor(cos.values), module.cos_cached)
    assert cos.note == "Cached's tensor 'cos_cached', which its state_dict does not hold"
    assert {"index", "mul", "neg", "cat", "add"} == {s.op for s in pipeline.spec.steps}  # cos_cached[:T]: an index of it


@pytest.fixture(scope="module")
def perturbed_llama():
    """A Llama whose rotary frequencies were changed after init: no config computes them."""
    config = transformers.LlamaConfig(
        hidden_size=16, intermediate_size=40, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1, vocab_size=32
    )
    config._attn_implementation = "eager"
    torch.manual_seed(0)
    model = transformers.LlamaModel(config).eval()
    model.rotary_emb.inv_freq *= torch.tensor([1.0, 0.5, 1.5, 0.25])
    ids = torch.randint(0, 32, (2, 7))
    return model, ids, from_module(model, ids)


def test_a_perturbed_rotary_table_is_one_table_every_folded_layer_reads(perturbed_llama):
    model, ids, pipeline = perturbed_llama
    assert not strict_problems(pipeline)
    assert difference(pipeline, model, ids) <= 1e-5
    (block,) = [s for s in pipeline.spec.steps if s.op == "block"]
    assert block.repeat == 2 and block.inputs[1:] == ["rotary_emb.cos", "rotary_emb.sin"]
    cos = pipeline.spec.params["rotary_emb.cos"]
    assert cos.buffer and cos.shape == [1, "T", "Dh"] and cos.note.startswith("computed at import by rotary_emb (modeling_llama.py:")


def test_the_command_line_imports_a_computed_table_into_a_strictly_clean_file(tmp_path):
    (tmp_path / "rotated.py").write_text(textwrap.dedent(ROTATED))
    done = tracer_cli("import", "rotated:Rotated", "--input", "x=2,3,7,8", "-o", "rotated.yaml", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert float(done.stdout.strip().splitlines()[-1].rsplit(" ", 1)[1]) <= 1e-5
    check = tracer_cli("check", "--strict", "rotated.yaml", cwd=tmp_path)
    assert check.returncode == 0, check.stdout + check.stderr


def test_weights_from_the_modules_state_dict_fill_every_param_but_the_tables_the_file_holds(perturbed_llama, tmp_path):
    model, _, pipeline = perturbed_llama
    for name, text in pipeline.files_named("llama").items():
        (tmp_path / name).write_text(text)
    torch.save(model.state_dict(), tmp_path / "weights.pt")  # no rotary table: inv_freq is no state_dict entry
    done = tracer_cli("run", "llama.yaml", "--weights", "weights.pt", cwd=tmp_path)
    assert done.returncode == 0, done.stderr


def test_a_computed_constant_too_large_to_write_as_values_is_refused_at_its_line():
    class Huge(torch.nn.Module):
        def forward(self, x):
            return x + torch.arange(300 * 300, dtype=torch.float32).reshape(300, 300).cos()

    with pytest.raises(tracer.TracerError) as caught:
        from_module(Huge(), torch.randn(2, 300, 300))
    (problem,) = caught.value.diagnostics
    assert problem.code == "import-unmapped" and "90,000 elements" in problem.message and "too large" in problem.message


def test_a_computed_constant_added_to_a_tensor_that_is_no_mask_is_added_as_its_values():
    class Offset(torch.nn.Module):  # a sinusoidal table added to the input: no mask pattern, no state_dict entry
        def forward(self, x):
            return x + torch.arange(x.shape[1] * x.shape[2], dtype=torch.float32).reshape(x.shape[1], x.shape[2]).sin()

    module, x = Offset(), torch.randn(2, 5, 6)
    pipeline = from_module(module, x)
    assert not strict_problems(pipeline)
    assert difference(pipeline, module, x) <= 1e-6
    (step,) = pipeline.spec.steps
    assert step.op == "add" and pipeline.spec.params[step.inputs[1]].shape == [5, 6]  # a table of fixed size: T is 5 here
