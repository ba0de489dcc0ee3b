"""``tracer.from_module``: a PyTorch module, run once on example inputs, as a pipeline.

The module is captured with ``torch.export.export(strict=False)`` under ``torch.no_grad()``,
in eval mode, with the fused ``nn.MultiheadAttention`` / encoder-layer fast path off, and with
no ``run_decompositions``: that graph keeps linear, SDPA, layer norm, softmax and split whole,
as tracer's steps are, and records every op's module path and source line
(``docs/import.md``). The batch and sequence dims of the inputs are captured symbolically
(``Dim.AUTO``), so they are ``B`` and ``T`` in the file; a module that specialises them is
captured at the example sizes. The pipeline is verified before it is returned: it must load and
check; :func:`difference` compares it with the module.

Capturing runs the module's own code (its ``forward`` with fake tensors), as calling it would.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import tempfile
from pathlib import Path

import torch
import torch.fx.proxy
from torch.export import Dim

from .analysis.lints.structure import unread_declarations
from .api import Pipeline, load
from .core.errors import Diagnostic, TracerError
from .import_dims import Namer, model_dims
from .import_graph import Graph
from .import_rules import Translator
from .import_yaml import Document, dims_of, drop_unused_dims, files, plain_line


def from_module(
    module: torch.nn.Module, *example_args, dims: dict[str, int] | None = None, name: str | None = None, **example_kwargs
) -> Pipeline:
    """The pipeline that computes what ``module(*example_args, **example_kwargs)`` computes.

    Inputs are named after ``forward``'s parameters, params after ``module.state_dict()``'s keys,
    so ``pipeline.run(params=module.state_dict(), inputs={...})`` runs it on the module's weights.
    ``dims`` names sizes the module's attributes do not (``{"d_model": 64, "H": 4}``).
    An op with no tracer step raises ``TracerError`` listing each one with its source line.
    """
    program, dynamic = capture(module, example_args, example_kwargs)
    graph = Graph(program, _graph_inputs(program, example_args, example_kwargs))
    symbols = _symbols(graph)
    namer = Namer(model_dims(module, dims), {symbol: dim for symbol, (dim, _) in symbols.items()})
    translator = Translator(graph, module, namer)
    translator.translate()
    name = plain_line(name or type(module).__name__)  # a class name is any string: one printable line in the file
    header = [
        f"Imported by tracer.from_module from {type(module).__module__}.{type(module).__qualname__}:",
        f"torch.export (non-strict), {'symbolic batch and sequence sizes' if dynamic else 'the example sizes'}; weights: module.state_dict().",
    ]
    if caching_configs(module):
        header.append("config.use_cache was off for the capture: the pipeline is one forward without a KV cache.")
    dims_section = dims_of(dict(symbols.values()), namer.dims)
    document = Document(name, header, dims_section, translator.inputs, translator.params, translator.steps, translator.outputs, seed=0)
    drop_unused_dims(document)
    pipeline = _load(document)
    unread = unread_declarations(pipeline.check())
    if not unread:
        return pipeline
    # declared all the same, so that run(params=module.state_dict(), inputs=forward's arguments) takes every one
    for section, reason in ((document.params, UNREAD_REASON), (document.inputs, UNREAD_INPUT_REASON)):
        for name in (n for n in unread if n in section):
            section[name] = {**section[name], "allow": {"unused-tensor": reason}}
    return _load(document)


UNREAD_REASON = "a state_dict entry of the module that no captured op reads"
UNREAD_INPUT_REASON = "an argument of forward that no captured op reads (a mask dropped for is_causal=True)"


@contextlib.contextmanager
def _capturing(module: torch.nn.Module):
    """Eval mode, no grad, no fused MHA fast path, no KV cache, and every frame outside torch in the
    stack traces; the module as it was afterwards."""
    fastpath, training = torch.backends.mha.get_fastpath_enabled(), module.training
    anchors = getattr(torch.fx.proxy, "_STACK_TRACE_ANCHORS", None)  # private: without it only forward() frames are kept
    cached = caching_configs(module)
    torch.backends.mha.set_fastpath_enabled(False)
    module.eval()
    for config in cached:
        config.use_cache = False
    if anchors is not None:
        torch.fx.proxy._STACK_TRACE_ANCHORS = _OutsideTorch()
    try:
        with torch.no_grad():
            yield
    finally:
        torch.backends.mha.set_fastpath_enabled(fastpath)
        module.train(training)
        for config in cached:
            config.use_cache = True
        if anchors is not None:
            torch.fx.proxy._STACK_TRACE_ANCHORS = anchors


def caching_configs(module: torch.nn.Module) -> list:
    """The configs of the module and its children with ``use_cache=True`` (every transformers
    config's default): the ``DynamicCache`` a forward then returns is no tensor torch.export can
    output, and the pipeline computes one forward, not a cache. They are off while tracer captures
    and compares, and on again afterwards."""
    found: dict[int, object] = {}
    for child in module.modules():
        config = getattr(child, "config", None)
        if getattr(config, "use_cache", None) is True:
            found[id(config)] = config
    return list(found.values())


class _OutsideTorch(set):
    def __contains__(self, frame) -> bool:
        return "/torch/" not in frame[0].replace("\\", "/")


def capture(module: torch.nn.Module, args: tuple, kwargs: dict):
    """(ExportedProgram, whether batch and sequence are symbolic)."""
    with _capturing(module):
        with contextlib.suppress(Exception):  # a module that specialises B or T: captured at the example sizes
            return torch.export.export(module, tuple(args), dict(kwargs), dynamic_shapes=_auto(module, args, kwargs), strict=False), True
        try:
            return torch.export.export(module, tuple(args), dict(kwargs), strict=False), False
        except Exception as exc:  # torch's own message says why (data-dependent control flow, unsupported types)
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
            message = f"torch.export could not capture {type(module).__name__}: {type(exc).__name__}: {first}"
            raise TracerError(Diagnostic("<module>", None, "import-capture", message)) from None


def _auto(module, args, kwargs) -> dict:
    bound = inspect.signature(module.forward).bind(*args, **kwargs).arguments
    return {name: {0: Dim.AUTO, 1: Dim.AUTO} if isinstance(v, torch.Tensor) and v.ndim >= 2 else None for name, v in bound.items()}


def _graph_inputs(program, args, kwargs) -> list:
    """The example value of each placeholder, in the graph's order."""
    user = iter(torch.utils._pytree.tree_leaves((tuple(args), dict(kwargs))))
    values = []
    for spec in program.graph_signature.input_specs:
        if spec.kind.name == "USER_INPUT":
            values.append(next(user))
        elif spec.target in program.state_dict:
            values.append(program.state_dict[spec.target])
        else:
            values.append(program.constants[spec.target])
    return values


def _symbols(graph: Graph) -> dict[str, tuple[str, int]]:
    """Capture symbol -> (dim name, example size): the first two dims of the inputs, B and T."""
    found: dict[str, tuple[str, int]] = {}
    for node in graph.fx.nodes:
        value = node.meta.get("val")
        if node.op != "placeholder" or graph.kind(node) != "USER_INPUT" or not isinstance(value, torch.Tensor):
            continue
        for axis, size in enumerate(value.shape[:2]):
            symbol = str(size.node.expr) if isinstance(size, torch.SymInt) else None
            if symbol and symbol.isidentifier() and symbol not in found:
                taken = sum(name.startswith("BT"[axis]) for name, _ in found.values())
                found[symbol] = ("BT"[axis] + (str(taken + 1) if taken else ""), int(graph.values[node].shape[axis]))
    return found


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
    with _capturing(module):
        expected = [t for t in torch.utils._pytree.tree_leaves(module(*args, **kwargs)) if isinstance(t, torch.Tensor)]
    bound = inspect.signature(module.forward).bind(*args, **kwargs).arguments
    inputs = {name: value for name, value in bound.items() if name in pipeline.spec.inputs}
    trace = pipeline.run(params=module.state_dict(), inputs=inputs, keep_values=True)
    got = [trace[name].tensor for name in pipeline.spec.outputs or [pipeline.spec.steps[-1].id]]
    if len(got) != len(expected):
        raise TracerError(
            Diagnostic(pipeline.path, None, "import-outputs", f"the pipeline has {len(got)} outputs, the module {len(expected)}")
        )
    return max(_largest_difference(a, b) for a, b in zip(got, expected, strict=True))


def _largest_difference(a: torch.Tensor, b: torch.Tensor) -> float:
    """Max |a - b|, positions where both are NaN (a fully masked row) or the same infinity counted equal."""
    a, b = a.double(), b.double()
    same = (a == b) | (a.isnan() & b.isnan())
    return float(torch.where(same, 0.0, (a - b).abs()).max()) if a.numel() else 0.0
