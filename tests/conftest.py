import atexit
import contextlib
import functools
import io
import os
import re
import shutil
import sys
import tempfile
import textwrap
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

# pytest-xdist with a worker per core (`make test`: -n auto): each worker's torch runs its kernels on
# one thread, as do the child processes the tests start (they inherit the variable). With torch's
# default of a thread per core, the workers' OpenMP threads outnumber the cores and spin waiting for
# each other: 12% of the suite's CPU time went to that. Read by torch at its import, which comes later.
if int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", 0)) >= len(os.sched_getaffinity(0)):
    os.environ.setdefault("OMP_NUM_THREADS", "1")

import tracer
from tracer.cli import main
from tracer.core.errors import TracerError

pytest_plugins = ["pytester"]  # the pytest plugin's own tests run pytest in this process

# `tracer check` keeps its results in .tracer_cache/ of the current folder: the suite's checks keep
# theirs in a folder of their own, not in the checkout (the cache's own tests choose theirs).
_CHECK_CACHE = tempfile.mkdtemp(prefix="tracer-suite-check-cache-")
os.environ.setdefault("TRACER_CACHE_DIR", _CHECK_CACHE)
atexit.register(shutil.rmtree, _CHECK_CACHE, ignore_errors=True)

ROOT = Path(__file__).resolve().parent.parent
PIPELINES = ROOT / "pipelines"
# Bundled files that are examples of an error, with the one error each must raise. Every other
# bundled file must load: the sweeps over them fail (not skip) on any TracerError.
INVALID_EXAMPLES = {"lint_examples/view_non_contiguous.yaml": "view-non-contiguous"}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Items marked ``long`` (seconds each: a child process, a build) run first. `make test` hands
    the xdist groups (below) to its two pytest-xdist workers first, the largest first, then every
    other item one at a time in collection order; a long item handed out last would keep one worker
    busy while the other has nothing left: started first, the short items that follow even the two
    out. The sort is stable, so each module's items stay in their order. Marked: the long items of
    the folders collected late (tests/analysis, cli, docs, fuzz start early anyway)."""
    items.sort(key=lambda item: item.get_closest_marker("long") is None)
    if config.getoption("loadgroup", False):  # in a pytest-xdist worker, under --dist loadgroup
        _name_groups(items)


def _name_groups(items: list[pytest.Item]) -> None:
    """pytest-xdist tells `--dist loadgroup` an item's xdist_group by a suffix of its node id
    (``path::test[x]@group``), which it writes to a field pytest 9.2 no longer reads (pytest-xdist
    issue 1386): every item went out on its own. The same suffix, set where pytest keeps the id now;
    nothing is done where pytest-xdist's own naming took effect.

    An item without a mark that reads a fixture of module (or class) scope is grouped with its
    module: items handed out one by one alternate between the workers, and a worker tears a module's
    fixtures down whenever its next item is another module's, so a module fixture (a transformers
    model imported, every bundled file exported, a browser started) was built again and again."""
    from _pytest.nodeid import NodeId

    for item in items:
        groups = sorted(
            {str(mark.args[0] if mark.args else mark.kwargs.get("name", "default")) for mark in item.iter_markers("xdist_group")}
        ) or _module_group(item)
        if groups and "@" not in item.nodeid.rpartition("]")[2] and hasattr(item, "_id"):
            item._id = NodeId.parse(f"{item.nodeid}@{'_'.join(groups)}")


def _module_group(item: pytest.Item) -> list[str]:
    """[the item's module] where the item reads a fixture that lives as long as its module or class."""
    fixtures = getattr(item, "_fixtureinfo", None)
    defs = fixtures.name2fixturedefs.values() if fixtures else ()
    shared = any(found and found[-1].scope in ("module", "class") for found in defs)
    return [item.nodeid.partition("::")[0]] if shared else []


# `make test` runs pytest-xdist with `--dist loadgroup`: the items of one xdist_group run in one
# worker (the groups are handed out first, the largest first). The items that launch ranks on
# torch.distributed (`tracer run --world`, `tracer.run_parallel`) are one group: a worker's first
# launch starts multiprocessing's fork server, which imports torch and torch.distributed (6 s of CPU),
# so launches spread over both workers paid for two fork servers.
FORK_SERVER = pytest.mark.xdist_group("fork-server")


def bundled_pipelines() -> list[Path]:
    """Every bundled pipeline file that must load (blocks and seeds included)."""
    found = sorted(PIPELINES.rglob("*.yaml"))
    return [p for p in found if p.relative_to(PIPELINES).as_posix() not in INVALID_EXAMPLES]


def two_copies_of_each_block(path: Path, folder: Path) -> Path:
    """``path``, or where it repeats a block more than twice, a copy with ``repeat: 2`` in a copy of
    its folder (the blocks it uses): for the sweeps whose property holds copy by copy (encoder_stack's
    48 made their longest items); the sweeps over the files as written keep the 48."""
    text = path.read_text(encoding="utf-8")
    fewer = re.sub(r"\brepeat: \d+", "repeat: 2", text)
    if fewer == text:
        return path
    shutil.copytree(path.parent, folder)
    (folder / path.name).write_text(fewer, encoding="utf-8")
    tracer.load(folder / path.name).check()  # it checks at its own dims: a sweep that accepts a refusal would miss a broken copy
    return folder / path.name


@functools.cache
def shared_pipeline(path: Path) -> tracer.Pipeline:
    """A bundled pipeline loaded once per session: its analyses and run plans (per dims and device) are
    cached on it, so the sweeps and tests that read the same file pay for them once. Only for tests
    that neither change it nor patch tracer's internals; tests about loading use ``tracer.load``."""
    return tracer.load(path)


def covering(paths: list[Path]) -> list[Path]:
    """The fewest of ``paths`` (greedily) whose steps, together, use every step kind with every set
    of fields that any of ``paths`` writes (a causal mask, a tensor mask, a windowed one...): for the
    sweeps whose cost is per file, run on every file that brings something no other brings."""
    ignored = {"id", "op", "input", "inputs", "group", "note"}

    def features(path: Path) -> set:
        steps = shared_pipeline(path).spec.steps
        return {(s.op, frozenset(s.model_dump(exclude_unset=True).keys() - ignored)) for s in steps}

    found = {path: features(path) for path in paths}
    left, chosen = set().union(*found.values()), []
    while left:
        best = max(paths, key=lambda p: (len(found[p] & left), -len(found[p])))
        chosen.append(best)
        left -= found[best]
    return sorted(chosen)


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
def _keep_libraries_loaded(monkeypatch):
    """pytester unloads every module that a test or an in-process run imported first. Libraries
    cannot all be imported twice in one process (torch's operator registrations: torch._dynamo is
    imported lazily on a first masked_fill; torch._inductor's artifact registry; C extensions that
    refuse to load twice), so only the modules of the test's own pytester project are unloaded. Its
    folder, not the temporary folder at large: a checkout cloned under /tmp has torch there too."""
    from _pytest.pytester import SysModulesSnapshot

    def snapshot(pytester: pytest.Pytester) -> SysModulesSnapshot:
        project = str(pytester.path)

        def from_elsewhere(name: str) -> bool:
            return not str(getattr(sys.modules.get(name), "__file__", None) or "").startswith(project)

        return SysModulesSnapshot(preserve=from_elsewhere)

    monkeypatch.setattr(pytest.Pytester, "_Pytester__take_sys_modules_snapshot", snapshot)


@pytest.fixture
def pytester(_keep_libraries_loaded, pytester):
    return pytester


@pytest.fixture
def no_renderer(monkeypatch, tmp_path_factory):
    """No program that draws DOT: neither `dot` nor `graphviz-pure` on PATH or beside Python, no TRACER_DOT."""
    programs = ("dot", "graphviz-pure")
    path = [p for p in os.environ.get("PATH", "").split(os.pathsep) if p and not any((Path(p) / n).exists() for n in programs)]
    monkeypatch.setenv("PATH", os.pathsep.join(path))
    monkeypatch.delenv("TRACER_DOT", raising=False)
    empty = str(tmp_path_factory.mktemp("no-scripts"))
    monkeypatch.setattr("tracer.presentation.graphviz.sysconfig.get_path", lambda name: empty)


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


def assert_flops_as_counted(text: str) -> None:
    """Each step's static FLOP count is what torch's FlopCounterMode counts while its kernel runs."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.utils.flop_counter import FlopCounterMode

    counter = FlopCounterMode(display=False)
    running = {}  # record id -> FLOPs counted so far, read right after its step ran
    # the CPU's fused attention kernel has no formula in FlopCounterMode; the math backend's bmms
    # do, and count what its flash and efficient kernels count on a GPU
    with sdpa_kernel(SDPBackend.MATH), counter:
        trace = run_text(text, observe=lambda rid, _: running.setdefault(rid, counter.get_total_flops()))
    analysis, total = trace.analysis, 0
    static = {}
    for record in trace.records:
        total += record.flops
        static[record.id] = total
    ends = [node.outs[-1].id for node in analysis.nodes.values()]
    assert {e: static[e] for e in ends} == {e: running[e] for e in ends}


@dataclass
class Done:
    """What ``tracer ARGV`` did, shaped like ``subprocess.CompletedProcess``."""

    returncode: int
    stdout: str
    stderr: str


def tracer_cli(*argv, cwd: Path | None = None) -> Done:
    """``tracer ARGV`` in this process: the CLI's own behaviour (exit code, output, messages) without
    a Python and torch start-up per call. Tests about the process itself start a real one."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.chdir(cwd or Path.cwd()), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main([str(a) for a in argv])
        except SystemExit as exc:  # argparse: usage errors
            code = exc.code
    return Done(code, out.getvalue(), err.getvalue())


FAST = 3.0  # CPU seconds (not wall clock, so a loaded machine does not fail them); each case takes well under one


def refused(text: str | bytes, tmp_path: Path, code: str | None = None, name: str = "p.yaml") -> TracerError:
    """Load ``text`` from a file: it must raise a located TracerError, fast, one line per diagnostic."""
    path = tmp_path / name
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    started = time.process_time()
    with pytest.raises(TracerError) as info:
        tracer.load(path)
    elapsed = time.process_time() - started
    assert elapsed < FAST, f"took {elapsed:.1f} s to refuse"
    message = str(info.value)
    for line in message.splitlines():
        assert re.match(re.escape(str(path)) + r"(:\d+:\d+)?: error\[", line), line
    if code is not None:
        assert code in {d.code for d in info.value.diagnostics}, message
    return info.value


@pytest.fixture
def special_files(tmp_path):
    """A folder with a FIFO, a link to /dev/zero, a sparse 5 GB file and a blocks/ folder."""
    (tmp_path / "blocks").mkdir()
    os.mkfifo(tmp_path / "fifo.yaml")
    os.symlink("/dev/zero", tmp_path / "zero.yaml")
    with open(tmp_path / "huge.yaml", "wb") as f:  # sparse: 5 GB that occupy no disk
        f.truncate(5 << 30)
    return tmp_path


def including(use: str) -> str:
    return f"name: inc\ninputs: {{x: {{shape: [2], init: randn}}}}\nsteps:\n  - {{id: b, op: block, use: '{use}', input: x}}\n"


def expected_exit(line: str) -> int:
    """The exit status a documented command line ends with: 0, or what its trailing comment says
    (``tracer diff a.yaml b.yaml  # exit 1: they differ``)."""
    said = re.search(r"#\s*exit (\d+)\b", line)
    return int(said.group(1)) if said else 0
