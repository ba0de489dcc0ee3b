"""The package as a user installs it: the wheel built from this tree, installed into a fresh venv in a
folder outside the repository, used from there.

The fresh venv reuses the project venv's packages (torch is gigabytes) through a path file, which
adds that folder without running its own path files: the project's editable install of tracer
stays invisible, so what runs is the wheel's copy. Marked ``dist``: a plain ``pytest`` leaves it out,
`make test` runs it beside the rest of the suite, ``pytest -m dist`` alone. One test, so that
pytest-xdist builds the wheel once.
"""

import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from tests.conftest import PIPELINES, ROOT
from tracer.docgen import PACKAGED_SCHEMA

pytestmark = pytest.mark.dist

ENV = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # nothing of the checkout on the path


def _run(*argv, cwd: Path) -> subprocess.CompletedProcess:
    done = subprocess.run([str(a) for a in argv], cwd=cwd, env=ENV, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, f"{argv}: {done.stderr[-2000:]}"
    return done


def _source_tree(dest: Path) -> Path:
    """The files a fresh clone has (tracked, plus new files not ignored), without build leftovers."""
    names = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT, capture_output=True, check=True
    ).stdout.decode()
    for name in filter(None, names.split("\0")):
        if (ROOT / name).is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, dest / name)
    return dest


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    """The fresh venv's bin folder, with the wheel installed."""
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("needs the git checkout to know its files")
    work = tmp_path_factory.mktemp("dist")
    source = _source_tree(work / "src")
    _run(sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", work / "wheels", source, cwd=work)
    (wheel,) = (work / "wheels").glob("attention_tracer-*.whl")
    venv = work / "venv"
    _run(sys.executable, "-m", "venv", "--without-pip", venv, cwd=work)
    purelib = Path(_run(venv / "bin/python", "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])", cwd=work).stdout.strip())
    (purelib / "_project_venv.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    _run(sys.executable, "-m", "pip", "--python", venv / "bin/python", "install", "-q", "--no-deps", "--no-index", wheel, cwd=work)
    return venv / "bin"


def test_the_wheel_installs_works_outside_the_repo_and_carries_license_types_and_assets(installed, tmp_path):
    shutil.copy(PIPELINES / "causal_mha.yaml", tmp_path)
    where = _run(installed / "python", "-c", "import tracer; print(tracer.__file__)", cwd=tmp_path).stdout
    assert Path(where).is_relative_to(installed.parent), where
    assert _run(installed / "tracer", "--version", cwd=tmp_path).stdout.startswith("tracer 0.")
    assert _run(installed / "tracer", "check", "causal_mha.yaml", cwd=tmp_path).stderr == ""
    _run(installed / "tracer", "render", "causal_mha.yaml", "-o", "x.dot", cwd=tmp_path)
    assert (tmp_path / "x.dot").read_text().startswith("digraph pipeline")
    _run(installed / "tracer", "render", "causal_mha.yaml", "-o", "x.html", cwd=tmp_path)
    assert "attentionSection" in (tmp_path / "x.html").read_text()  # the report's script came from the wheel
    assert _run(installed / "tracer", "schema", cwd=tmp_path).stdout == PACKAGED_SCHEMA.read_text()
    shipped = Path(_run(installed / "tracer", "schema", "--path", cwd=tmp_path).stdout.strip())
    assert shipped.is_relative_to(installed.parent) and shipped.read_text() == PACKAGED_SCHEMA.read_text()
    _carries_license_types_and_assets(Path(where).parent)


def _carries_license_types_and_assets(package: Path) -> None:
    assets = package / "presentation" / "report_assets"
    assert (package / "py.typed").exists() and {"report.js", "report.css"} <= {f.name for f in assets.iterdir()}
    (info,) = package.parent.glob("attention_tracer-*.dist-info")
    assert "MIT License" in (info / "licenses/LICENSE").read_text()
    assert "License-Expression: MIT" in (info / "METADATA").read_text()
