"""``tracer.from_module``: a PyTorch module, run once on example inputs, as a pipeline.

The importer package (``tracer/importer/``: capture → idioms → rules → naming → writer) makes the
YAML files; this module loads them as a :class:`~tracer.api.Pipeline`, verified before it is
returned (it must load and check), and :func:`difference` compares it with the module.

Capturing runs the module's own code (its ``forward`` with fake tensors), as calling it would.
"""

from __future__ import annotations

import copy
import functools
import inspect
import re
import tempfile
from pathlib import Path

import torch

from .analysis.lints.structure import unread_declarations
from .api import Pipeline, load
from .core.errors import Diagnostic, TracerError
from .importer.capture import caching_configs, capture, capturing, given_caches, graph_inputs
from .importer.idioms import Graph, one_thread_if_small
from .importer.naming import Namer, model_dims
from .importer.rules import Translator
from .importer.sizes import Sizes
from .importer.writer import Document, dims_of, drop_unused_dims, files, plain_line, unread_names


def from_module(
    module: torch.nn.Module, *example_args, dims: dict[str, int] | None = None, name: str | None = None, **example_kwargs
) -> Pipeline:
    """The pipeline that computes what ``module(*example_args, **example_kwargs)`` computes.

    Inputs are named after ``forward``'s parameters, params after ``module.state_dict()``'s keys,
    so ``pipeline.run(params=module.state_dict(), inputs={...})`` runs it on the module's weights.
    ``dims`` names sizes the module's attributes do not (``{"d_model": 64, "H": 4}``).
    An op with no tracer step raises ``TracerError`` listing each one with its source line.
    """
    caches = given_caches(module, example_args, example_kwargs)
    program = capture(module, example_args, example_kwargs)
    graph = Graph(program, graph_inputs(program, example_args, example_kwargs))
    model = model_dims(module, dims)
    sizes = Sizes(graph, frozenset(d.value for d in model.values()), _axis_order(module))
    namer = Namer(model, sizes.of_value(), sizes.roles())
    translator = Translator(graph, module, namer, tuple(caches))
    translator.translate()
    name = plain_line(name or type(module).__name__)  # a class name is any string: one printable line in the file
    header = [
        f"Imported by tracer.from_module from {type(module).__module__}.{type(module).__qualname__}:",
        "torch.export (non-strict) at the example sizes; weights: module.state_dict().",
    ]
    if caches:
        header.append(
            f"The KV cache {', '.join(caches)}: its keys and values are inputs, the updated ones outputs (the new tokens' appended)."
        )
    elif caching_configs(module):
        header.append("config.use_cache was off for the capture: the pipeline is one forward without a KV cache.")
    dims_section = dims_of({d.name: d.size for d in sizes.dims}, namer.dims)
    document = Document(name, header, dims_section, translator.inputs, translator.params, translator.steps, translator.outputs, seed=0)
    drop_unused_dims(document)
    return _verified(document)


def _verified(document: Document) -> Pipeline:
    """The document written, loaded and checked. Inputs and params no step reads are declared all
    the same, allowed, so that ``run(params=module.state_dict(), inputs=forward's arguments)``
    takes every one: the steps say which they are before the file is written, and the loaded
    file's analysis must agree (else it decides, and the file is written again)."""
    declared = {"params": dict(document.params), "inputs": dict(document.inputs)}
    predicted = set(unread_names(document))
    _allow_unread(document, declared, predicted)
    pipeline = _load(document)
    unread = set(unread_declarations(pipeline.check()))
    if unread == predicted:
        return pipeline
    _allow_unread(document, declared, unread)
    return _load(document)


def _allow_unread(document: Document, declared: dict[str, dict], unread: set[str]) -> None:
    """The declarations as captured, those in ``unread`` with an ``unused-tensor`` allow."""
    for section, reason in (("params", UNREAD_REASON), ("inputs", UNREAD_INPUT_REASON)):
        entries = {
            name: {**entry, "allow": {"unused-tensor": reason}} if name in unread else entry for name, entry in declared[section].items()
        }
        setattr(document, section, entries)


def _axis_order(module: torch.nn.Module) -> str:
    """The dims of the inputs' first two axes: a module built with ``batch_first=False``
    (``nn.MultiheadAttention``'s and ``nn.Transformer*``'s default) takes (T, B, E)."""
    return "TB" if getattr(module, "batch_first", None) is False else "BT"


UNREAD_REASON = "a state_dict entry of the module that no captured op reads"
UNREAD_INPUT_REASON = "an argument of forward that no captured op reads (a mask dropped for is_causal=True)"


def _load(document: Document) -> Pipeline:
    """Write the files to a folder the pipeline keeps, and load the main one (blocks are read from
    beside it); ``pipeline.files_named(stem)`` gives the files again, named after another main file."""
    texts = files(document)
    folder = tempfile.TemporaryDirectory(prefix="tracer-import-")
    for file_name, text in texts.items():
        Path(folder.name, file_name).write_text(text)
    pipeline = load(Path(folder.name, next(iter(texts))))
    pipeline.files, pipeline._folder = texts, folder
    pipeline.files_named = functools.partial(files, document)
    return pipeline


def difference(pipeline: Pipeline, module: torch.nn.Module, *args, **kwargs) -> float:
    """The largest absolute difference between the pipeline's outputs and the module's, on the module's weights."""
    caches = given_caches(module, args, kwargs)
    tensors = [*torch.utils._pytree.tree_leaves((args, kwargs)), *module.state_dict().values()]
    call = inspect.signature(module.forward).bind(*args, **kwargs)
    bound = dict(call.arguments)
    for name in caches:  # the module appends to the cache it is given: a copy, so that the caller's stays as it was
        call.arguments[name] = copy.deepcopy(bound[name])
    with one_thread_if_small(tensors):  # the module and the pipeline on the example: as small as the capture's
        with capturing(module, bool(caches)):
            expected = [t for t in torch.utils._pytree.tree_leaves(module(*call.args, **call.kwargs)) if isinstance(t, torch.Tensor)]
        inputs = {name: value for name, value in bound.items() if name in pipeline.spec.inputs}
        inputs.update(_cache_inputs(pipeline, {name: bound[name] for name in caches}))
        trace = pipeline.run(params=module.state_dict(), inputs=inputs, keep_values=True)
    got = [trace[name].tensor for name in pipeline.spec.outputs or [pipeline.spec.steps[-1].id]]
    if len(got) != len(expected):
        raise TracerError(
            Diagnostic(pipeline.path, None, "import-outputs", f"the pipeline has {len(got)} outputs, the module {len(expected)}")
        )
    return max(_largest_difference(a, b) for a, b in zip(got, expected, strict=True))


def _cache_inputs(pipeline: Pipeline, caches: dict) -> dict[str, torch.Tensor]:
    """Each input the import noted as a cache's keys or values (``past_key_values.layers[0].keys``), taken from that cache."""
    inputs = {}
    for name, declaration in pipeline.spec.inputs.items():
        held = re.fullmatch(r"(\w+)\.layers\[(\d+)\]\.(keys|values)", declaration.note or "")
        if held and held[1] in caches:
            inputs[name] = getattr(caches[held[1]].layers[int(held[2])], held[3])
    return inputs


def _largest_difference(a: torch.Tensor, b: torch.Tensor) -> float:
    """Max |a - b|, positions where both are NaN (a fully masked row) or the same infinity counted equal."""
    a, b = a.double(), b.double()
    same = (a == b) | (a.isnan() & b.isnan())
    return float(torch.where(same, 0.0, (a - b).abs()).max()) if a.numel() else 0.0
