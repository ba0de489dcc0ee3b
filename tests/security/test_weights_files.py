"""A checkpoint is untrusted input: read with bounded memory (never inflated, never a whole storage
for a small view, never more than the budget), only from a regular file, and every tensor or map
entry tracer cannot use is a located error, never an internal one (exit 3) or a silent choice."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile

import pytest
import torch
from safetensors.torch import save_file

import tracer
from tests.conftest import PIPELINES, tracer_cli

PIPELINE = """\
name: w
dims: {D: 4}
inputs:
  x: {shape: [2, D], init: randn}
params:
  W: {shape: [D, D], init: linear}
  b: {shape: [D], init: zeros}
steps:
  - {id: y, op: linear, input: x, weight: W, bias: b}
"""
VIEWED = """\
name: viewed
inputs:
  x: {shape: [2, 16], init: randn}
params:
  W: {shape: [4, 4], init: linear}
steps:
  - {id: flat, op: view, input: W, shape: [16]}
  - {id: y, op: mul, inputs: [x, flat]}
"""


@pytest.fixture
def pipeline(tmp_path):
    (tmp_path / "p.yaml").write_text(PIPELINE)
    return tmp_path / "p.yaml"


def _deflated(state: dict, path) -> None:
    """torch.save's zip with every member compressed: what a bomb looks like."""
    plain = path.with_suffix(".plain")
    torch.save(state, plain)
    with zipfile.ZipFile(plain) as source, zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as target:
        for member in source.infolist():
            target.writestr(member.filename, source.read(member.filename), compress_type=zipfile.ZIP_DEFLATED)
    plain.unlink()


def test_a_compressed_checkpoint_is_refused_before_it_is_inflated(pipeline, tmp_path):
    _deflated({"W": torch.randn(4, 4), "b": torch.zeros(4), "junk": torch.zeros(1 << 20)}, tmp_path / "bomb.pt")
    done = tracer_cli("run", pipeline, "--weights", tmp_path / "bomb.pt", "--max-memory", "64MiB")
    assert done.returncode == 1
    assert "bomb.pt: error[weights-file]: cannot read weights: member 'bomb/data.pkl' is compressed" in done.stderr


@pytest.mark.parametrize("suffix", [".pt", ".safetensors"])
def test_tensors_over_the_budget_are_refused_before_they_are_copied(pipeline, tmp_path, suffix):
    state = {"W": torch.zeros(2 << 20), "b": torch.zeros(4)}  # W is declared (4, 4): the file says 8 MiB
    weights = tmp_path / f"w{suffix}"
    torch.save(state, weights) if suffix == ".pt" else save_file(state, weights)
    done = tracer_cli("run", pipeline, "--weights", weights, "--max-memory", "4MiB")
    assert done.returncode == 1 and "error[weights-too-large]: the checkpoint's tensors take 8.0 MiB" in done.stderr, done.stderr


def test_many_keys_viewing_one_storage_count_once_each(tmp_path):
    """Twenty keys that each view the whole of one 1 MiB storage would be twenty copies."""
    params = "".join(f"  p{i}: {{shape: [4], init: zeros}}\n" for i in range(20))
    (tmp_path / "p.yaml").write_text(
        f"name: many\ninputs:\n  x: {{shape: [4], init: randn}}\nparams:\n{params}steps:\n  - {{id: y, op: add, inputs: [x, p0]}}\n"
    )
    shared = torch.zeros(1 << 18)
    torch.save({f"p{i}": shared for i in range(20)}, tmp_path / "w.pt")
    done = tracer_cli("run", tmp_path / "p.yaml", "--weights", tmp_path / "w.pt", "--max-memory", "8MiB")
    assert done.returncode == 1 and "the checkpoint's tensors take 20.0 MiB" in done.stderr, done.stderr


SUFFIXES = [".pt", ".safetensors"]
# Reads each file given, in one fresh process (one torch start-up for both formats): the growth of its
# peak resident memory (VmHWM, reset to the current size before each read) and what it read.
READ_SOME = """\
import json, sys, torch
from tracer import weights

def peak_kib():
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmHWM:"))

found = []
for path in sys.argv[1:]:
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # VmHWM back to the current resident size
    before = peak_kib()
    state = weights.read(path, max_bytes=1 << 20, wanted=lambda key: key != "unused")
    unused = state["unused"]
    found.append([peak_kib() - before, str(unused.device), list(unused.shape), state["W"].tolist() == torch.eye(4).tolist()])
    del state, unused
print(json.dumps(found))
"""


