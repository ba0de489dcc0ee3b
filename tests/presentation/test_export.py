"""``tracer export``: every bundled pipeline as a standalone nn.Module that computes its traced run."""

import subprocess
import sys
import textwrap

import pytest
import torch

import tracer
from tests.conftest import PIPELINES, bundled_pipelines, shared_pipeline, tracer_cli
from tests.exporting import assert_module_equals_trace, check_export, exported, load_module
from tracer.presentation.export import export_source

BUNDLED = bundled_pipelines()


@pytest.fixture(scope="module")
def sources():
    return {path: export_source(shared_pipeline(path)) for path in BUNDLED}


def small_dims(pipeline: tracer.Pipeline) -> dict[str, int] | None:
    """Tutorial 001's 4096 x 4608 runs take 450 MB: shrink large plain dims to 16 (when they still check)."""
    if pipeline.check().peak_bytes < 2**24:
        return None
    dims = {name: 16 for name, text in pipeline.spec.dims.items() if isinstance(text, int) and text > 64}
    return dims if not pipeline.check(dims).errors else None


NESTED = {
    "blocks/inner.yaml": """
        name: inner-block
        dims: {N: 3, D: 4, E: 2 * D}
        inputs:
          h: {shape: [N, D], init: randn}
          g: {shape: [N, D], init: randn}
        params:
          w-1.weight: {shape: [E, D], init: linear}
          w-1.bias: {shape: [E], init: linear, fan_in: D}
          back: {shape: [D, E], init: randn}
        steps:
          - {id: a, op: linear, input: h, weight: w-1.weight, bias: w-1.bias}
          - {id: c, op: linear, input: a, weight: back}
          - {id: out, op: add, inputs: [c, g]}
    """,
    "blocks/outer.yaml": """
        name: outer
        dims: {N: 3, D: 4}
        inputs:
          x: {shape: [N, D], init: randn}
          y: {shape: [N, D], init: randn}
        params:
          scale-p: {shape: [D], init: full, value: 0.5}
        steps:
          - {id: first, op: block, use: inner.yaml, inputs: [x, y], repeat: 2}
          - {id: scaled, op: mul, inputs: [first, scale-p]}
    """,
    "top.yaml": """
        name: edge top
        dims: {N: 3, sum: 4}
        dtype: float64
        seed: 5
        params:
          mask: {shape: [N, N], values: [[true, false, true], [true, true, false], [false, true, true]]}
        inputs:
          x: {shape: [N, sum], init: randn}
        steps:
          - {id: shared, op: block, use: blocks/outer.yaml, inputs: [x, x], dims: {D: sum}, repeat: 3, share_params: true}
          - {id: nest, op: block, use: blocks/outer.yaml, inputs: [shared, x], dims: {D: sum}}
          - {id: s, op: einsum, inputs: [nest, x], equation: "nd,md->nm"}
          - {id: m, op: mask, input: s, mask: mask, polarity: keep, fill: -1.0e9}
          - {id: parts, op: split, dim: 1, sizes: [1, 2], outputs: [p1, p2]}
        outputs: [p2, x, nest]
    """,
}


@pytest.mark.parametrize("path", BUNDLED, ids=lambda p: p.relative_to(PIPELINES).as_posix())
def test_every_bundled_pipeline_exports_to_its_traced_run(path, sources):
    pipeline = shared_pipeline(path)
    assert export_source(pipeline) == sources[path]  # deterministic: the same bytes again
    dims = small_dims(pipeline)
    module = load_module(sources[path]) if dims is None else None
    module_class = getattr(module, module.__all__[0]) if module else exported(pipeline, dims)[1]
    trace = pipeline.run(dims=dims, keep_values=True)
    module = module_class(seed=pipeline.spec.seed)
    # with the pipeline's seed the constructor creates the params as the run does: same tensors
    state = module.state_dict()
    assert state.keys() == {n.replace("/", ".") for n in trace.analysis.pipeline.params}
    for name in trace.analysis.pipeline.params:
        assert torch.equal(state[name.replace("/", ".")], trace[name].tensor), name
    assert_module_equals_trace(module, trace)


def test_exported_sources_pass_ruff_and_import_only_torch_and_math(sources, tmp_path):
    for path, source in sources.items():
        (tmp_path / f"{path.stem}_{abs(hash(path)) % 1000}.py").write_text(source)
        imports = {line.split()[1] for line in source.splitlines() if line.startswith(("import ", "from "))}
        assert imports <= {"math", "torch", "torch.nn.functional"}, imports
    ruff = subprocess.run(
        [sys.executable, "-m", "ruff", "check", "--isolated", "--no-cache", str(tmp_path)], capture_output=True, text=True
    )
    assert ruff.returncode == 0, ruff.stdout + ruff.stderr


