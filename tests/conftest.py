import textwrap
from pathlib import Path

import pytest

import tracer

ROOT = Path(__file__).resolve().parent.parent
PIPELINES = ROOT / "pipelines"


KERNEL_TESTED: set[str] = set()  # step kinds with a kernel test against plain torch (see test_architecture)


def covers(*ops: str):
    """Mark a test as the kernel test of these step kinds."""

    def mark(test):
        KERNEL_TESTED.update(ops)
        return test

    return mark


def pipeline_text(body: str, dims: str = "", inputs: str = "", params: str = "") -> str:
    """A small pipeline file around some steps (each argument is YAML at the section's indent)."""
    parts = ["name: t"]
    for section, text in (("dims", dims), ("inputs", inputs), ("params", params), ("steps", body)):
        if text.strip():
            parts.append(f"{section}:\n" + textwrap.indent(textwrap.dedent(text).strip("\n"), "  "))
    return "\n".join(parts) + "\n"


@pytest.fixture
def write(tmp_path):
    """Write a pipeline file and return its path."""

    def _write(text: str, name: str = "p.yaml") -> Path:
        path = tmp_path / name
        path.write_text(textwrap.dedent(text))
        return path

    return _write


def run_text(text: str, **kwargs):
    return tracer.loads(text, "t.yaml").run(keep_values=True, **kwargs)
