"""The architecture's rules, enforced: packages are layers that import only downwards, nothing
imports in a cycle, facts about a kind live in its class, and every step kind and lint is complete."""

import ast
import functools
import importlib
import pkgutil
import re
from pathlib import Path

import networkx as nx
import pytest
import yaml

import tests.steps
from tests.conftest import KERNEL_TESTED, PIPELINES, ROOT
from tracer.analysis.lints import LINTS
from tracer.spec.load import load_spec_text
from tracer.steps.contract import STEP_KINDS, StepBase

for _kind_tests in pkgutil.iter_modules(tests.steps.__path__):  # their @covers marks fill KERNEL_TESTED
    importlib.import_module(f"tests.steps.{_kind_tests.name}")
PACKAGE = ROOT / "tracer"
EXPANDED_BEFORE_ANALYSIS = {"block", "block_input"}  # spec-level kinds: no kernel of their own
# bottom to top (docs/architecture.md): a module imports modules of its own layer or of layers below
LAYERS = ("core", "steps", "spec", "analysis", "runtime", "presentation", "importer", "facade")
# the only imports of tracer's own modules made inside a function: each keeps torch out of `tracer
# check`, or the file format (pydantic and every step kind) out of `import tracer`
LAZY = {
    ("tracer", "tracer.module"),
    ("tracer", "tracer.importing"),
    ("tracer.commands", "tracer.importing"),  # to_module, from_module, `tracer import`: torch
    ("tracer.cli", "tracer.commands"),  # the format, the analysis, the runtime: not for --help nor check
    ("tracer.cli", "tracer.checking"),  # the format and the analysis: not for a check answered from the cache
    ("tracer", "tracer.api"),
    ("tracer", "tracer.presentation.trace"),  # load, run, Trace: ~0.3 s, twice the start-up target
    ("tracer", "tracer.distributed"),  # run_parallel: the same
    ("tracer.pytest_plugin", "tracer.api"),
    ("tracer.pytest_plugin", "tracer.spec.source"),
    ("tracer.testing", "tracer.api"),
    ("tracer.testing", "tracer.analysis.expect"),  # the plugin loads in every pytest session: ~0.25 s
}


def _module(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def layer(module: str) -> str:
    """The layer of a module: its sub-package, or "facade" for the top-level modules."""
    parts = module.split(".")
    return parts[1] if len(parts) > 2 or (len(parts) == 2 and (PACKAGE / parts[1]).is_dir()) else "facade"


def _runtime_imports(tree: ast.AST) -> list[tuple[ast.AST, bool]]:
    """Every import of the module with whether it is made inside a function; those under
    ``if TYPE_CHECKING:`` are left out (annotations only: never run)."""
    hidden = {
        id(inner)
        for node in ast.walk(tree)
        if isinstance(node, ast.If) and getattr(node.test, "id", None) == "TYPE_CHECKING"
        for stmt in node.body
        for inner in ast.walk(stmt)
    }
    in_function = {
        id(inner) for node in ast.walk(tree) if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) for inner in ast.walk(node)
    }
    return [
        (node, id(node) in in_function)
        for node in ast.walk(tree)
        if isinstance(node, ast.Import | ast.ImportFrom) and id(node) not in hidden
    ]


