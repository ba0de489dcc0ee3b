"""The JSON Schema in a real draft-07 validator: strict JSON, every bundled pipeline valid, and it
rejects a file exactly where tracer's own loader does (for what a schema can express)."""

import functools
import json
import textwrap
from pathlib import Path

import pytest
from jsonschema import Draft7Validator

import tracer
from tests.conftest import PIPELINES, ROOT, tracer_cli
from tracer.core.errors import TracerError
from tracer.docgen import PACKAGED_SCHEMA, schema_text
from tracer.spec.load import validate
from tracer.spec.source import parse_document


@functools.cache
def _schema_text() -> str:
    return schema_text()


def _strict_json(text: str) -> dict:
    def refuse(constant):
        raise AssertionError(f"{constant} is not JSON")

    return json.loads(text, parse_constant=refuse)


@pytest.fixture(scope="module")
def validator() -> Draft7Validator:
    schema = _strict_json(_schema_text())
    Draft7Validator.check_schema(schema)
    return Draft7Validator(schema)


def _schema_errors(validator: Draft7Validator, text: str) -> list[str]:
    """The validator's complaints about a document as tracer reads it (YAML 1.1: `-inf` is text)."""
    data, _ = parse_document(text, "t.yaml")
    return [f"{list(e.absolute_path)}: {e.message}" for e in validator.iter_errors(data)]


def _tracer_accepts(text: str) -> bool:
    try:
        validate(*parse_document(text, "t.yaml"))
    except TracerError:
        return False
    return True


STEPS = """\
name: t
dims: {T: 4}
inputs:
  x: {shape: [T, T], init: randn}
steps:
"""


def test_the_shipped_schemas_are_strict_json_and_current():
    for path in (PACKAGED_SCHEMA, ROOT / "docs/pipeline.schema.json"):
        assert path.read_text() == _schema_text(), f"{path} is stale: run python -m tracer.docgen docs"
    schema = _strict_json(_schema_text())
    assert schema["$schema"] == "http://json-schema.org/draft-07/schema#"


@pytest.mark.parametrize("path", sorted(PIPELINES.rglob("*.yaml")), ids=lambda p: p.relative_to(PIPELINES).as_posix())
def test_every_bundled_pipeline_is_valid(validator, path: Path):
    # the lint examples too: their mistakes (lints, a view of a strided tensor) are about shapes
    # and meaning, which only `tracer check` sees; their structure is valid
    assert _schema_errors(validator, path.read_text()) == []


@pytest.mark.parametrize(
    "step",
    [
        "{id: m, op: mask, input: x, causal: true, fill: -inf}",  # text to YAML 1.1 and to editors
        "{id: m, op: mask, input: x, causal: true, fill: -.inf}",  # YAML's own infinity
        "{id: m, op: mask, input: x, causal: true, fill: inf}",
        "{id: m, op: mask, input: x, causal: true, fill: -1e9}",  # text to YAML 1.1, a number to YAML 1.2
        "{id: m, op: mask, input: x, causal: true, fill: -1000000000.0}",
        "{id: m, op: mask, input: x, causal: true}",
        "{id: n, op: layernorm, input: x, eps: 1e-5}",
    ],
)
def test_numbers_are_accepted_in_every_spelling_tracer_accepts(validator, step):
    text = STEPS + f"  - {step}\n"
    assert _tracer_accepts(text)
    assert _schema_errors(validator, text) == []


@pytest.mark.parametrize(
    "document",
    [
        STEPS + "  - {id: m, op: mask, input: x, causal: true, fill: lots}",
        STEPS + "  - {id: m, op: mask, input: x, causal: true, fill: [1]}",
        STEPS + "  - {id: m, op: maks, input: x, causal: true}",
        STEPS + "  - {id: m, op: softmax, input: x, dim: -1, colour: red}",
        STEPS + "  - {op: softmax, input: x, dim: -1}",
        STEPS + "  - {id: 2m, op: softmax, input: x, dim: -1}",
        STEPS + "  - {id: n, op: layernorm, input: x, eps: small}",
        STEPS.replace("dims: {T: 4}", "dims: {T: [4]}") + "  - {id: s, op: softmax, input: x, dim: -1}",
        STEPS.replace("init: randn", "init: gaussian") + "  - {id: s, op: softmax, input: x, dim: -1}",
        STEPS + "  - {id: s, op: softmax, input: x, dim: -1}\nexpect: {s: 3}",
        "name: t\nsteps: []\n",
        "steps:\n  - {id: s, op: softmax, input: x, dim: -1}\n",
    ],
)
def test_the_schema_rejects_what_tracer_rejects(validator, document):
    # beyond a schema, and left to `tracer check`: the grammar of dim expressions, ids that name
    # no tensor, shapes
    assert not _tracer_accepts(document)
    assert _schema_errors(validator, document), textwrap.indent(document, "  ")


def test_the_cli_prints_the_shipped_schema_its_path_and_its_version():
    assert tracer_cli("schema").stdout == PACKAGED_SCHEMA.read_text()
    assert tracer_cli("schema", "--path").stdout.strip() == str(PACKAGED_SCHEMA.resolve())
    version = tracer_cli("--version")
    assert version.returncode == 0 and version.stdout == f"tracer {tracer.__version__}\n"
