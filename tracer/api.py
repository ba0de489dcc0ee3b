"""The Python API: ``tracer.load(path).run(...)`` and ``tracer.run(path, ...)``."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Collection, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from .analysis.expect import Layout, check_expectations
from .analysis.memory import check_budget
from .analysis.shapes import Analysis, analyze
from .core.errors import Diagnostic, ExpectationError, TracerError, printable
from .presentation.files import write_atomic
from .presentation.notebook import pipeline_html
from .presentation.trace import Trace
from .runtime.interpreter import Plan, device_problem, torch_module
from .runtime.tensors import create_tensors, match_routes, with_given
from .runtime.watch import ValueRows
from .spec.load import load_named, load_spec_text
from .spec.pipeline import SEED_MAX, SEED_MIN, PipelineSpec
from .spec.source import SourceMap

_CACHE_SIZE = 4


class Pipeline:
    """A validated pipeline file. Analyses, compiled plans and created tensors are cached, so
    repeated runs with the same dims and seed pay only for the kernels and the records."""

    def __init__(self, spec: PipelineSpec, source: SourceMap):
        self.spec, self.source = spec, source
        self.files: dict[str, str] | None = None  # generated files (tracer.from_module): name -> text, the main one first
        self.files_named: Callable[[str], dict[str, str]] | None = None  # the same files, named after another main file
        self._analyses: dict[tuple, Analysis] = {}
        self._plans: dict[tuple, Any] = {}
        self._tensors: dict[tuple, tuple[dict, Any]] = {}

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def path(self) -> str:
        return self.source.file

    def check(self, dims: Mapping[str, int] | None = None) -> Analysis:
        """Static analysis at these dims (errors and warnings in ``.diagnostics``; nothing raised)."""
        key = _dims_key(dims)
        if key not in self._analyses:
            _remember(self._analyses, key, analyze(self.spec, self.source, dims))
        return self._analyses[key]

    def run(
        self,
        dims: Mapping[str, int] | None = None,
        seed: int | None = None,
        keep_values: bool | Collection[str] = False,
        device: str = "cpu",
        tensors: Mapping[str, Any] | None = None,
        max_memory: int | str | None = None,
        observe: Callable[[str, Any], None] | None = None,
        params: Mapping[str, Any] | None = None,
        inputs: Mapping[str, Any] | None = None,
        check_values: bool = False,
        meta_kernels: bool = False,
    ) -> Trace:
        """Execute on torch and record every tensor. ``params`` and ``inputs`` replace declared
        tensors by name (a param's id, with ``/`` or ``.``: ``layers.3.W_q``), ``tensors`` either;
        every shape and dtype is checked against the declaration, all problems reported at once.

        ``observe(record_id, tensor)`` is called for every tensor a step produces, right after the
        step and before the tensor is freed: a hook for statistics (NaN rows, norms) that keeps no
        tensor alive, e.g. ``tracer.runtime.watch.SoftmaxNaNs``. ``check_values`` watches every
        tensor for rows holding NaN or inf and masks that hide every key of a query
        (``tracer.runtime.watch.ValueRows``): the trace's ``value_rows`` and ``value_warnings``, shown
        by its table, JSON, notebook view and report; ``tracer run`` always does.

        ``keep_values`` keeps every tensor's values in the trace (``True``) or only those of the
        tensor ids it lists (``["scores"]``: the others are freed after their last use, as without).

        A real run whose estimated peak (``analysis.peak_bytes``, plus every kept tensor held to the
        end) exceeds ``max_memory`` (bytes or ``'8GiB'``; default: half of the available RAM) raises
        ``TracerError`` before anything is allocated; ``device='meta'`` traces every shape and
        stride without allocating at all: torch's meta kernels run once per distinct step (a
        repeated block's later copies take the layouts its first copy agreed with, a few
        microseconds a tensor), or for every step with ``meta_kernels=True``.
        """
        analysis = self.check(dims)
        analysis.raise_errors()
        problem = device_problem(device)
        if problem is not None:
            raise TracerError(Diagnostic(self.path, None, "device", problem))
        kept = _kept(analysis, keep_values)
        check_budget(analysis, device, max_memory, kept)
        seed = self.spec.seed if seed is None else seed
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int) or not SEED_MIN <= seed <= SEED_MAX):
            raise TracerError(
                Diagnostic(
                    self.path,
                    None,
                    "seed-range",
                    f"seed {seed!r} is not an integer from -2**63 to 2**64 - 1 (what torch.manual_seed accepts)",
                )
            )
        plan_key = (_dims_key(dims), str(device), meta_kernels)
        if plan_key not in self._plans:
            _remember(self._plans, plan_key, Plan(analysis, device, meta_kernels=meta_kernels))
        plan = self._plans[plan_key]
        torch = torch_module()
        given = _given(analysis, tensors, params, inputs)
        # The drawn tensors depend only on which names are given, never on their values: drawn once,
        # they are reused, so a run with given tensors pays neither the draws nor torch.manual_seed
        # (which formats a stack trace per device on every call while CUDA is not initialised).
        tensor_key = plan_key + (seed, frozenset(given))
        if tensor_key not in self._tensors:
            created = create_tensors(analysis, device, seed, skip=frozenset(given))
            _remember(self._tensors, tensor_key, (created, torch.get_rng_state() if seed is not None else None))
        created, rng_state = self._tensors[tensor_key]
        if rng_state is not None and plan.random:
            torch.set_rng_state(rng_state)  # training dropout sees the same RNG as a fresh run
        if given:
            created = with_given(created, given, plan.device)
        watch = ValueRows(analysis) if check_values else None
        if isinstance(kept, bool):
            records, outputs, as_predicted = plan.run(created, kept, _both(watch, observe))
        else:
            found = {rid: created[rid] for rid in kept if rid in created}  # inputs and params live for the whole run
            records, outputs, as_predicted = plan.run(created, False, _both(_both(watch, observe), _keeping(kept, found)))
            records = [replace(record, tensor=found[record.id]) if record.id in found else record for record in records]
        trace = Trace(self, analysis, records, outputs, seed, kept, as_predicted=as_predicted)
        if watch is not None:
            trace.value_rows, trace.value_warnings = watch.found, tuple(watch.warnings())
        if not as_predicted:  # otherwise the static check of expect: already covers this run
            _enforce_expectations(trace)
        return trace

    def to_yaml(self, path: str | Path | None = None) -> str:
        """The pipeline's YAML text; with ``path``, also written there (atomically), and the block
        files an imported pipeline includes written beside it, named after it (``OUT_layers.yaml``)."""
        texts = self.files or {Path(self.path).name: Path(self.path).read_text()}
        if path is not None:
            path = Path(path)
            texts = self.files_named(path.stem) if self.files else texts
            reads = [] if self.files else [self.path]
            for name, text in texts.items():
                write_atomic(path if name == next(iter(texts)) else path.parent / name, text, reads=reads)
        return next(iter(texts.values()))

    def __repr__(self) -> str:
        return f"<Pipeline {self.name!r} from {self.path}: {len(self.spec.steps)} steps>"

    def _repr_html_(self) -> str:

        return pipeline_html(self)


def _given(analysis: Analysis, tensors, params, inputs) -> dict[str, Any]:
    """Every tensor given by name, checked against its declaration; all problems in one error."""
    return match_routes(analysis, [("tensors=", None, tensors), ("params=", "params", params), ("inputs=", "inputs", inputs)])


def _enforce_expectations(trace: Trace) -> None:
    """``expect:`` is checked statically, and again against what torch produced when a run's
    layouts differ from the prediction."""

    def layout_of(record_id: str) -> Layout | None:
        return trace.layout(record_id) if record_id in trace else None

    problems = check_expectations(trace.analysis, layout_of)
    if problems:
        raise ExpectationError(problems)


def _dims_key(dims: Mapping[str, int] | None) -> tuple:
    return tuple(sorted(dims.items())) if dims else ()


def _kept(analysis, keep_values: bool | Collection[str]) -> bool | frozenset[str]:
    """``keep_values`` as the run takes it: a bool, or the record ids of the tensors named (each
    a tensor of this run, or a located error)."""
    if isinstance(keep_values, bool):
        return keep_values
    if isinstance(keep_values, str):
        keep_values = [keep_values]
    unknown = [name for name in keep_values if analysis.meta(name) is None]
    if unknown:
        message = f"keep_values names {printable(unknown[0])!r}, which is no tensor of this run"
        raise TracerError(Diagnostic(analysis.source.file, None, "unknown-tensor", message))
    return frozenset(analysis.record_of(name) for name in keep_values)


def _keeping(kept: frozenset[str], found: dict) -> Callable[[str, Any], None]:
    """An observer holding on to the kept tensors (their storage stays until the trace is dropped)."""

    def keep(record_id: str, tensor) -> None:
        if record_id in kept:
            found[record_id] = tensor

    return keep


def _remember(cache: dict, key: tuple, value: Any) -> None:
    if len(cache) >= _CACHE_SIZE:
        cache.pop(next(iter(cache)))
    cache[key] = value


def load(path: str | Path) -> Pipeline:
    """Read and validate a pipeline file, or the bundled pipeline of that name when no such file
    exists (``tracer.load("llama_decoder_layer")``); static errors at its declared dims raise ``TracerError``."""
    spec, source = load_named(path)
    pipeline = Pipeline(spec, source)
    pipeline.check().raise_errors()
    return pipeline


def loads(text: str, name: str = "<string>") -> Pipeline:
    """Like ``load``, from YAML text."""
    spec, source = load_spec_text(text, name)
    pipeline = Pipeline(spec, source)
    pipeline.check().raise_errors()
    return pipeline


def run(path: str | Path, /, **options: Any) -> Trace:
    """``load(path).run(**options)`` in one call; the options are :meth:`Pipeline.run`'s."""
    return load(path).run(**options)


run.__signature__ = inspect.Signature(  # help() and editors show Pipeline.run's options
    [inspect.Parameter("path", inspect.Parameter.POSITIONAL_ONLY, annotation="str | Path")]
    + list(inspect.signature(Pipeline.run).parameters.values())[1:],
    return_annotation="Trace",
)


def _both(first: Callable | None, second: Callable | None) -> Callable | None:
    """One run hook calling both (either may be None)."""
    if first is None or second is None:
        return first or second

    def both(record_id: str, tensor: Any) -> None:
        first(record_id, tensor)
        second(record_id, tensor)

    return both
