"""Start-up (issue 32): ``import tracer`` loads neither pydantic nor a step kind, and checking a
file builds the validators of its own kinds only. benchmarks/startup.py measures the times."""

from __future__ import annotations

import subprocess
import sys

import tracer
from tests.conftest import PIPELINES, ROOT


def _run(code: str) -> str:
    proc = subprocess.run(
        [sys.executable, "-c", "import sys; sys.modules['torch'] = None; " + code], capture_output=True, text=True, cwd=ROOT
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip()


def test_import_tracer_loads_no_file_format_until_an_entry_point_is_used():
    heavy = "sorted(m for m, mod in sys.modules.items() if mod and (m.split('.')[0] in ('pydantic', 'yaml', 'torch') or m.startswith('tracer.steps')))"
    code = f"import tracer; print({heavy}); tracer.load({str(PIPELINES / 'causal_mha.yaml')!r}); print(len({heavy}) > 10)"
    before, after = _run(code).splitlines()
    assert before == "[]"
    assert after == "True"


def test_every_public_name_of_tracer_resolves():
    code = "import tracer; from tracer import Trace, Pipeline, load; print(all(hasattr(tracer, n) for n in tracer.__all__ if n not in ('to_module', 'from_module')), Trace.__name__, Pipeline.__name__, set(tracer.__all__) <= set(dir(tracer)))"
    assert _run(code) == "True Trace Pipeline True"


def test_checking_a_file_builds_the_validators_of_its_own_kinds_only():
    """The steps are validated kind by kind: the other ~90 kinds' validators are never built."""
    code = (
        "import tracer; from tracer.steps.contract import STEP_KINDS; "
        f"tracer.load({str(PIPELINES / 'causal_mha.yaml')!r}); "
        "print(sorted(op for op, kind in STEP_KINDS.items() if kind.__pydantic_complete__))"
    )
    ops = {step.op for step in tracer.load(PIPELINES / "causal_mha.yaml").spec.steps}
    assert _run(code) == str(sorted(ops))


def test_the_pytest_plugin_loads_no_file_format_until_a_pipeline_is_collected_or_traced():
    """Every pytest session where tracer is installed loads the plugin: it must cost no more than
    ``import tracer`` (it took ~0.25 s when it imported the file format up front)."""
    heavy = (
        "sorted(m for m, mod in sys.modules.items() if mod and (m.split('.')[0] in ('pydantic', 'yaml') or m.startswith('tracer.steps')))"
    )
    code = f"import tracer.pytest_plugin, tracer.testing; print({heavy})"
    assert _run(code) == "[]"


def test_checking_a_clean_file_finds_no_positions_and_a_second_check_no_quotient():
    """What an editor pays on save: a file with nothing to report walks no positions, and a
    second check (the same dims) divides no dims again: the quotients are kept per process."""
    from tracer.analysis.shapes import analyze
    from tracer.core import symbolic
    from tracer.spec.load import load_spec

    path = PIPELINES / "models" / "llama_decoder_layer.yaml"
    spec, source = load_spec(path)
    assert analyze(spec, source).diagnostics == () and source._values is None
    misses = symbolic._over.cache_info().misses
    analyze(*load_spec(path))
    assert symbolic._over.cache_info().misses == misses
