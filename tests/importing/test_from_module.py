"""tracer.from_module against the modules' own numbers: nanoGPT's attention, nn.MultiheadAttention,
nn.TransformerEncoder and transformers' GPT-2 and Llama (tiny random configs, no downloads)."""

import functools
import math

import pytest
import torch
import yaml
from torch import nn
from torch.nn import functional as F

import tracer
from tracer.importing import difference, from_module
from tracer.presentation.report import _Data, report_data

B, T, D = 2, 7, 32


class CausalSelfAttention(nn.Module):
    """karpathy/nanoGPT model.py's attention, with ``flash`` a switch."""

    def __init__(self, n_embd=D, n_head=2, block_size=8, flash=True):
        super().__init__()
        self.c_attn = nn.Linear(n_embd, 3 * n_embd)
        self.c_proj = nn.Linear(n_embd, n_embd)
        self.attn_dropout, self.resid_dropout = nn.Dropout(0.1), nn.Dropout(0.1)
        self.n_head, self.n_embd, self.dropout, self.flash = n_head, n_embd, 0.1, flash
        if not flash:
            self.register_buffer("bias", torch.tril(torch.ones(block_size, block_size)).view(1, 1, block_size, block_size))

    def forward(self, x):
        B, T, C = x.size()
        q, k, v = self.c_attn(x).split(self.n_embd, dim=2)
        k = k.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        q = q.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        v = v.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        if self.flash:
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=None, dropout_p=self.dropout if self.training else 0, is_causal=True)
        else:
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
            att = att.masked_fill(self.bias[:, :, :T, :T] == 0, float("-inf"))
            att = F.softmax(att, dim=-1)
            att = self.attn_dropout(att)
            y = att @ v
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        return self.resid_dropout(self.c_proj(y))


def _steps(pipeline, file=0):
    return yaml.safe_load(list(pipeline.files.values())[file])["steps"]


@pytest.mark.parametrize("flash", [True, False])
def test_nanogpt_attention_imports_with_readable_names_and_runs_equal(flash):
    torch.manual_seed(0)
    module, x = CausalSelfAttention(flash=flash), torch.randn(B, T, D)
    pipeline = from_module(module, x)
    assert difference(pipeline, module, x) <= 1e-5
    text = pipeline.to_yaml()
    assert "Dh: d_model // H" in text and "c_attn.weight: {shape: [3 * d_model, d_model]" in text
    assert "# " in text.split("steps:")[1]  # each step commented with its source line
    ops = [s["op"] for s in _steps(pipeline)]
    assert ops[:2] == ["linear", "split"] and "merge" in ops
    assert ("sdpa" in ops) == flash and (("mask" in ops) == (not flash))


def test_multihead_attention_batch_first():
    torch.manual_seed(0)
    module, x = nn.MultiheadAttention(D, 4, batch_first=True), torch.randn(B, T, D)
    pipeline = from_module(module, x, x, x, need_weights=False)
    assert set(pipeline.spec.inputs) == {"query", "key", "value"}
    assert difference(pipeline, module, x, x, x, need_weights=False) <= 1e-5


def test_transformer_encoder_folds_into_one_block_file(tmp_path):
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(d_model=D, nhead=2, dim_feedforward=64, dropout=0.0, batch_first=True)
    module, x = nn.TransformerEncoder(layer, num_layers=3, enable_nested_tensor=False), torch.randn(B, T, D)
    pipeline = from_module(module, x, name="encoder")
    (block,) = [s for s in _steps(pipeline) if s["op"] == "block"]
    assert block["repeat"] == 3 and list(pipeline.files) == ["encoder.yaml", block["use"]]
    assert difference(pipeline, module, x) <= 1e-5
    pipeline.to_yaml(tmp_path / "enc.yaml")
    assert difference(tracer.load(tmp_path / "enc.yaml"), module, x) <= 1e-5


def test_an_op_without_a_step_is_reported_with_its_source_line():
    class Cumulative(nn.Module):
        def forward(self, x):
            return torch.cumprod(x, dim=-1)

    with pytest.raises(tracer.TracerError) as caught:
        from_module(Cumulative(), torch.randn(B, T))
    assert "cumprod" in str(caught.value) and "test_from_module.py" in str(caught.value)
    assert "return torch.cumprod(x, dim=-1)" in str(caught.value)


def _transformers(family, attention):
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    if family == "gpt2":
        config = transformers.GPT2Config(n_embd=D, n_layer=2, n_head=2, n_positions=16, vocab_size=64, bos_token_id=0, eos_token_id=0)
        model_class = transformers.GPT2Model
    else:
        config = transformers.LlamaConfig(
            hidden_size=D, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, vocab_size=64
        )
        model_class = transformers.LlamaModel
    config._attn_implementation = attention
    config.use_cache = False
    return model_class(config).eval(), torch.randint(0, 64, (B, T))


@functools.cache
def _imported(family, attention):
    model, ids = _transformers(family, attention)
    return model, ids, from_module(model, ids, name=family)


@pytest.mark.parametrize("attention", ["eager", "sdpa"])
@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_transformers_models_fold_their_layers_and_run_equal(family, attention):
    model, ids, pipeline = _imported(family, attention)
    (block,) = [s for s in _steps(pipeline) if s["op"] == "block"]
    assert block["repeat"] == 2
    assert difference(pipeline, model, ids) <= 1e-5
    layer_ops = {s["op"] for s in _steps(pipeline, 1)}
    expected = {"rmsnorm", "rope", "repeat_interleave"} if family == "llama" else {"layernorm", "gelu", "split"}
    assert expected <= layer_ops


@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_the_report_of_a_model_with_sdpa_shows_the_weights_the_model_applied(family):
    """transformers' default attention is sdpa, which stores no weights: the report recomputes
    them (labelled so) for a map per head of each layer, equal to the model's eager attentions."""
    model, ids, pipeline = _imported(family, "sdpa")
    trace = pipeline.run(inputs={"input_ids": ids}, params=model.state_dict(), keep_values=True)
    page = report_data(trace)
    assert [site["fused"] for site in page["attention"]] == [True, True]
    shown = next(t for t in page["tensors"] if t["id"] == page["attention"][0]["recomputed"])
    assert shown["heatmap"]["recomputed"].startswith("recomputed from q, k, mask, scale")
    eager, _ = _transformers(family, "eager")  # the same weights (seed 0), attention written out
    with torch.no_grad():
        expected = eager(ids, output_attentions=True).attentions
    for site, weights in zip(page["attention"], expected):
        node = trace.analysis.producer(site["recomputed"])
        assert torch.allclose(_Data(trace).recomputed_weights(node), weights, atol=1e-5)
