"""Ops that have a step, each in a small module written as the model it comes from writes it:
ViT's patch embedding (conv2d), Whisper's stem (conv1d), RoBERTa's position ids (cumsum), CLIP's
pooler (argmax, then the rows it picks), Falcon's ``x @ weight.T``, ``x[-2]`` of a list of hidden
states, timm's ``qkv.unbind(0)``, einops-style ``einsum`` attention, ``flatten``, and numbers added
to or multiplying a tensor (Cohere's ``variance + eps``, GELU's ``1 + …``). Each imports to its
step, runs equal to the module on its weights and checks clean under ``--strict``."""

import math

import pytest
import torch
import yaml
from torch import nn
from torch.nn import functional as F

import tracer
from tests.conftest import PIPELINES
from tests.importing.test_round_trip import _reimported
from tracer.diff import diff
from tracer.importing import difference, from_module

B, T, D, H = 2, 6, 16, 2


class PatchEmbed(nn.Module):
    """ViT / timm: ``proj(x).flatten(2).transpose(1, 2)``."""

    def __init__(self):
        super().__init__()
        self.proj = nn.Conv2d(3, D, kernel_size=4, stride=4)

    def forward(self, pixel_values):
        return self.proj(pixel_values).flatten(2).transpose(1, 2)


class WhisperStem(nn.Module):
    """Whisper's encoder stem: two conv1d with GELU, the second with stride 2, then (B, T, D)."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv1d(8, D, kernel_size=3, padding=1)
        self.conv2 = nn.Conv1d(D, D, kernel_size=3, stride=2, padding=1)

    def forward(self, input_features):
        hidden = F.gelu(self.conv1(input_features))
        hidden = F.gelu(self.conv2(hidden))
        return hidden.permute(0, 2, 1)


class RobertaPositions(nn.Module):
    """RoBERTa's ``create_position_ids_from_input_ids``: padding_idx + 1 onwards, padding stays padding_idx."""

    def __init__(self, padding_idx=1):
        super().__init__()
        self.padding_idx = padding_idx
        self.position_embeddings = nn.Embedding(T + 2, D, padding_idx=padding_idx)

    def forward(self, input_ids):
        mask = input_ids.ne(self.padding_idx).int()
        incremental_indices = torch.cumsum(mask, dim=1).type_as(mask) * mask
        position_ids = incremental_indices.long() + self.padding_idx
        return self.position_embeddings(position_ids)


class ClipPooler(nn.Module):
    """CLIP's text pooler: the hidden state at each sequence's end-of-text token (its largest id)."""

    def forward(self, last_hidden_state, input_ids):
        eos = input_ids.to(dtype=torch.int, device=last_hidden_state.device).argmax(dim=-1)
        return last_hidden_state[torch.arange(last_hidden_state.shape[0], device=last_hidden_state.device), eos]


class FalconLinear(nn.Linear):
    """Falcon's ``FalconLinear``: ``input @ self.weight.T`` (+ bias)."""

    def forward(self, input):
        hidden_states = input @ self.weight.T
        return hidden_states if self.bias is None else hidden_states + self.bias


class SecondToLast(nn.Module):
    """``hidden_states[-2]`` of the layers' outputs (CLIP skip, LLaVA's vision feature layer)."""

    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(D, D) for _ in range(3))

    def forward(self, x):
        hidden_states = [x]
        for layer in self.layers:
            hidden_states.append(torch.tanh(layer(hidden_states[-1])))
        return hidden_states[-2]