def test_every_line_of_forward_says_its_shape_and_step(sources):
    source = sources[PIPELINES / "causal_mha.yaml"]
    forward = source.split("def forward")[1].splitlines()[1:]
    assert all("  # " in line for line in forward if line.strip())
    assert "scores = q_h @ k_t  # (B, H, T, T) scores" in source
    assert "merged = context.transpose(-3, -2).contiguous().view(B, T, d_model)" in source
    assert "F.dropout(weights, p=0.2, training=self.training)" in source


def _tensors_alive_at_return(module, *args) -> set[str]:
    """The locals of the module's forward that still hold a tensor when it returns."""
    alive: set[str] = set()

    def trace_calls(frame, event, arg):
        if event == "call" and frame.f_code is type(module).forward.__code__:
            return trace_return
        return None

    def trace_return(frame, event, arg):
        if event == "return":
            alive.update(name for name, value in frame.f_locals.items() if isinstance(value, torch.Tensor))
        return trace_return

    sys.settrace(trace_calls)
    try:
        module(*args)
    finally:
        sys.settrace(None)
    return alive


@pytest.mark.parametrize("name", ["causal_mha.yaml", "models/llama_decoder_layer.yaml", "models/gemma2_decoder_layer.yaml"])
def test_forward_frees_each_intermediate_after_its_last_use(name, sources):
    pipeline = shared_pipeline(PIPELINES / name)
    module = load_module(sources[PIPELINES / name])
    module = getattr(module, module.__all__[0])(seed=pipeline.spec.seed).eval()
    trace = pipeline.run(keep_values=True)
    given = list(pipeline.spec.inputs)
    with torch.no_grad():
        alive = _tensors_alive_at_return(module, *(trace[n].tensor for n in given))
    # only what forward returns and what it was given are left: every activation was let go
    returned = set(pipeline.spec.outputs or [pipeline.spec.steps[-1].id])
    assert alive <= returned | set(given), sorted(alive - returned - set(given))


def test_q_and_k_read_one_rotary_table():
    source = export_source(tracer.load(PIPELINES / "models/llama_decoder_layer.yaml"))
    forward = source.split("def forward")[1]
    assert forward.count(".cos()") == 1 and forward.count(".sin()") == 1
    assert forward.count("torch.arange(0, Dh, 2") == 1


def test_blocks_become_submodule_classes_and_repeat_a_module_list(sources):
    source = sources[PIPELINES / "encoder_stack.yaml"]
    assert "class EncoderLayer(nn.Module):" in source and "class EncoderStack(nn.Module):" in source
    assert "nn.ModuleList([EncoderLayer(d_model=d_model, H=H, d_ff=4 * d_model, generator=generator) for _ in range(48)])" in source
    assert source.index('__all__ = ["EncoderStack"') > 0


def test_constructor_takes_dims_and_checks_them_with_tracers_message(sources):
    cls = load_module(sources[PIPELINES / "causal_mha.yaml"]).CausalMha
    small = cls(d_model=6, H=3)
    assert small.W_q.shape == (6, 6) and small.Dh == 2
    assert small.eval()(torch.randn(1, 3, 6)).shape == (1, 3, 6)  # B and T come from the input
    with pytest.raises(tracer.TracerError) as tracer_error:
        tracer.load(PIPELINES / "causal_mha.yaml").run(dims={"H": 3})
    with pytest.raises(ValueError) as module_error:
        cls(H=3)
    assert str(module_error.value) in str(tracer_error.value)


def test_other_dims_export_and_match(tmp_path):
    pipeline = tracer.load(PIPELINES / "causal_mha.yaml")
    dims = {"B": 1, "T": 5, "d_model": 8, "H": 4}
    source, cls = exported(pipeline, dims)
    assert "def __init__(self, *, d_model=8, H=4, seed=None):" in source
    assert_module_equals_trace(cls(), pipeline.run(dims=dims, keep_values=True))


def test_dropout_follows_self_training(sources):
    cls = load_module(sources[PIPELINES / "causal_mha.yaml"]).CausalMha
    module, x = cls(), torch.randn(2, 6, 4)
    with torch.no_grad():
        assert torch.equal(module.eval()(x), module(x))
        assert not torch.equal(module.train()(x), module.eval()(x))


