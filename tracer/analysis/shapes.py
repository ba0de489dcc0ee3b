"""Static analysis: every tensor's symbolic shape, strides and storage before anything runs.

``analyze`` expands blocks, builds the step graph, and walks its nodes in order, calling each step
kind's shape rule; each node comes back with the records it makes. A failing step poisons only
what depends on it, so every independent error in a file is reported. No torch.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from ..core import dimexpr
from ..core.dtypes import DTYPE_BYTES, DTYPE_MAX, fits
from ..core.errors import Diagnostic, TracerError, merge_copies
from ..core.frozen import frozen
from ..core.gcpause import gc_paused
from ..core.layout import Meta, fresh, with_root
from ..core.symbolic import Dim, DimAlgebra, resolve
from ..spec.expand import expand_blocks
from ..spec.inits import INITS
from ..spec.load import dim_error
from ..spec.pipeline import PipelineSpec, TensorDecl, tensor_dtype
from ..spec.source import SourceMap
from ..steps.contract import Composite, Outputs, Shape
from ..steps.rules import DimCause, StepError
from . import costs, parallel, positions, roles
from .attention import find_sites
from .expect import Expectation, check_expectations
from .graph import CHAIN, ONE, OUTPUTS, Node, Out, StepGraph, build_graph
from .lints import run_lints
from .lints.allow import apply_allows
from .memory import estimate_peak

MAX_TENSOR_BYTES = 2**62  # torch computes sizes, strides and byte counts in int64


@frozen
class Declared:
    """An input or a param: its declaration, its metadata, and the dims its shape is written in."""

    name: str
    section: str  # "inputs" or "params"
    decl: TensorDecl
    meta: Meta
    dims: DimAlgebra


@dataclass(frozen=True, eq=False)
class Analysis:
    """Everything known about a pipeline at fixed dims, before running it (immutable)."""

    pipeline: PipelineSpec  # blocks expanded
    source: SourceMap
    alg: DimAlgebra  # the file's dims (and the block dims with one value everywhere)
    graph: StepGraph
    nodes: Mapping[str, Node]  # step id -> node with its records, in execution order
    declared: Mapping[str, Declared]
    outputs: tuple[str, ...]
    expectations: tuple[Expectation, ...]
    diagnostics: tuple[Diagnostic, ...]
    blocks: Mapping[str, Any]  # block step id -> tracer.spec.expand.BlockInfo
    aliases: Mapping[str, str]  # block step id -> the record holding its output
    degrees: Mapping[str, int] = field(default_factory=dict)  # mesh dim -> its degree (the dims hold 1: the reference run)
    rank: Any = None  # tracer.analysis.parallel.RankView: every rank's shapes and collectives (files with parallel:)

    @cached_property
    def metas(self) -> dict[str, Meta]:
        """Record id -> its metadata: inputs and params, then every record of every step."""
        metas = {name: d.meta for name, d in self.declared.items()}
        for node in self.nodes.values():
            metas.update((out.id, out.meta) for out in node.outs)
        return metas

    @cached_property
    def _made_by(self) -> dict[str, Node]:
        return {out.id: node for node in self.nodes.values() for out in node.outs}

    def node(self, step_id: str) -> Node:
        return self.nodes[step_id]

    def producer(self, tensor_id: str) -> Node | None:
        """The node that makes a tensor (a step id, one of its records, or one of its named
        outputs); None for inputs and params."""
        return self.nodes.get(tensor_id) or self._made_by.get(tensor_id)

    def record_of(self, tensor_id: str) -> str:
        """The record holding a tensor that a file names: a block's output record for its step id,
        a composite's last inner record for its step id, anything else itself."""
        tensor_id = self.aliases.get(tensor_id, tensor_id)
        node = self.nodes.get(tensor_id)
        return node.value if node is not None and node.value is not None else tensor_id

    def meta(self, tensor_id: str) -> Meta | None:
        return self.metas.get(self.record_of(tensor_id))

    def axis_roles(self, tensor_id: str) -> tuple[str | None, ...]:
        """What each axis of a tensor means (tracer.analysis.roles), in the dims its step is written in."""
        meta = self.meta(tensor_id)
        if meta is None:
            return ()
        node = self.producer(self.record_of(tensor_id))
        alg = node.dims if node is not None else self.alg
        known = self._roles_by_label.setdefault(id(alg), {})  # a dim's role depends on its label and its algebra only
        for dim in meta.shape:
            if dim.label not in known:
                known[dim.label] = roles.dim_role(dim, alg.exprs)
        return tuple(known[dim.label] for dim in meta.shape)

    @cached_property
    def _roles_by_label(self) -> dict[int, dict[str, str | None]]:
        """id(algebra) -> dim label -> role: every block copy shares its algebra, so a stack of
        layers asks the same few questions thousands of times. The algebras live as long as this
        analysis, so their ids stay theirs."""
        return {}

    @cached_property
    def _positions(self) -> dict[str, positions.Positions]:
        return positions.token_positions(self, self.axis_roles)

    def token_positions(self, tensor_id: str) -> positions.Positions:
        """Which tokens each positions axis of a tensor holds (tracer.analysis.positions): an
        ``Interval`` per axis, None where an axis holds no positions or they are not known."""
        return self._positions.get(self.record_of(tensor_id), ())

    def users(self, tensor_id: str) -> tuple[Node, ...]:
        """The nodes that read a tensor (by the name the file gives it), in file order."""
        return tuple(self.nodes[s] for s in self.graph.users.get(tensor_id, ()) if s in self.nodes)

    def records(self) -> Iterator[tuple[str, Meta]]:
        """(record id, meta) of every tensor, in the order a run creates them."""
        yield from self.metas.items()

    @cached_property
    def attention(self):
        """Every attention computation, found once (``tracer.analysis.attention.Site``s, run order)."""
        return find_sites(self)

    @cached_property
    def memory(self):
        """Static memory estimate of a real run (``tracer.analysis.memory.MemoryEstimate``)."""
        return estimate_peak(self)

    @property
    def total_flops(self) -> int:
        return sum(node.flops for node in self.nodes.values())

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

    def bindings(self, alg: DimAlgebra | None = None) -> str:
        """``[B=2, T=6, ...]``: the file's dims, or ``alg``'s (a block's, for its steps)."""
        values = self.dims if alg is None else alg.values
        return "[" + ", ".join(f"{k}={v}" for k, v in values.items()) + "]" if values else ""

    def error(self, node: Node, code: str, message: str, field: str | None = None, severity: str = "error") -> Diagnostic:
        """A diagnostic located at a step (its field, when given)."""
        path = ("steps", node.index) + ((field,) if field else ())
        return self.source.error(path, code, message, node.id, prefer_key=field is None, severity=severity)

    def raise_errors(self) -> None:
        if self.errors:
            raise TracerError(self.errors)


