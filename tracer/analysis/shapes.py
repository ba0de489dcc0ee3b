"""Static analysis: every tensor's symbolic shape, strides and storage before anything runs.

``analyze`` walks the step graph in order, calling each step kind's shape rule. A failing step
poisons only what depends on it, so every independent error in a file is reported. No torch.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property

from ..core import dimexpr
from ..core.errors import Diagnostic, TracerError, merge_copies
from ..core.fields import DTYPE_BYTES, DTYPE_MAX, FLOAT_DTYPES, fits
from ..core.layout import CONTIGUITY_RULE, Meta, fresh, meets_contiguity, with_root
from ..core.symbolic import DimAlgebra, resolve
from ..spec.expand import expand_blocks
from ..spec.pipeline import Expect, PipelineSpec, TensorDecl, tensor_dtype
from ..spec.source import SourceMap
from ..steps.block import Block
from ..steps.contract import Composite, Outputs, Shape
from ..steps.rules import StepError, show
from . import lints
from .graph import StepGraph, build_graph
from .memory import estimate_peak

MAX_TENSOR_BYTES = 2**62  # torch computes sizes, strides and byte counts in int64


@dataclass
class Analysis:
    """Everything known about a pipeline at fixed dims, before running it."""

    pipeline: PipelineSpec
    source: SourceMap
    alg: DimAlgebra
    graph: StepGraph
    metas: dict[str, Meta] = field(default_factory=dict)
    inner: dict[str, list[tuple[str, str]]] = field(default_factory=dict)  # step -> [(record id, op)]: composites, multi-output
    parts: dict[str, str] = field(default_factory=dict)  # output name of a multi-output step -> that step
    outputs: list[str] = field(default_factory=list)
    diagnostics: list[Diagnostic] = field(default_factory=list)
    algs: dict[str, DimAlgebra] = field(default_factory=dict)  # tensor id -> its block's dims (default: alg)
    aliases: dict[str, str] = field(default_factory=dict)  # block step id -> the record holding its output
    blocks: dict = field(default_factory=dict)  # block step id -> tracer.steps.block.BlockInfo
    expect_algs: dict[str, DimAlgebra] = field(default_factory=dict)  # expect entry of a block file -> its dims
    flops: dict[str, int] = field(default_factory=dict)  # record id -> its step's FLOPs (on the step's last record; absent: 0)
    # (dims, declaration, section) -> its shape: every copy of a block shares its declarations
    declared_dims: dict[tuple, tuple] = field(default_factory=dict, repr=False)

    def alg_of(self, tensor_id: str) -> DimAlgebra:
        """The dims a tensor's rule reads: its block's, for the steps and params of an ``op: block``."""
        return self.algs.get(tensor_id, self.alg)

    def expect_alg_of(self, name: str) -> DimAlgebra:
        """The dims an ``expect:`` entry is written in: its block file's, for a block's own entries."""
        return self.expect_algs.get(name, self.alg)

    @cached_property
    def memory(self):
        """Static memory estimate of a real run (``tracer.analysis.memory.MemoryEstimate``)."""
        return estimate_peak(self)

    @cached_property
    def expected_sizes(self) -> dict[str, tuple[int, ...] | None]:
        """Each ``expect:`` entry's shape at these dims (None where it pins contiguity only)."""
        sizes = {}
        for name, expected in self.pipeline.expect.items():
            shape = expected if isinstance(expected, list) else expected.shape
            sizes[name] = None if shape is None else tuple(self.expect_alg_of(name).dim(t).value for t in shape)
        return sizes

    @property
    def total_flops(self) -> int:
        return sum(self.flops.values())

    @property
    def peak_bytes(self) -> int:
        """Estimated peak bytes of tensor storage of a real run at these dims."""
        return self.memory.peak_bytes

    @property
    def dims(self) -> dict[str, int]:
        return self.alg.values

    @property
    def errors(self) -> list[Diagnostic]:
        return [d for d in self.diagnostics if d.severity == "error"]

    @property
    def warnings(self) -> list[Diagnostic]:
        return [d for d in self.diagnostics if d.severity == "warning"]

    def step(self, step_id: str):
        return self.pipeline.steps[self.graph.index[step_id]]

    def output_of(self, step_id: str) -> str:
        """The record id holding a step's result (a composite's last inner tensor)."""
        step_id = self.aliases.get(step_id, step_id)
        inner = self.inner.get(step_id)
        if not inner or inner[0][0] in self.parts:  # a multi-output step has no single result
            return step_id
        return inner[-1][0]

    def chained(self, step_id: str) -> bool:
        """Whether a step's records form a chain (a composite: each inner op reads the previous one)."""
        inner = self.inner.get(step_id)
        return bool(inner) and inner[0][0] not in self.parts

    def bindings(self, alg: DimAlgebra | None = None) -> str:
        """``[B=2, T=6, ...]``: the file's dims, or ``alg``'s (a block's, for its steps)."""
        values = self.dims if alg is None else alg.values
        return "[" + ", ".join(f"{k}={v}" for k, v in values.items()) + "]" if values else ""

    def raise_errors(self) -> None:
        if self.errors:
            raise TracerError(self.errors)


