"""pytest plugin: pipeline files as test items, and the ``trace_pipeline`` fixture.

``pytest --tracer-pipelines='pipelines/**/*.yaml'`` (or ``tracer_pipelines`` in the ini file) makes
each matching file a test item with the node id ``FILE::NAME`` (``NAME`` is the pipeline's
``name:``). The item checks the file statically, runs it on the CPU and enforces its ``expect:``
block; a failure is reported as the pipeline's own ``FILE:LINE:COL: error[CODE]: …`` message, and
each lint becomes a ``PipelineWarning`` located at its line.

Items are collected like any test: ``--collect-only`` lists and counts them, ``-k`` and node ids
select them, ``--ignore-glob``/``--deselect`` leave files out. When paths are named on the command
line only those are collected (``pytest tests/test_x.py`` runs no pipeline; ``pytest
pipelines/causal_mha.yaml`` runs that one); with none named, the matching files join the default
test paths. Nothing is collected unless asked.
"""

from __future__ import annotations

import fnmatch
import os
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest

from .core.errors import TracerError, printable
from .testing import trace_pipeline  # noqa: F401  (fixture)

SUFFIXES = (".yaml", ".yml")
_FILES = pytest.StashKey[frozenset]()
_ARGUMENT_SYNTAX = ("[", "]", "::")
MAX_VISITED = 200_000  # entries one pattern may look at: a whole source tree is far fewer


class PipelineWarning(UserWarning):
    """A lint of a collected pipeline (``-W error::tracer.pytest_plugin.PipelineWarning`` makes lints fail)."""


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("tracer")
    group.addoption(
        "--tracer-pipelines",
        action="append",
        default=[],
        metavar="GLOB",
        help="collect every pipeline file matching GLOB as a test item: check, run, enforce expect: (repeatable)",
    )
    parser.addini("tracer_pipelines", type="linelist", default=[], help="globs of pipeline files to collect as test items")


def pytest_configure(config: pytest.Config) -> None:
    files = _matching_files(config)
    config.stash[_FILES] = frozenset(files)
    if config.args_source != pytest.Config.ArgsSource.ARGS:  # no paths named: the pipelines join the default ones
        config.args.extend(str(path) for path in _named_by_path(config, files))


def _named_by_path(config: pytest.Config, files: list[Path]) -> list[Path]:
    """The files pytest can be given as arguments: it reads ``[...]`` and ``::`` in an argument as a
    test's parameters and name, so a file whose path holds them is left to its folder's collection,
    with one warning, instead of aborting the session."""
    named = []
    for path in files:
        if any(mark in str(path) for mark in _ARGUMENT_SYNTAX):
            message = f"{printable(path)}: pytest reads [, ] and :: in an argument as test ids, so this file is collected only with its folder; rename it to collect it alone"
            config.issue_config_time_warning(PipelineWarning(message), stacklevel=2)
        elif not config.hook.pytest_ignore_collect(collection_path=path, config=config):
            named.append(path)
    return named


def _matching_files(config: pytest.Config) -> list[Path]:
    """Command-line globs are relative to where pytest started, the ini file's to its folder (the rootdir)."""
    here, root = config.invocation_params.dir, config.rootpath
    patterns = [(here, p) for p in config.getoption("tracer_pipelines")] + [(root, p) for p in config.getini("tracer_pipelines")]
    found: dict[Path, None] = {}
    for base, pattern in patterns:
        for path in _glob(base, pattern):
            if path.suffix in SUFFIXES:
                found[path.resolve()] = None
    return list(found)