class ShapeContext:
    """What a shape rule may use (the step contract's ``RuleContext``): the node's dims, the ids
    of its inputs, and a place for jaxtyping-style warnings."""

    def __init__(self, alg: DimAlgebra, input_ids: list[str], dtype: str, step_id: str = ""):
        self.alg, self.input_ids, self.dtype, self.step_id = alg, input_ids, dtype, step_id
        self.warnings: list[tuple[str, str]] = []

    def warn_if_different(self, a: Dim, b: Dim, what: str, field: str) -> None:
        """jaxtyping's rule: two dims that must match should be the *same* dim, not just equal
        today (``d_in`` and ``d_out`` both 3 hides a bug that ``--dim d_out=4`` would expose)."""
        if a.value == b.value and not a.same_symbol(b) and a.poly.constant is None and b.poly.constant is None:
            self.warnings.append((f"{what}: {a} and {b} are equal only because {a}={a.value} and {b}={b.value} today", field))

    def record(self, suffix: str) -> str:
        """The id of a composite step's inner tensor, e.g. ``merged/contiguous``."""
        return f"{self.step_id}/{suffix}"

    def dim(self, text, field: str) -> Dim:
        try:
            return self.alg.dim(text)
        except dimexpr.DimError as exc:
            raise StepError(exc.code, str(exc), field) from None


