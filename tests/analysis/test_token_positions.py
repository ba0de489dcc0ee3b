"""Token positions as symbolic intervals: where each positions axis's tokens sit, through rope
offsets, cache concatenation and slices (tracer.analysis.positions)."""

import json

import tracer
from tests.conftest import PIPELINES
from tracer.cli import main

DECODE = PIPELINES / "models" / "kv_cache_decode.yaml"


def shown(analysis, tensor_id: str) -> list:
    return [None if p is None else str(p) for p in analysis.token_positions(tensor_id)]


def test_a_decode_step_places_new_tokens_after_the_cache():
    analysis = tracer.load(DECODE).check()
    assert shown(analysis, "k_cache") == [None, None, "0 .. past - 1", None]
    assert shown(analysis, "q_rot") == [None, None, "past .. T + past - 1", None]  # rope's offset: past
    assert shown(analysis, "k_all") == [None, None, "0 .. T + past - 1", None]  # the cache, then the new keys
    assert shown(analysis, "scores") == [None, None, "past .. T + past - 1", "0 .. T + past - 1"]
    assert shown(analysis, "out") == [None, "past .. T + past - 1", None]  # carried through merge and o_proj


def test_slices_move_the_start_and_per_token_positions_are_a_run_time_fact():
    text = """
name: s
dims: {B: 1, T: 8, W: 3, d: 4}
inputs:
  x: {shape: [B, T, d], init: randn}
  pos: {shape: [B, W], init: zeros, dtype: int64}
steps:
  - {id: last, op: index, input: x, dim: 1, start: T - W}
  - {id: first, op: index, input: x, dim: 1, start: 1, stop: W + 1}
  - {id: h, op: view, input: last, shape: [B, W, 2, 2]}
  - {id: rot, op: rope, input: h, seq_dim: 1, positions: pos}
"""
    analysis = tracer.loads(text, "s.yaml").check()
    assert shown(analysis, "last")[1] == "T - W .. T - 1"
    assert shown(analysis, "first")[1] == "1 .. W"
    assert shown(analysis, "h")[1] == "T - W .. T - 1"
    assert shown(analysis, "rot")[1] == "per-token positions (W)"


def test_run_json_shows_the_intervals(capsys):
    assert main(["run", str(DECODE), "--json"]) == 0
    tensors = {t["id"]: t for t in json.loads(capsys.readouterr().out)["tensors"]}
    assert tensors["k_all"]["positions"] == [None, None, "0 .. T + past - 1", None]
    assert tensors["k_all"]["axis_roles"][2] == "positions"