class TimmAttention(nn.Module):
    """timm's ViT attention: ``qkv.reshape(B, N, 3, H, Dh).permute(2, 0, 3, 1, 4)`` then ``q, k, v = qkv.unbind(0)``."""

    def __init__(self):
        super().__init__()
        self.num_heads, self.scale = H, (D // H) ** -0.5
        self.qkv, self.proj = nn.Linear(D, 3 * D), nn.Linear(D, D)

    def forward(self, x):
        b, n, c = x.shape
        qkv = self.qkv(x).reshape(b, n, 3, self.num_heads, c // self.num_heads).permute(2, 0, 3, 1, 4)
        q, k, v = qkv.unbind(0)
        attn = (q * self.scale) @ k.transpose(-2, -1)
        x = attn.softmax(dim=-1) @ v
        return self.proj(x.transpose(1, 2).reshape(b, n, c))


class EinsumAttention(nn.Module):
    """einops / lucidrains style: ``einsum('b h i d, b h j d -> b h i j')``."""

    def __init__(self):
        super().__init__()
        self.to_qkv, self.to_out = nn.Linear(D, 3 * D, bias=False), nn.Linear(D, D)

    def forward(self, x):
        b, n, _ = x.shape
        q, k, v = (t.reshape(b, n, H, -1).transpose(1, 2) for t in self.to_qkv(x).chunk(3, dim=-1))
        dots = torch.einsum("bhid,bhjd->bhij", q, k) * (D // H) ** -0.5
        out = torch.einsum("bhij,bhjd->bhid", dots.softmax(dim=-1), v)
        return self.to_out(out.transpose(1, 2).flatten(2))


class CohereNorm(nn.Module):
    """Cohere's LayerNorm without bias: ``variance + eps`` with a Python number, mean-centred."""

    def __init__(self):
        super().__init__()
        self.weight, self.variance_epsilon = nn.Parameter(torch.randn(D)), 1e-5

    def forward(self, hidden_states):
        mean = hidden_states.mean(-1, keepdim=True)
        variance = (hidden_states - mean).pow(2).mean(-1, keepdim=True)
        hidden_states = (hidden_states - mean) * torch.rsqrt(variance + self.variance_epsilon)
        return self.weight * hidden_states


class NewGelu(nn.Module):
    """GPT-2 / BERT's ``NewGELUActivation`` written out: ``0.5 * x * (1 + tanh(...))``, then ``2 * x - 1``."""

    def forward(self, x):
        gelu = 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))
        return 2 * gelu - 1


def _ids():
    ids = torch.randint(2, 30, (B, T))
    ids[1, 4:] = 1  # padding (RoBERTa's padding_idx)
    ids[0, 3] = ids[1, 2] = 40  # CLIP's end-of-text token: the largest id
    return ids


CASES = {  # name: (module, example inputs, {op: how many steps of it at least})
    "conv2d (ViT patch embedding)": (PatchEmbed(), lambda: (torch.randn(B, 3, 8, 8),), {"conv2d": 1, "reshape": 1}),
    "conv1d (Whisper)": (WhisperStem(), lambda: (torch.randn(B, 8, T),), {"conv1d": 2, "gelu": 2}),
    "cumsum (RoBERTa positions)": (RobertaPositions(), lambda: (_ids(),), {"cumsum": 1, "embed": 1}),
    "argmax and its rows (CLIP pooler)": (ClipPooler(), lambda: (torch.randn(B, T, D), _ids()), {"reduce": 1, "gather": 1}),
    "weight.T (Falcon)": (FalconLinear(D, 8), lambda: (torch.randn(B, T, D),), {"linear": 1}),
    "list [-2]": (SecondToLast(), lambda: (torch.randn(B, T, D),), {"linear": 2, "tanh": 2}),
    "unbind (timm)": (TimmAttention(), lambda: (torch.randn(B, T, D),), {"unbind": 1, "softmax": 1}),
    "einsum": (EinsumAttention(), lambda: (torch.randn(B, T, D),), {"einsum": 2}),
    "a number added (Cohere)": (CohereNorm(), lambda: (torch.randn(B, T, D),), {"add": 1}),
    "numbers multiplied and added (GELU)": (NewGelu(), lambda: (torch.randn(B, T, D),), {"gelu": 1, "scale": 1, "sub": 1}),
}


@pytest.mark.parametrize("case", list(CASES))
def test_op_imports_as_its_step_and_runs_equal(case):
    module, make, expected = CASES[case]
    torch.manual_seed(0)
    args = make()
    pipeline = from_module(module.eval(), *args)
    assert difference(pipeline, module, *args) <= 1e-5
    assert [str(d) for d in pipeline.check().diagnostics if d.severity in ("error", "warning")] == []
    ops = [s["op"] for text in pipeline.files.values() for s in yaml.safe_load(text)["steps"]]
    assert all(ops.count(op) >= n for op, n in expected.items()), ops


def _tiny_t5(attention: str):
    """A seeded two-layer T5Model with the given attn_implementation, and its encoder and decoder ids."""
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.T5Config(
        d_model=16,
        d_kv=8,
        d_ff=24,
        num_layers=2,
        num_heads=2,
        vocab_size=32,
        relative_attention_num_buckets=8,
        relative_attention_max_distance=16,
    )
    config._attn_implementation = attention
    return transformers.T5Model(config).eval(), torch.randint(0, 32, (B, T)), torch.randint(0, 32, (B, T - 1))


def test_t5_relative_buckets_import_as_relative_bias_in_every_layer():
    """T5: each stack's first layer's bias table looked up at constant buckets and added to every
    layer's scores is a ``relative_bias`` step per layer, bidirectional in the encoder, causal (then
    the causal mask) in the decoder; state_dict keys of 69 characters kept. The layers fold: the
    table held by the first block is a block input that every layer reads, kept in the main file."""
    model, ids, decoder_ids = _tiny_t5("eager")
    pipeline = from_module(model, ids, decoder_input_ids=decoder_ids)
    assert difference(pipeline, model, ids, decoder_input_ids=decoder_ids) <= 1e-5
    assert [str(d) for d in pipeline.check().diagnostics if d.severity in ("error", "warning")] == []
    table = "{}.block.0.layer.0.SelfAttention.relative_attention_bias.weight"
    main = yaml.safe_load(pipeline.files["T5Model.yaml"])
    blocks = {s["id"]: s for s in main["steps"] if s["op"] == "block"}
    assert {name: (s["repeat"], table.format(name.split(".")[0]) in s["inputs"]) for name, s in blocks.items()} == {
        "encoder.block": (2, True),
        "decoder.block": (2, True),
    }
    assert {table.format("encoder"), table.format("decoder")} <= set(main["params"])
    for stack, bidirectional in (("encoder", True), ("decoder", False)):
        layer = yaml.safe_load(pipeline.files[f"T5Model_{stack}_block.yaml"])
        (bias,) = [s for s in layer["steps"] if s["op"] == "relative_bias"]
        assert (bias["table"], bias["bidirectional"], bias["max_distance"]) == (table.format(stack).replace(".", "_"), bidirectional, 16)
        assert bias["table"] in layer["inputs"] and not any("relative_attention_bias" in name for name in layer["params"])


def _steps_of(pipeline, name: str) -> dict[str, dict]:
    """The steps of one of the import's files, by id."""
    return {s["id"]: s for s in yaml.safe_load(pipeline.files[name])["steps"]}


def test_t5_sdpa_bias_handed_to_sdpa_imports_as_relative_position_bias_in_every_layer():
    """transformers' sdpa path hands T5's bias to scaled_dot_product_attention as its float
    attn_mask (``where(keep, bias, min)``, then ``.contiguous()``): a ``relative_position_bias``
    step in each layer (the first block's table a block input, as in the eager import), the
    encoder's bias as it is (its mask keeps every key), the decoder's under a causal ``mask`` step,
    the cross-attention (a bias of zeros, nothing hidden) with no mask at all. The layers fold."""
    model, ids, decoder_ids = _tiny_t5("sdpa")
    pipeline = from_module(model, ids, decoder_input_ids=decoder_ids)
    assert difference(pipeline, model, ids, decoder_input_ids=decoder_ids) <= 1e-5
    assert [str(d) for d in pipeline.check().diagnostics if d.severity in ("error", "warning")] == []
    table = "{}.block.0.layer.0.SelfAttention.relative_attention_bias.weight"
    blocks = {i: s for i, s in _steps_of(pipeline, "T5Model.yaml").items() if s["op"] == "block"}
    assert {name: (s["repeat"], table.format(name.split(".")[0]) in s["inputs"]) for name, s in blocks.items()} == {
        "encoder.block": (2, True),
        "decoder.block": (2, True),
    }
    for stack, bidirectional, length, reader in (("encoder", True, "T", "contiguous"), ("decoder", False, "T2", "mask")):
        steps = _steps_of(pipeline, f"T5Model_{stack}_block.yaml")
        bias = steps["layer.0.SelfAttention.position_bias"]
        assert bias == {
            "id": "layer.0.SelfAttention.position_bias",
            "op": "relative_position_bias",
            "table": table.format(stack).replace(".", "_"),
            "bidirectional": bidirectional,
            "max_distance": 16,
            "queries": length,
            "keys": length,
        }
        (read,) = [s for s in steps.values() if s.get("input") == bias["id"]]
        assert read["op"] == reader and (reader == "contiguous" or (read["causal"], read["fill"]) == (True, "min"))
        # the encoder's bias is a permuted view that transformers copies; the decoder's mask step writes a new
        # contiguous tensor, which the sdpa reads as it is (transformers' copy of its strided where does nothing here)
        read_by_sdpa = "layer.0.SelfAttention.contiguous" if reader == "contiguous" else read["id"]
        assert steps["layer.0.SelfAttention.attn_output"]["mask"] == read_by_sdpa
    assert "mask" not in _steps_of(pipeline, "T5Model_decoder_block.yaml")["layer.1.EncDecAttention.attn_output"]


def test_t5_sdpa_with_padding_keeps_the_bias_where_the_mask_keeps_keys():
    """A padded batch: ``where(padding keeps, bias, min)`` is a ``where`` of the given mask and the
    ``relative_position_bias`` step; the cross-attention's ``where(keeps, zeros, min)`` a ``where``
    of two numbers (its bias of zeros held as no values: the file runs at any size)."""
    model, ids, decoder_ids = _tiny_t5("sdpa")
    keep = (torch.arange(T) < torch.tensor([[T], [3]])).long()
    pipeline = from_module(model, ids, decoder_input_ids=decoder_ids, attention_mask=keep)
    assert difference(pipeline, model, ids, decoder_input_ids=decoder_ids, attention_mask=keep) <= 1e-5
    assert [str(d) for d in pipeline.check().diagnostics if d.severity in ("error", "warning")] == []
    assert not [name for name, p in pipeline.spec.params.items() if p.values is not None]
    minimum = torch.finfo(torch.float32).min
    (where,) = [s for s in _steps_of(pipeline, "T5Model_encoder_block.yaml").values() if s["op"] == "where"]
    assert (where["inputs"][1], where["otherwise"]) == ("layer.0.SelfAttention.position_bias", minimum)
    (cross,) = [s for s in _steps_of(pipeline, "T5Model_decoder_block.yaml").values() if s["op"] == "where"]
    assert (len(cross["inputs"]), cross["then"], cross["otherwise"]) == (1, 0.0, minimum)


def test_t5_encoder_model_under_sdpa_imports_and_folds():
    transformers = pytest.importorskip("transformers")
    model, ids, _ = _tiny_t5("sdpa")
    encoder = transformers.T5EncoderModel(model.config).eval()
    pipeline = from_module(encoder, ids)
    assert difference(pipeline, encoder, ids) <= 1e-5
    assert [str(d) for d in pipeline.check().diagnostics if d.severity in ("error", "warning")] == []
    assert [(s.id, s.repeat) for s in pipeline.spec.steps if s.op == "block"] == [("encoder.block", 2)]


class LookedUpBias(nn.Module):
    """A position bias looked up at constant ids and handed to SDPA as its mask, laid out
    (H, T_kv, T_q) rather than as T5's ``permute(2, 0, 1)``: no step computes it."""

    def __init__(self):
        super().__init__()
        self.table = nn.Embedding(8, H)

    def forward(self, q, k, v):
        distance = (torch.arange(T)[None, :] - torch.arange(T)[:, None]).abs()
        bias = self.table(distance).permute(2, 1, 0).unsqueeze(0)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=bias)