@gc_paused
def analyze(pipeline: PipelineSpec, source: SourceMap, dims: Mapping[str, int] | None = None) -> Analysis:
    """Expand, order and infer every step of ``pipeline`` at ``dims`` (default: the file's). A file
    with ``parallel:`` is analysed as its single-device reference (every mesh dim 1), and each
    rank's view at the mesh's degrees is kept beside it (``Analysis.rank``)."""
    dims = dims or {}
    mesh = pipeline.parallel.mesh if pipeline.parallel is not None else {}
    alg = _algebra(pipeline, source, dims, dict.fromkeys(mesh, 1))
    degrees = _degrees(pipeline, source, dims)
    analysis = _analysis(pipeline, source, alg, lambda *made: _ShapePass(*made[:4]), degrees)
    found = list(analysis.diagnostics) + check_expectations(analysis)
    if degrees and not any(d.severity == "error" for d in found):
        rank, problems = _rank_view(pipeline, source, dims, degrees, analysis)
        object.__setattr__(analysis, "rank", rank)
        found += problems
        # dims equal only because a mesh dim is 1 here prove nothing: the rank's, at the mesh's degrees, tell
        rank_warnings = rank.analysis.warnings if rank.analysis is not None else []
        found = [d for d in found if d.code != "dim-mismatch"] + [d for d in rank_warnings if d.code == "dim-mismatch"]
    if not any(d.severity == "error" for d in found):
        found = apply_allows(analysis, found + run_lints(analysis))
    object.__setattr__(analysis, "diagnostics", tuple(merge_copies(found)))
    return analysis


def _analysis(pipeline: PipelineSpec, source: SourceMap, alg: DimAlgebra, make_pass, degrees: Mapping[str, int]) -> Analysis:
    """Blocks expanded, the graph built and every step's shape rule run by ``make_pass``'s pass."""
    block_dims, copies, aliases, blocks, expect_dims = {}, {}, {}, {}, {}
    if any(step.includes_file for step in pipeline.steps):
        expanded = expand_blocks(pipeline, source, alg)
        pipeline, source, alg = expanded.pipeline, expanded.source, expanded.alg
        block_dims, copies, aliases, blocks, expect_dims = (
            expanded.algs,
            expanded.copies,
            expanded.aliases,
            expanded.blocks,
            expanded.expect_algs,
        )
    graph = build_graph(pipeline, source, alg, block_dims, copies)
    pass_ = make_pass(pipeline, source, alg, block_dims, graph)
    declared = pass_.declarations()
    nodes = dict(graph.nodes)
    if not graph.diagnostics:
        for step_id, node in graph.nodes.items():
            nodes[step_id] = pass_.infer(node)
        pass_.diagnostics += pass_.cause_errors()
    outputs = _outputs(pipeline, graph, source, pass_.diagnostics)
    expectations = tuple(Expectation(name, expected, expect_dims.get(name, alg)) for name, expected in pipeline.expect.items())
    diagnostics = graph.diagnostics + tuple(pass_.diagnostics)
    return Analysis(pipeline, source, alg, graph, nodes, declared, outputs, expectations, diagnostics, blocks, aliases, dict(degrees))


def _degrees(pipeline: PipelineSpec, source: SourceMap, dims: Mapping[str, int]) -> dict[str, int]:
    """Mesh dim -> its degree at ``dims`` (``--dim tp=4`` overrides the mesh's 2); empty without ``parallel:``."""
    if pipeline.parallel is None:
        return {}
    exprs, needed, todo = pipeline.dim_exprs, set(), list(pipeline.parallel.mesh)
    while todo:  # the mesh's sizes and the dims they are computed from: another dim may fail at these degrees
        name = todo.pop()
        if name in exprs and name not in needed:
            needed.add(name)
            todo += dimexpr.names(exprs[name])
    values = resolve({name: exprs[name] for name in exprs if name in needed}, {k: v for k, v in dims.items() if k in needed})
    degrees = {name: values[name] for name in pipeline.parallel.mesh}
    for name, degree in degrees.items():
        if degree < 1:
            message = f"mesh dim {name} is {degree}; a degree is at least 1 (the number of ranks along it)"
            raise TracerError(source.error(("parallel", "mesh", name), "mesh-degree", message))
    return degrees


