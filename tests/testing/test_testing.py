"""tracer.testing helpers, the pytest plugin, and static shapes agreeing with torch."""

import json
import subprocess
import sys

import pytest

import tracer
from tests.conftest import INVALID_EXAMPLES, PIPELINES, ROOT, bundled_pipelines, shared_pipeline, tracer_cli, two_copies_of_each_block
from tracer.core.errors import ExpectationError, TracerError
from tracer.testing import assert_contiguous, assert_shape, assert_view_of

CAUSAL = PIPELINES / "causal_mha.yaml"


@pytest.fixture(scope="module")
def mha():
    return tracer.run(CAUSAL, dims={"T": 5})


CPU_BYTES = 64 << 20  # a variant past this (the tutorial-size seed files) runs on meta: torch's layouts, no minutes of matmuls


def dims_variants(pipeline):
    declared = pipeline.check().dims
    base = [name for name, text in pipeline.spec.dims.items() if isinstance(text, int)]
    yield {}
    yield {name: 1 for name in base}
    yield {name: declared[name] * 2 for name in base}
    if pipeline.check().peak_bytes > CPU_BYTES:
        yield {name: min(declared[name], 8) for name in base}  # so a file too big for the CPU is still compared on it


def _fixed_size_inputs(analysis) -> bool:
    return any(d.values is not None or d.tokens is not None for d in (analysis.pipeline.inputs or {}).values())


def test_assert_shape_symbolic_and_concrete(mha):
    assert_shape(mha, "scores", "B H T T")
    assert_shape(mha, "q_h", "(B, H, T, d_model // H)")
    assert_shape(mha, "scores", (2, 2, 5, 5))
    with pytest.raises(ExpectationError) as info:
        assert_shape(mha, "scores", "B H T Dh")
    message = str(info.value)
    assert message.startswith(f"{CAUSAL}:") and "expected (B, H, T, Dh) [2, 2, 5, 2], found (B, H, T, T) [2, 2, 5, 5]" in message
    assert "T=5" in message


def test_assert_contiguous_and_view_of(mha):
    assert_contiguous(mha, "q_h", False)
    assert_contiguous(mha, "merged/contiguous", True)
    assert_view_of(mha, "q_h", "q")
    assert_view_of(mha, "merged/contiguous", None)
    with pytest.raises(ExpectationError, match="expected a view of 'k', found its own storage"):
        assert_view_of(mha, "scores", "k")
    with pytest.raises(ExpectationError, match=r"expected 'k_h' to be contiguous, found stride \(\d+, \d+, \d+, 1\) for \(B, H, T, Dh\)"):
        assert_contiguous(mha, "k_h", True)


def test_trace_pipeline_fixture(trace_pipeline):
    t = trace_pipeline(CAUSAL, dims={"B": 1})
    assert t["out"].shape == (1, 6, 4) and t["out"].tensor is not None


def test_run_json_carries_symbolic_shape():
    proc = tracer_cli("run", CAUSAL, "--json")
    assert proc.returncode == 0, proc.stderr
    tensors = {t["id"]: t for t in json.loads(proc.stdout)["tensors"]}
    assert tensors["scores"]["symbolic_shape"] == ["B", "H", "T", "T"] and tensors["scores"]["op"] == "matmul"
    assert not tensors["k_t"]["contiguous"] and tensors["q_heads"]["view_of"] == "q"
    assert tensors["merged/contiguous"]["contiguous"] and tensors["merged/contiguous"]["view_of"] is None


