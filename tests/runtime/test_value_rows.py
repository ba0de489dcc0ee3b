"""Runtime companions of the static checks: rows holding NaN or inf and masks that hide every key
of a query, counted while running (``run(check_values=True)``, always in ``tracer run``), and
shown in the table, the JSON, the notebook view and the report."""

import json
import math

import torch

import tracer
from tracer.cli import main
from tracer.presentation.report import report_html

PADDED = """
name: padded
dims: {B: 2, H: 1, T: 3, Dh: 2}
inputs:
  q: {shape: [B, H, T, Dh], init: randn}
  k: {shape: [B, H, T, Dh], init: randn}
  v: {shape: [B, H, T, Dh], init: randn}
  keep: {shape: [B, 1, T, T], values: [[[[1, 1, 1], [1, 1, 1], [1, 1, 1]]], [[[1, 1, 0], [1, 1, 0], [0, 0, 0]]]], dtype: bool}
steps:
  - {id: kt, op: transpose, input: k, dims: [2, 3]}
  - {id: scores, op: matmul, inputs: [q, kt]}
  - {id: scaled, op: scale, divide: {sqrt: Dh}}
  - {id: masked, op: mask, mask: keep, polarity: keep, fill: FILL}
  - {id: weights, op: softmax, dim: -1}
  - {id: context, op: matmul, inputs: [weights, v]}
"""


def run(text: str, **options):
    return tracer.loads(text, "p.yaml").run(check_values=True, **options)


def test_a_fully_masked_query_is_counted_and_with_fill_min_stays_finite():
    trace = run(PADDED.replace("FILL", "min"))
    rows = trace.value_rows
    assert (rows["masked"].rows, rows["masked"].masked, rows["masked"].nan) == (6, 1, 0)  # batch 1's last query hides all
    assert not rows["weights"] and not rows["context"]  # finfo.min rows become uniform, not NaN
    assert trace.value_warnings == ()
    weights = trace.outputs["context"]
    assert torch.isfinite(weights).all()


def test_with_fill_inf_the_nan_is_counted_where_it_begins_and_carried_on():
    trace = run(PADDED.replace("FILL", "-inf"))
    rows = trace.value_rows
    assert rows["masked"].masked == 1 and rows["masked"].inf == 0  # the mask's own -inf is not an overflow
    assert rows["weights"].nan == 1 and rows["context"].nan == 1
    [warning] = trace.value_warnings
    assert warning.code == "nan-risk-mask" and warning.step == "weights" and "1 NaN row of 6" in warning.message


def test_the_first_step_to_make_nan_or_inf_is_named():
    text = """
name: div
dims: {T: 2, d: 3}
inputs:
  x: {shape: [T, d], values: [[1.0, 0.0, 2.0], [0.0, 0.0, 0.0]]}
params:
  z: {shape: [d], init: zeros}
steps:
  - {id: y, op: div, inputs: [x, z]}
  - {id: s, op: softmax, dim: -1}
"""
    trace = run(text)
    y = trace.value_rows["y"]
    expected = torch.tensor([[1.0, 0.0, 2.0], [0.0, 0.0, 0.0]]) / torch.zeros(3)
    assert y.nan == int(expected.isnan().any(-1).sum()) == 2
    assert y.inf == 0  # row 0 holds inf and NaN: counted once, as NaN
    warnings = {w.code: w for w in trace.value_warnings}
    assert warnings["non-finite"].step == "y" and "'y' is the first tensor of this run to hold NaN" in warnings["non-finite"].message


def test_rows_reach_the_table_the_json_the_notebook_and_the_report(tmp_path, capsys):
    path = tmp_path / "p.yaml"
    path.write_text(PADDED.replace("FILL", "-inf"))
    assert main(["run", str(path)]) == 0
    out, err = capsys.readouterr()
    values = out[out.index("\nvalues\n") :]
    assert values.splitlines()[4].split() == ["masked", "6", "-", "-", "1"]
    assert "warning[nan-risk-mask]" in err
    assert main(["run", str(path), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    by_id = {t["id"]: t for t in data["tensors"]}
    assert by_id["weights"]["rows"] == {"rows": 6, "nan": 1, "inf": 0, "masked": 0}
    assert "nan-risk-mask" in [c["code"] for c in data["checks"]]
    trace = tracer.load(path).run(check_values=True)
    html = trace._repr_html_()
    assert "all masked" in html and "softmax produced 1 NaN row of 6" in html
    report = report_html(trace)
    assert "1 NaN of 6 rows" in report and "nan-risk-mask" in report


def test_without_check_values_a_run_counts_nothing():
    trace = tracer.loads(PADDED.replace("FILL", "-inf"), "p.yaml").run()
    assert trace.value_rows == {} and trace.value_warnings == ()
    assert "\nvalues\n" not in trace.table()
    assert math.isnan(float(trace.outputs["context"][1, 0, 2, 0]))