class RuleContext:
    """What a shape rule may use: the dim algebra and the names of its inputs."""

    def __init__(self, alg: DimAlgebra, input_ids: list[str], dtype: str, step_id: str = ""):
        self.alg, self.input_ids, self.dtype, self.step_id = alg, input_ids, dtype, step_id
        self.warnings = []

    warnings: list

    def warn_if_different(self, a, b, what: str, field: str) -> None:
        """jaxtyping's rule: two dims that must match should be the *same* dim, not just equal
        today (``d_in`` and ``d_out`` both 3 hides a bug that ``--dim d_out=4`` would expose)."""
        if a.value == b.value and not a.same_symbol(b) and a.poly.constant is None and b.poly.constant is None:
            self.warnings.append((f"{what}: {a} and {b} are equal only because {a}={a.value} and {b}={b.value} today", field))

    def record(self, suffix: str) -> str:
        """The id of a composite step's inner tensor, e.g. ``merged/contiguous``."""
        return f"{self.step_id}/{suffix}"

    def dim(self, text, field: str):
        try:
            return self.alg.dim(text)
        except dimexpr.DimError as exc:
            raise StepError(exc.code, str(exc), field) from None


def analyze(pipeline: PipelineSpec, source: SourceMap, dims: Mapping[str, int] | None = None) -> Analysis:
    alg = _algebra(pipeline, source, dims or {})
    expanded = None
    if any(isinstance(step, Block) for step in pipeline.steps):
        expanded = expand_blocks(pipeline, source, alg)
        pipeline, source, alg = expanded.pipeline, expanded.source, expanded.alg
    graph = build_graph(pipeline, source)
    analysis = Analysis(pipeline, source, alg, graph, diagnostics=list(graph.diagnostics))
    if expanded is not None:
        analysis.algs, analysis.aliases, analysis.blocks = expanded.algs, expanded.aliases, expanded.blocks
        analysis.expect_algs = expanded.expect_algs
    for section in ("inputs", "params"):
        for name, decl in getattr(pipeline, section).items():
            meta = _declared_meta(name, decl, (section, name), analysis)
            if meta is not None:
                analysis.metas[name] = meta
    if not graph.diagnostics:
        for step_id in graph.order:
            _infer_step(step_id, analysis)
    analysis.outputs = _outputs(analysis)
    _check_expectations(analysis)
    analysis.diagnostics = merge_copies(analysis.diagnostics + lints.run_lints(analysis))
    return analysis