def test_a_position_bias_handed_to_sdpa_in_another_layout_is_refused_at_its_lookup():
    """Still refused, at the lookup's line, saying the sdpa reads it as its mask and what form is computed."""
    q, k, v = (torch.randn(B, H, T, 8) for _ in range(3))
    with pytest.raises(tracer.TracerError) as raised:
        from_module(LookedUpBias().eval(), q, k, v)
    (problem,) = raised.value.diagnostics
    assert problem.file.endswith("test_ops.py") and "self.table(distance)" in problem.message
    assert "is the float attn_mask of 'scaled_dot_product_attention'" in problem.message
    assert "relative_position_bias computes table[buckets].permute(2, 0, 1).unsqueeze(0)" in problem.message


@pytest.mark.parametrize("name", ["vit_embeddings_layer", "whisper_encoder"])
def test_bundled_convolution_models_export_then_import_back_with_equal_values(tmp_path, name):
    pipeline = tracer.load(PIPELINES / "models" / f"{name}.yaml")
    found = diff(pipeline, _reimported(pipeline, tmp_path), values=True)
    assert found.compared_values and found.diverges is None and not found.added and not found.removed
    assert {op.split(" -> ")[0] for op in found.changed_op} <= {"scaled: multiply 0.3535533905932738"}, found.changed_op
