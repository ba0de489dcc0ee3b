"""A transformers decode step called with its KV cache (``past_key_values``, a ``DynamicCache``)
imports as the bundled ``kv_cache_decode`` pipeline says one: the cache's keys and values are
inputs ``[B, H_kv, past, Dh]`` named per layer after the module that appends to them
(``layers.0.self_attn.k_cache``), the new token is rotated at offset ``past`` and appended (``cat``),
and the updated keys and values are outputs ``[B, H_kv, past + 1, Dh]``. Any other cache is refused,
saying how to call the module so that it imports."""

import copy

import pytest
import torch

from tracer.core.errors import TracerError
from tracer.importing import difference, from_module

transformers = pytest.importorskip("transformers")


def _llama_with_cache(layers: int):
    config = transformers.LlamaConfig(
        vocab_size=64, hidden_size=16, intermediate_size=32, num_attention_heads=4, num_key_value_heads=2, num_hidden_layers=layers
    )
    config._attn_implementation = "eager"
    torch.manual_seed(0)
    model = transformers.LlamaModel(config).eval()
    with torch.no_grad():
        cache = model(torch.randint(0, 64, (2, 5)), use_cache=True).past_key_values  # B = H_kv = 2: the batch is still B
    return model, cache


@pytest.fixture(scope="module")
def llama():
    return _llama_with_cache(1)


def test_a_decode_step_given_its_dynamic_cache_imports_with_the_cache_as_inputs_and_outputs(llama):
    model, cache = llama
    token = torch.randint(0, 64, (2, 1))
    pipeline = from_module(model, token, past_key_values=cache)
    spec = pipeline.spec
    assert spec.inputs["layers.0.self_attn.k_cache"].shape == ["B", "H_kv", "past", "Dh"] and spec.dims["past"] == 5
    assert spec.inputs["input_ids"].shape == ["B", 1]
    assert [(s.op, s.offset) for s in spec.steps if s.op == "rope"] == [("rope", "past")] * 2
    cats = [s for s in spec.steps if s.op == "cat"]
    assert [s.inputs[0] for s in cats] == ["layers.0.self_attn.k_cache", "layers.0.self_attn.v_cache"]
    assert spec.outputs == ["norm", *(s.id for s in cats)]
    analysis = pipeline.check()
    assert not analysis.diagnostics and str(analysis.meta(cats[0].id).symbolic) == "(B, H_kv, past + 1, Dh)"
    assert difference(pipeline, model, token, past_key_values=cache) <= 1e-5  # the last hidden state and the updated cache
    assert cache.get_seq_length() == 5  # neither the capture nor the comparison appended to the caller's cache


def test_a_two_layer_decode_names_each_layers_cache_after_its_attention_and_notes_where_the_cache_holds_it():
    """Layer by layer, keys then values, as a person writes them (torch.export flattens every
    layer's keys, then every layer's values); the note says which tensor of the cache to pass."""
    model, cache = _llama_with_cache(2)
    token = torch.randint(0, 64, (2, 1))
    pipeline = from_module(model, token, past_key_values=cache)
    inputs = pipeline.spec.inputs
    names = ["layers.0.self_attn.k_cache", "layers.0.self_attn.v_cache", "layers.1.self_attn.k_cache", "layers.1.self_attn.v_cache"]
    assert list(inputs) == ["input_ids", *names]
    assert [inputs[n].note for n in names] == [f"past_key_values.layers[{i}].{kv}" for i in (0, 1) for kv in ("keys", "values")]
    cats = {s.id: s.inputs[0] for s in pipeline.spec.steps if s.op == "cat"}
    assert cats == {f"layers.{i}.self_attn.{kv}s": f"layers.{i}.self_attn.{kv[0]}_cache" for i in (0, 1) for kv in ("key", "value")}
    assert pipeline.spec.outputs == [
        "norm",
        "layers.0.self_attn.keys",
        "layers.1.self_attn.keys",
        "layers.0.self_attn.values",
        "layers.1.self_attn.values",
    ]
    assert "layers.1.self_attn.v_cache: {shape: [B, H_kv, past, Dh]" in pipeline.files["LlamaModel.yaml"]
    assert not pipeline.check().diagnostics
    held = {f"layers.{i}.self_attn.{kv[0]}_cache": getattr(cache.layers[i], kv) for i in (0, 1) for kv in ("keys", "values")}
    run = pipeline.run(params=model.state_dict(), inputs={"input_ids": token, **held}, keep_values=True)
    with torch.no_grad():
        expected = model(token, past_key_values=copy.deepcopy(cache), use_cache=True)
    assert torch.allclose(run["norm"].tensor, expected.last_hidden_state, atol=1e-5)
    assert torch.allclose(run["layers.1.self_attn.values"].tensor, expected.past_key_values.layers[1].values, atol=1e-5)
    assert difference(pipeline, model, token, past_key_values=cache) <= 1e-5


def test_a_cache_other_than_a_dynamic_one_is_refused_with_how_to_call_the_module(llama):
    model, _ = llama
    static = transformers.StaticCache(config=model.config, max_cache_len=8)
    with pytest.raises(TracerError, match="argument 'past_key_values' is a StaticCache .*pass the DynamicCache the model returns"):
        from_module(model, torch.randint(0, 64, (2, 1)), past_key_values=static)


def _mistral_with_cache(seen: int):
    """Mistral with a window of 4 (its cache keeps the last 3 tokens), after ``seen`` tokens."""
    config = transformers.MistralConfig(
        vocab_size=64, hidden_size=16, intermediate_size=32, num_attention_heads=4, num_key_value_heads=2, num_hidden_layers=1,
        sliding_window=4,
    )  # fmt: skip
    config._attn_implementation = "eager"
    torch.manual_seed(0)
    model = transformers.MistralModel(config).eval()
    with torch.no_grad():
        return model, model(torch.randint(0, 64, (2, seen)), use_cache=True).past_key_values


def test_a_sliding_window_cache_keeps_its_last_keys_counted_from_the_end():
    """3 tokens seen, the window's 3 kept: the new keys are appended, then the last 3 kept, from
    ``past - 2`` (``keys[:, :, -3:]`` of ``past + 1``)."""
    model, cache = _mistral_with_cache(3)
    token = torch.randint(0, 64, (2, 1))
    pipeline = from_module(model, token, past_key_values=cache)
    kept = [(s.id, s.start) for s in pipeline.spec.steps if s.op == "index" and s.id.endswith(("keys", "values"))]
    assert kept == [("layers.0.self_attn.keys", "past - 2"), ("layers.0.self_attn.values", "past - 2")]
    assert not pipeline.check().diagnostics and difference(pipeline, model, token, past_key_values=cache) <= 1e-5


def test_a_sliding_window_cache_that_let_tokens_go_is_refused_saying_where_the_tokens_would_be_placed():
    """5 tokens seen, 3 kept: the capture, given the 3 keys, would rotate the new token at position
    3, where the module rotates it at 5."""
    model, cache = _mistral_with_cache(5)
    with pytest.raises(TracerError, match="layer 0 of forward's argument 'past_key_values' holds the last 3 of 5 tokens"):
        from_module(model, torch.randint(0, 64, (2, 1)), past_key_values=cache)
