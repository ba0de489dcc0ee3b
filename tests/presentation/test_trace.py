"""A trace as JSON: every record, with FLOPs, and the totals."""

import json
import math

from tests.conftest import PIPELINES, shared_pipeline, tracer_cli


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
