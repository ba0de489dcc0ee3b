"""The imported pipelines in pipelines/imported/ (the gallery shows them beside hand-written ones):
they are what importing their modules writes today, and ``tracer diff`` pairs their steps with the
hand-written twins by structure, so the Llama layer differs in names only."""

import sys

import pytest

import tracer
from tests.conftest import PIPELINES
from tracer.diff import diff, format_diff
from tracer.importing import difference, from_module

IMPORTED = PIPELINES / "imported"
REGENERATE = (
    "PYTHONPATH=pipelines/imported python -m tracer import modules:{factory} --input x=2,6,{width} -o pipelines/imported/{factory}.yaml"
)


@pytest.fixture(scope="module")
def modules():
    pytest.importorskip("transformers")
    sys.path.insert(0, str(IMPORTED))
    try:
        import modules

        yield modules
    finally:
        sys.path.remove(str(IMPORTED))
        sys.modules.pop("modules", None)


@pytest.mark.parametrize(("factory", "width"), [("nanogpt_attention", 8), ("llama_decoder_layer", 16)])
def test_committed_imports_are_what_importing_writes_now(modules, factory, width):
    import torch

    module, x = getattr(modules, factory)(), torch.randn(2, 6, width)
    pipeline = from_module(module, x, name=type(module).__name__)
    committed = (IMPORTED / f"{factory}.yaml").read_text()
    assert pipeline.to_yaml() == committed, f"stale: {REGENERATE.format(factory=factory, width=width)}"
    assert difference(pipeline, module, x) <= 1e-5


def test_llama_layer_imported_from_transformers_differs_from_the_hand_written_one_in_names_only():
    hand_written, imported = tracer.load(PIPELINES / "models/llama_decoder_layer.yaml"), tracer.load(IMPORTED / "llama_decoder_layer.yaml")
    found = diff(hand_written, imported, values=True)
    assert found.same and not found.added and not found.removed and not found.shapes and found.diverges is None
    assert "step q_rot -> layer.self_attn.q_embed: rope" in found.renamed
    assert "param W_k -> layer.self_attn.k_proj.weight" in found.renamed
    assert len([r for r in found.renamed if r.startswith("step ")]) == 30
    assert format_diff(found).endswith("values: every shared tensor agrees\nthe same pipeline but for names")


def test_nanogpt_attention_against_gpt2s_shows_the_layout_and_the_eval_dropout():
    hand_written, imported = tracer.load(PIPELINES / "models/gpt2_attention.yaml"), tracer.load(IMPORTED / "nanogpt_attention.yaml")
    found = diff(hand_written, imported, values=True)
    assert found.removed == ["weights_d: dropout"] and found.added == []
    assert "qkv -> c_attn: layout in_out -> out_in" in found.changed_op
    assert "step qkv_split -> q_split: split" in found.renamed
    assert found.diverges == "qkv -> c_attn"  # GPT-2's Conv1D weight is stored (in, out): not nanoGPT's weights
