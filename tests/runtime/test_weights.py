"""Real weights in: params=/inputs= checked against the declarations, and checkpoints via --weights."""

import json
from dataclasses import replace

import pytest
import torch
from safetensors.torch import save_file

import tracer
from tests.conftest import PIPELINES, tracer_cli

CAUSAL = PIPELINES / "causal_mha.yaml"


# nn.MultiheadAttention packs q, k, v into one (3*d_model, d_model) weight; the pipeline has none of its in-proj biases
MHA_MAP = """\
in_proj_weight: [W_q, W_k, W_v]   # split along dim 0
in_proj_bias: null                # MultiheadAttention starts it at zero; the pipeline has no q/k/v biases
out_proj.weight: W_o
out_proj.bias: b_o
"""


@pytest.fixture(scope="module")
def mha():
    torch.manual_seed(3)
    module = torch.nn.MultiheadAttention(4, 2, batch_first=True).eval()
    with torch.no_grad():
        module.out_proj.bias.normal_()  # nonzero, so a lost bias would show
    return module


def mha_output(module, x):
    causal = torch.ones(6, 6, dtype=torch.bool).triu(1)  # True: may not attend
    with torch.no_grad():
        return module(x, x, x, attn_mask=causal, need_weights=False)[0]


def test_params_and_inputs_replace_declared_tensors():
    pipeline = tracer.load(CAUSAL)
    x, w = torch.randn(2, 6, 4), torch.eye(4)
    trace = pipeline.run(params={"W_q": w, "W_k": w, "W_v": w, "W_o": w, "b_o": torch.zeros(4)}, inputs={"x": x}, keep_values=True)
    assert torch.equal(trace["q"].tensor, x) and torch.equal(trace["x"].tensor, x)


def test_tensors_that_fit_their_declarations_skip_the_locating_check(monkeypatch):
    """A run given fitting tensors on every call pays a few attribute reads a tensor: the check
    that finds and locates problems never runs. A non-contiguous tensor is taken contiguous, as a
    declared one is, and a CPU tensor given to a meta run moves to the meta device."""
    pipeline = tracer.load(CAUSAL)
    w, x = torch.randn(4, 4), torch.randn(2, 6, 4)
    params = {"W_q": w.t(), "W_k": w, "W_v": w.clone(), "W_o": w.clone(), "b_o": torch.zeros(4)}

    def refused(*args, **kwargs):
        raise AssertionError("the locating check ran for tensors that fit")

    monkeypatch.setattr(tracer.runtime.tensors, "match", refused)
    trace = pipeline.run(params=params, inputs={"x": x}, keep_values=True)
    assert trace["W_q"].tensor.is_contiguous() and torch.equal(trace["W_q"].tensor, w.t()) and torch.equal(trace["x"].tensor, x)
    meta = pipeline.run(device="meta", params=params, inputs={"x": x})
    assert meta.records == [replace(r, device="meta") for r in trace.records] and meta.outputs["out"].is_meta


def test_block_params_take_dotted_keys():
    pipeline = tracer.load(PIPELINES / "encoder_block.yaml")
    trace = pipeline.run(params={"encoder.b_Q": torch.ones(2)}, keep_values=True)
    assert torch.equal(trace["encoder/b_Q"].tensor, torch.ones(2))


def test_every_problem_is_reported_at_once_and_located():
    with pytest.raises(tracer.TracerError) as caught:
        tracer.load(CAUSAL).run(
            params={"W_q": torch.zeros(3, 3), "W_z": torch.zeros(4, 4), "b_o": torch.zeros(4, dtype=torch.float64)},
            inputs={"W_k": torch.zeros(4, 4)},
        )
    text = str(caught.value)
    assert (
        "causal_mha.yaml:23:3: error[tensor-given]: params=['W_q'] has shape [3, 3], the pipeline declares 'W_q' as (d_model, d_model) [4, 4]"
        in text
    )
    assert "params= names 'W_z', which is not one of the params of this pipeline; did you mean 'W_v'?" in text
    assert "params=['b_o'] is float64, the pipeline declares 'b_o' as float32" in text
    assert "inputs= names 'W_k', which is not one of the inputs" in text


@pytest.mark.parametrize(
    "routes, problem",
    [
        (
            {"tensors": {"W_q": torch.eye(4)}, "params": {"W_q": torch.zeros(4, 4)}},
            "23:3: error[tensor-given]: tensors= and params= both give 'W_q'",
        ),
        (
            {"tensors": {"x": torch.zeros(2, 6, 4)}, "inputs": {"x": torch.ones(2, 6, 4)}},
            "19:3: error[tensor-given]: tensors= and inputs= both give 'x'",
        ),
    ],
    ids=["a param", "an input"],
)
def test_a_tensor_given_by_two_routes_is_an_error_at_its_declaration(routes, problem):
    with pytest.raises(tracer.TracerError) as caught:
        tracer.load(CAUSAL).run(**routes)
    assert f"causal_mha.yaml:{problem}; give it once" in str(caught.value)  # at the declaration


