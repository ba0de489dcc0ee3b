"""`tracer diff` of two imported transformers models whose layers differ only inside the block file
`tracer import` writes (issue 29): Llama against Mistral with a sliding window. Before, the diff
compared the block step alone and said "the same pipeline", exit 0, --values too. Two captures
(the slow part), shared by the tests of this file."""

import pytest

from tests.conftest import tracer_cli
from tracer.diff import diff
from tracer.importing import from_module

SIZES = {"hidden_size": 16, "intermediate_size": 24, "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 64}


@pytest.fixture(scope="module")
def imported(tmp_path_factory):
    """{name: main file} of a 2-layer Llama and a 2-layer Mistral (window 3 < T), the same sizes."""
    transformers = pytest.importorskip("transformers")
    import torch

    folder, paths = tmp_path_factory.mktemp("imported"), {}
    for name, config in (
        ("llama", transformers.LlamaConfig(num_hidden_layers=2, **SIZES)),
        ("mistral", transformers.MistralConfig(num_hidden_layers=2, sliding_window=3, **SIZES)),
    ):
        config._attn_implementation, config.use_cache = "eager", False
        torch.manual_seed(0)
        model = getattr(transformers, f"{name.title()}Model")(config).eval()
        pipeline = from_module(model, torch.randint(0, 64, (2, 5)), name="model")
        (folder / name).mkdir()
        paths[name] = folder / name / "model.yaml"
        pipeline.to_yaml(paths[name])
    return paths


def test_llama_against_mistral_names_the_window_mask_inside_the_block_and_exits_1(imported):
    import tracer

    a, b = tracer.load(imported["llama"]), tracer.load(imported["mistral"])
    assert [s.op for s in a.spec.steps].count("block") == 1  # the layers are in a use: file
    found = diff(a, b, values=True)
    assert found.changed_op == ["layers/{0,1}/self_attn.attn_weights_2: window - -> W (3)"]
    assert found.dims == [["W", "-", "3"]] and not found.added and not found.removed
    assert found.diverges == "layers/0/self_attn.attn_weights_2"
    done = tracer_cli("diff", str(imported["llama"]), str(imported["mistral"]), "--values")
    assert done.returncode == 1 and "~ step layers/{0,1}/self_attn.attn_weights_2: window - -> W (3)" in done.stdout
    same = tracer_cli("diff", str(imported["llama"]), str(imported["llama"]), "--values")
    assert same.returncode == 0 and same.stdout.endswith("values: every shared tensor agrees\nthe same pipeline\n")
