"""FLOPs as torch counts them, and big models at a glance: `tracer run`'s folded, sized table."""

import io
import json
import math
import shutil
import time

import pytest

from tests.conftest import PIPELINES, assert_flops_as_counted, pipeline_text, shared_pipeline, tracer_cli
from tracer.presentation import progress

STACK = PIPELINES / "encoder_stack.yaml"


def _inputs(shapes) -> tuple[str, str]:
    names = [f"t{i}" for i in range(len(shapes))]
    return ", ".join(names), "\n".join(f"{n}: {{shape: {list(s)}, init: randn}}" for n, s in zip(names, shapes))


@pytest.mark.parametrize(
    "equation, shapes",
    [
        ("bij,bjk->bk", ([2, 3, 4], [2, 4, 5])),  # i is summed away before the product
        ("bij,bjk->ijk", ([2, 3, 4], [2, 4, 5])),  # b contracted, j a batch dim
        ("bij,bik->bijk", ([2, 3, 4], [2, 3, 5])),  # nothing to contract: an elementwise product, 0
        ("bij,bij->", ([2, 3, 4], [2, 3, 4])),
        ("bij,bjk,kl->bil", ([2, 3, 4], [2, 4, 5], [5, 6])),  # left to right, pair by pair
        ("...ij,jk->...ik", ([2, 1, 3, 4], [4, 5])),
        ("bij,xjk->bik", ([2, 3, 4], [1, 4, 5])),
        ("ij->ji", ([3, 4],)),
    ],
)
def test_einsum_flops_are_what_flop_counter_mode_counts(equation, shapes):
    names, inputs = _inputs(shapes)
    assert_flops_as_counted(pipeline_text(f"- {{id: e, op: einsum, inputs: [{names}], equation: '{equation}'}}", inputs=inputs))


@pytest.mark.parametrize("a, b", [([4], [4]), ([3, 4], [4]), ([4], [2, 4, 5]), ([3, 4], [2, 4, 5]), ([2, 1, 3, 4], [5, 4, 6])])
def test_matmul_flops_follow_the_kernel_torch_picks(a, b):
    names, inputs = _inputs([a, b])
    assert_flops_as_counted(pipeline_text(f"- {{id: y, op: matmul, inputs: [{names}]}}", inputs=inputs))


def test_sdpa_flops_with_grouped_heads_and_narrower_values():
    _, inputs = _inputs([[1, 4, 3, 8], [1, 2, 5, 8], [1, 2, 5, 4]])
    assert_flops_as_counted(pipeline_text("- {id: o, op: sdpa, inputs: [t0, t1, t2], gqa: true, causal: true}", inputs=inputs))


@pytest.fixture(scope="module")
def stack():
    return shared_pipeline(STACK).run(device="meta")


def test_the_stack_table_folds_the_copies_lists_parameters_with_totals_and_fits_100_columns(stack):
    lines = stack.table(width=100).splitlines()
    assert max(map(len, lines)) <= 100 and len(lines) < 80  # was 1,973 lines of up to 142 columns
    folded = next(line for line in lines if line.startswith("layers/1…47"))
    assert folded.split()[1] == "×47" and "(B, T, d_model)" in folded
    params = lines[lines.index("parameters") + 3 :]
    assert params[0].split()[:2] == ["layers/0/W_Q", "(d_model,"] and any(p.startswith("layers/1…47") for p in params)
    per_layer = 4 * (16 * 16 + 16) + 2 * 2 * 16 + 2 * 16 * 64 + 64 + 16  # Q, K, V, O; two layernorms; the feed-forward
    assert stack.param_count == 48 * per_layer and stack.param_bytes == 4 * 48 * per_layer
    assert lines[-1].startswith(f"total: {48 * per_layer:,} parameters (615.0 KiB) · ") and f"({stack.total_flops:,})" in lines[-1]
    expanded = stack.table(expand=True)
    assert "layers/47/out " in expanded and "×47" not in expanded
    assert max(map(len, expanded.splitlines())) > 100  # no width given: nothing elided


def test_depth_folds_groups_nested_deeper(stack):
    rows = [line.split()[0] for line in stack.table(depth=1).splitlines()[3:] if line and not line.startswith("parameters")]
    assert rows[:2] == ["x", "layers"] and not any(r.startswith("layers/") for r in rows[:2])
    assert tracer_cli("run", STACK, "--depth", "0").returncode == 2


def test_json_carries_flops_per_record_and_totals():
    done = tracer_cli("run", PIPELINES / "causal_mha.yaml", "--json")
    data = json.loads(done.stdout)
    flops = {t["id"]: t["flops"] for t in data["tensors"]}
    b, t, d, h = 2, 6, 4, 2
    assert flops["q"] == 2 * b * t * d * d and flops["scores"] == 2 * b * h * t * t * (d // h) and flops["weights"] == 0
    assert data["totals"]["flops"] == sum(flops.values()) and data["totals"]["params"] == 4 * d * d + d
    table = tracer_cli("run", PIPELINES / "causal_mha.yaml").stdout
    assert f"· {data['totals']['flops'] / 1000:.3g}K FLOPs ({data['totals']['flops']:,})" in table
    assert math.isclose(data["totals"]["peak_bytes"], shared_pipeline(PIPELINES / "causal_mha.yaml").check().peak_bytes)


class _Terminal(io.StringIO):
    def isatty(self):
        return True


def test_progress_shows_on_a_terminal_only_and_erases_itself(monkeypatch):
    monkeypatch.setattr(progress, "DELAY", 0.0)
    terminal = _Terminal()
    with progress.Progress("running", total=3, stream=terminal) as line:
        line.step("q")
    assert "tracer: running 1/3 · 0 s · q" in terminal.getvalue() and terminal.getvalue().endswith("\r\x1b[2K")
    for stream, quiet in ((_Terminal(), True), (io.StringIO(), False)):  # --quiet, or a pipe
        with progress.Progress("running", total=3, stream=stream, quiet=quiet) as line:
            line.step("q")
        assert stream.getvalue() == ""
    ticking = _Terminal()
    with progress.Progress("drawing x.svg", stream=ticking).ticking():
        time.sleep(0.05)
    assert "tracer: drawing x.svg · 0 s" in ticking.getvalue()


def test_the_cli_folds_repeats_by_default_and_expands_on_request(tmp_path):
    (tmp_path / "blocks").mkdir()
    shutil.copy(PIPELINES / "blocks" / "encoder_layer.yaml", tmp_path / "blocks")
    (tmp_path / "s.yaml").write_text(STACK.read_text().replace("repeat: 48", "repeat: 3"))
    assert tracer_cli("render", tmp_path / "s.yaml", "-o", tmp_path / "s.dot", "-q").returncode == 0
    assert "×2" in (tmp_path / "s.dot").read_text()
    listed = tracer_cli("run", tmp_path / "s.yaml", "--expand", "-q").stdout
    assert "layers/2/out " in listed and "×2" not in listed
