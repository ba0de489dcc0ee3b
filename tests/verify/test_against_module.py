"""tracer.verify.against_module: a pipeline against PyTorch's own modules, with their weights."""

import pytest
import torch

from tests.conftest import PIPELINES
from tests.exporting import exported, small_stack
from tracer import verify, weights

ENCODER = PIPELINES / "encoder_block.yaml"


# nn.TransformerEncoderLayer's state_dict -> the block's params (its in_proj packs W_Q, W_K, W_V)
LAYER_MAP = {
    "self_attn.in_proj_weight": ["encoder/W_Q", "encoder/W_K", "encoder/W_V"],
    "self_attn.in_proj_bias": ["encoder/b_Q", "encoder/b_K", "encoder/b_V"],
    "self_attn.out_proj.weight": "encoder/W_O",
    "self_attn.out_proj.bias": "encoder/b_O",
    "linear1.weight": "encoder/W_1",
    "linear1.bias": "encoder/b_1",
    "linear2.weight": "encoder/W_2",
    "linear2.bias": "encoder/b_2",
    "norm1.weight": "encoder/ln1_w",
    "norm1.bias": "encoder/ln1_b",
    "norm2.weight": "encoder/ln2_w",
    "norm2.bias": "encoder/ln2_b",
}


NAMES = {"encoder/mha_out": "self_attn", "encoder/normed_1": "norm1", "encoder/hidden": "linear1", "encoder/ffn_out": "linear2"}


@pytest.fixture(scope="module")
def layer():
    torch.manual_seed(1)
    return torch.nn.TransformerEncoderLayer(d_model=2, nhead=2, dim_feedforward=4, dropout=0.0, batch_first=True)


def test_encoder_block_is_transformer_encoder_layer(layer):
    diffs = verify.against_module(ENCODER, layer, weights=weights.rename(layer.state_dict(), LAYER_MAP))
    assert diffs.keys() == {"encoder/out"} and diffs["encoder/out"] <= 1e-6


def test_a_mismatch_names_the_first_tensor_that_differs(layer):
    wrong = weights.rename(layer.state_dict(), LAYER_MAP)
    wrong["encoder/b_1"] = wrong["encoder/b_1"] + 1.0  # the feed-forward's first bias
    with pytest.raises(verify.VerificationError, match=r"first recorded tensor that differs is 'encoder/hidden' vs submodule 'linear1'"):
        verify.against_module(ENCODER, layer, weights=wrong, names=NAMES)


def test_multihead_attention_through_a_call(layer):
    """Any calling convention: nn.MultiheadAttention takes (q, k, v) and returns (out, weights)."""
    mha = torch.nn.MultiheadAttention(4, 2, batch_first=True)
    renamed = weights.rename(
        mha.state_dict(), {"in_proj_weight": ["W_q", "W_k", "W_v"], "in_proj_bias": None, "out_proj.weight": "W_o", "out_proj.bias": "b_o"}
    )
    causal = torch.ones(6, 6, dtype=torch.bool).triu(1)
    diffs = verify.against_module(
        PIPELINES / "causal_mha.yaml", mha, weights=renamed, call=lambda m, x: m(x, x, x, attn_mask=causal, need_weights=False)[0]
    )
    assert diffs["out"] <= 1e-6


def test_an_exported_module_points_at_the_block_copy_that_differs(tmp_path):
    """Against its own export, with one layer's weights changed: the copy is named by its submodule."""
    pipeline = small_stack(tmp_path, 5)
    module = exported(pipeline)[1]()
    params = {name: tensor.clone() for name, tensor in module.state_dict().items()}
    assert verify.against_module(pipeline, module, weights=params)["layers/4/out"] <= 1e-5
    with torch.no_grad():
        module.layers[3].b_1 += 1.0
    with pytest.raises(verify.VerificationError, match=r"first recorded tensor that differs is 'layers/3/out' vs submodule 'layers.3'"):
        verify.against_module(pipeline, module, weights=params)


class CrossAttention(torch.nn.Module):
    """nn.MultiheadAttention over queries and a memory; the padding goes by keyword, so forward takes
    two of the three inputs cross_attention.yaml declares."""

    def __init__(self, d_model: int, heads: int):
        super().__init__()
        self.attn = torch.nn.MultiheadAttention(d_model, heads, batch_first=True)

    def forward(self, queries, memory, *, key_padding_mask=None):
        return self.attn(queries, memory, memory, key_padding_mask=key_padding_mask, need_weights=False)[0]


CROSS_MAP = {
    "attn.in_proj_weight": ["W_q", "W_k", "W_v"],
    "attn.in_proj_bias": ["b_q", "b_k", "b_v"],
    "attn.out_proj.weight": "W_o",
    "attn.out_proj.bias": "b_o",
}


def test_a_forward_that_takes_other_inputs_names_the_pipelines_and_suggests_call():
    pipeline = PIPELINES / "cross_attention.yaml"
    torch.manual_seed(2)
    module = CrossAttention(8, 2)
    params = weights.rename(module.state_dict(), CROSS_MAP)
    with pytest.raises(verify.VerificationError) as info:
        verify.against_module(pipeline, module, weights=params)
    message = str(info.value)
    assert message.startswith(
        "'cross_attention' declares 3 inputs (x_q (B, T_q, d_model), x_kv (B, T_kv, d_model), pad_mask (B, 1, 1, T_kv))"
    )
    assert "CrossAttention.forward(queries, memory, *, key_padding_mask=None) cannot take them (too many positional arguments)" in message
    assert message.endswith("call=lambda module, x_q, x_kv, pad_mask: module(...)")
    # the suggestion, followed; MultiheadAttention returns a tuple, which the submodule hooks must leave alone
    diffs = verify.against_module(
        pipeline, module, weights=params, call=lambda module, x_q, x_kv, pad_mask: module(x_q, x_kv, key_padding_mask=~pad_mask[:, 0, 0])
    )
    assert diffs["out"] <= 1e-5
