"""Load a pipeline file: safe YAML → pydantic validation → located diagnostics."""

from __future__ import annotations

import difflib
import re
from dataclasses import replace
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from ..core import dimexpr
from ..core.errors import Diagnostic, TracerError
from ..core.fields import ID_PATTERN, PARAM_PATTERN, RECORD_PATTERN
from ..core.gcpause import gc_paused
from ..core.symbolic import resolve
from ..steps.contract import STEP_KINDS
from .bundled import locate, not_found
from .pipeline import DIM_PATTERN, Expect, PipelineSpec, TensorDecl
from .source import SourceMap, parse_document, read_document


@gc_paused
def load_spec(path: str | Path) -> tuple[PipelineSpec, SourceMap]:
    data, source = read_document(path)
    return validate(data, source), source


def load_named(name: str | Path) -> tuple[PipelineSpec, SourceMap]:
    """A FILE argument: the file, or else the bundled pipeline of that name (``tracer run
    llama_decoder_layer``); a name that is neither says so, and where the bundled names are listed."""
    try:
        return load_spec(locate(name))
    except TracerError as exc:
        missing = [d.code == "file-missing" and d.file == str(name) for d in exc.diagnostics]
        if not all(missing):
            raise
        raise TracerError([replace(d, message=not_found(name)) for d in exc.diagnostics]) from None


@gc_paused
def load_spec_text(text: str, name: str = "<string>") -> tuple[PipelineSpec, SourceMap]:
    data, source = parse_document(text, name)
    return validate(data, source), source


def validate(data: Any, source: SourceMap) -> PipelineSpec:
    if not isinstance(data, dict):
        raise TracerError(source.error((), "not-a-pipeline", f"a pipeline file is a mapping with 'name' and 'steps', found {_kind(data)}"))
    try:
        with dimexpr.parsing_once():
            spec = PipelineSpec.model_validate(data)
    except ValidationError as exc:
        errors = exc.errors(include_url=False)
        diagnostics = [_diagnostic(err, data, source) for err in errors] + _dim_problems(data, source, errors)
        raise TracerError(_dedupe(diagnostics)) from None
    problems = _parallel_problems(spec, source)
    if problems:
        raise TracerError(problems)
    return with_implicit_inputs(spec)


def _parallel_problems(spec: PipelineSpec, source: SourceMap) -> list[Diagnostic]:
    """What the ``parallel:`` section says that contradicts the rest of the file: a mesh dim that
    ``dims:`` declares too, placements for an input the file does not declare or not one per mesh
    dim, a plan entry over a mesh dim the mesh does not have. (Plan targets name expanded steps:
    the analysis checks them.)"""
    parallel = spec.parallel
    if parallel is None:
        return []
    found, mesh = [], list(parallel.mesh)
    for name in mesh:
        if name in spec.dims:
            message = f"mesh dim '{name}' is declared in dims: too; a mesh dim is a dim already — remove it from dims: (--dim {name}=N sets the degree)"
            found.append(source.error(("parallel", "mesh", name), "mesh-dim-twice", message, prefer_key=True))
    for name, placements in parallel.inputs.items():
        if name not in spec.inputs:
            hint = difflib.get_close_matches(name, list(spec.inputs), n=1)
            known = f"; did you mean '{hint[0]}'?" if hint else f" (inputs: {', '.join(spec.inputs) or 'none'})"
            found.append(
                source.error(
                    ("parallel", "inputs", name), "unknown-input", f"'{name}' is not an input of this file{known}", prefer_key=True
                )
            )
        elif len(placements) != len(mesh):
            message = (
                f"'{name}': {len(placements)} placement{'s' if len(placements) != 1 else ''} for a mesh of {len(mesh)} dims ({', '.join(mesh)}); "
                f"give one per mesh dim, in its order, e.g. [{', '.join(['Replicate()'] * len(mesh))}]"
            )
            found.append(source.error(("parallel", "inputs", name), "placements", message))
    for target, entry in parallel.plan.items():
        mesh_dim = getattr(entry, "mesh_dim", None)
        if mesh_dim is not None and mesh_dim not in parallel.mesh:
            message = f"'{target}': mesh_dim '{mesh_dim}' is not a dim of the mesh ({', '.join(mesh)})"
            found.append(source.error(("parallel", "plan", target, "mesh_dim"), "unknown-mesh-dim", message))
    return found


