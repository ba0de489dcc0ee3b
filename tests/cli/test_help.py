"""The command line explains itself: every argument described, one spelling per option, examples
that run as written, `tracer help`, and errors that say what to install or type."""

from __future__ import annotations

import shlex

import pytest

import tracer
from tests.conftest import FORK_SERVER, PIPELINES, expected_exit, tracer_cli
from tracer.cli import _parser

COMMANDS = _parser()._subparsers._group_actions[0].choices  # name -> its parser


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_every_argument_of_every_command_is_described(name):
    undescribed = [a.dest for a in COMMANDS[name]._actions if not a.help]
    assert not undescribed, f"tracer {name}: {undescribed} have no help"


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_help_spells_each_option_once_and_points_at_no_file_of_the_repository(name):
    text = tracer_cli(name, "-h").stdout
    assert "-o OUT, --output OUT" not in text and "docs/" not in text
    if any("-o" in a.option_strings for a in COMMANDS[name]._actions):
        assert "-o, --output OUT" in text


def _examples(name: str) -> list[tuple[list[str], int]]:
    """Each example's words and the exit status it ends with (0, or a trailing ``# exit N``)."""
    epilog = COMMANDS[name].epilog or ""
    return [(shlex.split(line, comments=True), expected_exit(line)) for line in epilog.splitlines()[1:] if line.strip()]


@pytest.mark.parametrize(
    "name",
    [pytest.param(name, marks=FORK_SERVER if any("--world" in words for words, _ in _examples(name)) else ()) for name in sorted(COMMANDS)],
)
def test_every_command_shows_examples_and_they_run_as_written_in_an_empty_folder(name, tmp_path):
    """The examples name bundled pipelines, so they run wherever tracer is installed (test_dist
    runs them from the wheel, `tracer import` of the bundled modules included)."""
    examples = _examples(name)
    assert examples and all(words[:2] == ["tracer", name] for words, _ in examples)
    if name == "import":
        return  # tracer.pipelines is the installed package's: tests/test_dist.py runs it from the wheel
    for words, expected in examples:
        words = words[: words.index(">")] if ">" in words else words
        done = tracer_cli(*words[1:], cwd=tmp_path)
        assert done.returncode == expected, f"`{shlex.join(words)}` exited {done.returncode}: {done.stderr[-1000:]}"


def test_tracer_help_prints_the_overview_or_a_commands_help():
    overview = tracer_cli("help")
    assert overview.returncode == 0 and overview.stdout == tracer_cli("-h").stdout
    assert "tracer help COMMAND" in overview.stdout
    assert tracer_cli("help", "render").stdout == tracer_cli("render", "-h").stdout
    wrong = tracer_cli("help", "rnu")
    assert wrong.returncode == 2 and "invalid choice: 'rnu'" in wrong.stderr


def test_run_values_with_an_id_prints_that_tensor_alone():
    done = tracer_cli("run", PIPELINES / "causal_mha.yaml", "--values", "scores", "-q")
    assert done.returncode == 0, done.stderr
    printed = done.stdout[done.stdout.index("\nscores (B, H, T, T):\ntensor([[[[") :]
    assert done.stdout.count("tensor(") == 1
    everything = tracer_cli("run", PIPELINES / "causal_mha.yaml", "--values", "-q").stdout
    assert everything.count("tensor(") == len(tracer.load(PIPELINES / "causal_mha.yaml").run())
    assert printed.rstrip("\n") + "\n\n" in everything  # the values the full listing shows for it


def test_run_values_with_an_unknown_id_is_located_and_runs_nothing():
    done = tracer_cli("run", PIPELINES / "causal_mha.yaml", "--values", "scroes")
    assert done.returncode == 1 and done.stdout == ""
    assert (
        done.stderr
        == f"{PIPELINES / 'causal_mha.yaml'}: error[unknown-tensor]: --values 'scroes': no tensor of this run has that id; did you mean 'scores'?\n"
    )


def test_render_seed_draws_the_values_of_that_seed(tmp_path):
    for seed in ("1", "2"):
        done = tracer_cli("render", PIPELINES / "causal_mha.yaml", "--values", "--seed", seed, "-o", tmp_path / f"s{seed}.dot", "-q")
        assert done.returncode == 0, done.stderr
    again = tracer_cli("render", PIPELINES / "causal_mha.yaml", "--values", "--seed", "1", "-o", tmp_path / "again.dot", "-q")
    assert again.returncode == 0
    one, two = (tmp_path / "s1.dot").read_text(), (tmp_path / "s2.dot").read_text()
    assert one == (tmp_path / "again.dot").read_text() and one != two  # heatmaps of the seed's weights


def test_without_a_renderer_the_html_report_names_the_diagrams_extra_before_running(no_renderer, tmp_path):
    done = tracer_cli("render", PIPELINES / "causal_mha.yaml", "-o", tmp_path / "r.html")
    assert done.returncode == 1 and done.stderr.count("\n") == 1
    assert "error[no-renderer]: cannot render the html report" in done.stderr
    assert "pip install 'attention-tracer[diagrams]'" in done.stderr and list(tmp_path.iterdir()) == []


def test_run_collapse_shows_a_group_as_one_row_with_its_totals(monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")  # wide enough that no id is elided
    trace = tracer.load(PIPELINES / "causal_mha.yaml").run()
    done = tracer_cli("run", PIPELINES / "causal_mha.yaml", "--collapse", "attention core", "-q")
    assert done.returncode == 0, done.stderr
    rows = {line.split("  ")[0]: line for line in done.stdout.splitlines()}
    inside = [r for r in trace.records if trace.analysis.producer(r.id) and trace.analysis.producer(r.id).step.group == "attention core"]
    assert [r.id for r in inside] == ["k_t", "scores", "masked", "scaled", "weights", "weights_d", "context"]
    assert not any(r.id in rows for r in inside) and "attention core" in rows
    row = rows["attention core"].split()
    assert row[2:4] == ["collapsed", "(B,"] and f"{sum(r.flops for r in inside) / 1000:.2f}K" in row  # the group's FLOPs, summed
    assert "q_h" in rows and "out" in rows  # the other groups stay as they were


def test_run_collapse_of_an_unknown_group_is_a_located_error_before_the_run():
    done = tracer_cli("run", PIPELINES / "causal_mha.yaml", "--collapse", "atention core")
    assert done.returncode == 1 and done.stdout == ""
    assert "error[unknown-group]: --collapse 'atention core': no step has that group (groups: 'Q projection'" in done.stderr
