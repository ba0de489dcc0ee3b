"""``tracer run FILE --world N`` / ``tracer.run_parallel``: the pipeline as N processes on
torch.distributed (gloo), sharded by torch's parallelize_module, against its single-device run.

Each launch starts fresh processes (forked by multiprocessing's fork server: a few tenths of a
second once the server is up), so the runs the tests read are made once per module."""

import copy
import functools
import itertools
import json
import os
import signal
import subprocess
import sys
import time

import psutil
import pytest
import torch
import torch.nn.functional as F

import tracer
from tests.conftest import FORK_SERVER, PIPELINES, ROOT, tracer_cli
from tests.exporting import assert_module_equals_trace, load_module
from tests.runtime import failing_ranks
from tracer.analysis import parallel
from tracer.core.errors import TracerError
from tracer.distributed import _check_collectives
from tracer.presentation.export import export_source
from tracer.runtime import sharded

pytestmark = [pytest.mark.long, FORK_SERVER]  # a fork server, and a fresh launcher process

B, T, D, H = 2, 4, 8, 4

ATTENTION = f"""\
name: tp_attention
dims: {{B: {B}, T: {T}, D: {D}, H: {H}, Dh: D // H}}
seed: 0
inputs:
  x: {{shape: [B, T, D], init: randn}}
params:
  W_q: {{shape: [D, D], init: linear}}
  W_k: {{shape: [D, D], init: linear}}
  W_v: {{shape: [D, D], init: linear}}
  W_o: {{shape: [D, D], init: linear}}
  b_o: {{shape: [D], init: linear, fan_in: D}}
steps:
  - {{id: q, op: linear, input: x, weight: W_q}}
  - {{id: k, op: linear, input: x, weight: W_k}}
  - {{id: v, op: linear, input: x, weight: W_v}}
  - {{id: q_h, op: view, input: q, shape: [BATCH, T, H // tp, Dh]}}
  - {{id: k_h, op: view, input: k, shape: [BATCH, T, H // tp, Dh]}}
  - {{id: v_h, op: view, input: v, shape: [BATCH, T, H // tp, Dh]}}
  - {{id: qt, op: transpose, input: q_h, dims: [1, 2]}}
  - {{id: kt, op: transpose, input: k_h, dims: [1, 2]}}
  - {{id: vt, op: transpose, input: v_h, dims: [1, 2]}}
  - {{id: ctx, op: sdpa, inputs: [qt, kt, vt], causal: true}}
  - {{id: merged, op: merge, input: ctx}}
  - {{id: out, op: linear, input: merged, weight: W_o, bias: b_o}}
parallel:
  mesh: MESH
  plan: {{q: colwise, k: colwise, v: colwise, out: rowwise}}
"""
TP = ATTENTION.replace("BATCH", "B").replace("MESH", "{tp: 2}")
DP_TP = ATTENTION.replace("BATCH", "B // dp").replace("MESH", "{dp: 2, tp: 2}\n  inputs: {x: [Shard(0), Replicate()]}")

SOFTMAX_OVER_A_SHARD = """\
name: mlp
dims: {B: 2, T: 3, D: 4, F: 8}
seed: 1
inputs:
  x: {shape: [B, T, D], init: randn}
params:
  W_up: {shape: [F, D], init: linear}
  W_down: {shape: [D, F], init: linear}
steps:
  - {id: up, op: linear, input: x, weight: W_up}
  - {id: probs, op: softmax, dim: -1}
  - {id: down, op: linear, input: probs, weight: W_down}
parallel:
  mesh: {tp: 2}
  plan: {up: colwise, down: rowwise}
"""


@pytest.fixture(scope="module")
def tp_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("parallel") / "tp_attention.yaml"
    path.write_text(TP)
    return path


@pytest.fixture(scope="module")
def tp_run(tp_file):
    return tracer.run_parallel(tp_file, world=2)


def _children() -> list[psutil.Process]:
    """Every process this one started that still runs, but the fork server and multiprocessing's
    resource tracker (they live as long as this process, for its next run): the ranks left."""
    from multiprocessing import forkserver, resource_tracker

    helpers = {forkserver._forkserver._forkserver_pid, resource_tracker._resource_tracker._pid}
    return [
        child for child in psutil.Process().children(recursive=True) if child.pid not in helpers and child.status() != psutil.STATUS_ZOMBIE
    ]


