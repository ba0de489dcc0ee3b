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

import glob
import warnings
from pathlib import Path

import pytest

from .api import load
from .core.errors import TracerError
from .spec.source import read_document
from .testing import trace_pipeline  # noqa: F401  (fixture)

SUFFIXES = (".yaml", ".yml")
_FILES = pytest.StashKey[frozenset]()


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
        config.args.extend(str(path) for path in files if not config.hook.pytest_ignore_collect(collection_path=path, config=config))


def _matching_files(config: pytest.Config) -> list[Path]:
    """Command-line globs are relative to where pytest started, the ini file's to its folder (the rootdir)."""
    here, root = config.invocation_params.dir, config.rootpath
    patterns = [(here, p) for p in config.getoption("tracer_pipelines")] + [(root, p) for p in config.getini("tracer_pipelines")]
    found: dict[Path, None] = {}
    for base, pattern in patterns:
        full = pattern if Path(pattern).is_absolute() else str(base / pattern)
        for name in sorted(glob.glob(full, recursive=True)):
            path = Path(name).resolve()
            if path.is_file() and path.suffix in SUFFIXES:
                found[path] = None
    return list(found)


def pytest_collect_file(file_path: Path, parent: pytest.Collector) -> pytest.Collector | None:
    if file_path.suffix not in SUFFIXES:
        return None
    if file_path.resolve() in parent.config.stash[_FILES] or parent.session.isinitpath(file_path):
        return PipelineFile.from_parent(parent, path=file_path)
    return None


class PipelineFile(pytest.File):
    def collect(self):
        yield PipelineItem.from_parent(self, name=_pipeline_name(self.path))


def _pipeline_name(path: Path) -> str:
    """The file's ``name:`` as the item's name; the file's stem when it has none usable in a node id
    (the file is not loaded here: a broken one is collected, and fails when it runs)."""

    try:
        data, _ = read_document(path)
    except TracerError:
        return path.stem
    name = data.get("name") if isinstance(data, dict) else None
    usable = isinstance(name, str) and name.strip() and name.isprintable() and "::" not in name and "/" not in name
    return name.strip() if usable else path.stem


class PipelineItem(pytest.Item):
    def runtest(self) -> None:
        __tracebackhide__ = True  # a failure is the pipeline's located message, not tracer's frames

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