@functools.cache
def import_edges() -> list[tuple[str, str, bool]]:
    """(importer, imported, inside a function) for every import between tracer's modules."""
    modules = {_module(p): p for p in PACKAGE.rglob("*.py")}
    edges = []
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
        for node, lazy in _runtime_imports(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                base = package.split(".")[: len(package.split(".")) - node.level + 1] if node.level else []
                target = ".".join(base + ([node.module] if node.module else []))
                named = [f"{target}.{alias.name}" for alias in node.names if f"{target}.{alias.name}" in modules]
                targets = named or [target]
            else:
                targets = [alias.name for alias in node.names]
            edges += [(name, t, lazy) for t in targets if t in modules and t != name]
    return edges


def test_packages_are_layers_that_import_only_downwards():
    upward = [(a, b) for a, b, _ in import_edges() if LAYERS.index(layer(a)) < LAYERS.index(layer(b))]
    assert upward == [], f"imports from a layer to one above it: {upward}"


def test_no_import_cycle_among_modules_or_packages():
    edges = import_edges()
    modules = nx.DiGraph((a, b) for a, b, _ in edges)
    assert [c for c in nx.simple_cycles(modules) if len(c) > 1] == []
    packages = nx.DiGraph((layer(a), layer(b)) for a, b, _ in edges if layer(a) != layer(b))
    assert list(nx.simple_cycles(packages)) == []


def test_imports_inside_functions_only_keep_torch_out_of_tracer_check():
    lazy = {(a, b) for a, b, inside in import_edges() if inside}
    assert lazy <= LAZY and len(lazy) <= 12, f"imports of tracer's own modules made inside functions: {lazy - LAZY}"


def test_the_layer_check_sees_imports_inside_functions():
    assert ("tracer", "tracer.module", True) in import_edges()


def test_only_the_step_kinds_and_the_attention_core_test_for_a_kind():
    """Other layers read a kind's traits (docs/architecture.md), never its class, nor the
    attention core's or the lints' private helpers."""
    classes = "|".join(sorted({cls.__name__ for cls in STEP_KINDS.values()} | {"BlockInput"}))
    concrete = re.compile(rf"isinstance\([^)]*(?<![\w.])({classes})\b|type\([^)]*\)\s+is\s+({classes})\b")
    private = re.compile(r"\b(lints|attention|costs)\._[a-z]")
    allowed = {PACKAGE / "analysis" / "attention.py"}
    found = [
        f"{path.relative_to(ROOT)}:{n}: {line.strip()}"
        for path in PACKAGE.rglob("*.py")
        if not {"steps", "core"} & set(path.relative_to(PACKAGE).parts) and path not in allowed  # core is below the kinds
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if (concrete.search(line) or private.search(line)) and not line.lstrip().startswith("#")
    ]
    assert found == []


@pytest.mark.parametrize("op", sorted(STEP_KINDS))
def test_every_step_kind_fulfils_the_contract(op):
    kind = STEP_KINDS[op]
    assert kind.__doc__ and kind.__doc__.strip(), f"{op}: no docstring (the format reference is made from it)"
    assert kind.example.strip(), f"{op}: no example"
    if op in EXPANDED_BEFORE_ANALYSIS:
        return
    step = yaml.safe_load(kind.example)[0]
    assert step["op"] == op
    spec, _ = load_spec_text(
        yaml.safe_dump({"name": "example", "inputs": {"x": {"shape": [1], "init": "randn"}}, "steps": [step]}), "e.yaml"
    )
    assert spec.steps[0].op == op  # the example validates against the format
    assert op in KERNEL_TESTED, f"{op}: no kernel test against plain torch (mark it @covers('{op}') in tests/steps/)"
    assert kind.emit is not StepBase.emit, f"{op}: no emit (tracer export writes each step from its kind's emit)"


@pytest.mark.parametrize("code", sorted(LINTS))
def test_every_lint_is_documented_with_an_example_and_its_fixed_twin(code):
    lint = LINTS[code]
    assert "**What.**" in lint.doc() and "**Fix.**" in lint.doc(), f"{code}: its docstring is its docs section"
    assert (PIPELINES / "lint_examples" / f"{lint.example}.yaml").is_file()
    assert (PIPELINES / "lint_examples" / "fixed" / f"{lint.example}.yaml").is_file()


def test_no_op_name_lists_outside_the_step_kinds():
    """Facts about a kind live in its class (traits), not in lists of op names elsewhere."""
    names = "|".join(sorted(STEP_KINDS))
    pattern = re.compile(rf"""(\.op|get\(["']op["']\))\s*(==|!=|in\b|not in\b).*["']({names})["']""")
    found = [
        f"{path.relative_to(ROOT)}:{n}: {line.strip()}"
        for path in PACKAGE.rglob("*.py")
        if "steps" not in path.relative_to(PACKAGE).parts
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if pattern.search(line) and not line.lstrip().startswith("#")
    ]
    assert found == []
