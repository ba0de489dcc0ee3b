"""The pytest plugin's pipeline items behave as pytest items: collected, counted, selected, reported."""

import pytest

from tests.conftest import PIPELINES, ROOT

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


@pytest.mark.long
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


def _glob(base, pattern):
    from tracer.pytest_plugin import _glob as walk

    return sorted(p.relative_to(base).as_posix() for p in walk(base, pattern))


def test_double_star_never_descends_through_a_folder_symlink(tmp_path):
    (tmp_path / "sub").mkdir()
    (tmp_path / "p.yaml").write_text("")
    (tmp_path / "sub/q.yaml").write_text("")
    for link in "xyz":
        (tmp_path / link).symlink_to(".")
    assert _glob(tmp_path, "**/*.yaml") == ["p.yaml", "sub/q.yaml"]
    assert _glob(tmp_path, "x/sub/*.yaml") == ["x/sub/q.yaml"]  # a symlink the pattern names is followed
    assert _glob(tmp_path, str(tmp_path / "**" / "q.yaml")) == ["sub/q.yaml"]  # absolute: from its anchor
    assert _glob(tmp_path / "sub", "../*.yaml") == ["../p.yaml"]


def test_a_pattern_that_walks_too_far_is_stopped(tmp_path, monkeypatch):
    import tracer.pytest_plugin as plugin

    for i in range(10):
        (tmp_path / f"p{i}.yaml").write_text("")
    monkeypatch.setattr(plugin, "MAX_VISITED", 5)
    with pytest.raises(pytest.UsageError, match=r"--tracer-pipelines '\*\*/\*.yaml' visits more than 5 files; narrow the pattern"):
        _glob(tmp_path, "**/*.yaml")


def test_folder_symlink_loops_do_not_stall_collection(pytester, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", str(ROOT))  # the child imports this checkout's plugin
    (pytester.path / "p.yaml").write_text(CAUSAL.read_text())
    for link in "xyz":
        (pytester.path / link).symlink_to(".")
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--tracer-pipelines=**/*.yaml", "--co", "-q", timeout=60)
    assert result.ret == 0 and "p.yaml::causal_mha" in result.stdout.lines and "1 test collected" in result.stdout.str()


ODD_NAMES = ["w[1].yaml", "x::y.yaml", "e\x1b[31mred\x07.yaml", "t\x1b]0;title\x07.yaml"]


def test_odd_file_names_neither_abort_the_session_nor_reach_the_terminal(pytester):
    (pytester.path / "pipes").mkdir()
    for name in ODD_NAMES:
        (pytester.path / "pipes" / name).write_text(CAUSAL.read_text().replace("name: causal_mha", "name: ''"))
    result = run(pytester, "-rA")
    text = result.stdout.str()
    assert result.ret == 0 and "\x1b" not in text and "\x07" not in text, text
    result.assert_outcomes(passed=4, warnings=4)
    assert "PASSED pipes/e\\x1b[31mred\\x07.yaml::e\\x1b[31mred\\x07" in text
    assert "pipes/w[1].yaml: pytest reads [, ] and :: in an argument as test ids, so this file is collected only with its folder" in text