def _algebra(pipeline: PipelineSpec, source: SourceMap, overrides: Mapping[str, int]) -> DimAlgebra:
    exprs = {name: dimexpr.parse(text) for name, text in pipeline.dims.items()}
    for name, value in overrides.items():
        if name not in exprs:
            raise TracerError(
                source.error(
                    ("dims",),
                    "unknown-dim",
                    f"--dim {name}={value}: the pipeline has no dim '{name}' (dims: {', '.join(exprs) or 'none'})",
                    prefer_key=True,
                )
            )
        if not isinstance(exprs[name], dimexpr.Num):
            raise TracerError(
                source.error(
                    ("dims", name),
                    "derived-dim",
                    f"--dim {name}={value}: '{name}' is derived ({exprs[name]}); override the dims it is computed from",
                    prefer_key=True,
                )
            )
        if isinstance(value, bool) or not isinstance(value, int) or abs(value) > dimexpr.MAX_VALUE:
            raise TracerError(
                source.error(("dims", name), "dim-value", f"--dim {name}: expected an integer up to 2**62, got {value!r}", prefer_key=True)
            )
    try:
        values = resolve(exprs, overrides)
    except dimexpr.DimError as exc:
        raise TracerError(_dim_error(exc, exprs, source)) from None
    for name, value in values.items():
        if value < 0:
            given = f"--dim {name}={value}" if name in overrides else f"dim {name} = {exprs[name]} is {value}"
            raise TracerError(source.error(("dims", name), "dim-negative", f"{given}; dims must not be negative", prefer_key=True))
    return DimAlgebra(pipeline.dims, values)


def _dim_error(exc: dimexpr.DimError, exprs: dict, source: SourceMap) -> Diagnostic:
    name = getattr(exc, "dim", None)
    if name in exprs:
        return source.error(("dims", name), exc.code, f"dim {name} = {exprs[name]}: {exc}")
    return source.error(("dims",), exc.code, str(exc), prefer_key=True)


def _declared_meta(name: str, decl: TensorDecl, path: tuple, analysis: Analysis) -> Meta | None:
    shape = []
    alg = analysis.alg_of(name)
    cache = analysis.declared_dims
    key = (id(alg), id(decl), path[0])
    if key in cache:
        return with_root(fresh(cache[key], tensor_dtype(decl, analysis.pipeline.dtype)), name)
    for j, text in enumerate(decl.shape):
        try:
            dim = alg.dim(text)
        except dimexpr.DimError as exc:
            analysis.diagnostics.append(analysis.source.error(path + ("shape", j), exc.code, f"'{name}': {exc}"))
            return None
        if dim.value < 0:
            analysis.diagnostics.append(
                analysis.source.error(
                    path + ("shape", j), "dim-negative", f"'{name}': dim {dim} is {dim.value}; sizes must not be negative"
                )
            )
            return None
        shape.append(dim)
    if decl.fan_in is not None:
        try:
            alg.dim(decl.fan_in)
        except dimexpr.DimError as exc:
            analysis.diagnostics.append(analysis.source.error(path + ("fan_in",), exc.code, f"'{name}': fan_in: {exc}"))
            return None
    too_large = _too_large(tuple(d.value for d in shape), tensor_dtype(decl, analysis.pipeline.dtype))
    if too_large:
        analysis.diagnostics.append(
            analysis.source.error(path + ("shape",), "tensor-too-large", f"'{name}': {too_large} {analysis.bindings(alg)}")
        )
        return None
    problem = _source_problem(name, decl, tuple(d.value for d in shape), path[0], tensor_dtype(decl, analysis.pipeline.dtype))
    if problem:
        analysis.diagnostics.append(analysis.source.error(path + (problem[0],), "tensor-source", problem[1]))
        return None
    cache[key] = tuple(shape)
    return with_root(fresh(tuple(shape), tensor_dtype(decl, analysis.pipeline.dtype)), name)


def _source_problem(name: str, decl: TensorDecl, sizes: tuple[int, ...], section: str, dtype: str) -> tuple[str, str] | None:
    if decl.init in ("linear", "embedding") and section != "params":
        return "init", f"'{name}': init: {decl.init} is a parameter init; declare '{name}' under params"
    if decl.init in ("randn", "rand", "linear", "embedding") and decl.dtype not in (None, *FLOAT_DTYPES):
        return (
            "dtype",
            f"'{name}': init: {decl.init} draws floating-point numbers, it cannot make {decl.dtype}; use values, tokens, arange, zeros or ones",
        )
    if decl.init == "linear" and decl.fan_in is None and len(sizes) < 2:
        return "init", f"'{name}': a 1-d init: linear tensor (a bias) needs 'fan_in' (the in-features of its layer)"
    if decl.init == "full" and not fits(decl.value, dtype):
        return (
            "value",
            f"'{name}': init: full with {decl.value!r} overflows {dtype} (largest: {DTYPE_MAX[dtype]:g}); use a smaller number or -inf",
        )
    if decl.init in ("triu", "tril") and len(sizes) != 2:
        return "init", f"'{name}': init: {decl.init} builds a 2-d (T, T) pattern, the shape has {len(sizes)} dims"
    if decl.tokens is not None:
        count = len(decl.tokens.words())
        if sizes != (count,):
            return "tokens", f"'{name}': the sentence has {count} tokens, so the shape must be [{count}], not {list(sizes)}"
    if decl.values is not None:
        found = _literal_shape(decl.values)
        if found is None:
            return "values", f"'{name}': 'values' is ragged (rows of different lengths)"
        if found != sizes:
            return "values", f"'{name}': 'values' has shape {list(found)}, but the declared shape is {list(sizes)}"
    return None


