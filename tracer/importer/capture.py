"""Capture: the module run once under ``torch.export.export(strict=False)``, as the rules read it.

The capture is made under ``torch.no_grad()``, in eval mode, with the fused
``nn.MultiheadAttention`` / encoder-layer fast path off, with every config's KV cache off, and
with no ``run_decompositions``: that graph keeps linear, SDPA, layer norm, softmax and split
whole, as tracer's steps are, and records every op's module path and source line. The capture is
made at the example sizes: a symbolic one (``Dim.AUTO``) costs 2-3.5x as much, and the batch and
sequence sizes are followed through the graph afterwards (``sizes.py``), so they are ``B`` and ``T``
in the file all the same.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import traceback

import torch
import torch.fx.proxy

from ..core.errors import Diagnostic, TracerError
from .leaves import experts_whole
from .rotary import settled_rope_updates


@contextlib.contextmanager
def capturing(module: torch.nn.Module, cache_given: bool = False):
    """Eval mode, no grad, no fused MHA fast path, no KV cache (but the one a decode step is given:
    ``cache_given``), and every frame outside torch in the stack traces; the module as it was afterwards."""
    fastpath, training = torch.backends.mha.get_fastpath_enabled(), module.training
    anchors = getattr(torch.fx.proxy, "_STACK_TRACE_ANCHORS", None)  # private: without it only forward() frames are kept
    cached = [] if cache_given else caching_configs(module)
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
    """Asked for each frame of each node's stack trace while the capture runs: answered once per file."""

    def __contains__(self, frame) -> bool:
        return _outside_torch(frame[0])


@functools.lru_cache(maxsize=1024)
def _outside_torch(file: str) -> bool:
    return "/torch/" not in file.replace("\\", "/")


def given_caches(module: torch.nn.Module, args: tuple, kwargs: dict) -> list[str]:
    """The arguments of forward that are a transformers KV cache (``past_key_values`` of a decode
    step). A ``DynamicCache`` is registered as a pytree node with transformers' own
    ``register_dynamic_cache_export_support`` (what its export of decoder-only models does), so that
    torch.export takes its keys and values, per layer, as inputs and returns the updated ones; any
    other cache is refused, saying how to call the module so that it imports."""
    try:
        bound = inspect.signature(module.forward).bind(*args, **kwargs).arguments
    except TypeError:  # torch.export says what is wrong with the call
        return []
    found = [name for name, value in bound.items() if type(value).__module__ == "transformers.cache_utils"]
    for name in found:
        from transformers.cache_utils import DynamicCache  # a cache was given: transformers is loaded
        from transformers.integrations.executorch import register_dynamic_cache_export_support

        cache = bound[name]
        kinds = {type(layer).__name__ for layer in getattr(cache, "layers", [])}
        if type(cache) is not DynamicCache or not kinds <= {"DynamicLayer", "DynamicSlidingWindowLayer"}:
            message = (
                f"forward's argument '{name}' is a {type(cache).__name__} (layers: {', '.join(sorted(kinds)) or 'none'}): "
                "tracer imports a decode step given a DynamicCache of DynamicLayers (its keys and values become inputs, "
                "the updated ones outputs) — pass the DynamicCache the model returns with use_cache=True "
                "(model(ids, use_cache=True).past_key_values), or no cache: the whole sequence in one forward"
            )
            raise TracerError(Diagnostic("<module>", None, "import-cache", message))
        _refuse_dropped_tokens(name, cache)
        register_dynamic_cache_export_support()
    return found


def _refuse_dropped_tokens(name: str, cache) -> None:
    """torch.export takes a cache as its keys and values: a sliding-window layer that has let
    tokens go would come back holding only those it keeps, and the new tokens would be placed
    (rotated, masked) after them, not after every token the module has seen."""
    for index, layer in enumerate(cache.layers):
        held = 0 if layer.keys is None else int(layer.keys.shape[-2])
        seen = int(layer.get_seq_length())
        if held != seen:
            message = (
                f"layer {index} of forward's argument '{name}' holds the last {held} of {seen} tokens (a sliding window): "
                f"torch.export takes a cache as its keys and values, so the capture would place the new tokens at position {held}, "
                f"not {seen} — give a cache no longer than the window, or no cache (the whole sequence in one forward)"
            )
            raise TracerError(Diagnostic("<module>", None, "import-cache", message))


