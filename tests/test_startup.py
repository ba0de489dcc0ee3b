"""Start-up (issue 32): ``import tracer`` loads neither pydantic nor a step kind, and checking a
file builds the validators of its own kinds only. benchmarks/startup.py measures the times."""

from __future__ import annotations

import dataclasses
import importlib
import subprocess
import sys

import pytest

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


QUICK = [
    "tracer.core.layout.Meta",
    "tracer.core.symbolic.Dim",
    "tracer.core.errors.Position",
    "tracer.analysis.graph.Node",
    "tracer.analysis.graph.Out",
    "tracer.analysis.shapes.Declared",
]


@pytest.mark.parametrize("path", QUICK)
def test_a_quick_frozen_dataclass_builds_what_the_dataclass_would(path):
    """``@frozen``'s ``__init__`` (tracer/core/frozen.py) writes the fields itself: each field,
    positional or by keyword, with its default when left out, lands where the dataclass's own
    ``__init__`` would put it, and the instance stays immutable and equal to its copies."""
    module, name = path.rsplit(".", 1)
    cls = getattr(importlib.import_module(module), name)
    fields = dataclasses.fields(cls)
    values = {f.name: object() for f in fields}
    made = cls(*values.values())
    assert {f.name: getattr(made, f.name) for f in fields} == values
    assert cls(**values) == made and dataclasses.replace(made) == made
    required = {f.name: values[f.name] for f in fields if f.default is dataclasses.MISSING}
    defaulted = cls(**required)
    assert all(getattr(defaulted, f.name) == f.default for f in fields if f.name not in required)
    with pytest.raises(dataclasses.FrozenInstanceError):
        setattr(made, fields[0].name, None)


def test_frozen_refuses_what_its_init_would_get_wrong():
    from tracer.core.frozen import frozen

    with pytest.raises(TypeError, match="slots"):
        frozen(slots=True)(type("S", (), {"__annotations__": {"a": int}}))
    with pytest.raises(TypeError, match="default_factory"):
        frozen(type("F", (), {"__annotations__": {"a": list}, "a": dataclasses.field(default_factory=list)}))
    with pytest.raises(TypeError, match="__post_init__"):
        frozen(type("P", (), {"__annotations__": {"a": int}, "__post_init__": lambda self: None}))


def test_the_check_command_freezes_its_imports_only_in_a_process_of_its_own():
    """Run as the program, ``tracer check`` imports the file format and the analysis with the
    collector paused and freezes them out of its passes; called from Python (argv given), it
    leaves the caller's collector as it was."""
    file = str(PIPELINES / "causal_mha.yaml")
    frozen = "import gc, io, contextlib; from tracer.cli import main; out = io.StringIO()\nwith contextlib.redirect_stdout(out): rc = {call}\nprint(rc, gc.get_freeze_count() > 0, gc.isenabled())"
    program = f"sys.argv = ['tracer', 'check', '--no-cache', {file!r}]; " + frozen.format(call="main()")
    called = frozen.format(call=f"main(['check', '--no-cache', {file!r}])")
    assert _run(program).splitlines()[-1] == "0 True True"
    assert _run(called).splitlines()[-1] == "0 False True"


def test_a_fresh_tensor_knows_the_sizes_its_strides_were_made_from():
    """``fresh`` keeps the sizes it computed for the strides as ``Meta.sizes``: the same sizes
    ``Meta`` computes itself, for a shape with a zero and one of ones too."""
    from tracer.core.layout import Meta, contiguous_strides, fresh
    from tracer.core.symbolic import DimAlgebra

    alg = DimAlgebra({"B": 2, "T": 0, "H": 1, "D": 5})
    for names in (("B", "T", "D"), ("H", "H", "D"), (), ("D",)):
        shape = tuple(alg.dim(n) for n in names)
        made, plain = fresh(shape, "float16"), Meta(shape, contiguous_strides(tuple(d.value for d in shape)), "float16")
        assert made == plain and made.sizes == Meta(shape, plain.stride, "float16").sizes == tuple(d.value for d in shape)