def _too_large(sizes: tuple[int, ...], dtype: str) -> str | None:
    """Why torch could not even describe this tensor (its byte size or strides overflow int64), else None."""
    n = DTYPE_BYTES.get(dtype, 8)
    for size in sizes:
        n *= max(size, 1)
    if n > MAX_TENSOR_BYTES:
        return f"a {dtype} tensor of shape {list(sizes)} would need more than 2**62 bytes, which overflows torch's sizes"
    return None


def _literal_shape(values) -> tuple[int, ...] | None:
    if not isinstance(values, list):
        return ()
    shapes = {_literal_shape(v) for v in values}
    if len(shapes) > 1 or None in shapes:
        return None
    return (len(values),) + (shapes.pop() if shapes else ())


def _infer_step(step_id: str, analysis: Analysis) -> None:
    step = analysis.step(step_id)
    i = analysis.graph.index[step_id]
    refs = analysis.graph.refs[step_id]
    if any(ref not in analysis.metas for ref in refs):
        return  # an upstream error already explains this
    n_data = len(analysis.graph.data_inputs[step_id])
    if step.arity is not None and n_data != step.arity:
        field = "inputs" if step.inputs is not None else "input"
        analysis.diagnostics.append(
            analysis.source.error(
                ("steps", i, field),
                "arity",
                f"{step.op} takes {step.arity} input{'s' if step.arity > 1 else ''}, got {n_data}",
                step_id,
                prefer_key=True,
            )
        )
        return
    ins = [analysis.metas[r] for r in refs]
    ctx = RuleContext(analysis.alg_of(step_id), refs, analysis.pipeline.dtype, step_id)
    try:
        result = step.infer(ins, ctx)
    except StepError as exc:
        message = " ".join(filter(None, (exc.message, analysis.bindings(ctx.alg)))) + (f" — {exc.hint}" if exc.hint else "")
        analysis.diagnostics.append(analysis.source.error(("steps", i) + ((exc.field,) if exc.field else ()), exc.code, message, step_id))
        return
    metas = _result_metas(result)
    too_large = next(filter(None, (_too_large(m.sizes, m.dtype) for m in metas.values())), None)
    if too_large:
        analysis.diagnostics.append(
            analysis.source.error(("steps", i), "tensor-too-large", f"{too_large} {analysis.bindings(ctx.alg)}", step_id, prefer_key=True)
        )
        return
    for message, field_name in ctx.warnings:
        analysis.diagnostics.append(analysis.source.error(("steps", i, field_name), "dim-mismatch", message, step_id, severity="warning"))
    _store(analysis, step, result, metas)
    flops = step.flops(ins, list(metas.values())[-1])
    if flops:
        analysis.flops[analysis.inner[step_id][-1][0] if step_id in analysis.inner else step_id] = flops


def _result_metas(result: Shape) -> dict[str, Meta]:
    """What a shape rule returned, keyed by inner suffix (composite), output name, or '' (one tensor)."""
    if isinstance(result, Composite):
        return {inner.suffix: inner.meta for inner in result}
    if isinstance(result, Outputs):
        return dict(result.metas)
    return {"": result}


def _store(analysis: Analysis, step, result: Shape, metas: dict[str, Meta]) -> None:
    if isinstance(result, Outputs):
        for name, meta in metas.items():
            analysis.metas[name] = with_root(meta, name)
            analysis.parts[name] = step.id
        analysis.inner[step.id] = [(name, step.op) for name in metas]
    elif isinstance(result, Composite):
        analysis.inner[step.id] = [(f"{step.id}/{inner.suffix}", inner.op) for inner in result]
        for (record, _), inner in zip(analysis.inner[step.id], result):
            analysis.metas[record] = with_root(inner.meta, record)
        analysis.metas[step.id] = analysis.metas[analysis.inner[step.id][-1][0]]
    else:
        analysis.metas[step.id] = with_root(result, step.id)