def test_cli_writes_the_module(tmp_path):
    out = tmp_path / "causal.py"
    done = tracer_cli("export", str(PIPELINES / "causal_mha.yaml"), "-o", str(out), "--dim", "T=4")
    assert done.returncode == 0, done.stderr
    assert "def __init__(self, *, d_model=4, H=2, seed=None):" in out.read_text()
    assert tracer_cli("export", str(PIPELINES / "causal_mha.yaml")).stdout == export_source(tracer.load(PIPELINES / "causal_mha.yaml"))


@pytest.mark.parametrize("name", ["causal_mha.yaml", "encoder_block.yaml"])
def test_torch_export_accepts_the_canonical_modules(name, sources):
    pipeline = shared_pipeline(PIPELINES / name)
    cls = getattr(load_module(sources[PIPELINES / name]), load_module(sources[PIPELINES / name]).__all__[0])
    trace = pipeline.run(keep_values=True)
    inputs = tuple(trace[n].tensor for n in pipeline.spec.inputs)
    module = cls()
    module.load_state_dict({name.replace("/", "."): trace[name].tensor for name in trace.analysis.pipeline.params})
    program = torch.export.export(module.eval(), inputs)
    assert_module_equals_trace(program.module(), trace, load=False)


def test_nested_shared_blocks_odd_ids_buffers_and_float64(tmp_path):
    """Blocks in blocks (one shared by 3 copies), ids that are not identifiers, a bool buffer."""
    for name, text in NESTED.items():
        (tmp_path / name).parent.mkdir(exist_ok=True)
        (tmp_path / name).write_text(textwrap.dedent(text))
    pipeline = tracer.load(tmp_path / "top.yaml")
    trace = pipeline.run(keep_values=True)
    source, cls = exported(pipeline)
    assert '__all__ = ["EdgeTop", "InnerBlock", "Outer"]' in source and "class InnerBlock" in source.split("class Outer")[0]
    assert "setattr(self, 'scale-p', nn.Parameter(" in source and "self.register_buffer('mask'" in source
    module = cls(seed=5)  # the file's seed: the traced run's params
    assert "shared.first.1.w-1.weight" in module.state_dict() and "nest.first.0.back" in module.state_dict()
    assert all(torch.equal(module.state_dict()[n.replace("/", ".")], trace[n].tensor) for n in trace.analysis.pipeline.params)
    assert_module_equals_trace(module, trace)


def test_one_piece_splits_compound_dims_and_0d_tensors():
    """What the typed fuzzer found: a split into one piece is still a tuple, a dim expression in an
    operand position keeps its parentheses (rope's R = 2 * A), a 0-d tensor permutes and views."""
    text = """
        name: corners
        dims: {A: 2, T: 3}
        inputs:
          x: {shape: [T, 4 * A], init: randn}
          s: {shape: [], init: randn}
        steps:
          - {id: r, op: rope, input: x, rotary_dim: 2 * A, style: interleaved, offset: A + 1}
          - {id: one, op: split, input: r, dim: 0, chunks: 1, outputs: [whole]}
          - {id: p, op: permute, input: s, dims: []}
          - {id: v, op: view, input: p, shape: []}
        outputs: [whole, v]
    """
    pipeline = tracer.loads(textwrap.dedent(text), "corners.yaml")
    source = export_source(pipeline)
    assert "(whole,) = r.chunk(1, dim=0)" in source and ".float() / (2 * A)" in source
    check_export(pipeline, pipeline.run(keep_values=True))


@pytest.mark.parametrize("name", ["causal_mha.yaml", "models/llama_decoder_layer.yaml", "models/mistral_sliding_window.yaml"])
@pytest.mark.parametrize("batch, length", [(3, 1), (1, 10)])
def test_exported_modules_run_on_any_batch_and_length(name, batch, length, sources):
    """Sizes come from the input: the module of a (2, 6) pipeline computes a (3, 1) or (1, 10)
    input as the pipeline run at those dims does."""
    pipeline = shared_pipeline(PIPELINES / name)
    module = load_module(sources[PIPELINES / name])
    cls = getattr(module, module.__all__[0])
    sizes = {"B": batch, "T": length}
    trace = pipeline.run(dims={k: v for k, v in sizes.items() if k in pipeline.spec.dims}, keep_values=True)
    assert_module_equals_trace(cls(), trace, atol=1e-5)