def capture(module: torch.nn.Module, args: tuple, kwargs: dict):
    """The ExportedProgram of the module at the example sizes."""
    cache_given = bool(given_caches(module, args, kwargs))
    with capturing(module, cache_given), settled_rope_updates(module, args, kwargs), experts_whole(module), _kept_frames_only():
        try:
            return torch.export.export(module, tuple(args), dict(kwargs), strict=False)
        except Exception as exc:  # torch's own message says why (data-dependent control flow, unsupported types)
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
            message = f"torch.export could not capture {type(module).__name__}: {type(exc).__name__}: {first}"
            raise TracerError(Diagnostic("<module>", None, "import-capture", message)) from None


@contextlib.contextmanager
def _kept_frames_only():
    """Each node's stack trace gathered as torch gathers it, with a line of source read only for the
    frames torch's filter keeps: torch reads one for every frame of the stack (some 70 a node, most
    of them torch's own, which its filter then drops): some 5% of the capture's time. The
    traces are the same text. Private again (``torch.fx.proxy`` imports ``CapturedTraceback`` by
    name): where it is not, torch's own is used."""
    own = getattr(torch.fx.proxy, "CapturedTraceback", None)
    if own is None or not hasattr(torch.fx.proxy, "_STACK_TRACE_ANCHORS"):
        yield
        return
    torch.fx.proxy.CapturedTraceback = _KeptFrames
    try:
        yield
    finally:
        torch.fx.proxy.CapturedTraceback = own


class _KeptFrames:
    """``torch.utils._traceback.CapturedTraceback`` whose summary holds only the frames that
    ``TracerBase._filter_traceback_frames`` keeps (named ``forward``, torch's ``__init__.py``, or an
    anchor: outside torch while ``capturing``); the filter then keeps them all, in their order."""

    __slots__ = ("tb", "skip")

    def __init__(self, tb, skip: int):
        self.tb, self.skip = tb, skip

    @staticmethod
    def extract(*, skip: int = 0) -> _KeptFrames:
        from torch.utils._traceback import CapturedTraceback

        captured = CapturedTraceback.extract(skip=skip + 1)  # this frame is no node's
        return _KeptFrames(captured.tb, captured.skip)

    def summary(self) -> traceback.StackSummary:
        import torch._C._profiler

        stack = traceback.StackSummary()
        anchors = torch.fx.proxy._STACK_TRACE_ANCHORS
        for frame in reversed(torch._C._profiler.symbolize_tracebacks([self.tb])[0][self.skip :]):
            file, name = frame["filename"], frame["name"]
            if name == "forward" or file.endswith("torch/__init__.py") or (file, name) in anchors:
                stack.append(traceback.FrameSummary(file, frame["line"], name))
        return stack


def graph_inputs(program, args, kwargs) -> list:
    """The example value of each placeholder, in the graph's order."""
    user = iter(torch.utils._pytree.tree_leaves((tuple(args), dict(kwargs))))
    mutated = _written_in_place(program.graph_module.graph)
    values = []
    for spec in program.graph_signature.input_specs:
        if spec.kind.name == "USER_INPUT":
            values.append(next(user))
            continue
        value = program.state_dict[spec.target] if spec.target in program.state_dict else program.constants[spec.target]
        values.append(value.clone() if spec.arg.name in mutated else value)  # evaluating must not change the module's buffer
    return values


def _written_in_place(graph: torch.fx.Graph) -> set[str]:
    """The placeholders an in-place op of the (pre-dispatch, not functionalised) graph writes:
    LongRoPE's ``inv_freq.copy_(...)``."""
    written = set()
    for node in graph.nodes:
        schema = getattr(node.target, "_schema", None) if node.op == "call_function" else None
        if schema is None or not schema.is_mutable:
            continue
        for argument, value in zip(schema.arguments, node.args):
            if (
                argument.alias_info is not None
                and argument.alias_info.is_write
                and isinstance(value, torch.fx.Node)
                and value.op == "placeholder"
            ):
                written.add(value.name)
    return written