def with_implicit_inputs(spec: PipelineSpec) -> PipelineSpec:
    """The one rule for a step that names no input, for every kind: it reads the previous step, and
    the first step reads the pipeline's only input. Written into the step here, at load, so no
    later layer has a default to decide (a first step with several inputs to choose from keeps
    none, and the graph says so). A kind that takes no input (``arange``) gets none."""
    steps, previous = [], next(iter(spec.inputs)) if len(spec.inputs) == 1 else None
    for step in spec.steps:
        if step.input is None and step.inputs is None and previous is not None and step.arity != 0:
            step = step.model_copy(update={"input": previous})
        steps.append(step)
        previous = step.id
    return spec.model_copy(update={"steps": steps})


def _dim_problems(data: dict, source: SourceMap, errors: list[dict]) -> list[Diagnostic]:
    """The dims' own errors (not divisible, a cycle, an unknown name), reported beside the file's
    other errors: they are independent of them, and fixing one should not reveal the other."""
    dims = data.get("dims")
    if not isinstance(dims, dict) or any(err["loc"][:1] == ("dims",) for err in errors):
        return []
    mesh = data.get("parallel", {}).get("mesh") if isinstance(data.get("parallel"), dict) else None
    try:
        exprs = {name: dimexpr.parse(text) for name, text in {**(mesh if isinstance(mesh, dict) else {}), **dims}.items()}
        resolve(exprs)
    except dimexpr.DimError as exc:
        return [dim_error(exc, dims, source)]
    return []


def dim_error(exc: dimexpr.DimError, dims: dict, source: SourceMap) -> Diagnostic:
    """A dim expression's error at the dim it belongs to (``dim Dh = d_model // H: 10 is not
    divisible by 3``), or at ``dims:`` when it belongs to none."""
    name = getattr(exc, "dim", None)
    if name in dims:
        return source.error(("dims", name), exc.code, f"dim {name} = {dimexpr.parse(dims[name])}: {exc}")
    return source.error(("dims",), exc.code, str(exc), prefer_key=True)


def _diagnostic(err: dict, data: Any, source: SourceMap) -> Diagnostic:
    path = _doc_path(err["loc"], data)
    step = _step_id(path, data)
    kind = err["type"]
    if kind == "extra_forbidden":
        key = path[-1]
        allowed = _allowed_keys(path[:-1], data)
        hint = difflib.get_close_matches(str(key), allowed, n=1)
        message = f"unknown key '{key}'" + (
            f"; did you mean '{hint[0]}'?" if hint else f" (allowed: {', '.join(allowed)})" if allowed else ""
        )
        return source.error(path, "unknown-key", message, step, prefer_key=True)
    if kind == "missing":
        return source.error(path[:-1], "missing-key", f"missing required key '{err['loc'][-1]}'", step, prefer_key=True)
    if kind == "union_tag_invalid":
        op = err["ctx"]["tag"]
        hint = difflib.get_close_matches(str(op), STEP_KINDS, n=1)
        suggestion = f"; did you mean '{hint[0]}'?" if hint else f" (known ops: {', '.join(sorted(STEP_KINDS))})"
        return source.error(path + ("op",), "unknown-op", f"unknown op '{op}'{suggestion}", step)
    if kind == "union_tag_not_found":
        return source.error(path, "missing-key", f"a step needs an 'op' (one of: {', '.join(sorted(STEP_KINDS))})", step, prefer_key=True)
    if kind == "string_pattern_mismatch" and err["ctx"]["pattern"] in _ID_RULES:
        what, rule = _ID_RULES[err["ctx"]["pattern"]]
        declared = err["loc"][-1] == "[key]" or path[-1:] == ("id",)
        hint = _block_hint(err["input"], data) if not declared else ""
        return source.error(
            path,
            "invalid-id",
            f"{err['input']!r} is not a valid {what}: {rule}{hint or _id_hint(err['input'], err['ctx']['pattern'])}",
            step,
            prefer_key=declared,
        )
    message = err["msg"].removeprefix("Value error, ").removeprefix("Assertion failed, ")
    found = err.get("input")
    if kind not in ("value_error", "assertion_error") and not isinstance(found, (dict, list)):
        message += f", found {found!r}"[:120]
    field = path[-1] if path and isinstance(path[-1], str) else None
    prefix = f"'{field}': " if field and field not in message else ""
    return source.error(path, "invalid-value", prefix + message, step)


