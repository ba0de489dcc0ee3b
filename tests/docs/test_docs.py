"""The docs that are generated or quoted stay true."""

import re

import yaml

import tracer
from tests.conftest import ROOT, tracer_cli
from tracer.docgen import format_reference, schema_text
from tracer.steps.contract import STEP_KINDS


def test_format_reference_is_current():
    assert (ROOT / "docs/format.md").read_text() == format_reference(), "run: python -m tracer.docgen docs"


def test_committed_schema_is_current_and_matches_cli():
    assert (ROOT / "docs/pipeline.schema.json").read_text() == schema_text(), "run: python -m tracer.docgen docs"
    proc = tracer_cli("schema")
    assert proc.returncode == 0 and proc.stdout == schema_text()


def test_every_step_kind_has_docs_and_a_valid_example():
    text = format_reference()
    for op, cls in STEP_KINDS.items():
        assert f"### `{op}`" in text and cls.__doc__ and cls.example, op
        assert re.search(rf"op: {op}\b", cls.example), op
        for item in yaml.safe_load(cls.example):
            cls.model_validate(item)  # the documented example is a valid step


def test_quickstart_pipeline_runs_as_documented(tmp_path):
    doc = (ROOT / "docs/quickstart.md").read_text()
    yaml_text = re.search(r"```yaml\n(.*?)```", doc, re.S).group(1)
    path = tmp_path / "attention.yaml"
    path.write_text(yaml_text)
    t = tracer.run(path, dims={"T": 8})
    assert (t["scores"].shape, t["scores"].symbolic) == ((8, 8), "(T, T)")
    assert (t["keys_t"].contiguous, t["keys_t"].view_of) == (False, "keys")


def test_no_doc_cites_a_path_that_only_exists_on_one_machine():
    """A reader has the repository, not the developers' machines: no absolute path outside it."""
    docs = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    cited = {
        (doc.name, path) for doc in docs for path in re.findall(r"(?<![\w.:/])/(?:work|home|root|Users|tmp|mnt)/[\w./-]*", doc.read_text())
    }
    assert not cited


def test_testing_md_describes_the_lint_examples_as_they_are():
    """'one file per lint ... and view_non_contiguous.yaml, an error on purpose': no count to go stale."""
    from tracer.analysis.lints import LINTS

    text = (ROOT / "docs/testing.md").read_text()
    assert "one file per [lint](lints.md) (each passes,\nwith its warning) and `view_non_contiguous.yaml`, an error on purpose" in text
    examples = {p.stem for p in (ROOT / "pipelines/lint_examples").glob("*.yaml")}
    assert examples == {lint.example for lint in LINTS.values()} | {"view_non_contiguous"}
    errors = [p.stem for p in (ROOT / "pipelines/lint_examples").glob("*.yaml") if tracer_cli("check", p).returncode]
    assert errors == ["view_non_contiguous"]


def test_readme_links_name_files_that_exist():
    """Every link of the README into the project names a file of this tree (the README has no
    absolute links while the project has no public address: see pyproject.toml)."""
    links = re.findall(r"\]\(([^)]+)\)", (ROOT / "README.md").read_text())
    ours = [link.partition("#")[0] for link in links if not link.startswith(("https://", "http://", "#"))]
    assert ours and all((ROOT / path).is_file() for path in ours), [p for p in ours if not (ROOT / p).is_file()]
