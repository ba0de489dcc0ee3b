"""The run as a table: repeated blocks folded, parameters and totals, fitted to the terminal."""

import pytest

from tests.conftest import PIPELINES, shared_pipeline, tracer_cli

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


def test_depth_folds_groups_nested_deeper(stack):
    rows = [line.split()[0] for line in stack.table(depth=1).splitlines()[3:] if line and not line.startswith("parameters")]
    assert rows[:2] == ["x", "layers"] and not any(r.startswith("layers/") for r in rows[:2])
    assert tracer_cli("run", STACK, "--depth", "0").returncode == 2
