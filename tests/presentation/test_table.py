"""The run as a table: repeated blocks folded, parameters and totals, fitted to the terminal."""

import pytest

from tests.conftest import PIPELINES, shared_pipeline, tracer_cli
from tracer.presentation.diagram import dot_source
from tracer.presentation.export import export_source

STACK = PIPELINES / "encoder_stack.yaml"


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


def _rows(table: str) -> list[tuple[str, str]]:
    lines = table.split("\n\nparameters")[0].splitlines()[3:]
    return [tuple(line.split()[:2]) for line in lines]


def test_depth_shows_each_group_that_deep_as_one_row(stack):
    assert _rows(stack.table(depth=1)) == [("x", "input"), ("layers", "group")]
    assert _rows(stack.table(depth=2)) == [("x", "input")] + [(f"layers/{i}", "group") for i in range(48)]
    assert tracer_cli("run", STACK, "--depth", "0").returncode == 2


def test_depth_one_folds_the_top_level_groups_of_a_flat_file():
    """llama_decoder_layer's groups (self_attn, mlp) are at the top level, nested in nothing."""
    trace = shared_pipeline(LLAMA).run(device="meta")
    rows = _rows(trace.table(depth=1))
    assert rows == [
        ("x", "input"),
        ("h", "rmsnorm"),
        ("self_attn", "group"),
        ("resid_1", "add"),
        ("h_2", "rmsnorm"),
        ("mlp", "group"),
        ("out", "add"),
    ]
    assert trace.table(depth=2) == trace.table()  # no group is two levels deep


LLAMA = PIPELINES / "models" / "llama_decoder_layer.yaml"


def test_shapes_print_as_the_file_wrote_them_in_the_table_the_diagram_and_the_exported_module():
    pipeline = shared_pipeline(LLAMA)
    trace = pipeline.run(device="meta")
    # W_k is declared (H_kv * Dh, d_model); k = linear(h, W_k) computes its last dim from it
    assert trace["k"].symbolic == "(B, T, H_kv * Dh)"
    table = trace.table(width=100)
    assert "(H_kv * Dh, d_model)" in table and "H_kv*d_model" not in table
    assert "H_kv * Dh" in dot_source(trace) and "H_kv*d_model" not in dot_source(trace)
    assert "# (H_kv * Dh, d_model)" in export_source(pipeline)


def test_a_narrow_table_keeps_shapes_whole_and_elided_ids_distinct():
    lines = shared_pipeline(LLAMA).run(device="meta").table(width=80).splitlines()
    ids = [line.split()[0] for line in lines[4:] if line and not line.startswith(("parameters", "total"))]
    assert max(map(len, lines)) <= 80 and "(B, T, H_kv * Dh)" in "\n".join(lines)
    rotated = [i for i in ids if i.endswith("tated")]
    assert len(rotated) == 2 and rotated[0] != rotated[1] and rotated[0].startswith("q_rot") and rotated[1].startswith("k_rot")


def test_run_width_fits_the_table_and_a_pipe_gets_every_id_whole():
    narrow = tracer_cli("run", LLAMA, "--device", "meta", "--width", "80")
    assert narrow.returncode == 0 and max(map(len, narrow.stdout.splitlines()[:-1])) <= 80
    piped = tracer_cli("run", LLAMA, "--device", "meta")  # not a terminal: no width to fit
    assert "q_rot/rotated" in piped.stdout and "k_rot/rotated" in piped.stdout
    assert tracer_cli("run", LLAMA, "--width", "0").returncode == 2
