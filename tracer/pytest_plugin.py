"""pytest plugin: ``pytest --tracer-pipelines=GLOB`` turns pipeline files into test items.

Each item checks the file statically, runs it, and enforces its ``expect:`` block; a failure is
reported as ``FILE:LINE:COL: error[CODE]: …``. Nothing is collected unless asked. The plugin also
provides the ``trace_pipeline`` fixture from ``tracer.testing``.
"""

from __future__ import annotations

import glob
from pathlib import Path

import pytest

from .testing import trace_pipeline  # noqa: F401  (fixture)


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("tracer")
    group.addoption(
        "--tracer-pipelines",
        action="append",
        default=[],
        metavar="GLOB",
        help="check, run and enforce expect: of every pipeline file matching GLOB (repeatable)",
    )
    parser.addini("tracer_pipelines", type="linelist", default=[], help="globs of pipeline files to test")


def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config, items: list) -> None:
    patterns = config.getoption("tracer_pipelines") + config.getini("tracer_pipelines")
    base = config.invocation_params.dir
    seen = set()
    for pattern in patterns:
        for name in sorted(glob.glob(str(base / pattern) if not Path(pattern).is_absolute() else pattern, recursive=True)):
            path = Path(name).resolve()
            if path.is_file() and path not in seen:
                seen.add(path)
                items.append(
                    PipelineItem.from_parent(session, name=str(path.relative_to(base) if path.is_relative_to(base) else path), path=path)
                )


class PipelineFailure(Exception):
    pass


class PipelineItem(pytest.Item):
    def __init__(self, *, path: Path, **kwargs):
        super().__init__(path=path, **kwargs)
        self.pipeline_path = path
        self._nodeid = f"{self.name}::tracer"

    def runtest(self) -> None:
        from .api import load
        from .errors import TracerError

        try:
            load(self.pipeline_path).run(device="cpu")
        except TracerError as exc:
            raise PipelineFailure(str(exc)) from None

    def repr_failure(self, excinfo, style=None):
        if isinstance(excinfo.value, PipelineFailure):
            return str(excinfo.value)
        return super().repr_failure(excinfo, style)

    def reportinfo(self):
        return self.pipeline_path, 0, f"tracer pipeline {self.name}"
