"""Bloom end to end: its ALiBi (``build_alibi_tensor``'s constant slopes times key positions, added
by ``alibi.baddbmm(q, k)`` to (B·H, T, T) scores) imports as ``bmm`` → ``scale`` → the module's
view as (B, H, T, T) → ``alibi``, its (B, H, T, Dh) → (B·H, T, Dh) reshapes keep their dims in
order (``B * H``, not a merge of heads), and the file checks clean and runs equal."""

import textwrap

import pytest
import torch
import yaml

from tests.conftest import tracer_cli
from tracer.importing import difference, from_module

transformers = pytest.importorskip("transformers")


def bloom(layers: int = 1):
    torch.manual_seed(0)
    config = transformers.BloomConfig(hidden_size=24, n_layer=layers, n_head=4, vocab_size=32)  # Dh 6: no size twice
    config._attn_implementation = "eager"  # Bloom has no sdpa path
    return transformers.BloomModel(config).eval(), torch.randint(0, 32, (2, 7))


def test_bloom_alibi_imports_as_the_alibi_step_and_runs_equal():
    module, ids = bloom()
    pipeline = from_module(module, ids, name="bloom")
    assert [str(d) for d in pipeline.check().diagnostics if d.severity in ("error", "warning")] == []
    assert difference(pipeline, module, ids) <= 1e-5
    steps = {s["id"]: s for text in pipeline.files.values() for s in yaml.safe_load(text)["steps"]}
    attention = "h.0.self_attention."
    assert steps[attention + "attention_scores"] == {
        "id": attention + "attention_scores",
        "op": "alibi",
        "input": attention + "attention_scores_heads",
    }
    assert steps[attention + "attention_scores_heads"]["shape"] == ["B", "H", "T", "T"]
    scaled = steps[attention + "attention_scores_scaled"]  # inv_norm_factor = 1 / sqrt(head_dim)
    assert scaled.get("divide") == {"sqrt": "Dh"} or scaled.get("multiply") == {"rsqrt": "Dh"}
    assert steps[attention + "query_layer_2"]["shape"] == ["B * H", "T", "Dh"]  # reshape(batch_size * num_heads, -1, head_dim)
    assert not any(s["op"] == "merge" for s in steps.values())  # (B, H, T, Dh) -> (B·H, T, Dh) merges no heads


def test_a_bias_that_is_not_alibi_stays_an_added_tensor():
    class Biased(torch.nn.Module):  # baddbmm of a learned bias: no slopes to recognise
        def __init__(self):
            super().__init__()
            self.bias = torch.nn.Parameter(torch.randn(8, 1, 5))

        def forward(self, q, k):
            return self.bias.baddbmm(q, k.transpose(1, 2), alpha=0.5).view(2, 4, 5, 5)

    module, q, k = Biased(), torch.randn(8, 5, 4), torch.randn(8, 5, 4)
    pipeline = from_module(module, q, k)
    assert difference(pipeline, module, q, k) <= 1e-6
    assert not any(s.op == "alibi" for s in pipeline.spec.steps)


@pytest.fixture(scope="module")
def padded_bloom():
    """Bloom given a padding attention_mask: build_alibi_tensor counts each sequence's key positions
    with ``(attention_mask.cumsum(-1) - 1) * attention_mask`` and the padding hides keys."""
    module, ids = bloom(layers=2)
    mask = torch.ones(2, 7, dtype=torch.long)
    mask[1, 4:] = 0  # the second sequence ends after 4 tokens
    mask[0, :2] = 0  # the first is padded on the left: its positions start 2 keys late
    return module, ids, mask, from_module(module, ids, attention_mask=mask, name="bloom")


def test_bloom_with_a_padding_mask_imports_its_positions_from_the_mask_and_runs_equal(padded_bloom):
    module, ids, mask, pipeline = padded_bloom
    assert [str(d) for d in pipeline.check().diagnostics] == []
    assert difference(pipeline, module, ids, attention_mask=mask) <= 1e-5
    steps = {s["id"]: s for s in yaml.safe_load(pipeline.files["bloom.yaml"])["steps"]}
    assert steps["h"]["repeat"] == 2  # the layers fold, each adding the one bias
    assert steps["arange_tensor_cumsum"] == {"id": "arange_tensor_cumsum", "op": "cumsum", "input": "attention_mask", "dim": -1}
    assert steps["reshape"]["shape"] == ["B * H", 1, "T"]  # alibi.reshape(batch_size * num_heads, 1, seq_length)
    slopes = pipeline.spec.params["slopes"]  # build_alibi_tensor's slopes, computed from constants
    assert slopes.values == [0.25, 0.0625, 0.015625, 0.00390625] and "modeling_bloom.py" in slopes.note
    layer = {s["id"]: s for s in yaml.safe_load(pipeline.files["bloom_h.yaml"])["steps"]}
    masked = layer["self_attention.attn_weights_2"]
    assert masked["op"] == "mask" and masked["causal"] is True and masked["polarity"] == "keep"


def test_the_command_line_imports_a_padded_bloom(tmp_path):
    (tmp_path / "padded.py").write_text(
        textwrap.dedent(
            """
            import torch
            import transformers


            def bloom():
                torch.manual_seed(3)  # the example inputs are drawn after the module is built
                config = transformers.BloomConfig(hidden_size=24, n_layer=2, n_head=4, vocab_size=32)
                config._attn_implementation = "eager"
                return transformers.BloomModel(config)
            """
        )
    )
    inputs = ("--input", "input_ids=2,7:int", "--input", "attention_mask=2,7:int")  # a 0/1 mask: padding anywhere
    done = tracer_cli("import", "padded:bloom", *inputs, "-o", "bloom.yaml", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert float(done.stdout.strip().splitlines()[-1].rsplit(" ", 1)[1]) <= 1e-5
    check = tracer_cli("check", "--strict", "bloom.yaml", cwd=tmp_path)
    assert check.returncode == 0, check.stdout + check.stderr
