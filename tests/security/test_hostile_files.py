"""Hostile pipeline files: each is refused fast, with a located one-line error, and runs nothing."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

import tracer
from tests.conftest import FAST, PIPELINES, ROOT, including, refused, tracer_cli
from tracer.core.errors import TracerError


@pytest.mark.parametrize(
    "name, code, included",
    [
        ("fifo.yaml", "file-unreadable", "file-unreadable"),
        ("zero.yaml", "file-unreadable", "block-use"),
        ("huge.yaml", "file-too-large", "file-too-large"),
    ],
)
def test_special_and_huge_files_are_refused_before_reading(special_files, name, code, included):
    with pytest.raises(TracerError) as info:
        tracer.load(special_files / name)
    assert info.value.code == code
    (special_files / "inc.yaml").write_text(including(name))
    with pytest.raises(TracerError) as info:
        tracer.load(special_files / "inc.yaml")
    assert included in {d.code for d in info.value.diagnostics}
    assert str(info.value).splitlines()[-1].startswith(f"{special_files / 'inc.yaml'}:4:")


@pytest.mark.parametrize(
    "where, line",
    [
        ('name: "bad\\e[31mname"', 1),
        ('name: ok\nnote: "\\x01"', 2),
        ('name: "two\\nlines"', 1),
        ('name: ok\nsteps:\n  - {id: y, op: softmax, dim: -1, group: "g\\0"}', 3),
        ('name: ok\nsteps:\n  - {id: y, op: "lin\\eear"}', 3),
        ('name: ok\ndescription: "\\u202eevil"', 2),
    ],
)
def test_control_characters_are_refused_where_they_stand(tmp_path, where, line):
    path = tmp_path / "p.yaml"
    path.write_text(
        where + "\ninputs: {x: {shape: [2], init: randn}}\n" + ("" if "steps" in where else "steps:\n  - {id: y, op: softmax, dim: -1}\n")
    )
    with pytest.raises(TracerError) as info:
        tracer.load(path)
    assert info.value.code == "control-character"
    assert str(info.value).startswith(f"{path}:{line}:")
    assert str(info.value).isprintable()


GOOD = (PIPELINES / "causal_mha.yaml").read_text()


def with_dims(extra: str) -> str:
    return GOOD.replace("  Dh: d_model // H  # head width: each head sees Dh of the d_model features", f"  Dh: d_model // H\n{extra}")


PYTHON_TAGS = [
    "!!python/object/apply:os.system ['touch {marker}']",
    "!!python/object/new:subprocess.Popen [['touch', '{marker}']]",
    "!!python/name:os.system",
    "!!python/module:os",
    "!<tag:yaml.org,2002:python/object/apply:os.system> ['touch {marker}']",
    "!!python/object:builtins.dict {{}}",
]


def _block_file(folder: Path, use: str, name: str = "main.yaml") -> Path:
    path = folder / name
    path.write_text(
        f"name: main\ndims: {{T: 2}}\ninputs:\n  x: {{shape: [T], init: randn}}\nsteps:\n  - {{id: b, op: block, use: {use!r}, input: x}}\n"
    )
    return path


LEAVING = [
    "../outside.yaml",
    "sub/../../outside.yaml",
    "/etc/passwd",
    "~/.bashrc",
    "C:/x.yaml",
    "\\\\server\\share\\x.yaml",
    "/dev/zero",
    "/proc/self/environ",
    "a\x00b.yaml",
    "..",
    "link_out.yaml",
]


@pytest.mark.parametrize("tag", PYTHON_TAGS)
@pytest.mark.parametrize(
    "where",
    [
        "name: {value}\nsteps: []\n",
        "name: x\ndims: {{T: {value}}}\nsteps: []\n",
        "name: x\nsteps:\n  - {{id: a, op: relu, input: {value}}}\n",
    ],
)
def test_python_tags_are_refused_and_never_run(tag, where, tmp_path):
    marker = tmp_path / "pwned"
    error = refused(where.format(value=tag.format(marker=marker)), tmp_path)
    assert error.code in ("yaml-tag", "yaml-syntax"), str(error)  # in a flow mapping some tags are not even YAML
    assert not marker.exists()


@pytest.mark.parametrize("tag", ["!!binary aGk=", "!!set {a, b}", "!!omap [{a: 1}]", "!!timestamp 2001-12-14", "!custom x"])
def test_non_plain_tags_are_refused(tag, tmp_path):
    refused(f"name: x\ndescription: {tag}\nsteps: []\n", tmp_path, "yaml-tag")


def test_alias_bomb_is_refused_before_expanding(tmp_path):
    lines = ["name: x", "steps: []", "a0: &a0 [lol, lol, lol, lol, lol, lol, lol, lol, lol]"]
    lines += [f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 9) + "]" for i in range(1, 10)]  # 9**10 values
    refused("\n".join(lines) + "\n", tmp_path, "yaml-too-large")


def test_self_referencing_alias_is_refused(tmp_path):
    refused("name: x\nsteps: &s [*s]\n", tmp_path)


def test_merge_keys_are_refused(tmp_path):
    refused(
        "base: &b {shape: [2], init: randn}\nname: x\ninputs:\n  a: {<<: *b}\nsteps: [{id: r, op: relu, input: a}]\n",
        tmp_path,
        "yaml-merge-key",
    )


@pytest.mark.parametrize("opener, closer", [("[", "]"), ("{a: ", "}"), ("- ", "")])
def test_deep_nesting_is_refused_without_crashing_the_process(opener, closer, tmp_path):
    """10**5 levels: PyYAML's C composer would overflow the C stack (a segfault), libyaml is
    quadratic on deep flow nesting; the event stream is cut off at the first level too many."""
    n = 100_000
    prefix = "" if opener == "- " else "a: "
    path = tmp_path / "deep.yaml"
    path.write_text(prefix + opener * n + "1" + closer * n)
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "tracer", "check", str(path)], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert time.monotonic() - started < 30
    assert done.returncode == 1, done.stderr[-2000:]
    assert "yaml-too-deep" in done.stderr and done.stderr.startswith(f"{path}:1:")


def test_nesting_just_inside_the_limit_loads(tmp_path):
    depth = 60
    text = "name: x\nnote: " + "[" * depth + "]" * depth + "\nsteps: []\n"
    error = refused(text, tmp_path)  # it loads: the errors are the schema's, not the depth's
    assert "yaml-too-deep" not in {d.code for d in error.diagnostics}


def test_very_long_file_is_refused_before_parsing(tmp_path):
    refused("name: x\nsteps: []\n" + "# padding\n" * 500_000, tmp_path, "file-too-large")


def test_very_long_line_is_refused(tmp_path):
    refused("name: " + "x" * 3_000_000 + "\nsteps: [{id: a, op: relu, input: a}]\n", tmp_path, "invalid-value")


def test_very_long_number_is_refused_before_converting(tmp_path):
    """YAML 1.1 base-60 ints ('59:59:59...') cost quadratic time to convert."""
    refused("name: x\nseed: " + ":".join(["59"] * 200_000) + "\nsteps: []\n", tmp_path, "yaml-value")


@pytest.mark.parametrize(
    "data, code",
    [
        (b"name: x\x00\nsteps: []\n", "file-binary"),
        (b"name: \xff\xfe\nsteps: []\n", "file-binary"),
        (b"name: a\x07b\nsteps: []\n", "yaml-syntax"),
        ("name: a\u0085b\nsteps: []\n".encode(), None),
        (b"\xef\xbb\xbf", "empty-file"),
        (b"---\nname: a\n---\nname: b\n", "yaml-multi-doc"),
    ],
)
def test_binary_and_control_characters_give_one_located_line(data, code, tmp_path):
    refused(data, tmp_path, code)


def test_user_text_with_line_breaks_stays_on_one_line(tmp_path):
    error = refused(with_dims('  E: "T\\nT\\r\\u2028x"'), tmp_path, "control-character")
    assert len(str(error).splitlines()) == len(error.diagnostics)


def test_huge_and_odd_scalars_in_keys_and_values(tmp_path):
    refused("!!int notanumber: 1\nname: x\nsteps: []\n", tmp_path, "yaml-key")
    refused("name: x\nseed: !!bool maybe\nsteps: []\n", tmp_path, "yaml-value")
    refused("name: x\nseed: 99999999999999999999999\nsteps: []\n", tmp_path, "invalid-value")


def test_values_far_larger_than_the_shape_are_refused_before_any_tensor(tmp_path):
    big = "name: x\ninputs:\n  a: {shape: [2], values: [" + ",".join(["1"] * 90_000) + "]}\nsteps:\n  - {id: b, op: relu, input: a}\n"
    error = refused(big, tmp_path, "tensor-source")
    assert "declared shape is [2]" in str(error)


def test_values_beyond_the_document_limit_are_refused_while_parsing(tmp_path):
    huge = "name: x\ninputs:\n  a: {shape: [2], values: [" + ",".join(["1"] * 1_500_000) + "]}\nsteps:\n  - {id: b, op: relu, input: a}\n"
    refused(huge, tmp_path, "yaml-too-large")


def test_values_of_the_wrong_kind(tmp_path):
    refused("name: x\ninputs:\n  a: {shape: [2], values: [1, x]}\nsteps: [{id: b, op: relu, input: a}]\n", tmp_path, "invalid-value")
    refused(
        "name: x\ninputs:\n  a: {shape: [1], values: " + "[" * 20 + "1" + "]" * 20 + "}\nsteps: [{id: b, op: relu, input: a}]\n",
        tmp_path,
        "invalid-value",
    )


@pytest.mark.parametrize("use", LEAVING)
def test_includes_cannot_leave_the_pipeline_folder(use, tmp_path):
    folder = tmp_path / "project"
    folder.mkdir()
    (tmp_path / "outside.yaml").write_text(
        "name: outside\ndims: {T: 2}\ninputs:\n  x: {shape: [T], init: randn}\nsteps:\n  - {id: y, op: relu}\n"
    )
    (folder / "link_out.yaml").symlink_to(tmp_path / "outside.yaml")
    path = _block_file(folder, use)
    started = time.process_time()
    with pytest.raises(TracerError) as info:
        tracer.load(path)
    assert time.process_time() - started < FAST
    assert info.value.diagnostics[0].file == str(path), str(info.value)
    assert info.value.code in ("block-use", "block-missing", "invalid-value"), str(info.value)
    assert "outside" not in {d.file for d in info.value.diagnostics}


def test_include_cycles_are_refused(tmp_path):
    _block_file(tmp_path, "b.yaml", "a.yaml")
    _block_file(tmp_path, "a.yaml", "b.yaml")
    with pytest.raises(TracerError, match="block-cycle"):
        tracer.load(tmp_path / "a.yaml")


def test_include_bomb_is_refused(tmp_path):
    """Each file includes the next one twice: 2**24 steps if expanded."""
    for i in range(24):
        (tmp_path / f"b{i}.yaml").write_text(
            f"name: b{i}\ndims: {{T: 2}}\ninputs:\n  x: {{shape: [T], init: randn}}\nsteps:\n"
            f"  - {{id: a, op: block, use: b{i + 1}.yaml, input: x}}\n"
            f"  - {{id: b, op: block, use: b{i + 1}.yaml, input: a}}\n"
        )
    (tmp_path / "b24.yaml").write_text("name: leaf\ndims: {T: 2}\ninputs:\n  x: {shape: [T], init: randn}\nsteps:\n  - {id: a, op: relu}\n")
    started = time.process_time()
    with pytest.raises(TracerError, match="block-too-(large|deep)"):
        tracer.load(tmp_path / "b0.yaml")
    assert time.process_time() - started < 30


def test_repeat_bomb_is_refused(tmp_path):
    (tmp_path / "leaf.yaml").write_text(
        "name: leaf\ndims: {T: 2}\ninputs:\n  x: {shape: [T], init: randn}\nsteps:\n  - {id: a, op: relu}\n"
    )
    (tmp_path / "mid.yaml").write_text(
        "name: mid\ndims: {T: 2}\ninputs:\n  x: {shape: [T], init: randn}\nsteps:\n"
        "  - {id: a, op: block, use: leaf.yaml, input: x, repeat: 10000}\n"
    )
    (tmp_path / "top.yaml").write_text(
        "name: top\ndims: {T: 2}\ninputs:\n  x: {shape: [T], init: randn}\nsteps:\n"
        "  - {id: a, op: block, use: mid.yaml, input: x, repeat: 10000}\n"
    )
    started = time.process_time()
    with pytest.raises(TracerError, match="block-too-large"):
        tracer.load(tmp_path / "top.yaml")
    assert time.process_time() - started < FAST


@pytest.mark.parametrize(
    "text",
    [
        "name: !!python/object/apply:os.system ['true']\nsteps: []\n",
        "a: " + "[" * 5000 + "]" * 5000,
        "name: x\ndims: {T: '__import__(\"os\")'}\nsteps: []\n",
        "name: x\ndims: {T: 99999999999999999999}\nsteps: []\n",
    ],
)
def test_cli_refuses_hostile_files_with_exit_1_and_no_traceback(text, tmp_path):
    path = tmp_path / "p.yaml"
    path.write_text(text)
    for argv in (["check", str(path)], ["run", str(path), "--device", "meta", "--json"]):
        done = tracer_cli(*argv)
        assert done.returncode == 1, done.stderr
        assert "Traceback" not in done.stderr and "internal error" not in done.stderr
        assert all(line.startswith(str(path)) for line in done.stderr.splitlines()), done.stderr


@pytest.mark.long
def test_the_cli_never_reads_environment_or_imports_from_the_file(tmp_path, monkeypatch):
    """A file cannot name modules, environment variables or shell commands: such text is data.

    The name carries a payload that creates a file if a shell ever sees it (shown with sh first,
    so the check can fail); it goes through every command, `render` included, which starts Graphviz.
    Everything runs in tmp_path, where the payload's relative path would land."""
    monkeypatch.chdir(tmp_path)
    marker = tmp_path / "pwned"
    payload = "$(touch pwned) ${HOME} `touch pwned`"
    subprocess.run(["sh", "-c", f"echo {payload}"], check=True, capture_output=True, cwd=tmp_path)
    assert marker.exists()
    marker.unlink()
    path = tmp_path / "p.yaml"
    path.write_text(GOOD.replace("name: causal_mha", f"name: {json.dumps(payload)}"))
    done = tracer_cli("run", path, "--device", "meta")
    assert done.returncode == 0, done.stderr
    assert payload in done.stdout
    pictures = ["d.dot", "d.svg"] if shutil.which("dot") else ["d.dot"]  # .svg: Graphviz runs on the name
    for argv in (["check", path], *(["render", path, "-o", tmp_path / name] for name in pictures)):
        done = tracer_cli(*argv)
        assert done.returncode == 0, done.stderr
    assert payload in (tmp_path / "d.dot").read_text()
    assert not marker.exists()