def test_dotted_and_slashed_keys_by_two_routes_are_an_error():
    pipeline = tracer.load(PIPELINES / "encoder_block.yaml")
    with pytest.raises(tracer.TracerError, match="tensors= and params= both give 'encoder/b_Q'; give it once"):
        pipeline.run(tensors={"encoder.b_Q": torch.ones(2)}, params={"encoder/b_Q": torch.zeros(2)})


def test_a_dim_given_two_values_on_the_command_line_is_a_usage_error():
    done = tracer_cli("run", CAUSAL, "--dim", "T=4", "--dim", "T=5")
    assert done.returncode == 2 and "argument --dim: T is given twice, as 4 and as 5: give it once" in done.stderr
    assert tracer_cli("run", CAUSAL, "--dim", "T=4", "--dim", "T=4").returncode == 0


@pytest.mark.parametrize("suffix", [".pt", ".safetensors"])
def test_a_multihead_attention_state_dict_loads_through_a_weights_map(mha, tmp_path, suffix):
    """nn.MultiheadAttention's own checkpoint, renamed and split by the map, gives the module's numbers."""
    weights = tmp_path / f"mha{suffix}"
    state = {k: v.contiguous() for k, v in mha.state_dict().items()}
    torch.save(state, weights) if suffix == ".pt" else save_file(state, weights)
    (tmp_path / "map.yaml").write_text(MHA_MAP)
    out = tmp_path / "trace.json"
    done = tracer_cli("run", CAUSAL, "--weights", weights, "--weights-map", tmp_path / "map.yaml", "--json", "--values", "-o", out)
    assert done.returncode == 0, done.stderr
    records = {r["id"]: r for r in json.loads(out.read_text())["tensors"]}
    x = torch.tensor(records["x"]["values"])
    assert torch.allclose(torch.tensor(records["out"]["values"]), mha_output(mha, x), atol=1e-6)


def test_unknown_missing_and_misshaped_keys_are_reported_together(mha, tmp_path):
    state = dict(mha.state_dict())  # no map: every key is foreign, every param missing
    state["W_q"] = torch.zeros(2, 2)
    torch.save(state, tmp_path / "w.pt")
    done = tracer_cli("run", CAUSAL, "--weights", tmp_path / "w.pt")
    assert done.returncode == 1
    err = done.stderr
    assert "names 'in_proj_weight', which is not one of the params" in err
    assert "['W_q'] has shape [2, 2]" in err
    for name in ("W_k", "W_v", "W_o", "b_o"):
        assert f"has no '{name}'" in err
    assert "Traceback" not in err


def test_a_file_that_is_not_weights_is_a_located_error(tmp_path):
    (tmp_path / "w.pt").write_text("not a checkpoint")
    done = tracer_cli("run", CAUSAL, "--weights", tmp_path / "w.pt")
    assert done.returncode == 1 and "error[weights-file]: cannot read weights" in done.stderr


TRAINING_DROPOUT = """\
name: drop
dims: {T: 4, D: 8}
seed: 7
inputs:
  x: {shape: [T, D], init: randn}
params:
  w: {shape: [D, D], init: randn}
steps:
  - {id: y, op: linear, input: x, weight: w}
  - {id: dropped, op: dropout, p: 0.5, training: true}
"""


def test_runs_with_given_tensors_draw_the_others_once_and_replay_the_dropout_stream(monkeypatch):
    """A run that gives tensors draws the rest once, as the file seeds them; each later run reuses them,
    and training dropout sees the random stream a fresh run would, so the runs agree bitwise."""
    x = torch.randn(4, 8)
    torch.manual_seed(7)  # the file's seed; x is given, so w is the first draw
    w = torch.randn(8, 8)
    expected = torch.nn.functional.dropout(x @ w.T, 0.5, training=True)
    pipeline = tracer.loads(TRAINING_DROPOUT)
    first = pipeline.run(inputs={"x": x}, keep_values=True)
    drawn = []
    original = tracer.api.create_tensors
    monkeypatch.setattr(tracer.api, "create_tensors", lambda *a, **k: drawn.append(1) or original(*a, **k))
    torch.rand(100)  # the caller's own draws between runs change nothing
    later = pipeline.run(inputs={"x": x.clone()})
    assert not drawn
    assert torch.equal(first["w"].tensor, w) and (expected == 0).any()
    assert torch.equal(first.outputs["dropped"], expected) and torch.equal(later.outputs["dropped"], expected)
