"""The tensors a run starts from: the declared inputs and params, created as their ``init:``
says, or given by name and checked against their declarations.

``create_tensors`` draws them in declaration order, seeded as the tutorials seed them. ``match``
checks tensors given by name (``Pipeline.run(params=..., inputs=..., tensors=...)``) and reports
every problem at once: unknown names, missing params (for a whole checkpoint), shapes and dtypes
that differ from the declaration, each located at the declaration.

A param's key is its id, with ``/`` or ``.`` between a block's parts: ``layers/3/W_q`` and
``layers.3.W_q`` (what an exported module's ``state_dict()`` says) name the same tensor.
"""

from __future__ import annotations

import difflib
import math
import weakref
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

from ..analysis.shapes import Analysis, Declared
from ..core.errors import Diagnostic, TracerError
from ..spec.inits import INITS, Made

SECTIONS = ("inputs", "params")


def create_tensors(analysis: Analysis, device: str, seed: int | None, skip: frozenset[str] = frozenset()) -> dict[str, Any]:
    """Inputs and params in declaration order, seeded exactly as the tutorials seed them. The names
    in ``skip`` (tensors the caller gives) are not drawn: they keep their places, as None, for
    :func:`with_given`, and every other tensor is what it would be in a run that gives the same names."""
    import torch

    if seed is not None:
        torch.manual_seed(seed)
    created = {}
    for declared in _declaration_order(analysis):
        name, decl = declared.name, declared.decl
        if name in skip:
            created[name] = None
            continue
        if decl.seed is not None:
            torch.manual_seed(decl.seed)
        created[name] = _create(declared, torch, torch.device(device))
    return created


def with_given(created: dict[str, Any], given: dict[str, Any], device: Any) -> dict[str, Any]:
    """``created`` (from ``create_tensors(..., skip=given)``) with the ``given`` tensors, checked by
    :func:`match`, in their places and moved to ``device``."""
    if device.type == "cpu":  # is_cpu reads a flag: a third of building t.device to compare it
        moved = {name: t.to(device) for name, t in given.items() if not t.is_cpu}
    else:
        moved = {name: t.to(device) for name, t in given.items() if t.device != device}
    return {**created, **given, **moved}  # every name keeps its place in created


def _declaration_order(analysis: Analysis) -> list[Declared]:
    """The section written first in the file is created first; a section the file lacks (blocks add
    params to a file without any) comes last, inputs before params."""
    keys = analysis.source.keys
    first = sorted(SECTIONS, key=lambda s: keys[(s,)].line if (s,) in keys else math.inf)
    return sorted(analysis.declared.values(), key=lambda d: first.index(d.section))


def _create(declared: Declared, torch, device):
    decl, meta = declared.decl, declared.meta
    dtype = getattr(torch, meta.dtype)
    if decl.values is not None:
        return torch.tensor(decl.values, dtype=dtype, device=device)
    if decl.tokens is not None:
        return torch.tensor(decl.tokens.ids(), dtype=dtype, device=device)
    fan_in = declared.dims.dim(decl.fan_in).value if decl.fan_in is not None else None
    return INITS[decl.init].create(torch, Made(meta.sizes, meta.dtype, fan_in), device, decl)


def match(analysis: Analysis, given: Mapping[str, Any], section: str | None, what: str, complete: bool = False) -> dict[str, Any]:
    """``given`` by declared name, after checking every entry; ``section`` limits the names to
    inputs or params (None: either); ``complete`` also requires every param of the pipeline.

    A run may give tensors on every call, so a tensor that fits its declaration costs a few
    attribute reads; what is wrong, and where, is worked out only for one that does not."""
    if not given and not complete:
        return {}
    table = _table(analysis)
    declared, wanted = table.keys[section], table.wanted
    found, problems, given_by = {}, [], {}
    for key, tensor in given.items():
        name = declared.get(key) or declared.get(str(key).replace(".", "/"))
        if name is None:
            problems.append(_unknown(analysis, key, declared, section, what))
            continue
        if name not in given_by and _fits(tensor, *wanted[name]):
            given_by[name] = key
            found[name] = tensor.contiguous()  # as a declared tensor is: an expanded one would break a later view
            continue
        where = "inputs" if name in analysis.pipeline.inputs else "params"
        problem = _problem(analysis, name, key, tensor, what, given_by.get(name))
        given_by.setdefault(name, key)
        if problem is None:
            found[name] = tensor.contiguous()
            continue
        problems.append(analysis.source.error((where, name), "tensor-given", problem, prefer_key=True))
    if complete:
        for name, decl in analysis.pipeline.params.items():
            if name not in given_by and decl.values is None:  # a param the file holds the values of (an imported computed table)
                meta = analysis.metas[name]
                problems.append(
                    analysis.source.error(
                        ("params", name), "tensor-missing", f"{what} has no '{name}' {meta.symbolic} {meta.concrete}", prefer_key=True
                    )
                )
    if problems:
        raise TracerError(problems)
    return found


class _Table(NamedTuple):
    keys: dict[str | None, dict[str, str]]  # section (None: either) -> every accepted key -> the declared name
    wanted: dict[str, tuple[tuple[int, ...], Any, Any, Any]]  # name -> (sizes, dtype, torch.Tensor, torch.strided)


_TABLES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # analysis -> its _Table (an analysis never changes)


def _table(analysis: Analysis) -> _Table:
    table = _TABLES.get(analysis)
    if table is None:
        import torch

        keys = {section: _declared(analysis, section) for section in (None, *SECTIONS)}
        wanted = {name: (d.meta.sizes, getattr(torch, d.meta.dtype), torch.Tensor, torch.strided) for name, d in analysis.declared.items()}
        table = _TABLES[analysis] = _Table(keys, wanted)
    return table


