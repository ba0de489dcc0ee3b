"""The Python API: ``tracer.load(path).run(...)`` and ``tracer.run(path, ...)``."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from .analysis.shapes import Analysis, analyze
from .core.errors import Diagnostic, ExpectationError, TracerError
from .core.layout import CONTIGUITY_RULE, meets_contiguity
from .runtime.trace import Trace
from .spec.load import load_spec, load_spec_text
from .spec.pipeline import SEED_MAX, SEED_MIN, PipelineSpec
from .spec.source import SourceMap

_CACHE_SIZE = 4


class Pipeline:
    """A validated pipeline file. Analyses, compiled plans and created tensors are cached, so
    repeated runs with the same dims and seed pay only for the kernels and the records."""

    def __init__(self, spec: PipelineSpec, source: SourceMap):
        self.spec, self.source = spec, source
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
        keep_values: bool = False,
        device: str = "cpu",
        tensors: Mapping[str, Any] | None = None,
        max_memory: int | str | None = None,
        observe: Callable[[str, Any], None] | None = None,
        params: Mapping[str, Any] | None = None,
        inputs: Mapping[str, Any] | None = None,
    ) -> Trace:
        """Execute on torch and record every tensor. ``params`` and ``inputs`` replace declared
        tensors by name (a param's id, with ``/`` or ``.``: ``layers.3.W_q``), ``tensors`` either;
        every shape and dtype is checked against the declaration, all problems reported at once.

        ``observe(record_id, tensor)`` is called for every tensor a step produces, right after the
        step and before the tensor is freed: a hook for statistics (NaN rows, norms) that keeps no
        tensor alive, e.g. ``tracer.analysis.lints.SoftmaxNaNs``.

        A real run whose estimated peak (``analysis.peak_bytes``) exceeds ``max_memory`` (bytes or
        ``'8GiB'``; default: half of the available RAM) raises ``TracerError`` before anything is
        allocated; ``device='meta'`` traces every shape and stride without allocating at all.
        """
        from .analysis.memory import check_budget
        from .runtime.interpreter import Plan, create_tensors, device_problem, run_plan, torch_module

        analysis = self.check(dims)
        analysis.raise_errors()
        problem = device_problem(device)
        if problem is not None:
            raise TracerError(Diagnostic(self.path, None, "device", problem))
        check_budget(analysis, device, max_memory)
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
        plan_key = (_dims_key(dims), str(device))
        if plan_key not in self._plans:
            _remember(self._plans, plan_key, Plan(analysis, device))
        plan = self._plans[plan_key]
        torch = torch_module()
        given = _given(analysis, tensors, params, inputs)
        if given:
            created = create_tensors(analysis, device, seed, given)
        else:
            tensor_key = plan_key + (seed,)
            if tensor_key not in self._tensors:
                created = create_tensors(analysis, device, seed)
                _remember(self._tensors, tensor_key, (created, torch.get_rng_state() if seed is not None else None))
            created, rng_state = self._tensors[tensor_key]
            if rng_state is not None and plan.random:
                torch.set_rng_state(rng_state)  # training dropout sees the same RNG as a fresh run
        trace = run_plan(plan, created, self, seed, keep_values, observe)
        trace.renderer = _renderer()
        if not trace.as_predicted:  # otherwise the static check of expect: already covers this run
            _enforce_expectations(trace)
        return trace

    def __repr__(self) -> str:
        return f"<Pipeline {self.name!r} from {self.path}: {len(self.spec.steps)} steps>"

    def _repr_html_(self) -> str:
        from .presentation.notebook import pipeline_html

        return pipeline_html(self)


def _renderer():
    from .presentation import diagram as render  # the API joins running and drawing; neither layer imports the other

    return render


def _given(analysis: Analysis, tensors, params, inputs) -> dict[str, Any]:
    """Every tensor given by name, checked against its declaration; all problems in one error."""
    from .runtime.tensors import match

    given, problems = {}, []
    for what, section, tensors_given in (("tensors=", None, tensors), ("params=", "params", params), ("inputs=", "inputs", inputs)):
        try:
            given.update(match(analysis, tensors_given or {}, section, what))
        except TracerError as exc:
            problems += exc.diagnostics
    if problems:
        raise TracerError(problems)
    return given


def _enforce_expectations(trace: Trace) -> None:
    """``expect:`` is checked statically, and again here against what torch actually produced."""
    analysis = trace.analysis
    problems = []
    for name, expected in analysis.pipeline.expect.items():
        record = trace[name]
        shape = expected if isinstance(expected, list) else expected.shape
        if shape is not None and analysis.expected_sizes[name] != record.shape:
            problems.append((name, f"'{name}' ran with shape {list(record.shape)}, expected ({', '.join(map(str, shape))})"))
        contiguous = getattr(expected, "contiguous", None)
        if contiguous is not None and not meets_contiguity(record.shape, record.stride, contiguous):
            ran = "non-" if contiguous else ""
            want = "contiguous" if contiguous else "non-contiguous"
            rule = f" ({CONTIGUITY_RULE})" if 1 in record.shape else ""
            problems.append((name, f"'{name}' ran {ran}contiguous (stride {record.stride}), expected {want}{rule}"))
    if problems:
        raise ExpectationError([analysis.source.error(("expect", name), "expect", text, prefer_key=True) for name, text in problems])


def _dims_key(dims: Mapping[str, int] | None) -> tuple:
    return tuple(sorted((dims or {}).items()))


def _remember(cache: dict, key: tuple, value: Any) -> None:
    if len(cache) >= _CACHE_SIZE:
        cache.pop(next(iter(cache)))
    cache[key] = value


def load(path: str | Path) -> Pipeline:
    """Read and validate a pipeline file; static errors at its declared dims raise ``TracerError``."""
    spec, source = load_spec(path)
    pipeline = Pipeline(spec, source)
    pipeline.check().raise_errors()
    return pipeline


def loads(text: str, name: str = "<string>") -> Pipeline:
    """Like ``load``, from YAML text."""
    spec, source = load_spec_text(text, name)
    pipeline = Pipeline(spec, source)
    pipeline.check().raise_errors()
    return pipeline


def run(
    path: str | Path,
    dims: Mapping[str, int] | None = None,
    seed: int | None = None,
    keep_values: bool = False,
    device: str = "cpu",
    tensors: Mapping[str, Any] | None = None,
    max_memory: int | str | None = None,
    observe: Callable[[str, Any], None] | None = None,
    params: Mapping[str, Any] | None = None,
    inputs: Mapping[str, Any] | None = None,
) -> Trace:
    """``load(path).run(...)`` in one call."""
    return load(path).run(
        dims=dims,
        seed=seed,
        keep_values=keep_values,
        device=device,
        tensors=tensors,
        max_memory=max_memory,
        observe=observe,
        params=params,
        inputs=inputs,
    )