def _outputs(analysis: Analysis) -> list[str]:
    pipeline = analysis.pipeline
    if pipeline.outputs is None:
        return pipeline.steps[-1].output_ids()
    known = analysis.graph.nodes
    for j, name in enumerate(pipeline.outputs):
        if name not in known:
            analysis.diagnostics.append(
                analysis.source.error(("outputs", j), "unknown-ref", f"output '{name}' is not a step, an input or a param")
            )
    return [name for name in pipeline.outputs if name in known]


def _check_expectations(analysis: Analysis) -> None:
    for name, expected in analysis.pipeline.expect.items():
        path = ("expect", name)
        if name not in analysis.graph.nodes and name not in analysis.metas:  # metas: composites' inner records too
            owner = name.rsplit("/", 1)[0]
            if not (owner in analysis.graph.index and owner not in analysis.metas):  # else an upstream error explains it
                analysis.diagnostics.append(
                    analysis.source.error(path, "unknown-ref", f"expect: '{name}' is not a tensor of this pipeline", prefer_key=True)
                )
            continue
        if name in analysis.graph.index and analysis.step(name).output_field is not None:
            made = ", ".join(analysis.step(name).output_ids())
            message = f"expect: '{name}' has several outputs ({made}); pin each by its name"
            analysis.diagnostics.append(analysis.source.error(path, "several-outputs", message, name, prefer_key=True))
            continue
        meta = analysis.metas.get(name)
        if meta is None:
            continue
        alg = analysis.expect_alg_of(name)
        problem = expectation_problem(alg, name, meta, expected)
        if problem:
            message = " ".join(filter(None, (problem, analysis.bindings(alg)))) + _block_dims_hint(analysis, name, expected, alg)
            analysis.diagnostics.append(
                analysis.source.error(path, "expect", message, name if name in analysis.graph.index else None, prefer_key=True)
            )


def _block_dims_hint(analysis: Analysis, name: str, expected, alg: DimAlgebra) -> str:
    """When this file's entry for a block's tensor reads dims only the block has, say so."""
    block_alg = analysis.alg_of(name)
    shape = expected if isinstance(expected, list) else expected.shape
    if block_alg is alg or not shape:
        return ""
    try:
        for text in shape:
            alg.dim(text)
        return ""
    except dimexpr.DimError:
        pass
    try:
        for text in shape:
            block_alg.dim(text)
    except dimexpr.DimError:
        return ""
    return (
        f" — '{name}' is inside a block, whose dims are {analysis.bindings(block_alg)}: this file's expect: reads "
        "this file's dims, the block file's own expect: reads the block's"
    )


def expectation_problem(alg: DimAlgebra, name: str, meta: Meta, expected) -> str | None:
    """Why ``meta`` does not meet an ``expect:`` entry (a shape list or ``{shape, contiguous}``), else None."""
    shape = expected if isinstance(expected, list) else expected.shape
    contiguous = expected.contiguous if isinstance(expected, Expect) else None
    if shape is not None:
        try:
            want = tuple(alg.dim(t) for t in shape)
        except dimexpr.DimError as exc:
            return f"expect '{name}': {exc}"
        if tuple(d.value for d in want) != meta.sizes:
            wanted = "(" + ", ".join(map(str, want)) + ") [" + ", ".join(str(d.value) for d in want) + "]"
            return f"expected '{name}' to be {wanted}, found {show(meta)}"
    if contiguous is not None and not meets_contiguity(meta.sizes, meta.stride, contiguous):
        rule = f" ({CONTIGUITY_RULE})" if 1 in meta.sizes else ""
        return (
            f"expected '{name}' to be {'contiguous' if contiguous else 'non-contiguous'}, found stride {meta.stride} for {show(meta)}{rule}"
        )
    return None


def symbolic_shape(meta: Meta) -> list[str]:
    return [str(d) for d in meta.shape]