def _rank_view(
    pipeline: PipelineSpec, source: SourceMap, dims: Mapping[str, int], degrees: dict[str, int], reference: Analysis
) -> tuple[parallel.RankView, list[Diagnostic]]:
    """Each rank's analysis at the mesh's degrees (the same shapes on every rank), its collectives
    and the plan's problems; and the plan's own located errors."""

    def error(path, code, message, prefer_key):
        return reference.source.error(path, code, message, prefer_key=prefer_key)

    plan, problems = parallel.resolve_plan(pipeline.parallel, reference.nodes, error)
    view = parallel.RankView(degrees, plan)
    if problems:
        return view, problems
    made = []

    def rank_pass(pipeline, source, alg, block_dims, graph):
        made.append(parallel.Sharding(pipeline.parallel, plan, degrees, graph.nodes))
        return _RankPass(pipeline, source, alg, block_dims, made[-1])

    try:
        view.analysis = _analysis(pipeline, source, _algebra(pipeline, source, dims), rank_pass, degrees)
    except TracerError as exc:  # a dim such as H // tp (a block's too) that the degree does not divide
        view.failure = exc.diagnostics[0]
        return view, []
    view.collectives, view.problems = made[-1].collectives, made[-1].problems
    errors = [error(path, "placement", message, False) for path, message in dict.fromkeys(made[-1].errors)]
    return view, errors


def _algebra(
    pipeline: PipelineSpec, source: SourceMap, overrides: Mapping[str, int], forced: Mapping[str, int] | None = None
) -> DimAlgebra:
    """The file's dims at ``overrides`` (the user's, checked), and ``forced`` (tracer's own: the
    mesh dims at 1 for the single-device reference)."""
    exprs = pipeline.dim_exprs
    for name, value in overrides.items():
        if name not in exprs:
            message = f"--dim {name}={value}: the pipeline has no dim '{name}' (dims: {', '.join(exprs) or 'none'})"
            raise TracerError(source.error(("dims",), "unknown-dim", message, prefer_key=True))
        if not dimexpr.is_number(exprs[name]):
            message = f"--dim {name}={value}: '{name}' is derived ({exprs[name]}); override the dims it is computed from"
            raise TracerError(source.error(("dims", name), "derived-dim", message, prefer_key=True))
        if isinstance(value, bool) or not isinstance(value, int) or abs(value) > dimexpr.MAX_VALUE:
            message = f"--dim {name}: expected an integer up to 2**62, got {value!r}"
            raise TracerError(source.error(("dims", name), "dim-value", message, prefer_key=True))
    try:
        values = resolve(exprs, {**overrides, **(forced or {})})
    except dimexpr.DimError as exc:
        raise TracerError(dim_error(exc, pipeline.dims, source)) from None
    for name, value in values.items():
        if value < 0:
            given = f"--dim {name}={value}" if name in overrides else f"dim {name} = {exprs[name]} is {value}"
            raise TracerError(source.error(("dims", name), "dim-negative", f"{given}; dims must not be negative", prefer_key=True))
    return DimAlgebra(exprs, values)


def too_large(sizes: tuple[int, ...], dtype: str) -> str | None:
    """Why torch could not even describe this tensor (its byte size or strides overflow int64), else None."""
    n = DTYPE_BYTES.get(dtype, 8)
    for size in sizes:
        n *= max(size, 1)
    if n > MAX_TENSOR_BYTES:
        return f"a {dtype} tensor of shape {list(sizes)} would need more than 2**62 bytes, which overflows torch's sizes"
    return None


