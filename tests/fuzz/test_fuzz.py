"""Property-based fuzzing for CI: a few hundred cases of every strategy of the ``tests/fuzz`` package."""

from __future__ import annotations

import io
import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.fuzz import driver, folders, generators, oracle, pairs

CI = settings(deadline=None, derandomize=True, database=None, suppress_health_check=list(HealthCheck))


def _check(generator, rnd: random.Random, tmp_path_factory, cli: bool = False) -> None:
    folder = tmp_path_factory.mktemp("case", numbered=True)
    data = generator(rnd)
    outcome = oracle.run_case(data, folder, rnd, cpu=True, cli=cli)
    assert outcome.kind not in ("crash", "hang"), f"{outcome.kind} on:\n{data.decode('utf-8', 'replace')[:3000]}\n{outcome.detail}"


# strategy -> cases per CI run; `make fuzz` runs the same generators 10,000 times
GENERATED = {
    "typed": 40,  # well-typed pipelines from the step vocabulary: layouts and memory against torch
    "mutated": 70,  # bundled pipelines after structural mutations
    "gentle": 20,  # group names, collapse patterns and nested expect keys on runnable pipelines
    "text_mutated": 40,  # truncations and edited lines
    "dims": 40,  # degenerate and huge dims of bundled pipelines
    "random_pipeline": 50,
    "random_yaml": 25,
    "named": 30,  # risky names (nn.Module's attributes, keywords, the generated code's own names), exported
}


class Terminal(io.StringIO):
    def isatty(self):
        return True


@pytest.mark.parametrize("strategy", GENERATED)
def test_generated_cases_end_in_success_or_a_located_error(strategy, tmp_path_factory):
    @settings(CI, max_examples=GENERATED[strategy])
    @given(rnd=st.randoms(use_true_random=False))
    def case(rnd):
        _check(getattr(generators, f"gen_{strategy}"), rnd, tmp_path_factory)

    case()


@settings(CI, max_examples=12)
@given(rnd=st.randoms(use_true_random=False))
def test_diff_pairs_get_a_true_verdict_and_exit_0_1_or_2(rnd, tmp_path_factory):
    """A renamed copy is the same pipeline, a change in a block file is named inside its copies, a
    stack of another depth is one repeat line, and 'the same' is never said of different outputs."""
    data = pairs.gen_diff(rnd)
    outcome = pairs.run_pair(data, tmp_path_factory.mktemp("pair", numbered=True), rnd)
    assert outcome.kind not in ("crash", "hang"), f"{outcome.kind} on:\n{data.decode()[:3000]}\n{outcome.detail}"


@settings(CI, max_examples=25)
@given(data=st.binary(max_size=400))
def test_random_bytes(data, tmp_path_factory):
    folder = tmp_path_factory.mktemp("case", numbered=True)
    outcome = oracle.run_case(data, folder, random.Random(0))
    assert outcome.kind not in ("crash", "hang"), f"{outcome.kind} on {data!r}\n{outcome.detail}"


# folder strategies -> cases per CI run: a checkpoint case takes a fraction of a second, an import one torch.export
FOLDERS = {"checkpoint": 30, "import": 4}


@pytest.mark.parametrize("strategy", FOLDERS)
def test_folder_cases_exit_cleanly_and_write_only_what_they_list(strategy, tmp_path_factory):
    @settings(CI, max_examples=FOLDERS[strategy])
    @given(rnd=st.randoms(use_true_random=False))
    def case(rnd):
        folder = tmp_path_factory.mktemp("case", numbered=True)
        data = getattr(folders, f"gen_{strategy}")(rnd)
        outcome = folders.RUNNERS[strategy](data, folder)
        assert outcome.kind not in ("crash", "hang"), f"{outcome.kind} on:\n{data.decode()}\n{outcome.detail}"

    case()


@settings(CI, max_examples=15)
@given(rnd=st.randoms(use_true_random=False))
def test_hostile_shapes_through_the_cli(rnd, tmp_path_factory):
    _check(generators.gen_hostile, rnd, tmp_path_factory, cli=True)


def test_campaign_reports_cases_and_crashes(capsys):
    assert driver.campaign(20, seed="ci") == 0
    report = capsys.readouterr().out
    assert "20 cases, 0 crashes, 0 hangs" in report
    assert "valid and ran: " in report and "ran, by strategy: " in report
    assert "memory estimate / measured peak over " in report


def test_progress_shows_on_a_terminal_only():
    shown, piped = Terminal(), io.StringIO()
    for stream in (shown, piped):
        progress = driver.Progress(2, stream)
        progress.update(1, {"ran": 1}, 0.0)
        progress.update(2, {"ran": 1, "crash": 1}, 0.0)
    assert shown.getvalue().startswith("\r1/2 cases, 0 crashes, 0 hangs, valid 100%")
    assert "\r2/2 cases, 1 crashes, 0 hangs, valid 50%" in shown.getvalue() and shown.getvalue().endswith("\n")
    assert piped.getvalue() == ""


def test_the_oracle_rejects_unlocated_lines():
    oracle.check_lines("p.yaml:3:5: error[x]: fine\np.yaml: error[y]: no position", "p.yaml")
    for bad in ("error: no file", "p.yaml:3:5: error[x]: two\nlines", "other.yaml:1:1: error[x]: wrong file", ""):
        with pytest.raises(oracle.OracleFailure):
            oracle.check_lines(bad, "p.yaml")


def test_a_hang_is_reported_as_a_hang(tmp_path, monkeypatch):
    import time

    def spin(path, rng, cpu):  # an endless loop in tracer: CPU time runs out
        while True:
            pass

    monkeypatch.setattr(oracle, "CASE_SECONDS", 0.05)  # the blocked case waits out the wall-clock limit: 10x this
    monkeypatch.setattr(oracle, "_exercise", spin)
    assert oracle.run_case(b"name: x", tmp_path, random.Random(0)).kind == "hang"
    monkeypatch.setattr(oracle, "_exercise", lambda path, rng, cpu: time.sleep(5))  # blocked, no CPU: the wall clock
    assert oracle.run_case(b"name: x", tmp_path, random.Random(0)).kind == "hang"