@pytest.fixture(scope="module")
def partial_reads(tmp_path_factory) -> dict:
    """{suffix: [KiB the read grew the peak by, the unused tensor's device and shape, W as saved]} of
    a 64 MiB file of which the pipeline takes 80 bytes, read under a 1 MiB budget."""
    folder, files = tmp_path_factory.mktemp("partial"), []
    for suffix in SUFFIXES:
        state = {"W": torch.eye(4), "b": torch.zeros(4), "unused": torch.ones(16 << 20)}
        files.append(folder / f"w{suffix}")
        torch.save(state, files[-1]) if suffix == ".pt" else save_file(state, files[-1])
        del state
    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    done = subprocess.run([sys.executable, "-c", READ_SOME, *files], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    return dict(zip(SUFFIXES, json.loads(done.stdout)))


@pytest.mark.parametrize("suffix", SUFFIXES)
def test_only_the_tensors_the_pipeline_takes_are_read_and_counted(partial_reads, suffix):
    """A 64 MiB file of which the pipeline takes 80 bytes: memory grows by those, under a 1 MiB budget."""
    grown_kib, device, shape, same = partial_reads[suffix]
    assert grown_kib < 16 << 10 and device == "meta" and shape == [16777216] and same, partial_reads


@pytest.mark.parametrize("suffix", [".pt", ".safetensors"])
def test_a_key_the_map_drops_or_no_param_has_is_never_read(pipeline, tmp_path, suffix):
    state = {"W": torch.randn(4, 4), "b": torch.zeros(4), "unused": torch.ones(4 << 20)}  # 16 MiB
    weights = tmp_path / f"w{suffix}"
    torch.save(state, weights) if suffix == ".pt" else save_file(state, weights)
    (tmp_path / "map.yaml").write_text("unused: null\n")
    dropped = tracer_cli("run", pipeline, "--weights", weights, "--weights-map", tmp_path / "map.yaml", "--max-memory", "8MiB")
    assert dropped.returncode == 0, dropped.stderr
    unknown = tracer_cli("run", pipeline, "--weights", weights, "--max-memory", "8MiB")
    assert unknown.returncode == 1 and "error[unknown-tensor]" in unknown.stderr and "'unused'" in unknown.stderr, unknown.stderr
    assert "weights-too-large" not in unknown.stderr


@pytest.mark.parametrize("suffix", [".pt", ".safetensors"])
def test_a_fifo_as_weights_is_refused_at_once(pipeline, tmp_path, suffix):
    os.mkfifo(tmp_path / f"w{suffix}")
    done = subprocess.run(
        [sys.executable, "-m", "tracer", "run", pipeline, "--weights", tmp_path / f"w{suffix}"],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": os.getcwd()},
    )
    assert done.returncode == 1
    assert f"w{suffix}: error[weights-file]: is a FIFO, not a regular file; give a .safetensors file" in done.stderr


@pytest.mark.parametrize(
    "make, problem",
    [
        (lambda: torch.eye(4).to_sparse(), "is a sparse_coo tensor; give a dense one (tensor.to_dense())"),
        (lambda: torch.empty(4, 4, device="meta"), "is a meta tensor, which holds no values"),
        (
            lambda: torch.quantize_per_tensor(torch.eye(4), 0.1, 0, torch.qint8),
            "is quantized (qint8); give a float tensor (tensor.dequantize())",
        ),
    ],
    ids=["sparse", "meta", "quantized"],
)
@pytest.mark.filterwarnings("ignore::UserWarning")  # torch deprecates quantized tensors and typed storages
def test_a_tensor_without_dense_values_is_a_located_error(pipeline, tmp_path, make, problem):
    torch.save({"W": make(), "b": torch.zeros(4)}, tmp_path / "w.pt")
    done = tracer_cli("run", pipeline, "--weights", tmp_path / "w.pt")
    assert done.returncode == 1 and f"p.yaml:6:3: error[tensor-given]: --weights {tmp_path / 'w.pt'}['W'] {problem}" in done.stderr


def test_an_expanded_param_is_made_dense_so_a_view_of_it_works(tmp_path):
    row = torch.randn(1, 4)
    torch.save({"W": row.expand(4, 4)}, tmp_path / "w.pt")
    (tmp_path / "p.yaml").write_text(VIEWED)
    out = tmp_path / "out.json"
    done = tracer_cli("run", tmp_path / "p.yaml", "--weights", tmp_path / "w.pt", "--json", "-o", out)
    assert done.returncode == 0, done.stderr
    trace = tracer.load(tmp_path / "p.yaml").run(params={"W": row.expand(4, 4)}, keep_values=True)
    assert trace["W"].stride == (4, 1) and torch.equal(trace["flat"].tensor, row.expand(4, 4).reshape(16))


@pytest.mark.parametrize(
    "dim, problem",
    [
        ("7", "'packed' [8, 4] has no dim 7; give a dim from -2 to 1"),
        ("-7", "'packed' [8, 4] has no dim -7; give a dim from -2 to 1"),
        ("true", "'packed': dim must be a whole number such as 0 or -1, not true"),
        ("1.0", "'packed': dim must be a whole number such as 0 or -1, not 1.0"),
    ],
)
def test_a_map_dim_is_checked_against_the_tensor(pipeline, tmp_path, dim, problem):
    torch.save({"packed": torch.randn(8, 4), "b": torch.zeros(4)}, tmp_path / "w.pt")
    (tmp_path / "map.yaml").write_text(f"packed: {{into: [W, W2], dim: {dim}}}\n")
    done = tracer_cli("run", pipeline, "--weights", tmp_path / "w.pt", "--weights-map", tmp_path / "map.yaml")
    assert done.returncode == 1 and f"map.yaml:1:30: error[weights-map]: {problem}" in done.stderr, done.stderr  # at the dim


@pytest.mark.parametrize(
    "state, map_text, problem",
    [
        ({"packed": torch.randn(8, 4)}, "packed: [W, W]\n", "map.yaml:1:9: error[weights-map]: 'packed' gives 'W' twice"),
        (
            {"a": torch.randn(4, 4), "c": torch.randn(4, 4)},
            "a: W\nc: W\n",
            "map.yaml:2:4: error[weights-map]: 'c' gives 'W' and so does 'a'; a param takes one tensor",
        ),
        (
            {"W": torch.randn(4, 4), "W_alt": torch.ones(4, 4)},
            "W_alt: W\n",
            "map.yaml:1:8: error[weights-map]: 'W_alt' and 'W' both give 'W'; map one of them to null",
        ),
    ],
    ids=["one entry", "two entries", "renamed onto a key that passes through"],
)
def test_two_tensors_for_one_param_are_an_error(pipeline, tmp_path, state, map_text, problem):
    torch.save({**state, "b": torch.zeros(4)}, tmp_path / "w.pt")
    (tmp_path / "map.yaml").write_text(map_text)
    done = tracer_cli("run", pipeline, "--weights", tmp_path / "w.pt", "--weights-map", tmp_path / "map.yaml")
    assert done.returncode == 1 and problem in done.stderr, done.stderr


def test_dotted_and_slashed_keys_for_one_param_are_an_error():
    pipeline = tracer.load(PIPELINES / "encoder_block.yaml")
    with pytest.raises(tracer.TracerError, match=r"params= gives 'encoder/b_Q' twice, as 'encoder.b_Q' and as 'encoder/b_Q'"):
        pipeline.run(params={"encoder.b_Q": torch.ones(2), "encoder/b_Q": torch.zeros(2)})


def test_torch_advice_to_unpickle_anything_is_never_passed_on(pipeline, tmp_path):
    torch.save({"W": torch.randn(4, 4), "b": torch.zeros(4), "extra": zipfile.ZipInfo("x")}, tmp_path / "w.pt")
    done = tracer_cli("run", pipeline, "--weights", tmp_path / "w.pt")
    assert done.returncode == 1 and "weights_only" not in done.stderr
    assert "error[weights-file]: cannot read weights: the file holds objects other than tensors" in done.stderr