class _ShapePass:
    """The declared tensors' metadata, then each node's records from its kind's shape rule."""

    def __init__(self, pipeline: PipelineSpec, source: SourceMap, alg: DimAlgebra, block_dims: Mapping[str, DimAlgebra]):
        self.pipeline, self.source, self.alg, self.block_dims = pipeline, source, alg, block_dims
        self.metas: dict[str, Meta] = {}  # every record so far: what later rules read
        self.diagnostics: list[Diagnostic] = []
        self.declared_metas: dict[tuple, Meta] = {}  # (dims, declaration, section) -> its tensor, rootless: block copies share declarations
        self.values: dict[str, str] = {}  # composite step id -> its last inner record
        self.causes: dict[DimCause, list[str]] = {}  # a derived dim that made steps fail -> those steps

    def cause_errors(self) -> list[Diagnostic]:
        """One error at the line of ``dims:`` that defines each dim that made steps fail: the
        steps' own errors point where it shows, this one where to fix it."""
        found = []
        for cause, steps in self.causes.items():
            written = self.pipeline.dims[cause.name]
            needs = f"step '{steps[0]}' needs" if len(steps) == 1 else f"steps {', '.join(repr(s) for s in steps)} need"
            fix = f": write `{cause.name}: {cause.written}`" if cause.written else ""
            message = f"{cause.name}: {written} is {self.alg.values[cause.name]}, but {needs} {cause.name} = {cause.needed}{fix}"
            found.append(self.source.error(("dims", cause.name), "dim-value", message, prefer_key=True))
        return found

    def bindings(self, alg: DimAlgebra) -> str:
        return "[" + ", ".join(f"{k}={v}" for k, v in alg.values.items()) + "]" if alg.values else ""

    # ------------------------------------------------------------------ inputs and params

    def declarations(self) -> dict[str, Declared]:
        declared = {}
        for section in ("inputs", "params"):
            for name, decl in getattr(self.pipeline, section).items():
                alg = self.block_dims.get(name, self.alg)
                meta = self._declared_meta(name, decl, (section, name), alg)
                if meta is not None and name not in declared:
                    declared[name] = Declared(name, section, decl, meta, alg)
                    self.metas[name] = meta
        return declared

    def _declared_meta(self, name: str, decl: TensorDecl, path: tuple, alg: DimAlgebra) -> Meta | None:
        dtype = tensor_dtype(decl, self.pipeline.dtype)
        key = (id(alg), id(decl), path[0])  # the dtype is the declaration's (or this file's)
        if key not in self.declared_metas:
            shape = self._declared_shape(name, decl, path, alg, dtype)
            if shape is None:
                return None
            self.declared_metas[key] = fresh(shape, dtype)
        return with_root(self.declared_metas[key], name)

    def _declared_shape(self, name: str, decl: TensorDecl, path: tuple, alg: DimAlgebra, dtype: str) -> tuple[Dim, ...] | None:
        shape = []
        for j, text in enumerate(decl.shape):
            try:
                dim = alg.dim(text)
            except dimexpr.DimError as exc:
                return self._problem(path + ("shape", j), exc.code, f"'{name}': {exc}")
            if dim.value < 0:
                return self._problem(path + ("shape", j), "dim-negative", f"'{name}': dim {dim} is {dim.value}; sizes must not be negative")
            shape.append(dim)
        if decl.fan_in is not None:
            try:
                alg.dim(decl.fan_in)
            except dimexpr.DimError as exc:
                return self._problem(path + ("fan_in",), exc.code, f"'{name}': fan_in: {exc}")
        sizes = tuple(d.value for d in shape)
        large = too_large(sizes, dtype)
        if large:
            return self._problem(path + ("shape",), "tensor-too-large", f"'{name}': {large} {self.bindings(alg)}")
        problem = _source_problem(name, decl, sizes, path[0], dtype)
        if problem:
            return self._problem(path + (problem[0],), "tensor-source", problem[1])
        return tuple(shape)

    def _problem(self, path: tuple, code: str, message: str) -> None:
        self.diagnostics.append(self.source.error(path, code, message))
        return None

    # ------------------------------------------------------------------ steps

    def infer(self, node: Node) -> Node:
        """``node`` with its records, or as it was when an upstream error or its own rule stops it."""
        step, i = node.step, node.index
        metas = self.metas
        reads = [metas.get(self._value(ref)) for ref in node.refs]
        if None in reads:
            return node  # an upstream error already explains this
        if step.arity is not None and len(node.inputs) != step.arity:
            field = "inputs" if step.inputs is not None else "input"
            takes = "no input" if step.arity == 0 else f"{step.arity} input{'s' if step.arity > 1 else ''}"
            message = f"{step.op} takes {takes}, got {len(node.inputs)}"
            self.diagnostics.append(self.source.error(("steps", i, field), "arity", message, step.id, prefer_key=True))
            return node
        ctx = ShapeContext(node.dims, list(node.refs), self.pipeline.dtype, step.id)
        try:
            result = step.infer(reads, ctx)
        except StepError as exc:
            message = " ".join(filter(None, (exc.message, self.bindings(ctx.alg)))) + (f" — {exc.hint}" if exc.hint else "")
            self.diagnostics.append(self.source.error(("steps", i) + ((exc.field,) if exc.field else ()), exc.code, message, step.id))
            if exc.cause is not None and node.dims is self.alg and exc.cause.name in self.pipeline.dims:
                self.causes.setdefault(exc.cause, []).append(step.id)
            return node
        form, made = _made(step, result)
        large = next(filter(None, (too_large(meta.sizes, meta.dtype) for _, _, meta, _ in made)), None)
        if large:
            message = f"{large} {self.bindings(ctx.alg)}"
            self.diagnostics.append(self.source.error(("steps", i), "tensor-too-large", message, step.id, prefer_key=True))
            return node
        for message, field_name in ctx.warnings:
            self.diagnostics.append(self.source.error(("steps", i, field_name), "dim-mismatch", message, step.id, severity="warning"))
        inputs = tuple(self._value(ref) for ref in node.refs)
        outs = []
        for record, op, meta, named in made:
            out = Out(record, op, with_root(meta, record), _resolve(form, named, inputs, step.id, outs))
            metas[record] = out.meta
            outs.append(out)
        if form == CHAIN:
            self.values[step.id] = outs[-1].id
        outs = tuple(outs)
        return node.made(inputs, outs, form, costs.flops(step, reads, outs))

    def _value(self, ref: str) -> str:
        """The record a reference reads: a composite step's id reads its last inner record."""
        return self.values.get(ref, ref)


