"""``tracer check``'s cache (tracer/checkcache.py): a hit prints exactly what checking prints, and
any change to what the check read or to how it was asked misses."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from tests.conftest import PIPELINES, ROOT, tracer_cli
from tracer import checkcache, checking

FILES = {  # clean, warnings, an error, a block file, invalid YAML
    "causal_mha.yaml": PIPELINES / "causal_mha.yaml",
    "scale_mismatch.yaml": PIPELINES / "lint_examples" / "scale_mismatch.yaml",
    "view_non_contiguous.yaml": PIPELINES / "lint_examples" / "view_non_contiguous.yaml",
    "encoder_block.yaml": PIPELINES / "encoder_block.yaml",
    "blocks/encoder_layer.yaml": PIPELINES / "blocks" / "encoder_layer.yaml",
}


@pytest.fixture
def project(tmp_path, monkeypatch):
    """A folder holding a few pipelines, as the current folder; the cache in its .tracer_cache/."""
    for name, source in FILES.items():
        (tmp_path / name).parent.mkdir(exist_ok=True)
        shutil.copy(source, tmp_path / name)
    (tmp_path / "broken.yaml").write_text("name: broken\nsteps: [\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv(checkcache.DIR_ENV, raising=False)
    monkeypatch.delenv(checkcache.OFF_ENV, raising=False)
    return tmp_path


CHECKED = ["causal_mha.yaml", "scale_mismatch.yaml", "view_non_contiguous.yaml", "encoder_block.yaml", "broken.yaml"]


def check(*argv):
    return tracer_cli("check", *argv)


def entries(project: Path) -> list[Path]:
    return sorted(project.glob(".tracer_cache/check-*/*.json"))


def test_a_hit_prints_what_checking_printed(project, monkeypatch):
    cold = check(*CHECKED, "--no-cache")
    assert cold.returncode == 1 and "error[view-non-contiguous]" in cold.stderr and "warning[scale-mismatch]" in cold.stderr
    assert "broken.yaml:3:1: error[yaml-syntax]" in cold.stderr
    assert not (project / ".tracer_cache").exists()
    assert check(*CHECKED) == cold  # stored
    assert len(entries(project)) == len(CHECKED)
    assert (project / ".tracer_cache" / ".gitignore").read_text().endswith("*\n")
    monkeypatch.setattr(checking, "check_file", None)  # a hit checks nothing: this would be exit 3
    assert check(*CHECKED) == cold


def test_a_hit_with_rank_prints_the_rank_table(project, monkeypatch):
    shutil.copy(PIPELINES / "parallel" / "dp_tp.yaml", project / "tp.yaml")
    cold = check("tp.yaml", "--rank", "1")
    assert cold.returncode == 0 and cold.stdout
    monkeypatch.setattr(checking, "check_file", None)
    assert check("tp.yaml", "--rank", "1") == cold


def test_an_edit_of_the_same_size_and_time_misses(project):
    path = project / "causal_mha.yaml"
    assert check("causal_mha.yaml").returncode == 0
    before, text = path.stat(), path.read_text()
    edited = text.replace("op: softmax", "op: softmay", 1)
    assert len(edited) == len(text) and edited != text
    path.write_text(edited)
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert (path.stat().st_size, path.stat().st_mtime_ns) == (before.st_size, before.st_mtime_ns)
    again = check("causal_mha.yaml")
    assert again.returncode == 1 and "unknown op 'softmay'" in again.stderr
    assert again == check("causal_mha.yaml", "--no-cache")


def test_an_edited_block_file_misses(project):
    assert check("encoder_block.yaml").returncode == 0
    block = project / "blocks" / "encoder_layer.yaml"
    block.write_text(block.read_text().replace("op: softmax", "op: softmaxx", 1))
    edited = check("encoder_block.yaml")
    assert edited.returncode == 1 and "blocks/encoder_layer.yaml" in edited.stderr and "unknown op 'softmaxx'" in edited.stderr
    assert edited == check("encoder_block.yaml", "--no-cache")


def test_a_missing_block_file_is_never_stored(project):
    (project / "blocks" / "encoder_layer.yaml").rename(project / "later.yaml")
    assert "error[block-missing]" in check("encoder_block.yaml").stderr
    (project / "later.yaml").rename(project / "blocks" / "encoder_layer.yaml")
    assert check("encoder_block.yaml").returncode == 0


@pytest.mark.parametrize("option", [["--strict"], ["--dim", "T=5"], ["--rank", "0"]])
def test_another_option_misses(project, option):
    assert check("scale_mismatch.yaml").returncode == 0
    with_option = check("scale_mismatch.yaml", *option)
    assert with_option == check("scale_mismatch.yaml", *option, "--no-cache")
    if option == ["--strict"]:
        assert with_option.returncode == 1 and "error[scale-mismatch]" in with_option.stderr


def test_another_folder_misses(project, monkeypatch):
    """Block files are named relative to the current folder: the same file checked from elsewhere."""
    block = project / "blocks" / "encoder_layer.yaml"
    block.write_text(block.read_text().replace("op: softmax", "op: softmaxx", 1))
    file = str(project / "encoder_block.yaml")
    assert "\nblocks/encoder_layer.yaml:" in "\n" + check(file).stderr
    (project / "sub").mkdir()
    monkeypatch.chdir(project / "sub")
    monkeypatch.setenv(checkcache.DIR_ENV, str(project / ".tracer_cache"))
    elsewhere = check(file)
    assert f"\n{block}:" in "\n" + elsewhere.stderr and elsewhere == check(file, "--no-cache")


@pytest.mark.parametrize(
    "damage",
    [b"", b"{not json", b"[]", b"[" * 100_000, b'{"key": 1}', "foreign", "bad reads", "bad printed", "fifo"],
    ids=["empty", "not-json", "a-list", "too-deep", "wrong-key", "foreign", "bad-reads", "bad-printed", "fifo"],
)
def test_a_damaged_or_foreign_entry_is_a_miss(project, damage):
    cold = check(*CHECKED)
    stored = entries(project)
    for path in stored:
        entry = json.loads(path.read_bytes())
        if damage == "foreign":  # another file's entry, whole and valid, under this name
            other = json.loads(stored[(stored.index(path) + 1) % len(stored)].read_bytes())
            path.write_text(json.dumps(other))
        elif damage == "bad reads":
            path.write_text(json.dumps({**entry, "reads": [["x", 1, None]]}))
        elif damage == "bad printed":
            path.write_text(json.dumps({**entry, "printed": [["tty", "ok"]]}))
        elif damage == "fifo":  # reading it must not wait for a writer
            path.unlink()
            os.mkfifo(path)
        else:
            path.write_bytes(damage)
    again = check(*CHECKED)
    assert again == cold and "Traceback" not in again.stderr


def test_no_cache_and_the_environment_turn_it_off(project, monkeypatch):
    assert check("causal_mha.yaml", "--no-cache").returncode == 0
    monkeypatch.setenv(checkcache.OFF_ENV, "1")
    assert check("causal_mha.yaml").returncode == 0
    assert not (project / ".tracer_cache").exists()


def test_a_cache_folder_that_cannot_be_written_is_no_error(project, monkeypatch):
    (project / "taken").write_text("a file, not a folder")
    monkeypatch.setenv(checkcache.DIR_ENV, str(project / "taken" / "cache"))
    assert check(*CHECKED) == check(*CHECKED, "--no-cache")


def test_a_current_folder_that_is_gone_checks_uncached(tmp_path):
    """os.getcwd() fails in a removed folder: the check runs, without a cache and without a traceback."""
    gone = tmp_path / "gone"
    gone.mkdir()
    code = (
        f"import os, sys; sys.modules['torch'] = None; os.chdir({str(gone)!r}); os.rmdir({str(gone)!r}); "
        f"from tracer.cli import main; sys.exit(main(['check', {str(FILES['scale_mismatch.yaml'])!r}]))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0 and "warning[scale-mismatch]" in done.stderr and "Traceback" not in done.stderr


def test_the_cache_folder_moves_with_the_environment(project, monkeypatch):
    monkeypatch.setenv(checkcache.DIR_ENV, str(project / "elsewhere"))
    check("causal_mha.yaml")
    assert len(list((project / "elsewhere").glob("check-*/*.json"))) == 1 and not (project / ".tracer_cache").exists()


def test_another_version_of_tracer_replaces_the_entries(project, monkeypatch):
    check("causal_mha.yaml")
    monkeypatch.setattr(checkcache, "_fingerprint", lambda: "f" * 64)
    check("causal_mha.yaml")
    assert [p.name for p in (project / ".tracer_cache").glob("check-*")] == ["check-" + "f" * 16]


def test_only_tracers_own_folders_are_replaced(project):
    mine = project / ".tracer_cache" / "check-notes"
    mine.mkdir(parents=True)
    (mine / "todo.txt").write_text("keep me")
    check("causal_mha.yaml")
    assert (mine / "todo.txt").read_text() == "keep me"


def test_concurrent_writers_leave_whole_entries(project):
    """Threads storing and reading one entry at once: every read is a miss or one whole result."""
    cache = checkcache.CheckCache({"strict": False})
    data = (project / "causal_mha.yaml").read_bytes()
    results = [checkcache.Checked((("err", f"line {i}" * 500),), i % 2 == 0, (("causal_mha.yaml", data),)) for i in range(8)]
    seen, errors = [], []

    def write_and_read(result):
        try:
            for _ in range(20):
                cache.put("causal_mha.yaml", result)
                seen.append(cache.get("causal_mha.yaml"))
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=write_and_read, args=(r,)) for r in results]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    whole = {(r.printed, r.failed) for r in results}
    assert not errors and seen and all((s.printed, s.failed) in whole for s in seen if s is not None)
    assert not list(project.glob(".tracer_cache/check-*/.*.tmp"))


def test_a_fully_cached_check_imports_no_file_format(project):
    assert check(*CHECKED).returncode == 1
    code = (
        "import sys; sys.modules['torch'] = None; from tracer.cli import main; code = main(sys.argv[1:]); "
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('pydantic', 'yaml') or m.startswith(('tracer.steps', 'tracer.analysis'))), file=sys.stderr); "
        "sys.exit(code)"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, "check", *CHECKED],
        capture_output=True,
        text=True,
        cwd=project,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    *printed, modules = done.stderr.splitlines()
    assert modules == "[]"
    assert (done.returncode, "\n".join(printed) + "\n") == (1, check(*CHECKED, "--no-cache").stderr)