def _attention_in_torch(trace, tensors: dict) -> torch.Tensor:
    x = tensors["x"]

    def heads(w):
        return F.linear(x, w).view(B, T, H, D // H).transpose(1, 2)

    context = F.scaled_dot_product_attention(heads(tensors["W_q"]), heads(tensors["W_k"]), heads(tensors["W_v"]), is_causal=True)
    return F.linear(context.transpose(1, 2).reshape(B, T, D), tensors["W_o"], tensors["b_o"])


def test_tensor_parallel_attention_on_two_ranks_equals_the_single_device_run_and_torch(tp_run, tp_file):
    single = tracer.load(tp_file).run(keep_values=True)
    tensors = {name: single[name].tensor for name in ("x", "W_q", "W_k", "W_v", "W_o", "b_o")}
    gathered = tp_run.outputs["out"]
    assert gathered.shape == (B, T, D)
    assert torch.allclose(gathered, single["out"].tensor, atol=1e-5, rtol=0)
    assert torch.allclose(gathered, _attention_in_torch(single, tensors), atol=1e-5, rtol=0)
    assert tp_run.differences["out"] <= 1e-5


def test_each_rank_records_its_local_shapes(tp_run):
    for trace in tp_run.ranks:
        assert trace["W_q"].shape == (D // 2, D)  # colwise: the output features split
        assert trace["W_o"].shape == (D, D // 2)  # rowwise: the input features split
        assert trace["q"].shape == (B, T, D // 2)
        assert trace["ctx"].shape == (B, H // 2, T, D // H)  # the rank's heads
        assert trace["out"].shape == (B, T, D)  # all-reduced: whole on every rank
    assert tp_run.ranks[0]["q_h"].symbolic_shape == ("B", "T", "H // tp", "Dh")


def test_collectives_are_counted_per_step_with_their_bytes(tp_run):
    for rank in range(2):
        assert tp_run.counts(rank) == {("out", "all_reduce"): 1}  # rowwise: one all-reduce, colwise: none
        (event,) = tp_run.collectives[rank]
        assert (event.shape, event.dtype, event.bytes) == ((B, T, D), "float32", B * T * D * 4)
    assert "all_reduce ×1 in step 'out' over 2 ranks: 256 B, 256 B sent per rank" in tp_run.summary()  # ring: 2 (n - 1) / n


def test_the_run_as_json_holds_every_ranks_trace_and_collectives(tp_run):
    data = json.loads(tp_run.to_json())
    assert (data["world"], data["mesh"]) == (2, {"tp": 2})
    assert [len(trace["tensors"]) for trace in data["ranks"]] == [len(trace.records) for trace in tp_run.ranks]
    assert data["collectives"][1] == [
        {"step": "out", "op": "all_reduce", "shape": [B, T, D], "dtype": "float32", "bytes": B * T * D * 4, "group_size": 2}
    ]
    assert data["differences"]["out"] <= 1e-5


def test_sequence_parallel_runs_as_predicted_shard_by_shard_and_collective_by_collective():
    pipeline = tracer.load(PIPELINES / "parallel" / "sequence_parallel.yaml")
    run = tracer.run_parallel(pipeline, world=2)
    assert run.differences["out"] <= 1e-5
    predicted = [(c.step, c.op) for c in parallel.collectives(pipeline.check())]
    assert predicted == [
        ("q", "all_gather_into_tensor"),
        ("k", "all_gather_into_tensor"),
        ("v", "all_gather_into_tensor"),
        ("attn_out", "reduce_scatter_tensor"),
    ]
    for rank, trace in enumerate(run.ranks):
        assert [(e.step, e.op) for e in run.collectives[rank]] == predicted
        static = parallel.rank_view(pipeline.check(), rank)
        assert {record.id: record.shape for record in trace.records} == {rid: local.concrete for rid, local in static.items()}
        assert trace["h"].shape == (2, 2, 8) and trace["q"].shape == (2, 4, 4)  # the norm on T // tp, q gathered
        assert trace["out"].shape == (2, 2, 8)  # reduce-scattered back to a sequence shard
    assert run.outputs["out"].shape == (2, 4, 8)  # gathered along the sequence


@pytest.mark.parametrize("cp", [2, 4])
def test_context_parallel_with_rope_runs_on_cpu_as_torchs_ring_attention_equal_to_the_single_device_run(cp):
    """Each rank ropes its own positions (pos: [Shard(0)]) and attends its queries to every
    rank's keys, gathered once, causally at its offset: the gathered output is the single-device
    run's, and the one all-gather of cat(k, v) per rank is the predicted one, byte for byte."""
    pipeline = tracer.load(PIPELINES / "parallel" / "context_parallel.yaml")
    run = tracer.run_parallel(pipeline, world=cp, dims={"cp": cp})
    assert run.differences["out"] <= 1e-5
    assert run.outputs["out"].shape == (2, 8, 8)
    analysis = pipeline.check({"cp": cp})
    predicted = [(c.step, c.op, c.shape) for c in parallel.collectives(analysis)]
    assert predicted == [("context", "all_gather_into_tensor", (2 * 2 * 2 * 8 * 4,))]  # cat(k, v) of every rank: 2·B·H·T·Dh
    local = 2 * 2 * 2 * (8 // cp) * 4 * 4  # this rank's cat(k, v) in bytes
    for rank, trace in enumerate(run.ranks):
        assert [(e.step, e.op, e.bytes, e.group_size) for e in run.collectives[rank]] == [("context", "all_gather_into_tensor", local, cp)]
        assert trace["context"].shape == (2, 2, 8 // cp, 4)
    assert parallel.rank_view(analysis, 1)["pos"].positions == ("T // cp .. 2*T // cp - 1",)  # rank 1 ropes from T // cp


def test_context_parallel_over_cp_combines_with_tensor_parallel_heads_on_a_2d_mesh(tmp_path):
    """{tp: 2, cp: 2}: q, k, v column-parallel (H // tp heads), the ring over cp within each tp
    column, the output projection row-parallel: the ring's all-gather spans the cp group only."""
    text = (PIPELINES / "parallel" / "context_parallel.yaml").read_text()
    for old, new in (
        ("mesh: {cp: 2}", "mesh: {tp: 2, cp: 2}"),
        ("x: [Shard(1)]", "x: [Replicate(), Shard(1)]"),
        ("pos: [Shard(0)]", "pos: [Replicate(), Shard(0)]"),
        ("H, Dh]", "H // tp, Dh]"),
        ("context: context", "{q: colwise, k: colwise, v: colwise, out: rowwise, context: context}"),
    ):
        assert old in text
        text = text.replace(old, new)
    path = tmp_path / "tp_cp.yaml"
    path.write_text(text)
    run = tracer.run_parallel(path, world=4)
    assert run.differences["out"] <= 1e-5
    kv_bytes = 2 * 2 * 1 * 4 * 4 * 4  # cat(k, v) of one rank: B, H // tp, T // cp, Dh in float32
    for rank in range(4):
        assert [(e.step, e.op, e.bytes, e.group_size) for e in run.collectives[rank]] == [
            ("context", "all_gather_into_tensor", kv_bytes, 2),
            ("out", "all_reduce", 2 * 4 * 8 * 4, 2),
        ]
        assert run.ranks[rank]["context"].shape == (2, 1, 4, 4)


CROSS_CONTEXT = """\
name: cross_context
dims: {B: 1, T: 4, S: 8, D: 4}
inputs:
  x: {shape: [B, 1, T, D], init: randn}
  m: {shape: [B, 1, S, D], init: randn}
steps:
  - {id: ctx, op: sdpa, inputs: [x, m, m], causal: true, align: top-left}
parallel:
  mesh: {cp: 2}
  inputs: {x: [Shard(2)], m: [Shard(2)]}
  plan: {ctx: context}
"""


def test_a_context_step_the_ring_cannot_run_is_refused_at_its_plan_entry(tmp_path):
    path = tmp_path / "cross.yaml"
    path.write_text(CROSS_CONTEXT)
    with pytest.raises(TracerError, match="takes no causal mask between 4 queries and 8 keys") as caught:
        tracer.run_parallel(path, world=2)
    assert caught.value.code == "plan-runtime" and caught.value.diagnostics[0].position.line == 11
    path.write_text(CROSS_CONTEXT.replace("causal: true, align: top-left", "scale: 0.5"))
    run = tracer.run_parallel(path, world=2)  # without the causal mask, queries meet keys of any length
    assert run.differences["ctx"] <= 1e-5 and run.counts(1) == {("ctx", "all_gather_into_tensor"): 1}
    assert _children() == []


def test_context_parallel_roping_every_shard_from_0_differs_from_the_single_device_run_at_the_output():
    """shard-offset's example: the same ring, but its rope reads no positions, so every rank
    rotates its tokens from 0; the run finds what the lint says."""
    path = PIPELINES / "lint_examples" / "shard_offset.yaml"
    with pytest.raises(TracerError) as caught:
        tracer.run_parallel(path, world=2)
    assert caught.value.code == "parallel-mismatch" and "output 'out' differs from the single-device run" in str(caught.value)


def test_a_collective_the_prediction_lacks_is_a_located_error(tp_run, tp_file):
    run = copy.copy(tp_run)
    run.predicted = []
    with pytest.raises(TracerError) as caught:
        _check_collectives(run)
    assert str(caught.value).startswith(f"{tp_file}:24:5: error[collective-mismatch]: step 'out': rank 0 issued 1 collectives")
    assert "torch ran all_reduce of 256 B in step 'out', the static analysis predicts none" in str(caught.value)


def test_a_two_dimensional_mesh_shards_the_batch_over_dp_and_the_heads_over_tp(tmp_path):
    path = tmp_path / "dp_tp.yaml"
    path.write_text(DP_TP)
    run = tracer.run_parallel(path, world=4)
    assert run.mesh == {"dp": 2, "tp": 2}
    single = tracer.load(path).run(keep_values=True)
    assert torch.allclose(run.outputs["out"], single["out"].tensor, atol=1e-5, rtol=0)
    for trace in run.ranks:
        assert trace["x"].shape == (B // 2, T, D)
        assert trace["ctx"].shape == (B // 2, H // 2, T, D // H)
    assert all(run.counts(rank) == {("out", "all_reduce"): 1} for rank in range(4))  # over tp only
    assert run.collectives[0][0].bytes == B // 2 * T * D * 4


def test_the_command_line_runs_it_and_prints_rank_0_and_the_collectives(tp_file):
    done = tracer_cli("run", str(tp_file), "--world", "2")
    assert done.returncode == 0, done.stderr
    assert "W_q        (D // tp, D)  [4, 8]" in done.stdout
    assert "world 2 (tp=2)" in done.stdout and "all_reduce ×1 in step 'out'" in done.stdout
    assert "collectives as predicted: 1 on every rank" in done.stdout


def test_a_plan_that_computes_something_else_on_the_shards_fails_located(tmp_path):
    path = tmp_path / "mlp.yaml"
    path.write_text(SOFTMAX_OVER_A_SHARD)
    with pytest.raises(TracerError) as caught:
        tracer.run_parallel(path, world=2)
    assert caught.value.code == "parallel-mismatch"
    assert "output 'down' differs from the single-device run" in str(caught.value)
    assert str(caught.value).startswith(f"{path}:12:")  # the step that makes the output
    assert _children() == []


def test_a_view_with_global_heads_on_a_local_shard_is_refused_before_any_process_starts(tmp_path):
    path = tmp_path / "global_heads.yaml"
    path.write_text(TP.replace("shape: [B, T, H // tp, Dh]}", "shape: [B, T, H, Dh]}", 1))
    with pytest.raises(TracerError) as caught:
        tracer.run_parallel(path, world=2)
    assert "q_h" in str(caught.value) and "tp=2" in str(caught.value)
    assert _children() == []


def test_the_world_must_be_the_mesh_size_and_the_mesh_dims_are_dims(tp_file):
    with pytest.raises(TracerError, match=r"--world 4, but the mesh is tp=2 = 2 ranks") as caught:
        tracer.run_parallel(tp_file, world=4)
    assert caught.value.diagnostics[0].position.line == 26  # parallel: mesh:
    assert tracer.load(tp_file).check().dims["tp"] == 1  # a single-device run takes every mesh dim as 1


def test_what_the_run_cannot_do_is_a_located_error(tmp_path, tp_file):
    path = tmp_path / "ctx.yaml"
    path.write_text(TP.replace("out: rowwise}", "out: rowwise, ctx: colwise}"))
    with pytest.raises(TracerError, match="colwise applies to a linear step .*, but step 'ctx' is op sdpa"):
        tracer.run_parallel(path, world=2)
    windowed = TP.replace("causal: true}", "causal: true, window: 2}").replace("out: rowwise}", "out: rowwise, ctx: context}")
    path.write_text(windowed.replace("{tp: 2}", "{tp: 2, cp: 1}"))
    with pytest.raises(TracerError, match="torch's ring attention, which takes no window") as caught:
        tracer.run_parallel(path, world=2)
    assert caught.value.code == "plan-runtime" and caught.value.diagnostics[0].position.line == 27  # plan:
    path.write_text(TP.replace("H // tp", "H").split("parallel:")[0])
    with pytest.raises(TracerError, match="this file has none"):
        tracer.run_parallel(path, world=2)


def test_a_rank_that_raises_ends_the_run_at_its_step_and_leaves_no_process(tp_file, monkeypatch):
    monkeypatch.setattr(tracer.distributed, "run_rank", functools.partial(failing_ranks.rank_failing_in, "out", 1, failing_ranks.broken))
    with pytest.raises(TracerError) as caught:
        tracer.run_parallel(tp_file, world=2, timeout=30)
    message = str(caught.value)
    assert message.startswith(f"{tp_file}:24:5: error[rank-failed]: step 'out': rank 1 of 2: ValueError: a broken rank")
    assert _children() == []


def test_a_rank_that_hangs_ends_the_run_within_the_timeout_and_leaves_no_process(tp_file, monkeypatch):
    monkeypatch.setattr(
        tracer.distributed, "run_rank", functools.partial(failing_ranks.rank_failing_in, "q", 1, failing_ranks.hang)
    )  # the first step: reached at once
    timeout = 6  # long enough for both ranks to reach 'q' on a loaded 2-core machine (3 s was not, once)
    start = time.monotonic()
    with pytest.raises(TracerError) as caught:
        tracer.run_parallel(tp_file, world=2, timeout=timeout)
    assert time.monotonic() - start < timeout + 10  # the timeout, then the kill
    assert f"{tp_file}:13:5: error[rank-failed]: step 'q': rank 1 of 2: had not finished after {timeout} s" in str(caught.value)
    assert _children() == []


def _exported_rank(rank: int, source: str, port: int, folder: str) -> None:
    """A rank: the exported module built at the mesh's degree, sharded by its own
    parallelize(), run on this rank's sequence shard, its output gathered by DTensor."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Shard

    torch.set_num_threads(1)
    store = torch.distributed.TCPStore("127.0.0.1", port, 2, is_master=False)
    torch.distributed.init_process_group("gloo", store=store, rank=rank, world_size=2)
    try:
        mesh = init_device_mesh("cpu", (2,), mesh_dim_names=("tp",))
        module = load_module(source)
        sharded_module = module.parallelize(getattr(module, module.__all__[0])(tp=2, seed=0), mesh)
        assert sharded_module.q.weight.to_local().shape == (4, 8)  # ColwiseParallel's shard
        x = torch.randn(2, 4, 8, generator=torch.Generator().manual_seed(5))
        out = sharded_module(x.chunk(2, dim=1)[rank])  # x: [Shard(1)]
        torch.save(DTensor.from_local(out, mesh, [Shard(1)]).full_tensor(), f"{folder}/rank{rank}.pt")
    finally:
        torch.distributed.destroy_process_group()


def test_the_exported_module_sharded_by_its_parallelize_on_two_ranks_equals_the_unsharded_module(tmp_path):
    pipeline = tracer.load(PIPELINES / "parallel" / "sequence_parallel.yaml")
    source = export_source(pipeline)
    module = load_module(source)
    whole = getattr(module, module.__all__[0])(seed=0)  # tp=1: the single-device module
    assert whole.state_dict().keys() == tracer.to_module(pipeline).state_dict().keys()  # param ids, W_q not q.weight
    assert_module_equals_trace(whole, pipeline.run(keep_values=True))  # loads a state_dict keyed by param ids
    store = torch.distributed.TCPStore("127.0.0.1", 0, 2, is_master=True, wait_for_workers=False)
    torch.multiprocessing.start_processes(_exported_rank, (source, store.port, str(tmp_path)), nprocs=2, start_method="forkserver")
    expected = whole(torch.randn(2, 4, 8, generator=torch.Generator().manual_seed(5)))
    for rank in range(2):
        assert torch.allclose(torch.load(tmp_path / f"rank{rank}.pt"), expected, atol=1e-5, rtol=0)
    assert _children() == []


def test_export_refuses_a_plan_it_cannot_write_as_nn_linear_at_the_plan_entry(tmp_path):
    path = tmp_path / "in_out.yaml"
    path.write_text(TP.replace("weight: W_q}", "weight: W_q, layout: in_out}"))
    with pytest.raises(TracerError) as caught:
        export_source(tracer.load(path))
    assert caught.value.code == "export-plan" and "it stores its weight (in, out)" in str(caught.value)
    assert caught.value.diagnostics[0].position.line == 27  # plan:


def test_the_command_line_refuses_what_a_world_run_does_not_do(tp_file):
    for extra, said in ((["--values"], "leave out --values"), (["--device", "meta"], "leave out --device meta")):
        done = tracer_cli("run", str(tp_file), "--world", "2", *extra)
        assert done.returncode == 1 and said in done.stderr
    with pytest.raises(TracerError, match="--world runs on cpu \\(gloo\\) or cuda \\(nccl, a GPU per rank\\), not meta"):
        tracer.run_parallel(tp_file, world=2, device="meta")
    done = tracer_cli("run", str(tp_file), "--world", "2", "--timeout", "0")
    assert done.returncode == 2 and "expected a number of seconds above 0" in done.stderr


def test_a_rank_dies_with_its_parent_however_the_parent_dies():
    """run_rank asks the kernel for it first thing (PR_SET_PDEATHSIG): a parent killed by SIGKILL,
    which runs no cleanup, leaves no rank behind. Plain processes here, no torch."""
    ready_read, ready_write = os.pipe()
    launcher = os.fork()
    if launcher == 0:
        if os.fork() == 0:  # the rank
            sharded._die_with_parent()
            os.write(ready_write, b"1")
            time.sleep(60)
        time.sleep(60)
        os._exit(0)
    try:
        assert os.read(ready_read, 1) == b"1"
        (rank,) = psutil.Process(launcher).children()
    finally:
        os.kill(launcher, signal.SIGKILL)
        os.waitpid(launcher, 0)
    _, alive = psutil.wait_procs([rank], timeout=10)
    assert alive == []


LAUNCHER = """\\
import functools, sys
import tracer, tracer.distributed
from tests.runtime.failing_ranks import hang, rank_failing_in

print("started", flush=True)  # once: the ranks never run this script again
run = tracer.run_parallel(sys.argv[1], world=2, timeout=600)
print(run.summary())
print("hanging", flush=True)  # a second run from the same launcher, on the fork server of the first
tracer.distributed.run_rank = functools.partial(rank_failing_in, "q", 1, hang)
tracer.run_parallel(sys.argv[1], world=2, timeout=600)
"""


def test_a_script_without_a_main_guard_runs_once_and_no_rank_outlives_it_killed_by_sigkill(tmp_path, tp_file):
    """One launcher (a Python and torch start-up is most of the cost): its first run completes, and
    its ranks run only tracer, not the script; during its second, which hangs, it is killed by
    SIGKILL. The ranks' parent is the fork server, which exits when its launcher does; then the
    kernel ends the ranks (PR_SET_PDEATHSIG)."""
    script = tmp_path / "launch.py"
    script.write_text(LAUNCHER)
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    launcher = subprocess.Popen([sys.executable, str(script), str(tp_file)], cwd=tmp_path, env=env, stdout=subprocess.PIPE, text=True)
    try:
        out = "".join(itertools.takewhile(lambda line: line != "hanging\n", launcher.stdout))  # or to the end, if it failed
        assert out.count("started") == 1, out
        assert "collective: all_reduce ×1 in step 'out' over 2 ranks" in out
        deadline = time.monotonic() + 60
        while len(psutil.Process(launcher.pid).children(recursive=True)) < 4 and time.monotonic() < deadline:  # server, tracker, 2 ranks
            time.sleep(0.05)
        started = psutil.Process(launcher.pid).children(recursive=True)
        assert len(started) >= 4
    finally:
        launcher.kill()
        launcher.wait()
    _, alive = psutil.wait_procs(started, timeout=15)
    assert alive == []


def test_a_rank_that_fails_outside_its_steps_is_told_where_it_was(tp_file):
    """The launcher's message for a rank stopped before its first step or after its last: no step to
    locate it at, so the message says which phase (the progress the rank last wrote)."""
    pipeline = tracer.load(tp_file)
    analysis = pipeline.check({})
    job = sharded.RankJob(pipeline.spec, pipeline.source, {}, 0, "cpu", tuple(analysis.degrees.items()), analysis)
    said = {index: str(sharded.rank_error(job, index, "rank 1 of 2: stopped")) for index in (sharded.STARTING, sharded.JOINING, 12, 0)}
    assert (
        said[sharded.STARTING]
        == f"{tp_file}: error[rank-failed]: rank 1 of 2: stopped (it was starting, before it joined the process group)"
    )
    assert said[sharded.JOINING].endswith("(it was joining the process group or building its mesh and modules)")
    assert said[12].endswith("(it was past its last step, gathering the outputs)")  # the file's 12 steps done
    assert said[0].startswith(f"{tp_file}:13:5: error[rank-failed]: step 'q': rank 1 of 2: stopped")