class _RankPass(_ShapePass):
    """The shape pass as one rank runs it: declared tensors local, planned steps redistributed."""

    def __init__(self, pipeline, source, alg, block_dims, sharding: parallel.Sharding):
        super().__init__(pipeline, source, alg, block_dims)
        self.sharding = sharding

    def _declared_meta(self, name: str, decl: TensorDecl, path: tuple, alg: DimAlgebra) -> Meta | None:
        meta = super()._declared_meta(name, decl, path, alg)
        return None if meta is None else self.sharding.declared(name, path[0], meta, alg)

    def infer(self, node: Node) -> Node:
        return self.sharding.step(node, self.metas, super().infer, self._value)


def _made(step, result: Shape) -> tuple[str, list[tuple[str, str, Meta, tuple | None]]]:
    """What a shape rule returned, as (form, [(record id, op, meta, what it reads)])."""
    if isinstance(result, Composite):
        return CHAIN, [(f"{step.id}/{inner.suffix}", inner.op, inner.meta, inner.reads) for inner in result]
    if isinstance(result, Outputs):
        return OUTPUTS, [(name, step.op, meta, None) for name, meta in result.metas.items()]
    return ONE, [(step.id, step.op, result, None)]


def _resolve(form: str, reads: tuple | None, inputs: tuple[str, ...], step_id: str, before: list[Out]) -> tuple[str, ...]:
    """The record ids a record was computed from: every tensor of the step for one op or named
    outputs; for a composite's inner op what ``Inner.reads`` names (by default the one before it,
    the step's tensors for the first one)."""
    if form != CHAIN:
        return inputs
    if reads is None:
        return (before[-1].id,) if before else inputs
    return tuple(inputs[r] if isinstance(r, int) else f"{step_id}/{r}" for r in reads)


def _source_problem(name: str, decl: TensorDecl, sizes: tuple[int, ...], section: str, dtype: str) -> tuple[str, str] | None:
    """Why the declaration cannot make a tensor of these sizes: its init's own rule, or literal
    values and tokens that do not have the declared shape."""
    if decl.buffer and section == "inputs":
        return (
            "buffer",
            f"'{name}': buffer: true marks a param the module holds but does not train; an input is given to each run, so drop it",
        )
    if decl.init is not None:
        problem = INITS[decl.init].problem(decl, sizes, section)
        if problem:
            return problem[0], f"'{name}': {problem[1]}"
        if decl.init == "full" and not fits(decl.value, dtype):
            return (
                "value",
                f"'{name}': init: full with {decl.value!r} overflows {dtype} (largest: {DTYPE_MAX[dtype]:g}); use a smaller number or -inf",
            )
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


def _literal_shape(values) -> tuple[int, ...] | None:
    if not isinstance(values, list):
        return ()
    shapes = {_literal_shape(v) for v in values}
    if len(shapes) > 1 or None in shapes:
        return None
    return (len(values),) + (shapes.pop() if shapes else ())


def _outputs(pipeline: PipelineSpec, graph: StepGraph, source: SourceMap, diagnostics: list[Diagnostic]) -> tuple[str, ...]:
    if pipeline.outputs is None:
        return tuple(pipeline.steps[-1].output_ids())
    for j, name in enumerate(pipeline.outputs):
        if not graph.knows(name):
            diagnostics.append(source.error(("outputs", j), "unknown-ref", f"output '{name}' is not a step, an input or a param"))
    return tuple(name for name in pipeline.outputs if graph.knows(name))
