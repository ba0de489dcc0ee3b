"""Issue 31: sizes keep their names when example values coincide. Tiny configs make the batch as
large as the head count (B == H == 2), the length as long as a head (T == Dh == 8), T5's bucket
count a head's width too (NB == Dh == 8) and its decoder as long as its encoder (T2 == T == 8);
the vocab (40) equals nothing. Each size is named after where it enters (an input's axis, a
config attribute, a view's factor, a table's rows), not after another size of the same value,
and the file runs at other sizes equal to the module."""

import pytest
import torch
import yaml

from tracer.importing import from_module

B, T, VOCAB = 2, 8, 40
MODEL = {"d_model": 16, "H": 2, "d_ff": 24, "V": VOCAB, "Dh": "d_model // H"}


def _model(family: str, attention: str):
    import transformers

    torch.manual_seed(0)
    if family == "llama":
        config = transformers.LlamaConfig(
            hidden_size=16, intermediate_size=24, num_attention_heads=2, num_key_value_heads=2, vocab_size=VOCAB, num_hidden_layers=1
        )
        model_class = transformers.LlamaModel
    elif family == "bert":
        config = transformers.BertConfig(
            hidden_size=16, intermediate_size=24, num_attention_heads=2, vocab_size=VOCAB, num_hidden_layers=1, max_position_embeddings=32
        )
        model_class = transformers.BertModel
    else:
        config = transformers.T5Config(
            d_model=16,
            d_kv=8,
            d_ff=24,
            num_heads=2,
            vocab_size=VOCAB,
            num_layers=1,
            relative_attention_num_buckets=8,
            relative_attention_max_distance=16,
        )
        model_class = transformers.T5Model
    config._attn_implementation = attention
    return model_class(config).eval()


def _inputs(family: str, batch: int, length: int, decoded: int) -> dict:
    generator = torch.Generator().manual_seed(1)
    ids = {"input_ids": torch.randint(1, VOCAB, (batch, length), generator=generator)}
    if family == "t5":
        return {**ids, "decoder_input_ids": torch.randint(1, VOCAB, (batch, decoded), generator=generator)}
    return {**ids, "attention_mask": (torch.arange(length) < torch.tensor([[length]] + [[length - 3]] * (batch - 1))).long()}


EXPECTED = {  # family: (its dims besides the model's, its inputs, {step: symbolic shape})
    "llama": (
        {"B": 2, "T": 8},
        {"input_ids": ["B", "T"], "attention_mask": ["B", "T"]},
        {
            "layers.0.self_attn.query_states_view": "(B, T, H, Dh)",
            "layers.0.self_attn.attn_output_2/view": "(B, T, d_model)",
            "norm": "(B, T, d_model)",
        },
    ),
    "bert": (
        {"B": 2, "T": 8, "P": 32},
        {"input_ids": ["B", "T"], "attention_mask": ["B", "T"], "position_ids": [1, "T"]},
        {
            "embeddings.position_embeddings.weight": "(P, d_model)",
            "encoder.layer.0.attention.self.query_layer_view": "(B, T, H, Dh)",
            "encoder.layer.0.attention.self.attn_output_2/view": "(B, T, d_model)",
        },
    ),
    "t5": (
        {"B": 2, "T": 8, "T2": 8, "NB": 8},  # the decoder's length is its own, the buckets are no head width
        {"input_ids": ["B", "T"], "decoder_input_ids": ["B", "T2"]},
        {
            "encoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight": "(NB, H)",
            "encoder.block.0.layer.0.SelfAttention.query_states_view": "(B, T, H, Dh)",
            "decoder.block.0.layer.0.SelfAttention.query_states_view": "(B, T2, H, Dh)",
            "decoder.block.0.layer.1.EncDecAttention.query_states_view": "(B, T2, H, Dh)",
            "decoder.final_layer_norm": "(B, T2, d_model)",
        },
    ),
}


@pytest.mark.parametrize("attention", ["eager", "sdpa"])
@pytest.mark.parametrize("family", ["llama", "bert", "t5"])
def test_coinciding_sizes_keep_the_names_of_where_they_enter(family, attention):
    model, inputs = _model(family, attention), _inputs(family, B, T, T)
    pipeline = from_module(model, **inputs)
    dims, declared, shapes = EXPECTED[family]
    written = yaml.safe_load(pipeline.to_yaml())
    assert written["dims"] == {**dims, **MODEL}
    assert {name: entry["shape"] for name, entry in written["inputs"].items()} == declared
    trace = pipeline.run(params=model.state_dict(), inputs=inputs)
    assert {name: trace[name].symbolic for name in shapes} == shapes
    if family == "t5":
        bias = next(s for s in pipeline.spec.steps if s.op in ("relative_bias", "relative_position_bias") and s.id.startswith("decoder"))
        assert trace[bias.id].symbolic.endswith("T2, T2)")
    # the names are the sizes: the file runs at a batch of 3, a length of 5 (and a decoder of 4) equal to the module
    other = _inputs(family, 3, 5, 4)
    sizes = {"B": 3, "T": 5, **({"T2": 4} if family == "t5" else {})}
    trace = pipeline.run(
        dims=sizes, params=model.state_dict(), inputs={n: other[n] for n in pipeline.spec.inputs if n in other}, keep_values=True
    )
    with torch.no_grad():
        expected = model(**other)
    assert torch.allclose(trace[pipeline.spec.outputs[0]].tensor, expected[0], atol=1e-5)