_ID_RULES = {  # pattern -> (what it names, the rule in words)
    ID_PATTERN: ("id", "start with a letter or '_', then letters, digits, '_', '.' or '-'"),
    RECORD_PATTERN: ("tensor id", "an id, or a block's tensor as BLOCK/ID or BLOCK/COPY/ID such as layers/3/scores"),
    PARAM_PATTERN: ("param id", "an id, or a block copy's param as BLOCK/COPY/ID (h/0/W_q), {layer} standing for every copy"),
    DIM_PATTERN: ("dim name", "start with a letter or '_', then letters, digits or '_' (it is used in expressions)"),
}


def _block_hint(text: str, data: Any) -> str:
    """A reference such as 'layers/3/out' to a tensor inside a block of this file."""
    steps = data.get("steps") if isinstance(data, dict) else None
    block = text.split("/")[0]
    if (
        "/" in text
        and isinstance(steps, list)
        and any(
            isinstance(s, dict) and getattr(STEP_KINDS.get(s.get("op")), "includes_file", False) and s.get("id") == block for s in steps
        )
    ):
        return f" — only expect: and outputs: can name a block's inner tensors; the block's own id ('{block}') names its output"
    return ""


def _id_hint(text: str, pattern: str) -> str:
    fixed = re.sub(r"[^\w/]" if pattern == RECORD_PATTERN else r"\W", "_", text, flags=re.ASCII)
    fixed = re.sub(r"/+", "/", fixed).strip("/")
    fixed = fixed if fixed[:1].isalpha() or fixed[:1] == "_" else "_" + fixed
    return f" — e.g. '{fixed}'" if fixed != text and len(fixed) <= 64 else ""


def _doc_path(loc: tuple, data: Any) -> tuple:
    """Follow pydantic's location through the document, skipping union tags it inserts."""
    path, node = [], data
    for part in loc:
        if isinstance(node, dict) and part in node:
            node = node[part]
            path.append(part)
        elif isinstance(node, list) and isinstance(part, int) and 0 <= part < len(node):
            node = node[part]
            path.append(part)
        elif isinstance(node, dict) and not isinstance(part, int) and part not in STEP_KINDS and not _is_type_tag(part):
            path.append(part)  # a missing or extra key: keep it so the message can name it
            node = None
    return tuple(path)


def _is_type_tag(part: Any) -> bool:
    return isinstance(part, str) and (
        part in ("int", "str", "float", "bool", "list", "Sqrt", "Rsqrt", "Expect", "function-after")
        or part.startswith(("list[", "function-", "constrained-", "lax-", "strict-"))
    )


def _step_id(path: tuple, data: Any) -> str | None:
    if len(path) >= 2 and path[0] == "steps" and isinstance(data.get("steps"), list):
        step = data["steps"][path[1]]
        if isinstance(step, dict) and isinstance(step.get("id"), str):
            return step["id"]
    return None


def _allowed_keys(path: tuple, data: Any) -> list[str]:
    if not path:
        return list(PipelineSpec.model_fields)
    if path[0] == "steps" and len(path) == 2:
        step = data["steps"][path[1]]
        kind = STEP_KINDS.get(step.get("op")) if isinstance(step, dict) else None
        return list(kind.model_fields) if kind else []
    if path[0] in ("inputs", "params") and len(path) == 2:
        return list(TensorDecl.model_fields)
    if path[0] == "expect" and len(path) == 2:
        return list(Expect.model_fields)
    return []


def _dedupe(diagnostics: list[Diagnostic]) -> list[Diagnostic]:
    seen, result = set(), []
    for d in diagnostics:
        key = (d.position, d.message)
        if key not in seen:
            seen.add(key)
            result.append(d)
    return result


def _kind(value: Any) -> str:
    return {list: "a list", str: "a string", int: "a number", float: "a number", bool: "a boolean"}.get(type(value), type(value).__name__)
