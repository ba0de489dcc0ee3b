"""``nn.MultiheadAttention`` given a key padding mask, an attention mask or both (bool: True
hides; float: added), batch first or not, on its own or inside a model that builds its causal
mask: each imports as the projections, the heads, one ``sdpa`` with the merged mask and the output
projection, checks clean under ``--strict`` and runs equal to the module, rows whose keys are all
hidden included (torch's SDPA gives them zeros, so the output is the projection's bias)."""

import pytest
import torch
import yaml
from torch import nn

from tracer.importing import difference, from_module

B, T, D, H = 2, 5, 16, 2


def _padding(fully_hidden_row: bool = False) -> torch.Tensor:
    hidden = torch.zeros(B, T, dtype=torch.bool)
    hidden[1, 3:] = True  # the second sequence ends after 3 tokens
    if fully_hidden_row:
        hidden[0] = True  # every key of the first sequence hidden
    return hidden


CAUSAL = torch.triu(torch.ones(T, T, dtype=torch.bool), 1)  # True: not allowed, as nn.Transformer's masks

CASES = {
    "no mask": {},
    "padding": {"key_padding_mask": _padding()},
    "causal": {"attn_mask": CAUSAL},
    "both": {"key_padding_mask": _padding(), "attn_mask": CAUSAL},
    "fully hidden rows": {"key_padding_mask": _padding(fully_hidden_row=True), "attn_mask": CAUSAL},
    "float masks": {"key_padding_mask": _padding().float() * -1e4, "attn_mask": torch.randn(T, T)},
    "bool padding, float mask": {"key_padding_mask": _padding(), "attn_mask": torch.randn(T, T)},
    "per-head mask": {"attn_mask": torch.rand(B * H, T, T) < 0.3},
}


def _clean(pipeline) -> list[str]:
    return [str(d) for d in pipeline.check().diagnostics if d.severity in ("error", "warning")]


@pytest.mark.parametrize(
    ("case", "batch_first"), [(case, True) for case in CASES] + [("no mask", False), ("both", False), ("float masks", False)]
)
def test_multihead_attention_with_masks_imports_clean_and_runs_equal(case, batch_first):
    torch.manual_seed(0)
    module = nn.MultiheadAttention(D, H, batch_first=batch_first).eval()
    x = torch.randn(B, T, D) if batch_first else torch.randn(T, B, D)
    masks = CASES[case]
    pipeline = from_module(module, x, x, x, need_weights=False, **masks)
    assert difference(pipeline, module, x, x, x, need_weights=False, **masks) <= 1e-5
    assert _clean(pipeline) == []
    steps = yaml.safe_load(pipeline.to_yaml())["steps"]
    (sdpa,) = [s for s in steps if s["op"] == "sdpa"]
    bool_only = all(m.dtype == torch.bool for m in masks.values())
    assert sdpa.get("polarity") == ("block" if masks and bool_only else None) and ("mask" in sdpa) == bool(masks)
    assert set(masks) <= set(pipeline.spec.inputs)


class CausalDecoder(nn.Module):
    """A decoder block as people write it: the causal mask built in forward, the padding given."""

    def __init__(self):
        super().__init__()
        self.attn = nn.MultiheadAttention(D, H, batch_first=True)
        self.norm = nn.LayerNorm(D)

    def forward(self, x, padding):
        causal = torch.ones(x.shape[1], x.shape[1], dtype=torch.bool).triu(1)
        out, _ = self.attn(x, x, x, attn_mask=causal, key_padding_mask=padding, need_weights=False)
        return self.norm(x + out)


def test_a_causal_mask_built_in_forward_is_the_pattern_and_the_padding_the_mask():
    torch.manual_seed(0)
    module, x, padding = CausalDecoder().eval(), torch.randn(B, T, D), _padding()
    pipeline = from_module(module, x, padding)
    assert difference(pipeline, module, x, padding) <= 1e-5
    assert _clean(pipeline) == []
    (sdpa,) = [s for s in yaml.safe_load(pipeline.to_yaml())["steps"] if s["op"] == "sdpa"]
    assert sdpa["causal"] is True and sdpa["polarity"] == "block"


@pytest.mark.parametrize("causal", [False, True])
def test_transformer_encoder_with_a_padding_mask_folds_its_layers_and_runs_equal(causal):
    """nn.TransformerEncoder makes its bool ``src_key_padding_mask`` a float one first
    (``_canonical_mask``: a ``where``), then every layer's attention adds it."""
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(d_model=D, nhead=H, dim_feedforward=32, dropout=0.0, batch_first=True)
    module, x = nn.TransformerEncoder(layer, num_layers=2, enable_nested_tensor=False).eval(), torch.randn(B, T, D)
    masks = {"src_key_padding_mask": _padding()}
    if causal:
        masks.update(mask=nn.Transformer.generate_square_subsequent_mask(T), is_causal=True)
    pipeline = from_module(module, x, **masks)
    assert difference(pipeline, module, x, **masks) <= 1e-5
    assert _clean(pipeline) == []
    steps = yaml.safe_load(pipeline.to_yaml())["steps"]
    assert steps[0] == {"id": steps[0]["id"], "op": "where", "inputs": ["src_key_padding_mask"], "then": -float("inf"), "otherwise": 0.0}
    assert [s["repeat"] for s in steps if s["op"] == "block"] == [2]


def test_transformer_decoder_layer_with_padding_on_both_sides_and_a_causal_mask():
    """Self-attention given the causal mask and the target's padding, cross-attention the memory's."""
    torch.manual_seed(0)
    module = nn.TransformerDecoderLayer(d_model=D, nhead=H, dim_feedforward=32, dropout=0.0, batch_first=True).eval()
    x, memory, memory_padding = torch.randn(B, T, D), torch.randn(B, T - 1, D), torch.zeros(B, T - 1, dtype=torch.bool)
    memory_padding[0, 3:] = True
    masks = {"tgt_mask": CAUSAL, "tgt_key_padding_mask": _padding(), "memory_key_padding_mask": memory_padding}
    pipeline = from_module(module, x, memory, **masks)
    assert difference(pipeline, module, x, memory, **masks) <= 1e-5
    assert _clean(pipeline) == []
    attentions = [s for s in yaml.safe_load(pipeline.to_yaml())["steps"] if s["op"] == "sdpa"]
    assert [(s.get("polarity"), "mask" in s) for s in attentions] == [("block", True), ("block", True)]