def test_wrong_expect_fails_check_and_pytest_plugin_with_file_and_line(pytester):
    bad = pytester.path / "bad_mha.yaml"
    text = CAUSAL.read_text().replace("scores: [B, H, T, T]", "scores: [B, T, H, T]")
    bad.write_text(text)
    line = next(i for i, line_text in enumerate(text.splitlines(), 1) if line_text.strip().startswith("scores: [B, T, H, T]"))
    check = tracer_cli("check", bad)
    assert check.returncode == 1 and f"{bad}:{line}:3: error[expect]" in check.stderr
    (pytester.path / "good.yaml").write_text(CAUSAL.read_text())
    result = pytester.runpytest("-p", "no:cacheprovider", "-p", "no:hypothesispytest", "--tracer-pipelines=*.yaml")
    result.assert_outcomes(passed=1, failed=1)
    assert f"\nbad_mha.yaml:{line}:3: error[expect]" in result.stdout.str()  # as the user named it: relative


@pytest.mark.long
def test_check_of_every_bundled_pipeline_never_imports_torch():
    files = [str(p) for p in bundled_pipelines()]
    # torch is made unimportable; networkx is only needed for out-of-order steps, cycles and diagrams
    code = (
        "import sys; sys.modules['torch'] = None; from tracer.cli import main; rc = main(sys.argv[1:]); "
        "print(sorted(m for m in ('torch', 'networkx') if sys.modules.get(m))); sys.exit(rc)"
    )
    proc = subprocess.run([sys.executable, "-c", code, "check", *files], capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"
    assert len(files) > 15 and "error" not in proc.stderr


def test_plugin_collects_nothing_unless_asked(pytester):
    (pytester.path / "good.yaml").write_text(CAUSAL.read_text())
    assert pytester.runpytest("-p", "no:cacheprovider", "-p", "no:hypothesispytest").ret == pytest.ExitCode.NO_TESTS_COLLECTED


def test_the_invalid_examples_fail_with_their_own_error():
    """The sweeps leave out exactly these files; each must still fail, and for its own reason."""
    for name, code in INVALID_EXAMPLES.items():
        with pytest.raises(tracer.TracerError) as info:
            tracer.load(PIPELINES / name)
        assert [d.code for d in info.value.diagnostics] == [code], name


@pytest.mark.long
@pytest.mark.parametrize("path", bundled_pipelines(), ids=lambda p: str(p.relative_to(PIPELINES)))
def test_static_analysis_agrees_with_torch(path, tmp_path):
    """Shape rules are exact: shapes, strides, contiguity and storage sharing predicted before
    running equal what torch produces, over every bundled pipeline and several dims (a repeated
    block twice: each copy reads the one before it as every further copy does)."""
    fewer = two_copies_of_each_block(path, tmp_path / "pipelines")
    pipeline = shared_pipeline(path) if fewer == path else tracer.load(fewer)
    checked = 0
    for dims in dims_variants(pipeline):
        try:
            analysis = pipeline.check(dims)
        except tracer.TracerError:
            if not dims:
                raise  # the declared dims must always check
            continue  # e.g. d_model=1 is not divisible by H=2: nothing to compare
        if dims and (analysis.errors or _fixed_size_inputs(analysis)):
            continue  # literal values and token lists fit the declared dims only
        assert not analysis.errors, [str(d) for d in analysis.errors]
        trace = pipeline.run(dims=dims, device="cpu" if analysis.peak_bytes <= CPU_BYTES else "meta")
        for record in trace.records:
            meta = analysis.metas[record.id]
            predicted = (meta.sizes, meta.stride, meta.contiguous, None if meta.root == record.id else meta.root)
            assert predicted == (record.shape, record.stride, record.contiguous, record.view_of), (record.id, dims)
        checked += 1
    assert checked >= 1


def test_dims_that_are_only_coincidentally_equal_are_flagged(write):
    """d_in == d_out == 3 today: x @ W_k.T would run, but is wrong as soon as d_out changes."""
    path = write("""
        name: coincidence
        dims: {T: 4, d_in: 3, d_out: 3}
        inputs:
          x: {shape: [T, d_in], init: randn}
        params:
          W_q: {shape: [d_in, d_out], init: rand}
        steps:
          - {id: q, op: linear, input: x, weight: W_q, layout: in_out}
          - {id: scores, op: matmul, inputs: [q, x_t]}
          - {id: x_t, op: transpose, input: x, dims: [0, 1]}
        outputs: [scores]
    """)
    warnings = [d for d in tracer.load(path).check().warnings if d.code == "dim-mismatch"]
    assert len(warnings) == 1 and warnings[0].step == "scores"
    assert "d_out and d_in are equal only because d_out=3 and d_in=3" in warnings[0].message


def test_expect_can_pin_a_composite_steps_inner_records(tmp_path):
    text = CAUSAL.read_text().replace(
        "expect:\n", "expect:\n  merged/transpose: {contiguous: false}\n  merged/contiguous: {contiguous: true}\n", 1
    )
    assert tracer.loads(text, "m.yaml").run()["merged/contiguous"].contiguous
    wrong = text.replace("merged/transpose: {contiguous: false}", "merged/transpose: {contiguous: true}")
    with pytest.raises(tracer.TracerError) as info:
        tracer.loads(wrong, "m.yaml")
    assert info.value.code == "expect" and "expected 'merged/transpose' to be contiguous" in str(info.value)


def test_an_inner_record_expect_is_quiet_when_an_upstream_error_explains_it():
    text = CAUSAL.read_text().replace("expect:\n", "expect:\n  merged/contiguous: [B, T, H, Dh]\n", 1)
    broken = text.replace("inputs: [weights_d, v_h]", "inputs: [weights_d, k_t]")
    with pytest.raises(tracer.TracerError) as info:
        tracer.loads(broken, "m.yaml")
    assert [d.code for d in info.value.diagnostics] == ["matmul-shape"]


@pytest.mark.parametrize("tokens", [1, 5])
@pytest.mark.parametrize("contiguous", [True, False])
def test_assert_contiguous_follows_the_rule_of_expect(tokens, contiguous, tmp_path):
    """At T = 1 a transposed (B, H, T, Dh) is row-major but for a size-1 axis: torch calls it
    contiguous, and both `expect:` and assert_contiguous accept either answer."""
    text = CAUSAL.read_text().replace("\n  T: 6 ", f"\n  T: {tokens} ")
    entry = f"q_h: {{contiguous: {str(contiguous).lower()}}}"
    (tmp_path / "mha.yaml").write_text(text.replace("q_h: {shape: [B, H, T, Dh], contiguous: false}", entry))
    try:
        tracer.load(tmp_path / "mha.yaml")
    except TracerError as failure:
        assert "error[expect]" in str(failure)
        expect_holds = False
    else:
        expect_holds = True
    trace = tracer.run(CAUSAL, dims={"T": tokens})
    try:
        assert_contiguous(trace, "q_h", contiguous)
    except ExpectationError as failure:
        assert str(failure).count("expected 'q_h' to be") == 1
        helper_holds = False
    else:
        helper_holds = True
    assert helper_holds == expect_holds == (tokens == 1 or not contiguous)


def test_a_failing_helper_shows_the_test_line_not_the_helpers_source(pytester):
    pytester.makepyfile(
        test_mine=f"""
import tracer
from tracer.testing import assert_contiguous, assert_shape, assert_view_of

def test_layout():
    trace = tracer.run({str(CAUSAL)!r}, dims={{"T": 5}})
    assert_contiguous(trace, "q_h", True)

def test_shape():
    assert_shape(tracer.run({str(CAUSAL)!r}), "scores", "B T")

def test_view():
    assert_view_of(tracer.run({str(CAUSAL)!r}), "scores", "k")
"""
    )
    result = pytester.runpytest("-p", "no:cacheprovider", "-p", "no:hypothesispytest")
    result.assert_outcomes(failed=3)
    output = result.stdout.str()
    assert "expected 'q_h' to be contiguous, found stride" in output
    assert "def assert_contiguous" not in output and "_failure(" not in output and "__tracebackhide__" not in output