def _glob(base: Path, pattern: str) -> Iterator[Path]:
    """The files ``pattern`` matches, visiting each folder once per pattern segment: ``**`` never
    descends through a symlink (``x -> .`` made glob.glob walk 3**40 paths), an absolute pattern
    starts at its anchor, and a walk past MAX_VISITED entries (``/**/*.yaml``) is stopped."""
    anchor = Path(pattern).anchor
    start = Path(anchor) if anchor else base
    parts = Path(pattern).relative_to(anchor).parts if anchor else Path(pattern).parts
    todo, seen, visited = [(start, 0)], set(), 0
    while todo:
        folder, index = todo.pop()
        if (folder, index) in seen or index == len(parts):
            continue
        seen.add((folder, index))
        part, last = parts[index], index == len(parts) - 1
        if not any(c in part for c in "*?["):  # a plain name, '.' or '..': no listing needed
            yield from _plain(folder / part, index, last, todo)
            continue
        if part == "**":
            todo.append((folder, index + 1))
        for entry in _entries(folder, part):
            visited += 1
            if visited > MAX_VISITED:
                raise pytest.UsageError(
                    f"--tracer-pipelines {printable(pattern)!r} visits more than {MAX_VISITED:,} files; narrow the pattern"
                )
            if part == "**":
                if entry.is_dir(follow_symlinks=False):
                    todo.append((Path(entry.path), index))
            elif last and entry.is_file():
                yield Path(entry.path)
            elif not last and entry.is_dir():
                todo.append((Path(entry.path), index + 1))


def _plain(path: Path, index: int, last: bool, todo: list) -> Iterator[Path]:
    if last and path.is_file():
        yield path
    elif not last and path.is_dir():
        todo.append((path, index + 1))


def _entries(folder: Path, part: str) -> list[os.DirEntry]:
    """The entries of ``folder`` that ``part`` may name (hidden ones only when it says so, as glob)."""
    try:
        with os.scandir(folder) as entries:
            return [e for e in entries if part == "**" and not e.name.startswith(".") or part != "**" and _matches(e.name, part)]
    except OSError:  # unreadable, vanished or not a folder: nothing matches there
        return []


def _matches(name: str, part: str) -> bool:
    return fnmatch.fnmatchcase(name, part) and (part.startswith(".") or not name.startswith("."))


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    """A folder symlink to one of its own ancestors (``x -> .``) is left out: pytest's own walk
    follows folder symlinks, and three such links made it walk 3**40 paths before ELOOP."""
    if collection_path.is_symlink() and collection_path.is_dir():
        return collection_path.parent.resolve().is_relative_to(collection_path.resolve()) or None
    return None


def pytest_collect_file(file_path: Path, parent: pytest.Collector) -> pytest.Collector | None:
    if file_path.suffix not in SUFFIXES:
        return None
    if file_path.resolve() in parent.config.stash[_FILES] or parent.session.isinitpath(file_path):
        node = PipelineFile.from_parent(parent, path=file_path)
        shown = printable(node.nodeid)  # a file name's escape sequences never reach the terminal
        return node if shown == node.nodeid else PipelineFile.from_parent(parent, path=file_path, nodeid=shown)
    return None


class PipelineFile(pytest.File):
    def collect(self):
        yield PipelineItem.from_parent(self, name=_pipeline_name(self.path))


def _pipeline_name(path: Path) -> str:
    """The file's ``name:`` as the item's name; the file's stem when it has none usable in a node id
    (the file is not loaded here: a broken one is collected, and fails when it runs)."""
    from .spec.source import read_document  # yaml: only when pipelines are collected

    try:
        data, _ = read_document(path)
    except TracerError:
        return printable(path.stem)
    name = data.get("name") if isinstance(data, dict) else None
    usable = isinstance(name, str) and name.strip() and name.isprintable() and "::" not in name and "/" not in name
    return name.strip() if usable else printable(path.stem)


class PipelineItem(pytest.Item):
    def runtest(self) -> None:
        __tracebackhide__ = True  # a failure is the pipeline's located message, not tracer's frames

        from .api import load  # the file format: only when a pipeline item runs

        trace = load(self._shown_path()).run(device="cpu")
        for lint in trace.analysis.warnings:
            line = lint.position.line if lint.position else 1
            warnings.warn_explicit(str(lint), PipelineWarning, filename=lint.file, lineno=line)

    def _shown_path(self) -> Path:
        """The file as messages name it: relative to where pytest was started, as the user typed it."""
        base = self.config.invocation_params.dir
        return self.path.relative_to(base) if self.path.is_relative_to(base) else self.path

    def repr_failure(self, excinfo, style=None):

        if isinstance(excinfo.value, TracerError | PipelineWarning):
            return str(excinfo.value)
        return super().repr_failure(excinfo, style)

    def reportinfo(self):
        return self.path, None, f"pipeline {self.name}"
