"""An embedding table's rows are a vocab (``V``): its first axis is indexed by token ids. A vocab
the size of ``d_model`` by coincidence is still ``V``, in a tied table's both names too (T5's
``shared`` and ``encoder.embed_tokens`` are one tensor, of which the capture reads one), and a
module with no config naming its vocab gets a ``V`` from the table."""

import pytest
import torch
import yaml

from tracer.importing import difference, from_module

transformers = pytest.importorskip("transformers")
WIDTH = 32  # the vocab and the model width alike


def _t5():
    config = transformers.T5Config(vocab_size=WIDTH, d_model=WIDTH, d_kv=8, d_ff=64, num_layers=1, num_heads=4)
    config._attn_implementation = "eager"
    return transformers.T5EncoderModel(config), ["shared.weight", "encoder.embed_tokens.weight"]


def _gpt2():
    config = transformers.GPT2Config(vocab_size=WIDTH, n_embd=WIDTH, n_head=4, n_layer=1, n_positions=16)
    config._attn_implementation = "eager"
    return transformers.GPT2LMHeadModel(config), ["transformer.wte.weight", "lm_head.weight"]


def _llama():
    config = transformers.LlamaConfig(
        vocab_size=WIDTH, hidden_size=WIDTH, intermediate_size=48, num_attention_heads=4, num_hidden_layers=1, tie_word_embeddings=True
    )
    config._attn_implementation = "eager"
    return transformers.LlamaForCausalLM(config), ["model.embed_tokens.weight", "lm_head.weight"]


@pytest.mark.parametrize("build", [_t5, _gpt2, _llama], ids=["t5", "gpt2", "llama"])
def test_a_vocab_as_wide_as_the_model_is_named_v(build):
    torch.manual_seed(0)
    model, tables = build()
    model.eval()
    ids = torch.randint(0, WIDTH, (2, 6))
    pipeline = from_module(model, ids)
    document = yaml.safe_load(pipeline.files[next(iter(pipeline.files))])
    assert document["dims"]["V"] == WIDTH == document["dims"]["d_model"]
    for name in tables:
        assert document["params"][name]["shape"] == ["V", "d_model"], name
    assert difference(pipeline, model, ids) <= 1e-5


def test_a_table_looked_up_by_ids_names_the_vocab_no_config_names():
    class Tagger(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.d_model = 16
            self.tok = torch.nn.Embedding(16, 16)
            self.proj = torch.nn.Linear(16, 16)

        def forward(self, ids):
            return self.proj(self.tok(ids))

    pipeline = from_module(Tagger(), torch.randint(0, 16, (2, 5)))
    assert pipeline.spec.dims["V"] == 16 and pipeline.spec.params["tok.weight"].shape == ["V", "d_model"]
    assert pipeline.spec.params["proj.weight"].shape == ["d_model", "d_model"]
