"""Sizes keep their names: the batch and sequence sizes of an import are followed from the inputs
through the captured graph, not matched by value. A batch of 3 beside a fused ``3`` (q, k, v), a
length equal to the head count, a batch equal to the length, and a KV cache's length each stay
the dim they are, and the file runs at other sizes equal to the module."""

import pytest
import torch
import yaml
from torch import nn
from torch.nn import functional as F

from tracer.importing import difference, from_module

D, H = 16, 4


class FusedHeads(nn.Module):
    """A fused q, k, v projection cut into heads by one reshape: ``[B, T, 3, H, Dh]``."""

    def __init__(self):
        super().__init__()
        self.qkv, self.proj, self.num_heads, self.hidden_size = nn.Linear(D, 3 * D), nn.Linear(D, D), H, D

    def forward(self, x):
        b, t, _ = x.shape
        q, k, v = self.qkv(x).reshape(b, t, 3, H, D // H).permute(2, 0, 3, 1, 4).unbind(0)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(b, t, D))


class CachedAttention(nn.Module):
    """One decoding step: the new keys and values appended to the cache the module is given."""

    def __init__(self):
        super().__init__()
        self.q, self.k, self.v, self.num_heads, self.hidden_size = nn.Linear(D, D), nn.Linear(D, D), nn.Linear(D, D), H, D

    def forward(self, x, past_k, past_v):
        b, t, _ = x.shape
        q, k, v = (p(x).view(b, t, H, D // H).transpose(1, 2) for p in (self.q, self.k, self.v))
        k, v = torch.cat([past_k, k], dim=2), torch.cat([past_v, v], dim=2)
        return F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(b, t, D)


def _file(pipeline) -> dict:
    return yaml.safe_load(pipeline.to_yaml())


def _runs_equal_at(pipeline, module, sizes: dict, *inputs):
    """The pipeline at other dims against the module on inputs of those sizes, on the module's weights."""
    names = list(pipeline.spec.inputs)
    trace = pipeline.run(dims=sizes, params=module.state_dict(), inputs=dict(zip(names, inputs, strict=True)), keep_values=True)
    with torch.no_grad():
        expected = module(*inputs)
    assert torch.allclose(trace[pipeline.spec.outputs[0]].tensor, expected, atol=1e-5)


@pytest.mark.parametrize(
    ("batch", "length"), [(3, 5), (4, 4), (2, 4)], ids=["batch-3-beside-qkv", "batch-equals-length", "length-equals-heads"]
)
def test_batch_and_sequence_keep_their_names_whatever_their_example_sizes(batch, length):
    torch.manual_seed(0)
    module, x = FusedHeads().eval(), torch.randn(batch, length, D)
    pipeline = from_module(module, x)
    assert difference(pipeline, module, x) <= 1e-5
    found = _file(pipeline)
    assert found["dims"]["B"] == batch and found["dims"]["T"] == length
    assert found["inputs"]["x"]["shape"] == ["B", "T", "d_model"]
    (heads,) = [s for s in found["steps"] if s["op"] == "reshape" and len(s["shape"]) == 5]
    assert heads["shape"] == ["B", "T", 3, "H", "Dh"]
    _runs_equal_at(pipeline, module, {"B": 5, "T": 3}, torch.randn(5, 3, D))


def test_a_kv_cache_length_is_a_dim_and_the_keys_after_it_are_past_plus_t():
    torch.manual_seed(0)
    module = CachedAttention().eval()
    x, past = torch.randn(2, 3, D), torch.randn(2, H, 5, D // H)
    pipeline = from_module(module, x, past, past.clone())
    assert difference(pipeline, module, x, past, past.clone()) <= 1e-5
    found = _file(pipeline)
    assert found["dims"]["past"] == 5
    assert found["inputs"]["past_k"]["shape"] == ["B", "H", "past", "Dh"]
    _runs_equal_at(pipeline, module, {"B": 3, "T": 2, "past": 7}, torch.randn(3, 2, D), torch.randn(3, H, 7, 4), torch.randn(3, H, 7, 4))


def test_a_padded_llamas_sequence_stays_t_and_runs_at_other_sizes():
    """transformers' masking_utils made the symbolic capture fix T (the file said 7); followed
    through the graph it is T, and the file runs a longer padded batch as the model does."""
    pytest.importorskip("transformers")
    from tests.importing.sweep_rows import imported_row

    module, (ids,), kwargs, pipeline = imported_row("llama", "eager")  # test_architectures' row: one capture for both
    assert _file(pipeline)["inputs"]["attention_mask"]["shape"] == ["B", "T"]
    longer, mask = torch.randint(1, 64, (3, 9)), (torch.arange(9) < torch.tensor([[9], [5], [7]])).long()
    trace = pipeline.run(
        dims={"B": 3, "T": 9}, params=module.state_dict(), inputs={"input_ids": longer, "attention_mask": mask}, keep_values=True
    )
    with torch.no_grad():
        expected = module(longer, attention_mask=mask).last_hidden_state
    assert torch.allclose(trace[pipeline.spec.outputs[0]].tensor, expected, atol=1e-5)


def test_a_positions_table_as_long_as_the_vocab_is_p_not_v():
    """GPT-2 with n_positions == vocab_size: the two tables have as many rows, but the one looked
    up at positions 0 .. T-1 has P rows and the one looked up at the ids has V."""
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.GPT2Config(n_embd=D, n_layer=1, n_head=2, n_positions=64, vocab_size=64, bos_token_id=0, eos_token_id=0)
    module, ids = transformers.GPT2Model(config).eval(), torch.randint(0, 64, (2, 7))
    pipeline = from_module(module, ids)
    found = _file(pipeline)
    assert found["params"]["wte.weight"]["shape"] == ["V", "d_model"] and found["params"]["wpe.weight"]["shape"] == ["P", "d_model"]
    assert found["dims"]["P"] == found["dims"]["V"] == 64
    assert difference(pipeline, module, ids) <= 1e-5
    assert [str(d) for d in pipeline.check().diagnostics if d.severity in ("error", "warning")] == []