def match_routes(analysis: Analysis, routes: list[tuple[str, str | None, Mapping[str, Any] | None]]) -> dict[str, Any]:
    """The tensors of several routes (``(what, section, given)``: ``tensors=``, ``params=``,
    ``inputs=``) by declared name, all problems at once; a tensor two routes give is an error
    located at its declaration, never resolved by the order of the routes."""
    routes = [route for route in routes if route[2]]
    found = _fitting(analysis, routes) if routes else {}
    if found is not None:
        return found
    if len(routes) == 1:  # nothing given twice: no bookkeeping across routes
        return match(analysis, routes[0][2], routes[0][1], routes[0][0])
    found, given_by, problems = {}, {}, []
    for what, section, given in routes:
        try:
            matched = match(analysis, given or {}, section, what)
        except TracerError as exc:
            problems += exc.diagnostics
            continue
        for name, tensor in matched.items():
            if name in given_by:
                where = "inputs" if name in analysis.pipeline.inputs else "params"
                message = f"{given_by[name]} and {what} both give '{name}'; give it once"
                problems.append(analysis.source.error((where, name), "tensor-given", message, prefer_key=True))
            given_by.setdefault(name, what)
            found.setdefault(name, tensor)
    if problems:
        raise TracerError(problems)
    return found


def _fitting(analysis: Analysis, routes: list[tuple[str, str | None, Mapping[str, Any] | None]]) -> dict[str, Any] | None:
    """The tensors the ``routes`` (those giving some) give, by declared name, when every one is
    named once, by a key of its route's section, and is a dense tensor of its declared shape and
    dtype: what a run that gives the same weights on every call passes, for a few attribute reads
    a tensor. None when anything needs a closer look; :func:`match` then finds and reports it."""
    table = _table(analysis)
    wanted, found = table.wanted, {}
    for _, section, given in routes:
        keys = table.keys[section]
        for key, tensor in given.items():
            name = keys.get(key)
            if name is None or name in found:
                return None
            if not _fits(tensor, *wanted[name]):
                return None
            found[name] = tensor.contiguous()  # as a declared tensor is: an expanded one would break a later view
    return found


def _fits(tensor, sizes: tuple[int, ...], dtype, tensor_type, strided) -> bool:
    """A dense tensor of the declared shape and dtype: what :func:`_problem` finds nothing wrong with."""
    return (
        isinstance(tensor, tensor_type)
        and tensor.dtype is dtype
        and tensor.shape == sizes
        and tensor.layout == strided
        and not tensor.is_nested
        and not tensor.is_meta
    )


def _problem(analysis: Analysis, name: str, key, tensor, what: str, earlier_key) -> str | None:
    """What is wrong with ``tensor`` as the declared ``name`` (None: nothing)."""
    import torch

    meta = analysis.metas[name]
    if earlier_key is not None:
        return f"{what} gives '{name}' twice, as '{earlier_key}' and as '{key}'; give it once"
    if not isinstance(tensor, torch.Tensor):
        return f"{what}['{key}'] must be a torch.Tensor, got {type(tensor).__name__}"
    unusable = _unusable(tensor)
    if unusable:
        return f"{what}['{key}'] is {unusable}"
    if tuple(tensor.shape) != meta.sizes:
        return f"{what}['{key}'] has shape {list(tensor.shape)}, the pipeline declares '{name}' as {meta.symbolic} {meta.concrete}"
    if str(tensor.dtype).removeprefix("torch.") != meta.dtype:
        return f"{what}['{key}'] is {str(tensor.dtype).removeprefix('torch.')}, the pipeline declares '{name}' as {meta.dtype}"
    return None


def _unusable(tensor) -> str | None:
    """Why a tensor cannot stand for a declared one, which is dense and holds values (None: it can)."""
    import torch

    if tensor.is_nested or tensor.layout != torch.strided:
        return (
            f"a {'nested' if tensor.is_nested else str(tensor.layout).removeprefix('torch.')} tensor; give a dense one (tensor.to_dense())"
        )
    if tensor.is_quantized:
        return f"quantized ({str(tensor.dtype).removeprefix('torch.')}); give a float tensor (tensor.dequantize())"
    if tensor.is_meta:
        return "a meta tensor, which holds no values; give one with data"
    return None


def takes(analysis: Analysis, section: str | None) -> Callable[[str], bool]:
    """Whether :func:`match` would take a key as a declared tensor (of ``section``; None: either)."""
    declared = _declared(analysis, section)
    return lambda key: key in declared or key.replace(".", "/") in declared


def _declared(analysis: Analysis, section: str | None) -> dict[str, str]:
    """Every accepted key -> the declared name: the id itself, and with ``.`` for ``/``."""
    names = {}
    for where in SECTIONS if section is None else (section,):
        for name in getattr(analysis.pipeline, where):
            if name in analysis.metas:
                names[name] = name
                names.setdefault(name.replace("/", "."), name)
    return names


def _unknown(analysis: Analysis, key, declared: dict[str, str], section: str | None, what: str) -> Diagnostic:
    kinds = "inputs or params" if section is None else section
    close = difflib.get_close_matches(str(key), list(declared), n=1)
    hint = f"; did you mean '{close[0]}'?" if close else ""
    return Diagnostic(
        analysis.source.file, None, "unknown-tensor", f"{what} names '{key}', which is not one of the {kinds} of this pipeline{hint}"
    )
