"""The pytest plugin's pipeline items behave as pytest items: collected, counted, selected, reported."""

import pytest

from tests.conftest import PIPELINES

CAUSAL = PIPELINES / "causal_mha.yaml"


DEAD_STEP = PIPELINES / "lint_examples/dead_step.yaml"


@pytest.fixture
def project(pytester):
    """A project with a good pipeline, one whose expect: is wrong, a linted one and an ordinary test."""
    (pytester.path / "pipes").mkdir()
    (pytester.path / "pipes/good.yaml").write_text(CAUSAL.read_text())
    (pytester.path / "pipes/bad.yaml").write_text(
        CAUSAL.read_text().replace("name: causal_mha", "name: wrong_expect").replace("scores: [B, H, T, T]", "scores: [B, T, H, T]")
    )
    (pytester.path / "pipes/linted.yaml").write_text(DEAD_STEP.read_text())
    pytester.makepyfile(test_plain="def test_plain():\n    pass\n")
    return pytester


def run(pytester, *args):
    # hypothesis's plugin would re-import hypothesis in every inner run (pytester unloads it): seconds each
    return pytester.runpytest("-p", "no:cacheprovider", "-p", "no:hypothesispytest", "--tracer-pipelines=pipes/*.yaml", *args)


def test_collect_only_lists_and_counts_pipeline_items_with_their_node_ids(project):
    result = run(project, "--collect-only", "-q")
    lines = result.stdout.lines
    for node in (
        "pipes/good.yaml::causal_mha",
        "pipes/bad.yaml::wrong_expect",
        "pipes/linted.yaml::dead_step",
        "test_plain.py::test_plain",
    ):
        assert node in lines
    assert "4 tests collected" in result.stdout.str()


def test_a_node_id_or_k_selects_one_pipeline(project):
    run(project, "pipes/good.yaml::causal_mha").assert_outcomes(passed=1)
    run(project, "-k", "causal").assert_outcomes(passed=1, deselected=3)


def test_naming_an_unrelated_test_runs_no_pipeline(project):
    run(project, "test_plain.py").assert_outcomes(passed=1)


def test_a_failure_is_the_pipelines_located_message_without_tracers_frames(project):
    result = run(project, "pipes/bad.yaml")
    result.assert_outcomes(failed=1)
    text = result.stdout.str()
    assert "pipes/bad.yaml:" in text and ": error[expect]: step 'scores'" in text
    assert "tracer/" not in text and "Traceback" not in text


def test_lints_are_warnings_at_their_line_and_can_be_made_errors(project):
    result = run(project, "pipes/linted.yaml")
    result.assert_outcomes(passed=1, warnings=1)
    assert "PipelineWarning: pipes/linted.yaml:" in result.stdout.str() and "warning[dead-step]" in result.stdout.str()
    strict = run(project, "pipes/linted.yaml", "-W", "error::tracer.pytest_plugin.PipelineWarning")
    strict.assert_outcomes(failed=1)
    assert "warning[dead-step]" in strict.stdout.str() and "Traceback" not in strict.stdout.str()


def test_ignore_glob_leaves_pipeline_files_out(project):
    run(project, "--ignore-glob=*/bad.yaml", "--ignore-glob=*/linted.yaml").assert_outcomes(passed=2)


def test_the_ini_option_is_relative_to_the_ini_files_folder(project, monkeypatch):
    project.makeini("[pytest]\ntracer_pipelines = pipes/good.yaml\n")
    (project.path / "sub").mkdir()
    monkeypatch.chdir(project.path / "sub")  # started elsewhere, as from an editor's terminal
    result = project.runpytest("-p", "no:cacheprovider", "-p", "no:hypothesispytest", str(project.path))
    result.assert_outcomes(passed=2)  # the pipeline and test_plain.py
