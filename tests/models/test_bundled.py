"""Every bundled pipeline, at its dims and at others."""

import pytest

import tracer
from tests.conftest import INVALID_EXAMPLES, PIPELINES, shared_pipeline


def bundled_with_t():
    for path in sorted(PIPELINES.rglob("*.yaml")):
        if path.relative_to(PIPELINES).as_posix() in INVALID_EXAMPLES:
            continue  # an error example
        pipeline = shared_pipeline(path)
        literal = any(d.values is not None or d.tokens is not None for d in pipeline.spec.inputs.values())
        if "T" in pipeline.spec.dims and isinstance(pipeline.spec.dims["T"], int) and not literal:
            yield path


@pytest.mark.parametrize("path", list(bundled_with_t()), ids=lambda p: str(p.relative_to(PIPELINES)))
def test_every_bundled_pipeline_runs_at_t_equal_one(path):
    """--dim T=1 (one token: a decode step) checks and runs, expectations included."""
    pipeline = tracer.load(path)
    assert not pipeline.check({"T": 1}).errors
    pipeline.run(dims={"T": 1}, device="meta")
