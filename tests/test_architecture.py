"""The architecture's rules, enforced: one-way imports, and a complete contract for every step kind."""

import ast
import re
from pathlib import Path

import networkx as nx
import pytest
import yaml

import tests.test_modern_steps  # noqa: F401  (their @covers marks fill KERNEL_TESTED)
import tests.test_steps  # noqa: F401
from tests.conftest import KERNEL_TESTED, ROOT
from tracer.spec.load import load_spec_text
from tracer.steps.contract import STEP_KINDS, StepBase

PACKAGE = ROOT / "tracer"
EXPANDED_BEFORE_ANALYSIS = {"block", "block_input"}  # spec-level kinds: no kernel of their own


def _module(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _runtime_imports(tree: ast.AST):
    """Every node of the module, but those under ``if TYPE_CHECKING:`` (annotations only: never run)."""
    hidden = {
        id(inner)
        for node in ast.walk(tree)
        if isinstance(node, ast.If) and getattr(node.test, "id", None) == "TYPE_CHECKING"
        for stmt in node.body
        for inner in ast.walk(stmt)
    }
    return [node for node in ast.walk(tree) if id(node) not in hidden]


def import_graph() -> nx.DiGraph:
    """tracer's modules and every import between them, at any depth (inside functions too)."""
    modules = {_module(p): p for p in PACKAGE.rglob("*.py")}
    graph = nx.DiGraph()
    graph.add_nodes_from(modules)
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
        for node in _runtime_imports(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                base = package.split(".")[: len(package.split(".")) - node.level + 1] if node.level else []
                target = ".".join(base + ([node.module] if node.module else []))
                named = [f"{target}.{alias.name}" for alias in node.names if f"{target}.{alias.name}" in modules]
                targets = named or [target]
            elif isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            else:
                continue
            graph.add_edges_from((name, t) for t in targets if t in modules and t != name)
    return graph


def test_no_import_cycle_among_tracer_modules():
    cycles = [c for c in nx.simple_cycles(import_graph()) if len(c) > 1]
    assert cycles == [], f"import cycles: {cycles}"


@pytest.mark.parametrize(
    "lower, upper",
    [
        ("tracer.runtime.records", "tracer.presentation.diagram"),
        ("tracer.presentation.diagram", "tracer.api"),
        ("tracer.analysis.memory", "tracer.runtime.records"),
        ("tracer.steps.block", "tracer.spec.load"),
    ],
)
def test_layers_import_one_way(lower, upper):
    assert not nx.has_path(import_graph(), lower, upper), f"{lower} reaches {upper}"


def test_the_import_graph_sees_imports_inside_functions():
    assert import_graph().has_edge("tracer.cli", "tracer.presentation.outputs")  # the CLI's _draw imports it lazily


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
    assert op in KERNEL_TESTED, (
        f"{op}: no kernel test against plain torch (mark it @covers('{op}') in tests/test_steps.py or test_modern_steps.py)"
    )
    assert kind.emit is not StepBase.emit, f"{op}: no emit (tracer export writes each step from its kind's emit)"


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


def test_every_init_the_format_accepts_has_exactly_one_way_to_create_it():
    from typing import get_args

    from tracer.spec.inits import INITS
    from tracer.spec.pipeline import Init

    assert set(INITS) == set(get_args(Init))
