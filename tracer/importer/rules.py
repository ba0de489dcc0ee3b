"""The captured graph as tracer steps: one rule per ATen op or idiom, names a person would write.

A step's id is the module path of the leaf module that made it (``c_attn``,
``layers.0.self_attn.q_proj``), or else the variable the source line assigns (``att``,
``query_states``), under the path of the module whose code it is. Its comment is that line. An op
with no rule is reported with the line it came from; nothing is dropped.
"""

from __future__ import annotations

import ast
import functools
import inspect
import math
import operator
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ..core.errors import Diagnostic, Position, TracerError
from ..steps.positions import alibi_bias, alibi_slopes, mpt_alibi_slopes, t5_buckets
from .idioms import Graph, Idiom, aten, hidden_pattern, mask_argument, module_stack, sdpa_reading_as_mask
from .leaves import captured, settings
from .lines import exported_file, exported_step, frames, source_line
from .naming import Namer
from .rotary import assigned_call, exported_parameters, literal, scaling_of
from .sizes import plus, size_value

EXPERTS = torch.ops.tracer.experts.default  # a sparse mixture of experts captured whole (leaves.py)
INDEXED = re.compile(r"([A-Za-z_]\w*)\[")
ASSIGNED = re.compile(r"^\s*([A-Za-z_][\w.]*(?:\s*,\s*[A-Za-z_][\w.]*)*)\s*(?::[^=]+)?=(?!=)")
UNARY = {
    getattr(aten, name).default: name
    for name in ("silu", "relu", "tanh", "neg", "exp", "sigmoid", "abs", "cos", "sin", "log", "log1p", "floor", "ceil", "trunc", "sign")
    + ("rsqrt", "sqrt", "reciprocal", "square")
}
# a DynamicCache's keys and values as torch.export flattens them (transformers' register_dynamic_cache_export_support)
CACHE_LEAF = re.compile(r"^(?P<cache>.+)_(?P<kind>key|value)_cache_(?P<layer>\d+)$")
CACHE_NAMES = {"key": ("k_cache", "keys"), "value": ("v_cache", "values")}  # the input's name, the cache layer's attribute
BINARY = {aten.add.Tensor: "add", aten.mul.Tensor: "mul", aten.sub.Tensor: "sub", aten.div.Tensor: "div"}
POWERS = {2: "square", 0.5: "sqrt", -0.5: "rsqrt", -1: "reciprocal"}  # x ** p as the step that computes it
LOGICAL = {
    **dict.fromkeys((aten.bitwise_not.default, aten.logical_not.default), "not"),
    **dict.fromkeys((aten.__or__.Tensor, aten.bitwise_or.Tensor, aten.logical_or.default), "or"),
    **dict.fromkeys((aten.__and__.Tensor, aten.bitwise_and.Tensor, aten.logical_and.default), "and"),
    **dict.fromkeys((aten.__xor__.Tensor, aten.bitwise_xor.Tensor, aten.logical_xor.default), "xor"),
}
COMPARES = {
    getattr(aten, cmp).__getattr__(overload): cmp for cmp in ("eq", "ne", "lt", "le", "gt", "ge") for overload in ("Scalar", "Tensor")
}
REDUCTIONS = {
    aten.mean.dim: "mean",
    aten.sum.dim_IntList: "sum",
    aten.amax.default: "amax",
    aten.amin.default: "amin",
    aten.any.dim: "any",
    aten.all.dim: "all",
}
WHERES = (aten.where.self, aten.where.ScalarSelf, aten.where.ScalarOther, aten.where.Scalar)
CASTS = (aten.to.dtype, aten.to.device, aten.to.dtype_layout, aten.type_as.default, aten._to_copy.default)
ADVANCED_INDEXING = (
    "; advanced indexing by a tensor of positions, or by a list that is not a run of consecutive positions, has no step "
    "(a run, as x[:, [-1]] or x[:, [2, 3]], imports as op: index with start/stop)"
)
UNMAPPED_HINTS = {aten.index_select.default: ADVANCED_INDEXING}
MASKED_FILLS = (aten.masked_fill.Scalar, aten.masked_fill_.Scalar)
SPLITS = (aten.split.Tensor, aten.split_with_sizes.default, aten.chunk.default)
MAX_CONSTANT_ELEMENTS = 1 << 16  # a computed constant the file holds as values: a table at the example sizes, not a weight
# ops that give a computed constant another shape or dtype: a step over the one declared table
CONSTANT_VIEWS = (
    aten.unsqueeze.default,
    aten.view.default,
    aten.reshape.default,
    aten.expand.default,
    aten.transpose.int,
    aten.permute.default,
    aten.slice.Tensor,
    aten.select.int,
    *CASTS,
)


@dataclass
class Step:
    """One step of the file: its fields, the node it came from, its layer (container, index)."""

    fields: dict[str, Any]
    node: torch.fx.Node
    comment: str | None = None
    layer: tuple[str, int] | None = None
    shape: list | None = None  # its output's shape in dims (a block's input, once layers fold)


class Unmapped(Exception):
    """A node with no rule; the message says what it is."""


def calling_line(node: torch.fx.Node, leaf: torch.nn.Module) -> tuple[str, int, str] | None:
    """The line that called the leaf module whose output the node is (``q = self.q_proj(x)``),
    not a line of the module's own forward (torch's ``linear.py: return F.linear(...)``)."""
    found, span = frames(node), _forward_span(type(leaf))
    own = [i for i, (file, line, _, _) in enumerate(found) if span and _same_file(file, span[0]) and span[1] <= line <= span[2]]
    if not own or own[-1] == 0:
        return source_line(node)
    file, line, _, code = found[own[-1] - 1]
    return file, line, code


@functools.cache
def _forward_span(cls: type) -> tuple[str, int, int] | None:
    """(file, first line, last line) of a module class's ``forward``; None where its source is not to be had."""
    try:
        lines, start = inspect.getsourcelines(cls.forward)
        return os.path.realpath(inspect.getsourcefile(cls.forward) or ""), start, start + len(lines) - 1
    except (OSError, TypeError):
        return None


def _same_file(file: str, real: str) -> bool:
    return _real_path(file) == real


@functools.lru_cache(maxsize=1024)
def _real_path(file: str) -> str:
    """``os.path.realpath``, which asks the file system each time, asked once per file."""
    return os.path.realpath(file)


class Translator:
    """Walks the graph in order and writes a step for each node that computes something."""

    def __init__(self, graph: Graph, module: torch.nn.Module, namer: Namer, caches: tuple[str, ...] = ()):
        self.graph, self.module, self.namer = graph, module, namer
        self.caches = caches  # forward's arguments that are a DynamicCache: their leaves are named per layer
        self.names: dict[torch.fx.Node, str] = {}
        self.failed: set[torch.fx.Node] = set()
        self.steps: list[Step] = []
        self.inputs: dict[str, dict] = {}
        self.params: dict[str, dict] = {}
        self.outputs: list[str] = []
        self.taken: set[str] = set()
        self.module_paths = {path for path, _ in module.named_modules() if path}
        self.childless: dict[str, bool] = {}

    def translate(self) -> None:
        self.graph.find_idioms()
        self._declare()
        problems = []
        for node in self.graph.calls():
            if node in self.graph.consumed or node not in self.graph.live and node not in self.graph.idioms:
                continue
            try:
                self._translate(node)
            except Unmapped as exc:
                self.failed.add(node)
                problems.append(_problem(node, str(exc), self._line(node)))
            except _Downstream:
                self.failed.add(node)
        if problems:
            raise TracerError(problems)
        self.outputs = [self.ref(n) for n in _outputs(self.graph)]

    def _declare(self) -> None:
        """Inputs in forward's order, params and buffers in state_dict's (each module's own, then its children's)."""
        state = self.module.state_dict(keep_vars=True)
        order = {key: i for i, key in enumerate(state)}

        def place(node) -> int:  # user inputs first, as the graph has them
            return -1 if self.graph.kind(node) == "USER_INPUT" else order.get(self.graph.target(node), -1)

        for node in sorted((n for n in self.graph.fx.nodes if n.op == "placeholder"), key=place):
            kind, value = self.graph.kind(node), node.meta.get("val")
            if not isinstance(value, torch.Tensor):
                continue
            if kind == "USER_INPUT":
                name, note = self._cache_leaf(node) or (node.name, None)
                self.inputs[name] = self._declaration(value) | ({"note": note} if note else {})
                self.names[node] = name
                self.taken.add(name)
            elif kind in ("PARAMETER", "BUFFER") and self.graph.target(node) in state:
                buffer = {"buffer": True} if kind == "BUFFER" else {}  # held, not trained: export registers it as a buffer
                self.params[self.graph.target(node)] = {**self._declaration(value), **buffer}
                self.names[node] = self.graph.target(node)
                self.taken.add(self.graph.target(node))
        self._cache_leaves_by_layer()

    def _cache_leaves_by_layer(self) -> None:
        """A cache's keys and values layer by layer (torch.export has every layer's keys, then every
        layer's values), in the places its leaves took among forward's inputs."""
        leaves = [name for name, entry in self.inputs.items() if "note" in entry]
        ordered = iter(sorted(leaves, key=lambda name: _cache_place(self.inputs[name]["note"])))
        names = [next(ordered) if name in leaves else name for name in self.inputs]
        self.inputs = {name: self.inputs[name] for name in names}

    def _cache_leaf(self, node: torch.fx.Node) -> tuple[str, str] | None:
        """A KV cache's keys or values of one layer, named as a person writes them: after the module
        that appends to them (``layers.0.self_attn.k_cache``), noted with where the cache holds them
        (``past_key_values.layers[0].keys``), which is what ``difference`` passes."""
        match = CACHE_LEAF.match(node.name)
        if match is None or match["cache"] not in self.caches:
            return None
        paths = [_module_path(user) for user in node.users]
        path = next((p for p in paths if p), match["cache"] + f".layers.{match['layer']}")
        name, attribute = CACHE_NAMES[match["kind"]]
        return self._unique(_join(path, name)), f"{match['cache']}.layers[{match['layer']}].{attribute}"

    def _declaration(self, value: torch.Tensor, init: str | None = None) -> dict:
        declaration = {"shape": self.namer.shape(value), "init": init or ("randn" if value.dtype.is_floating_point else "zeros")}
        if value.dtype != torch.float32:
            declaration["dtype"] = str(value.dtype).removeprefix("torch.")
        return declaration

    # -------------------------------------------------------------- references and names

    def ref(self, node) -> str:
        if node in self.names:
            return self.names[node]
        if node in self.failed:
            raise _Downstream
        if node in self.graph.constant and isinstance(self.graph.values.get(node), torch.Tensor):
            return self._computed_constant(node)
        if node in self.graph.constant:
            raise Unmapped(f"it reads '{node.name}', a value the module computes from constants ({_label(node)}) that is no tensor")
        raise _Downstream

    def _computed_constant(self, node: torch.fx.Node) -> str:
        """A tensor the module computes from constants that no idiom names (a rotary table of
        frequencies no config reproduces, a table at an offset): a param holding its value at the
        example (``values:``, ``buffer: true``), its ``note`` saying which module and op computed it.
        A view or cast of another such tensor is that step of it, so every layer reads one table
        (transformers' rotary embedding's ``cos``, unsqueezed in each layer's attention)."""
        source = node.args[0] if node.op == "call_function" and node.target in CONSTANT_VIEWS and node.args else None
        if isinstance(source, torch.fx.Node) and source in self.graph.constant and not _reads_tensors(node.args[1:]):
            self.ref(source)
            RULES[node.target](self, node)
            return self.names[node]
        value = self.graph.values[node]
        if value.numel() > MAX_CONSTANT_ELEMENTS:
            raise Unmapped(
                f"it reads '{node.name}', a tensor of {value.numel():,} elements the module computes from constants "
                f"({_label(node)}): over {MAX_CONSTANT_ELEMENTS:,}, too large to write into the file as values"
            )
        if node.op == "placeholder":  # a non-persistent buffer or a tensor attribute: held, in no state_dict
            name = self._unique(self.graph.target(node))
            note = f"{type(self.module).__name__}'s tensor '{self.graph.target(node)}', which its state_dict does not hold"
        else:
            line = source_line(node)
            assigned = _assigned(line[2]) if line else []  # `cos = emb.cos()`, whatever step a line of `tracer export` is tagged with
            name = self._unique(_join(_module_path(node), assigned[0] if len(assigned) == 1 else _op_name(node)))
            note = f"computed at import by {_provenance(node, self._line(node), type(self.module).__name__)}"
        self.params[name] = {
            "shape": self._constant_shape(node),
            **({} if value.dtype == torch.float32 else {"dtype": str(value.dtype).removeprefix("torch.")}),
            "values": value.tolist(),
            "buffer": True,
            "note": plain_note(note),
        }
        self.names[node] = name
        self.taken.add(name)
        return name

    def _constant_shape(self, node: torch.fx.Node) -> list:
        """A computed constant's shape, each axis named as the tensor that reads it names its axis of
        that size, aligned from the last as broadcasting aligns them: the constant follows from no input,
        and a rotary table's width of 4 is the head width ``Dh``, not ``H`` of the same size."""
        names, sizes = self.namer.shape(node.meta["val"]), node.meta["val"].shape
        reader = next((u for u in node.users if isinstance(u.meta.get("val"), torch.Tensor)), None)
        if reader is None:
            return names
        theirs, their_sizes = self.namer.shape(reader.meta["val"]), reader.meta["val"].shape
        for i in range(1, min(len(sizes), len(their_sizes)) + 1):
            if sizes[-i] == their_sizes[-i] and isinstance(theirs[-i], str):
                names[-i] = theirs[-i]
        rotated = self._rotated_width(node) if sizes else None
        return [*names[:-1], rotated] if rotated is not None else names

    def _rotated_width(self, node: torch.fx.Node) -> str | None:
        """The last axis of a constant that rotary frequencies are made of, named after the heads
        they rotate: followed through the ops that keep its width (times the positions, cos, sin,
        casts, views) and a ``cat`` of copies along it (rotate_half's ``cat((freqs, freqs), -1)``:
        twice as wide), to the product with a tensor of heads, whose last axis is the head width.
        Llama 3.1's (4,) frequencies of a head width of 8 are ``Dh // 2``, not ``H`` of the same
        size (whose doubling then reads as a view that scrambles dims); None if no such product."""
        width = node.meta["val"].shape[-1]
        factors, todo = {node: 1}, [node]
        while todo:
            current = todo.pop()
            for user in current.users:
                value = user.meta.get("val")
                if user in factors or not isinstance(value, torch.Tensor) or value.ndim == 0:
                    continue
                factor = factors[current] * _copies_along_last(user, current)
                if value.shape[-1] != width * factor:
                    continue
                other = next((a for a in user.args if isinstance(a, torch.fx.Node) and a is not current), None)
                heads = other is not None and other not in factors and getattr(other.meta.get("val"), "ndim", 0) >= 4
                if user.target == aten.mul.Tensor and heads:
                    head = self.namer.shape(other.meta["val"])[-1]
                    if isinstance(head, str) and head.isidentifier():
                        return head if factor == 1 else f"{head} // {factor}"
                factors[user] = factor
                todo.append(user)
        return None

    def size(self, value, prefer: tuple[str, ...] = ()) -> int | str:
        if isinstance(value, torch.fx.Node):
            value = value.meta["val"]
        return self.namer.size(value, prefer)

    def step_id(self, node: torch.fx.Node, op: str) -> str:
        leaf = self._leaf_module(node)
        if leaf is not None:
            return self._unique(leaf)
        base = _join(_module_path(node), self._variable(node, op) or op)
        line = source_line(node)
        tagged = line is not None and exported_step(line[0], line[2]) is not None  # `tracer export`'s own ids stay
        if base in self.module_paths and not tagged:  # `down_proj = self.down_proj(a * b)`: the product is not the Linear
            base = f"{base}_{op}"
        return self._unique(base)

    def _line(self, node: torch.fx.Node) -> tuple[str, int, str] | None:
        """The line a step is commented with and a problem located at: a leaf module's caller's."""
        if node.target == EXPERTS:
            return _calling_the_experts(node)
        leaf = self._leaf_module(node)
        return calling_line(node, self.module.get_submodule(leaf)) if leaf else source_line(node)

    def _leaf_module(self, node: torch.fx.Node) -> str | None:
        """The path of a childless module whose output this node is (a Linear, an Embedding, a norm)."""
        stack = module_stack(node)
        path = stack[-1][0] if stack else ""
        if not path or any(_module_path(user) == path for user in node.users):
            return None
        return path if self._childless(path) else None

    def _childless(self, path: str) -> bool:
        """Whether the module at ``path`` has no children, asked once per path (each node of a module asks)."""
        if path not in self.childless:
            try:
                self.childless[path] = not list(self.module.get_submodule(path).children())
            except AttributeError:
                self.childless[path] = False
        return self.childless[path]

    def _variable(self, node: torch.fx.Node, op: str) -> str | None:
        """The step id a module `tracer export` wrote tags the line with, else the name the source
        line assigns; ``NAME_op`` for a node another node of the line reads."""
        line = source_line(node)
        tag = exported_step(line[0], line[2]) if line else None
        names = [tag] if tag else _assigned(line[2]) if line else []
        if not names:
            return None
        same_line = [user for user in node.users if _same_statement(user, node) and not (tag and user.target == operator.getitem)]
        if same_line:
            return f"{names[0]}_{op}"
        return names[min(self._position_on_line(node), len(names) - 1)] if len(names) > 1 else names[0]

    def _position_on_line(self, node) -> int:
        """Which of ``a, b = …``'s names: the node's place among the line's last nodes in this module."""
        last = [n for n in self.graph.calls() if _same_statement(n, node) and not any(_same_statement(u, n) for u in n.users)]
        return last.index(node) if node in last else 0

    def _unique(self, base: str) -> str:
        base = re.sub(r"[^A-Za-z0-9_.\-]", "_", base)[:60]
        base = base if re.match(r"[A-Za-z_]", base) else f"t_{base}"
        name, i = base, 2
        while name in self.taken:
            name, i = f"{base}_{i}", i + 1
        self.taken.add(name)
        return name

    def emit(self, node: torch.fx.Node, fields: dict, op_name: str | None = None, step_id: str | None = None, shape=None) -> Step:
        """A step of the node; ``shape`` is its output's in dims where the rule writes it (a view's
        ``B * H``), so a block input it makes is declared as written."""
        step_id = step_id or self.step_id(node, op_name or fields["op"])
        self.names[node] = step_id
        comment = _comment(self._line(node))
        value = node.meta.get("val")
        shape = shape or (self.namer.shape(value) if isinstance(value, torch.Tensor) else None)
        step = Step({"id": step_id, **fields}, node, comment, _layer(node), shape)
        self.steps.append(step)
        return step

    # -------------------------------------------------------------- the rules

    def _translate(self, node: torch.fx.Node) -> None:
        idiom = self.graph.idioms.get(node)
        if idiom is not None:
            return IDIOMS[idiom.kind](self, idiom)
        if node.target == operator.getitem and node in self.names:
            return None
        return self._by_rule(node)

    def _by_rule(self, node: torch.fx.Node) -> None:
        rule = RULES.get(node.target)
        if rule is None:
            raise Unmapped(f"no tracer step for {_label(node)}{UNMAPPED_HINTS.get(node.target, '')}")
        return rule(self, node)

    def _unary(self, node):
        self.emit(node, {"op": UNARY[node.target], "input": self.ref(node.args[0])})

    def _binary(self, node):
        a, b = node.args[:2]
        if not isinstance(b, torch.fx.Node):
            return self._scale(node, a, b)
        scalar = next((t for t in (b, a) if self._constant_scalar(t)), None)
        if scalar is not None and node.target in (aten.mul.Tensor, aten.div.Tensor) and (scalar is b or node.target == aten.mul.Tensor):
            return self._scale(node, a if scalar is b else b, float(self.graph.values[scalar]))
        if node.target == aten.add.Tensor and b in self.graph.constant:
            return self._additive_mask(node, a, b)
        self.emit(node, {"op": BINARY[node.target], "inputs": [self.ref(a), self.ref(b)]})

    def _rsub(self, node):
        """``number - x`` (BERT's ``1.0 - mask``): a ``sub`` with the number first."""
        x, number = node.args[:2]
        if isinstance(number, torch.fx.Node):
            raise Unmapped(f"{_label(node)} of two tensors")
        self.emit(node, {"op": "sub", "input": self.ref(x), "value": _number(number), "value_first": True})

    def _constant_scalar(self, node) -> bool:
        """A one-element tensor the module computes or keeps out of its state_dict (Gemma's ``embed_scale``): a number."""
        value = self.graph.values.get(node) if isinstance(node, torch.fx.Node) else None
        return node in self.graph.constant and node not in self.names and isinstance(value, torch.Tensor) and value.numel() == 1

    def _scale(self, node, x, number):
        """``x OP number``: a ``scale`` for a product or a quotient (by ``{sqrt: Dh}`` or ``{rsqrt:
        Dh}`` where the number is the head width's root as Python computes it), else ``add``/``sub``
        with the number as ``value`` (``x - 1``)."""
        if node.target not in (aten.mul.Tensor, aten.div.Tensor):
            self.emit(node, {"op": BINARY[node.target], "input": self.ref(x), "value": _number(number)})
            return
        self.emit(node, self._scale_fields(x, "multiply" if node.target == aten.mul.Tensor else "divide", number), "scaled")

    def _scale_fields(self, x, key: str, number, head: int | None = None) -> dict:
        """``scale`` of x by a number: ``{rsqrt: Dh}``/``{sqrt: Dh}`` where it is the head width's root."""
        head = head or _head_width(x)
        dh = self.size(head, ("Dh",))
        if key == "multiply" and float(number) == head**-0.5:  # transformers' `scaling = head_dim ** -0.5`, bit for bit
            return {"op": "scale", "input": self.ref(x), "multiply": {"rsqrt": dh}}
        if math.isclose(float(number), head ** (-0.5 if key == "multiply" else 0.5), rel_tol=1e-6):
            return {"op": "scale", "input": self.ref(x), "divide": {"sqrt": dh}}
        return {"op": "scale", "input": self.ref(x), key: float(number)}

    def _additive_mask(self, node, x, mask):
        """``x + constant``: a mask step for a constant causal, window or band mask, nothing for adding
        zeros; a buffer of the state_dict that is no mask (loading may change it), or any other
        constant (a computed one, held as values), is added as it is."""
        declared = mask in self.names
        if not declared and not _hides_any(self.graph.values[mask]):  # BART's encoder mask without padding: adding zeros
            self.names[node] = self.ref(x)
            return
        alibi = None if declared else self._exported_alibi(x, mask)
        if alibi is not None:  # the bias a `tracer export`ed alibi step computes: the step again
            return self.emit(node, {"op": "alibi", "input": self.ref(x), **alibi}, "biased")
        found = _additive_pattern(self.graph.values[mask])
        if found is None:  # a buffer, or a computed constant (held as values): added as it is
            return self.emit(node, {"op": "add", "inputs": [self.ref(x), self.ref(mask)]})
        fields = {"op": "mask", "input": self.ref(x), **self._pattern(found[0]), "fill": _fill(found[1], x.meta["val"].dtype)}
        self.emit(node, fields, "masked")

    def _exported_alibi(self, scores, bias) -> dict | None:
        """The fields of the ``alibi`` step a module ``tracer export`` wrote computed this constant
        bias with: its slopes line names the slopes function (and MPT's bias_max, a literal read with
        ``ast``), and the bias is held against the step's own, plain and ``relative``; None for any other."""
        written = next((found for line in self._exported_lines(bias) if (found := exported_alibi_slopes(line)) is not None), None)
        table, shape = self.graph.values[bias], tuple(scores.meta["val"].shape)
        if written is None or len(shape) < 3 or not table.is_floating_point():
            return None
        for relative in (False, True):
            expected = alibi_bias(torch, *shape[-3:], relative, written.get("bias_max")).to(table.dtype)
            if expected.shape == table.shape and torch.allclose(expected.double(), table.double(), rtol=1e-6, atol=0):
                return {**written, **({"relative": True} if relative else {})}
        return None

    def _pattern(self, pattern: dict) -> dict:
        """A mask pattern's fields, its window and chunk written in dims (``W``: a config's ``sliding_window``)."""
        sizes = {key: self.size(pattern[key], prefer) for key, prefer in (("window", ("W",)), ("chunk", ("C",))) if key in pattern}
        return {**pattern, **sizes}

    def _masked_fill(self, node):
        """A masked_fill the mask walker left: torch's ``_canonical_mask`` (a bool mask as a float one:
        ``zeros_like(m, dtype=float).masked_fill_(m, -inf)``, as nn.TransformerEncoder makes its
        ``src_key_padding_mask``) is a ``where``; any other is a constant no pattern hides, or two masks."""
        base, mask, fill = node.args[:3]
        if _fresh_zeros(base) and mask is base.args[0] and mask.meta["val"].dtype == torch.bool:
            return self.emit(node, {"op": "where", "inputs": [self.ref(mask)], "then": float(fill), "otherwise": 0.0})
        raise Unmapped(f"masked_fill with '{node.args[1].name}': not a causal, sliding-window or band pattern or one given mask")

    def _zeros_like(self, node):
        """``zeros_like(m)`` that only ``_canonical_mask``'s masked_fill reads: no step of its own."""
        if not all(u.target in MASKED_FILLS and u.args[0] is node and u.args[1] is node.args[0] for u in node.users):
            raise Unmapped(f"{_label(node)} read as a tensor of its own: tracer makes zeros with an input's init: zeros")

    def _pow(self, node):
        x, exponent = node.args[:2]
        kind = POWERS.get(exponent) if isinstance(exponent, int | float) else None
        if kind is None:  # x ** 3 (GELU's cubic term): a pow step
            return self.emit(node, {"op": "pow", "input": self.ref(x), "exponent": _number(exponent)})
        self.emit(node, {"op": kind, "input": self.ref(x)})

    def _logical(self, node):
        tensors = [a for a in node.args if isinstance(a, torch.fx.Node)]
        if len(tensors) != len(node.args) or any(t.meta["val"].dtype != torch.bool for t in tensors):
            raise Unmapped(f"{_label(node)} of an integer tensor or a number: tracer's logical step takes bool tensors")
        fn = LOGICAL[node.target]
        neutral = [t for t in tensors if t in self.graph.constant and _neutral(self.graph.values[t], fn)]
        if len(tensors) == 2 and len(neutral) == 1:  # masking_utils' `padding & all-True`: the other, broadcast
            return self._broadcast(node, next(t for t in tensors if t is not neutral[0]))
        self.emit(node, {"op": "logical", "fn": fn, **_reads([self.ref(t) for t in tensors])})

    def _broadcast(self, node, source):
        """``node`` is ``source`` broadcast to its shape: the same name, or an ``expand``."""
        if tuple(source.meta["val"].shape) == tuple(node.meta["val"].shape):
            self.names[node] = self.ref(source)
            return
        self.emit(node, {"op": "expand", "input": self.ref(source), "shape": self.namer.shape(node.meta["val"])})

    def _index(self, node):
        """``x[rows, cols]`` with each index a constant ``arange`` over its whole dim, on its own output
        axis in order (masking_utils' ``padding_mask[batch_idx, kv_idx]``): x with size-1 axes between."""
        x, indices = node.args[:2]
        value, out = self.graph.values[x], self.graph.values[node]
        run = _consecutive_positions(self.graph, indices, value.shape)
        if run is not None:  # x[:, [-1]] or x[:, [2, 3]]: a slice of consecutive positions
            dim, first, count = run
            start, stop = self._from_end(self.namer.axis(x.meta["val"], dim), first, count) if first < 0 else (first, first + count)
            fields = {"op": "index", "input": self.ref(x), "dim": dim, **({"start": start} if start else {}), "stop": stop}
            return self.emit(node, fields)
        if _picks_a_row_per_batch(self.graph, indices, value.shape):  # CLIP's pooler: x[arange(B), eos]
            return self._picked_rows(node, x, indices[1])
        axes = [
            _range_axis(self.graph.values[i], n) if i in self.graph.constant else None for i, n in zip(indices, value.shape, strict=False)
        ]
        if len(indices) != value.ndim or None in axes or axes != sorted(set(axes)) or out.numel() != value.numel():
            raise Unmapped(f"no tracer step for {_label(node)}{ADVANCED_INDEXING}")
        line = source_line(node)
        indexed = INDEXED.search(line[2]) if line else None  # `return padding_mask[batch_idx, kv_idx]`: padding_mask
        fields = {"op": "reshape", "input": self.ref(x), "shape": self.namer.shape(node.meta["val"])}
        self.emit(node, fields, indexed.group(1) if indexed and not _assigned(line[2]) else None)

    def _picked_rows(self, node, x, positions):
        """``x[arange(B), positions]``: for each batch entry the row at its own position, as
        ``gather`` along dim 1 of the positions viewed (B, 1, 1…) and expanded, then that axis dropped."""
        shape = self.namer.shape(x.meta["val"])
        base = self.step_id(node, "picked")
        index = {"op": "view", "input": self.ref(positions), "shape": [shape[0], 1] + [1] * (len(shape) - 2)}
        self.emit(node, index, step_id=self._unique(f"{base}_at"))
        expanded = {"op": "expand", "input": self.names[node], "shape": [shape[0], 1, *shape[2:]]}
        self.emit(node, expanded, step_id=self._unique(f"{base}_index"))
        self.emit(node, {"op": "gather", "inputs": [self.ref(x), self.names[node]], "dim": 1}, step_id=self._unique(f"{base}_gathered"))
        self.emit(node, {"op": "index", "input": self.names[node], "dim": 1, "index": 0}, step_id=base)

    def _argmax(self, node):
        """``x.argmax(dim)`` (CLIP's end-of-text position): a ``reduce`` over that dim."""
        dim = _arg(node, 1, None, "dim")
        if dim is None and node.args[0].meta["val"].ndim != 1:
            raise Unmapped(f"{_label(node)} without dim (the position in the flattened tensor): tracer's argmax runs along one dim")
        fields = {"op": "reduce", "fn": "argmax" if node.target == aten.argmax.default else "argmin", "input": self.ref(node.args[0])}
        fields.update({"dim": dim} if dim is not None else {}, **({"keepdim": True} if _arg(node, 2, False, "keepdim") else {}))
        self.emit(node, fields)

    def _from_end(self, size, first: int, count: int) -> tuple[int | str, int | str]:
        """(start, stop) of positions counted from the end (``[-1]``), in the dim's name where it has one (``T - 1``)."""
        end = self.size(size)
        if isinstance(end, int):
            return end + first, end + first + count
        return f"{end} - {-first}", end if first + count == 0 else f"{end} - {-(first + count)}"

    def _compare(self, node):
        a, b = node.args[:2]
        fields = {"op": "compare", "cmp": COMPARES[node.target]}
        if isinstance(b, torch.fx.Node):
            fields["inputs"] = [self.ref(a), self.ref(b)]
        else:
            fields.update(input=self.ref(a), value=b)
        self.emit(node, fields)

    def _where(self, node):
        cond = node.args[0]
        then, otherwise = (float(self.graph.values[a].reshape(-1)[0]) if self._uniform_branch(node, a) else a for a in node.args[1:3])
        fields = {"op": "where", "inputs": [self.ref(x) for x in (cond, then, otherwise) if isinstance(x, torch.fx.Node)]}
        fields.update({key: value for key, value in (("then", then), ("otherwise", otherwise)) if not isinstance(value, torch.fx.Node)})
        self.emit(node, fields)

    def _uniform_branch(self, node, branch) -> bool:
        """A branch of ``where`` that is one number: a one-element constant, or a constant of one
        value that only broadcasts, into a mask only sdpas read (T5's cross-attention under sdpa:
        ``where(keep, zeros(1, H, T, S), min)``, its bias of zeros): no values to hold, any size."""
        if not isinstance(branch, torch.fx.Node) or self._constant_scalar(branch):
            return self._constant_scalar(branch)
        value = self.graph.values.get(branch) if branch in self.graph.constant and branch not in self.names else None
        if not isinstance(value, torch.Tensor) or not value.numel() or not bool((value == value.reshape(-1)[0]).all()):
            return False
        same_dtype = value.dtype == node.meta["val"].dtype == torch.float32  # a number keeps a float32 where float32
        return same_dtype and all(mask_argument(user) is node for user in node.users)

    def _cast(self, node):
        dtype = str(node.meta["val"].dtype).removeprefix("torch.")
        self.emit(node, {"op": "cast", "input": self.ref(node.args[0]), "dtype": dtype})

    def _reduce(self, node):
        fields = {"op": "reduce", "fn": REDUCTIONS[node.target], "input": self.ref(node.args[0])}
        dims = _arg(node, 1, None, "dim")
        dims = [dims] if isinstance(dims, int) else list(dims or [])
        if dims:
            fields["dim"] = dims[0] if len(dims) == 1 else dims
        if _arg(node, 2, False, "keepdim"):
            fields["keepdim"] = True
        self.emit(node, fields)

    def _repeat(self, node):
        repeats = [self.size(r) if isinstance(r, torch.fx.Node | torch.SymInt) else int(r) for r in node.args[1]]
        self.emit(node, {"op": "repeat", "input": self.ref(node.args[0]), "repeats": repeats})

    def _stack(self, node):
        self.emit(node, {"op": "stack", "inputs": [self.ref(x) for x in node.args[0]], "dim": _arg(node, 1, 0, "dim")})

    def _linear(self, node):
        fields = {"op": "linear", "input": self.ref(node.args[0]), "weight": self.ref(node.args[1])}
        if len(node.args) > 2 and node.args[2] is not None:
            fields["bias"] = self.ref(node.args[2])
        self.emit(node, fields)

    def _embedding(self, node):
        table, ids = node.args[:2]
        if ids in self.graph.constant and ids not in self.names:
            return self._positions(node, table, ids)
        self.emit(node, {"op": "embed", "input": self.ref(ids), "weight": self.ref(table)})

    def _positions(self, node, table, ids):
        """A lookup of constant ids: 0 .. T-1 is a ``position_ids`` input made by ``init: arange``;
        ``c .. c+T-1`` (BART's offset 2) or one id everywhere (BERT's token type 0) is the slice of
        the table's rows it reads, which broadcasts over the batch as the lookup's rows did."""
        value = self.graph.values[ids]
        first = int(value.reshape(-1)[0]) if value.numel() else 0
        if first == 0 and torch.equal(value, torch.arange(value.numel()).reshape(value.shape)):
            name = self._unique(self._variable(ids, "positions") or "position_ids")
            self.inputs[name] = self._declaration(ids.meta["val"], "arange")
            self.names[ids] = name
            return self.emit(node, {"op": "embed", "input": name, "weight": self.ref(table)})
        length = self.namer.axis(ids.meta["val"], -1)
        if torch.equal(value, torch.arange(first, first + value.shape[-1]).expand(value.shape)):
            stop = self.size(length) if first == 0 else f"{self.size(length)} + {first}"
        elif bool((value == first).all()):
            stop = first + 1
        else:
            raise Unmapped(
                _sdpa_bias_reason(node) or f"it looks up '{ids.name}', constant ids that are neither one id nor consecutive positions"
            )
        fields = {"op": "index", "input": self.ref(table), "dim": 0, **({"start": first} if first else {}), "stop": stop}
        return self.emit(node, fields)

    def _split(self, node):
        pieces = sorted(node.users, key=lambda user: user.args[1])
        line = source_line(node)
        assigned = _exported_outputs(line[0], line[2]) if line else []
        count = len(node.meta["val"])
        bases = assigned if len(assigned) == count else [f"part{i}" for i in range(count)]
        outputs = [self._unique(_join(_module_path(node), base)) for base in bases]
        for piece in pieces:
            self.names[piece] = outputs[piece.args[1]]
        fields = {"op": "split", "input": self.ref(node.args[0]), "dim": _arg(node, 2, 0)}
        if node.target == aten.chunk.default:
            fields["chunks"] = node.args[1]
        else:
            sizes = node.args[1]
            fields["sizes"] = [self.size(s) for s in sizes] if isinstance(sizes, list | tuple) else self.size(sizes)
        self.emit(node, {**fields, "outputs": outputs}, "split")

    def _unbind(self, node):
        """``q, k, v = qkv.unbind(2)``: one ``unbind`` step, its outputs named as the line names them."""
        line = source_line(node)
        assigned = _exported_outputs(line[0], line[2]) if line else []
        count = len(node.meta["val"])
        bases = assigned if len(assigned) == count else [f"part{i}" for i in range(count)]
        outputs = [self._unique(_join(_module_path(node), base)) for base in bases]
        for piece in node.users:
            self.names[piece] = outputs[piece.args[1]]
        fields = {"op": "unbind", "input": self.ref(node.args[0]), "dim": _arg(node, 1, 0, "dim"), "outputs": outputs}
        self.emit(node, fields, "unbind")

    def _topk(self, node):
        """``values, indices = torch.topk(x, k, dim)``: a ``topk`` step, its outputs named as the line
        names them. Values divided in place by their sum over the k and read by nothing else
        (Mixtral's router: ``router_top_value /= router_top_value.sum(dim=-1, keepdim=True)``) are
        its ``normalize: true``."""
        dim, largest, ordered = _arg(node, 2, -1, "dim"), _arg(node, 3, True, "largest"), _arg(node, 4, True, "sorted")
        pieces = {user.args[1]: user for user in node.users}
        line = source_line(node)
        assigned = _exported_outputs(line[0], line[2]) if line else []
        outputs = [self._unique(_join(_module_path(node), base)) for base in (assigned if len(assigned) == 2 else ["values", "indices"])]
        fields = {"op": "topk", "input": self.ref(node.args[0]), "k": self.size(node.args[1], ("K",)), "dim": dim}
        fields.update({} if largest else {"largest": False}, **({} if ordered else {"sorted": False}))
        normalized = _normalized(pieces[0], dim) if 0 in pieces else None
        if normalized is not None:
            fields["normalize"] = True
            self.names[normalized[1]] = outputs[0]
            self.graph.consumed.update(normalized)
        for index, piece in pieces.items():
            self.names[piece] = outputs[index]
        self.emit(node, {**fields, "outputs": outputs}, "route")

    def _experts(self, node):
        """A sparse mixture of experts captured whole (``leaves.py``): a ``moe`` step of the tokens,
        the routing weights and the chosen experts, with the module's settings. transformers'
        experts are commented with the line that called them and named by their module path; a
        ``tracer export``ed module's keep the step id its calling line is tagged with."""
        tokens, weights, chosen, gate_up, down, up_bias, down_bias, module = node.args
        try:
            fields = settings(captured(module))
        except ValueError as exc:
            raise Unmapped(f"the experts module marked tracer_step = 'moe' at {_module_path(node)!r}: {exc}") from None
        fields = {"op": "moe", "inputs": [self.ref(tokens), self.ref(weights), self.ref(chosen)], "gate_up": self.ref(gate_up), **fields}
        fields.update(
            down=self.ref(down), **{k: self.ref(v) for k, v in (("gate_up_bias", up_bias), ("down_bias", down_bias)) if v is not None}
        )
        calling = _calling_the_experts(node)
        tag = exported_step(calling[0], calling[2]) if calling else None
        path = _module_path(node)
        step_id = _join(path.rpartition(".")[0], tag) if tag else path or "experts"
        self.emit(node, fields, step_id=self._unique(step_id))  # commented with the calling line (_line)
        self._name_expert_axes(node, fields)

    def _name_expert_axes(self, node: torch.fx.Node, fields: dict) -> None:
        """The experts' weights and the router's as the config names them, ``(E, 2 * d_ff, d_model)``
        and ``(E, d_model, d_ff)`` (``in_out``: each transposed), ``(E, d_model)``: by value, E could read
        as H and 2F as ``3 * d_model`` of the same sizes."""
        tokens, _, chosen, gate_up, down, up_bias, down_bias, _ = node.args
        count, width = gate_up.meta["val"].shape[0], tokens.meta["val"].shape[-1]
        in_out = fields.get("layout") == "in_out"
        model = down.meta["val"].shape[1 if in_out else 2]
        experts, hidden, inner = self.size(count, ("E",)), self.size(width, ("d_model",)), self.size(model, ("d_ff",))
        if not all(isinstance(name, str) for name in (experts, hidden, inner)):
            return
        stacked = f"2 * {inner}" if fields.get("gated", True) else inner
        shapes = {gate_up: [stacked, hidden], down: [hidden, inner], up_bias: [stacked], down_bias: [hidden]}
        for param, shape in shapes.items():
            if param is not None and self.names.get(param) in self.params:  # a weight the module computes keeps its step's shape
                self.params[self.names[param]]["shape"] = [experts, *(reversed(shape) if in_out else shape)]
        router = _router_weight(self.graph, chosen)
        if router is not None and tuple(router.meta["val"].shape) == (count, width):
            self.params[self.names[router]]["shape"] = [experts, hidden]

    def _flatten(self, node):
        self.emit(node, {"op": "reshape", "input": self.ref(node.args[0]), "shape": self.namer.shape(node.meta["val"])}, "flattened")

    def _cumsum(self, node):
        fields = {"op": "cumsum", "input": self.ref(node.args[0]), "dim": node.args[1]}
        dtype = node.kwargs.get("dtype")
        if dtype is not None:
            fields["dtype"] = str(dtype).removeprefix("torch.")
        self.emit(node, fields)

    def _roll(self, node):
        shifts, dims = node.args[1], _arg(node, 2, [], "dims")
        if not dims:
            raise Unmapped("torch.roll without dims (it rolls the flattened tensor): tracer rolls along named dims")
        fields = {"op": "roll", "input": self.ref(node.args[0]), "shifts": [self.size(s) for s in shifts], "dims": list(dims)}
        self.emit(node, fields)

    def _diff(self, node):
        """``torch.diff(x, n, dim)``; with ``prepend``/``append`` tensors (masking_utils' packed
        sequences: ``torch.diff(position_ids, prepend=first - 1)``), the ``cat`` it differences first."""
        dim, before, after = _arg(node, 2, -1, "dim"), _arg(node, 3, None, "prepend"), _arg(node, 4, None, "append")
        if any(part is not None and not isinstance(part, torch.fx.Node) for part in (before, after)):
            raise Unmapped("torch.diff with a number to prepend or append: tracer's cat joins tensors")
        source, step_id = self.ref(node.args[0]), self.step_id(node, "diff")
        if before is not None or after is not None:
            parts = [self.ref(part) for part in (before, node.args[0], after) if part is not None]
            source = self.emit(node, {"op": "cat", "inputs": parts, "dim": dim}, step_id=self._unique(f"{step_id}_joined")).fields["id"]
        self.emit(node, {"op": "diff", "input": source, "n": _arg(node, 1, 1, "n"), "dim": dim}, step_id=step_id)

    def _einsum(self, node):
        self.emit(node, {"op": "einsum", "inputs": [self.ref(x) for x in node.args[1]], "equation": node.args[0]})

    def _conv(self, node):
        """``F.conv1d``/``F.conv2d`` (an nn.Conv's forward), with the options that differ from torch's defaults."""
        x, weight = node.args[:2]
        fields = {"op": "conv1d" if node.target == aten.conv1d.default else "conv2d", "input": self.ref(x), "weight": self.ref(weight)}
        bias = _arg(node, 2, None, "bias")
        if bias is not None:
            fields["bias"] = self.ref(bias)
        for position, key, default in ((3, "stride", 1), (4, "padding", 0), (5, "dilation", 1), (6, "groups", 1)):
            value = _arg(node, position, default, key)
            value = value[0] if isinstance(value, list | tuple) and len(set(value)) == 1 else value
            if value != default:
                fields[key] = list(value) if isinstance(value, list | tuple) else value
        self.emit(node, fields)

    def _shaped(self, node):
        op = {aten.view.default: "view", aten.reshape.default: "reshape", aten.expand.default: "expand"}[node.target]
        shape = self.namer.shape(node.meta["val"])
        if op != "expand":
            sizes = (self.graph.values[node.args[0]].shape, self.graph.values[node].shape)
            shape = _merged_names(self.namer.shape(node.args[0].meta["val"]), shape, *sizes)
        self.emit(node, {"op": op, "input": self.ref(node.args[0]), "shape": shape}, shape=shape)

    def _transpose(self, node):
        self.emit(node, {"op": "transpose", "input": self.ref(node.args[0]), "dims": [node.args[1], node.args[2]]})

    def _permute(self, node):
        self.emit(node, {"op": "permute", "input": self.ref(node.args[0]), "dims": list(node.args[1])})

    def _unsqueeze(self, node):
        self.emit(node, {"op": "unsqueeze", "input": self.ref(node.args[0]), "dim": node.args[1]})

    def _cat(self, node):
        fields = {"op": "cat", "inputs": [self.ref(x) for x in node.args[0]], "dim": _arg(node, 1, 0)}
        self.emit(node, {**fields, **self._cat_size(node, fields["dim"])})

    def _cat_size(self, node, dim: int) -> dict:
        """``size:`` where parts of literal sizes join into a dim of the model (StableLM's per-head
        norm: H tensors of one head each, joined back into the H heads)."""
        parts = [self.namer.shape(x.meta["val"])[dim] for x in node.args[0]]
        joined = self.namer.shape(node.meta["val"])[dim]
        sources = {_split_of(x, dim) for x in node.args[0]}  # a dim taken apart one by one and joined back, not sizes that add up by chance
        units = all(p == 1 for p in parts) and len(sources) == 1 and None not in sources
        return {"size": joined} if units and len(parts) > 1 and isinstance(joined, str) and joined.isidentifier() else {}

    def _slice(self, node):
        fields = {"op": "index", "input": self.ref(node.args[0]), "dim": _arg(node, 1, 0)}
        start, stop, step = _arg(node, 2, None), _arg(node, 3, None), _arg(node, 4, 1)
        if isinstance(start, int) and start < 0:  # from the end: x[:, :, -3:] of past + 1 keys starts at past - 2
            axis = self.namer.axis(node.args[0].meta["val"], fields["dim"])
            start = plus(axis, start) if size_value(axis) + start > 0 else None
        if start not in (None, 0):
            fields["start"] = self.size(start)
        if isinstance(start, int) and isinstance(stop, int) and 0 < start < stop < 2**62:  # BART's positions[2:T + 2]
            length = self.namer.axis(node.meta["val"], fields["dim"])
            stop = stop if isinstance(length, int) else plus(length, start)
        if stop is not None and not (isinstance(stop, int) and stop >= 2**62):
            fields["stop"] = self.size(stop)
        if step != 1:
            fields["step"] = step
        self.emit(node, fields)

    def _select(self, node):
        self.emit(node, {"op": "index", "input": self.ref(node.args[0]), "dim": node.args[1], "index": node.args[2]})

    def _repeat_interleave(self, node):
        repeats, dim = node.args[1], _arg(node, 2, None, "dim")
        if dim is None:
            raise Unmapped("repeat_interleave without dim (it flattens the tensor first): tracer repeats along one dim")
        fields = {"op": "repeat_interleave", "input": self.ref(node.args[0]), "repeats": self.size(repeats, ("n_rep",)), "dim": dim}
        self.emit(node, fields)

    def _product(self, node):
        op = "matmul" if node.target == aten.matmul.default else "bmm"
        self.emit(node, {"op": op, "inputs": [self.ref(node.args[0]), self.ref(node.args[1])]})

    def _baddbmm(self, node):
        """``bias.baddbmm(q, k, beta=1, alpha=a)`` (Bloom's ALiBi scores): ``bmm``, ``scale`` by a, ``add`` the bias."""
        bias, left, right = node.args[:3]
        beta, alpha = node.kwargs.get("beta", 1), node.kwargs.get("alpha", 1)
        if beta != 1:
            raise Unmapped(f"{_label(node)} with beta={beta}: tracer adds the bias as it is (beta 1)")
        heads = self._alibi_heads(node)
        if heads is not None:
            return self._alibi_scores(node, heads)
        base = self.step_id(node, "scores")
        product = self.emit(node, {"op": "bmm", "inputs": [self.ref(left), self.ref(right)]}, step_id=self._unique(f"{base}_bmm"))
        if alpha != 1:
            fields = {"op": "scale", "input": product.fields["id"], "multiply": float(alpha)}
            self.emit(node, fields, step_id=self._unique(f"{base}_scaled"))
        self.emit(node, {"op": "add", "inputs": [self.names[node], self.ref(bias)]}, step_id=base)

    def _alibi_heads(self, node) -> int | None:
        """The head count of Bloom's ``alibi.baddbmm(q, k)``: the bias a constant (B·H, 1, T_kv) table of
        ``slope[h] · j`` (``build_alibi_tensor`` without padding), the scores read only by their view
        as (B, H, T_q, T_kv); None for another bias."""
        bias = node.args[0]
        (user,) = node.users if len(node.users) == 1 else (None,)
        if (
            bias not in self.graph.constant
            or bias in self.names
            or user is None
            or user.target not in (aten.view.default, aten.reshape.default)
        ):
            return None
        table, shape = self.graph.values[bias], tuple(self.graph.values[user].shape)
        if (
            len(shape) != 4
            or table.ndim != 3
            or table.shape[1] != 1
            or table.shape[0] != shape[0] * shape[1]
            or not table.is_floating_point()
        ):
            return None
        heads, keys = shape[1], shape[3]
        expected = (alibi_slopes(torch, heads)[:, None] * torch.arange(keys)).to(table.dtype)
        found = table.reshape(-1, heads, keys)
        return heads if torch.allclose(found.double(), expected.double().expand_as(found), rtol=1e-6, atol=0) else None

    def _alibi_scores(self, node, heads: int) -> None:
        """Bloom's ALiBi scores: ``bmm``, ``scale`` by alpha, the view as (B, H, T_q, T_kv) the module
        makes next, and ``alibi`` on it (the constant bias is the step's own slopes and key positions)."""
        left, right = node.args[1:3]
        (view,) = node.users
        base = self.step_id(node, "scores")
        self.emit(node, {"op": "bmm", "inputs": [self.ref(left), self.ref(right)]}, step_id=self._unique(f"{base}_bmm"))
        alpha = node.kwargs.get("alpha", 1)
        if alpha != 1:  # Bloom's inv_norm_factor, 1 / sqrt(head_dim)
            fields = self._scale_fields(node, "multiply", alpha, left.meta["val"].shape[-1])
            self.emit(node, fields, step_id=self._unique(f"{base}_scaled"))
        shape = self.namer.shape(view.meta["val"])
        self.emit(view, {"op": "view", "input": self.names[node], "shape": shape}, step_id=self._unique(f"{base}_heads"))
        self.emit(view, {"op": "alibi", "input": self.names[view]}, step_id=base)
        self.graph.consumed.add(view)

    def _softmax(self, node):
        self.emit(node, {"op": "softmax", "input": self.ref(node.args[0]), "dim": node.args[1]})

    def _layer_norm(self, node):
        fields = {"op": "layernorm", "input": self.ref(node.args[0])}
        for position, key in ((2, "weight"), (3, "bias")):
            if _arg(node, position, None) is not None:
                fields[key] = self.ref(node.args[position])
        eps = _arg(node, 4, 1e-5)
        if eps != 1e-5:
            fields["eps"] = eps
        self.emit(node, fields)

    def _gelu(self, node):
        fields = {"op": "gelu", "input": self.ref(node.args[0])}
        if node.kwargs.get("approximate", "none") != "none":
            fields["approximate"] = node.kwargs["approximate"]
        self.emit(node, fields)

    def _contiguous(self, node):
        self.emit(node, {"op": "contiguous", "input": self.ref(node.args[0])})

    def _sdpa(self, node):
        q, k, v = node.args[:3]
        fields = {"op": "sdpa", "inputs": [self.ref(q), self.ref(k), self.ref(v)]}
        fields.update(self._sdpa_options(node))
        self.emit(node, fields)

    def _sdpa_options(self, node) -> dict:
        options = {}
        mask, causal = _arg(node, 3, None, "attn_mask"), _arg(node, 5, False, "is_causal")
        if node in self.graph.kept:  # a padding mask anded with a causal or window pattern
            kept = self.graph.kept[node]
            options.update(mask=self.ref(kept["mask"]), **self._pattern({k: v for k, v in kept.items() if k != "mask"}))
        elif mask is not None and mask not in self.graph.constant:
            name = self.ref(mask)  # a mask that failed to map is reported once, where it failed
            # torch's attn_mask is bool (True attends) or float, added to the scores, as the step's is
            options["mask"] = name
            if mask.meta["val"].dtype == torch.bool:
                options["polarity"] = "keep"
        elif mask is not None and _hides_any(self.graph.values[mask]):
            value = self.graph.values[mask]
            pattern = hidden_pattern(~value) if value.dtype == torch.bool else (_additive_pattern(value) or (None,))[0]
            if pattern is None:
                raise Unmapped(
                    f"scaled_dot_product_attention with the mask '{mask.name}', which is not a causal, sliding-window or band mask"
                )
            options.update(self._pattern(pattern))
        if causal:  # is_causal: top-left aligned, as torch defines it
            options["causal"] = True
            q_len, k_len = node.args[0].meta["val"].shape[-2], node.args[1].meta["val"].shape[-2]
            if q_len != k_len:
                options["align"] = "top-left"
        scale = _arg(node, 6, None, "scale")
        if scale is not None and not math.isclose(scale, node.args[0].meta["val"].shape[-1] ** -0.5, rel_tol=1e-6):
            options["scale"] = scale
        if node.kwargs.get("enable_gqa"):
            options["gqa"] = True
        return options

    # -------------------------------------------------------------- idioms

    def _rmsnorm(self, idiom: Idiom):
        facts = idiom.facts
        fields = {"op": "rmsnorm", "input": self.ref(facts["x"])}
        fields.update({"weight": self.ref(facts["weight"])} if facts["weight"] is not None else {}, eps=facts["eps"])
        self.emit(idiom.node, {**fields, **({"unit_offset": True} if facts.get("unit_offset") else {})})

    def _softcap(self, idiom: Idiom):
        self.emit(idiom.node, {"op": "softcap", "input": self.ref(idiom.facts["x"]), "cap": idiom.facts["cap"]}, "capped")

    def _rope(self, idiom: Idiom):
        facts = idiom.facts
        found = self._rope_scaling(facts)
        if found is None:  # a table no rope step computes: its ops as they are, reading it as a computed constant
            for node in idiom.inner:
                self._by_rule(node)
            return
        theta, scaling = found
        offset = self._offset(facts["offset"]) if "offset" in facts else 0
        if offset is None:  # positions at an offset no input's size names: the table as a computed constant
            for node in idiom.inner:
                self._by_rule(node)
            return
        fields = {"op": "rope", "input": self.ref(facts["x"]), "theta": theta}
        if scaling is not None:
            fields["rope_scaling"] = scaling
        if offset != 0:
            fields["offset"] = offset
        if facts.get("style", "half") != "half":
            fields["style"] = facts["style"]
        if facts.get("seq_dim", -2) != -2:
            fields["seq_dim"] = facts["seq_dim"]
        self.emit(idiom.node, fields)

    def _offset(self, value: int) -> str | None:
        """The dim expression of the one input size (a KV cache's ``past``) that a rope's first position equals."""
        names = set()
        for node in self.graph.fx.nodes:
            example = self.graph.values.get(node) if node.op == "placeholder" and self.graph.kind(node) == "USER_INPUT" else None
            if isinstance(example, torch.Tensor):
                names.update(str(self.namer.axis(node.meta["val"], axis)) for axis, size in enumerate(example.shape) if size == value)
        named = {name for name in names if not name.isdigit()}
        return named.pop() if len(named) == 1 else None

    def _rope_scaling(self, facts: dict) -> tuple[float, dict | None] | None:
        """(theta, rope_scaling or None) of a rotary table: a scaling of the rope parameters of the
        config of the module that holds its ``inv_freq`` (transformers' rotary embedding), else of
        any config, that computes the table; else plain RoPE of the theta the idiom read; None
        for a table no ``rope`` step computes."""
        found = None
        if "table" in facts:
            owner = self.module.get_submodule(facts["owner"]) if facts["owner"] is not None else None
            configs = [getattr(m, "config", None) for m in (owner, self.module, *self.module.modules()) if m is not None]
            written = tuple(filter(None, map(exported_parameters, self._exported_lines(facts["cos"]))))
            found = scaling_of(facts["table"], list({id(c): c for c in configs if c is not None}.values()), written)
        if found is None and "theta" in facts:
            return facts["theta"], None
        return found

    def _exported_lines(self, node: torch.fx.Node) -> list[str]:
        """The lines of a module ``tracer export`` wrote that computed a constant: a rope's call of
        its frequencies function, which says its scaling, or a relative bias's call of
        ``t5_buckets``, which says its max_distance (the module has no config)."""
        lines, seen, todo = {}, set(), [node]
        while todo:
            current = todo.pop()
            if current in seen or current not in self.graph.constant:
                continue
            seen.add(current)
            lines.update((code, None) for file, _, _, code in frames(current) if exported_file(file))
            todo += current.all_input_nodes
        return list(lines)

    def _repeat_kv(self, idiom: Idiom):
        """GQA's ``repeat_kv(key_states, n_rep)``: named after the keys or values it repeats."""
        repeats, source = self.size(idiom.facts["repeats"], ("n_rep",)), self.ref(idiom.facts["x"])
        fields = {"op": "repeat_interleave", "input": source, "repeats": repeats, "dim": idiom.facts["dim"]}
        self.emit(idiom.node, fields, step_id=self._unique(f"{source}_repeated"))

    def _gelu_tanh(self, idiom: Idiom):
        self.emit(idiom.node, {"op": "gelu", "input": self.ref(idiom.facts["x"]), "approximate": "tanh"})

    def _merge(self, idiom: Idiom):
        self.emit(idiom.node, {"op": "merge", "input": self.ref(idiom.facts["x"])}, "merged")

    def _in_out_linear(self, idiom: Idiom):
        facts = idiom.facts
        fields = {"op": "linear", "input": self.ref(facts["x"]), "weight": self.ref(facts["weight"])}
        if "bias" in facts:
            fields["bias"] = self.ref(facts["bias"])
        self.emit(idiom.node, {**fields, **({"layout": "in_out"} if facts.get("in_out", True) else {})})

    def _mask(self, idiom: Idiom):
        facts = idiom.facts
        fields = {"op": "mask", "input": self.ref(facts["x"])}
        if "mask" in facts:
            fields.update(mask=self.ref(facts["mask"]), polarity=facts["polarity"])
        fields.update(self._pattern({key: facts[key] for key in ("causal", "window", "chunk", "align") if key in facts}))
        fields["fill"] = _fill(facts["fill"], facts["x"].meta["val"].dtype)
        self.emit(idiom.node, fields, "masked")

    def _relative_bias(self, idiom: Idiom):
        """T5's relative position bias added to scores."""
        fields = {"op": "relative_bias", "input": self.ref(idiom.facts["x"]), **self._t5_fields(idiom.facts)}
        self.emit(idiom.node, fields, "biased")

    def _position_bias(self, idiom: Idiom):
        """T5's relative position bias handed to an sdpa as its mask (transformers' sdpa path): a
        ``relative_position_bias`` step in the layer of the op that reads it (each layer computes
        it from the first one's table, as each eager layer adds it), then that op reading it."""
        facts, reader = idiom.facts, idiom.node
        fields = {"op": "relative_position_bias", **self._t5_fields(facts), **self._bias_lengths(facts["bias"], facts["sdpa"])}
        line = source_line(facts["bias"])
        tag = exported_step(line[0], line[2]) if line else None  # a `tracer export`ed module's own id; else one per layer
        step = self.emit(reader, fields, step_id=self._unique(_join(_module_path(reader), tag or "position_bias")))
        step.comment = _comment(self._line(facts["lookup"]))  # compute_bias's line, not the reader's
        self.names[facts["bias"]] = step.fields["id"]  # the bias as this layer reads it
        if facts["then"] is not None:
            return IDIOMS[facts["then"].kind](self, facts["then"])
        if not self._kept_bias(reader, facts["bias"]):
            self._by_rule(reader)

    def _bias_lengths(self, bias: torch.fx.Node, sdpa: torch.fx.Node) -> dict:
        """{queries, keys} of a (1, H, T_q, T_kv) bias, named as the sdpa that reads it names its
        queries' and keys' lengths (the bias is computed from constants: no input's size reaches it)."""
        lengths = {}
        for key, tensor, size in zip(("queries", "keys"), sdpa.args[:2], bias.meta["val"].shape[-2:]):
            named = self.namer.shape(tensor.meta["val"])[-2]
            lengths[key] = named if tensor.meta["val"].shape[-2] == size else self.size(size)
        return lengths

    def _kept_bias(self, reader: torch.fx.Node, bias: torch.fx.Node) -> bool:
        """``where(keep, bias, min)`` with a constant ``keep`` (transformers' mask of an unpadded
        batch): the bias itself where every key is kept, a ``mask`` step of its pattern (the
        decoder's causal one) where not; False for any other op."""
        if reader.target != aten.where.ScalarOther or reader.args[1] is not bias or reader.args[0] not in self.graph.constant:
            return False
        keep = self.graph.values[reader.args[0]].bool()
        if bool(keep.all()):
            self.names[reader] = self.names[bias]
            return True
        pattern = hidden_pattern(~keep) if keep.ndim >= 2 and keep.shape[-2:] == reader.meta["val"].shape[-2:] else None
        if pattern is None:
            return False
        fill = _fill(reader.args[2], reader.meta["val"].dtype)
        self.emit(reader, {"op": "mask", "input": self.names[bias], **self._pattern(pattern), "fill": fill}, "masked")
        copies = list(reader.users)
        if len(copies) == 1 and copies[0].target == aten.contiguous.default:
            # transformers' where spread the bias over the batch, strided, and copies it; the mask step writes a
            # new (1, H, T, T) tensor, contiguous, so that copy is the mask (the module `tracer export` writes has none)
            self.names[copies[0]] = self.names[reader]
            self.graph.consumed.add(copies[0])
        return True

    def _t5_fields(self, facts: dict) -> dict:
        """The table and the settings of T5's bias, read from the attention module that owns the
        table (``relative_attention_max_distance``, ``is_decoder``) and held against the buckets."""
        table = facts["table"]
        owner = self.module.get_submodule(self.graph.target(table).rpartition(".relative_attention_bias")[0] or "")
        written = next(filter(None, map(exported_t5_settings, self._exported_lines(facts["ids"]))), {})
        settings = _t5_settings(owner, facts["buckets"], int(table.meta["val"].shape[0]), written)
        if settings is None:
            raise Unmapped(
                f"it looks up '{table.name}' at constant ids that are not T5's relative position buckets, or that several "
                "max_distance give at this length (its attention module's relative_attention_max_distance settles it)"
            )
        return {"table": self.ref(table), **settings}

    def _mha(self, idiom: Idiom):
        from_template(self, idiom)


class _Downstream(Exception):
    """A node that reads one already reported."""


def from_template(t: Translator, idiom: Idiom) -> None:
    """``nn.MultiheadAttention`` (``need_weights=False``; a key padding mask and an attention mask
    as the module is given them) as the steps it stands for."""
    path, node = idiom.facts["path"], idiom.node
    mha = t.module.get_submodule(path)
    sdpa = [n for n in t.graph.calls() if n in t.graph.consumed | {node} and n.target == aten.scaled_dot_product_attention.default]
    sdpa = [n for n in sdpa if any(p == path for p, _ in module_stack(n))]
    if len(sdpa) != 1 or len(idiom.facts["leaving"]) != 1:
        raise Unmapped(f"nn.MultiheadAttention '{path or 'the module'}' with need_weights=True (average weights): not supported")
    if mha.bias_k is not None or mha.add_zero_attn or not mha._qkv_same_embed_dim:
        raise Unmapped(f"nn.MultiheadAttention '{path or 'the module'}' with add_bias_kv, add_zero_attn or kdim/vdim: not supported")
    masks = _MhaMasks(t, idiom, sdpa[0])
    sources = _mha_sources(t, idiom, masks.given)
    projected = _mha_projections(t, node, path, sources)
    batch, tokens, width = t.namer.shape(sources[0].meta["val"])
    if not mha.batch_first:  # (T, B, E)
        batch, tokens = tokens, batch
    heads, head_width = t.size(mha.num_heads, ("H",)), t.size(mha.head_dim, ("Dh",))
    split = {"op": "transpose", "dims": [1, 2]} if mha.batch_first else {"op": "permute", "dims": [1, 2, 0, 3]}
    heads_of = []
    for name, source in zip(projected, sources, strict=True):
        order = t.namer.shape(source.meta["val"])[:2]  # (batch, tokens) or (tokens, batch), as this source has them
        t.emit(node, {"op": "view", "input": name, "shape": [*order, heads, head_width]}, step_id=t._unique(f"{name}_heads"))
        heads_of.append(t.emit(node, {**split, "input": t.names[node]}, step_id=t._unique(f"{name}_h")).fields["id"])
    if masks.given or masks.fixed is not None:
        options = masks.steps(sources[0].meta["val"].shape[0 if mha.batch_first else 1], heads)
    else:
        options = t._sdpa_options(sdpa[0])
    t.emit(node, {"op": "sdpa", "inputs": heads_of, **options}, step_id=t._unique(_join(path, "context")))
    if mha.batch_first:
        t.emit(node, {"op": "merge", "input": t.names[node]}, step_id=t._unique(_join(path, "merged")))
    else:
        t.emit(node, {"op": "permute", "input": t.names[node], "dims": [2, 0, 1, 3]}, step_id=t._unique(_join(path, "context_t")))
        t.emit(node, {"op": "reshape", "input": t.names[node], "shape": [tokens, batch, width]}, step_id=t._unique(_join(path, "merged")))
    out = {"op": "linear", "input": t.names[node], "weight": _join(path, "out_proj.weight"), "bias": _join(path, "out_proj.bias")}
    t.emit(node, out, step_id=t._unique(path or "attn_output"))


MHA_MASK_WALK = {
    aten.add.Tensor,
    aten.view.default,
    aten.reshape.default,
    aten.expand.default,
    aten.unsqueeze.default,
    aten.masked_fill_.Scalar,
    aten.masked_fill.Scalar,
    aten.zeros_like.default,
    *CASTS,
}


class _MhaMasks:
    """The masks an ``nn.MultiheadAttention`` merges into its SDPA's ``attn_mask``: the
    ``key_padding_mask`` (B, S) and the ``attn_mask`` (T, S) or (B·H, T, S) it is given (bool, True
    hides, or float, added), and a constant mask made before it (``generate_square_subsequent_mask``
    in the model's forward), read as its pattern."""

    def __init__(self, t: Translator, idiom: Idiom, sdpa: torch.fx.Node):
        self.t, self.path, self.node = t, idiom.facts["path"], idiom.node
        self.padding = self.attn = self.fixed = None
        mask = _arg(sdpa, 3, None, "attn_mask")
        leaves = _mask_leaves(t.graph, mask, set(t.graph.consumed) | {idiom.node}) if mask is not None else []
        for leaf in leaves:
            if leaf in t.graph.constant and leaf not in t.names:
                self.fixed = leaf
            elif leaf.meta["val"].ndim == 2 and _viewed_per_batch(leaf):
                self.padding = leaf
            else:
                self.attn = leaf
        self.given = [m for m in (self.padding, self.attn) if m is not None]

    def steps(self, batch_size: int, heads) -> dict:
        """The sdpa fields that apply them, after the steps that bring them to (B, H or 1, T, S)."""
        t, fields = self.t, {}
        if self.fixed is not None:
            value = t.graph.values[self.fixed]
            pattern = hidden_pattern(~value) if value.dtype == torch.bool else (_additive_pattern(value) or (None,))[0]
            if pattern is None and _hides_any(value):
                raise Unmapped(f"nn.MultiheadAttention '{self.path or 'the module'}' with a constant mask of no causal or window pattern")
            fields.update(t._pattern(pattern or {}))
        terms = [self._shaped(m, batch_size, heads) for m in self.given]
        if not terms:
            return fields
        if all(m.meta["val"].dtype == torch.bool for m in self.given):
            if len(terms) == 2:
                terms = [
                    t.emit(self.node, {"op": "logical", "fn": "or", "inputs": terms}, step_id=t._unique(_join(self.path, "hidden"))).fields[
                        "id"
                    ]
                ]
            return {**fields, "mask": terms[0], "polarity": "block"}
        added = [self._additive(name, m) for name, m in zip(terms, self.given, strict=True)]
        if len(added) == 2:
            added = [t.emit(self.node, {"op": "add", "inputs": added}, step_id=t._unique(_join(self.path, "attn_bias"))).fields["id"]]
        return {**fields, "mask": added[0]}

    def _shaped(self, mask: torch.fx.Node, batch_size: int, heads) -> str:
        """The padding mask as (B, 1, 1, S) and a per-head mask as (B, H, T, S); a (T, S) one broadcasts as it is."""
        t, value = self.t, mask.meta["val"]
        if mask is self.padding:
            shape, name = [t.namer.shape(value)[0], 1, 1, t.namer.shape(value)[1]], "key_padding"
        elif value.ndim == 3:
            _, queries, keys = t.namer.shape(value)
            shape, name = [t.size(batch_size, ("B",)), heads, queries, keys], "attn_mask_heads"
        else:
            return t.ref(mask)
        return t.emit(self.node, {"op": "view", "input": t.ref(mask), "shape": shape}, step_id=t._unique(_join(self.path, name))).fields[
            "id"
        ]

    def _additive(self, name: str, mask: torch.fx.Node) -> str:
        """A bool mask as the float one MultiheadAttention makes of it (-inf where True) when the other is a float one."""
        if mask.meta["val"].dtype != torch.bool:
            return name
        fields = {"op": "where", "inputs": [name], "then": -math.inf, "otherwise": 0.0}
        return self.t.emit(self.node, fields, step_id=self.t._unique(f"{name}_additive")).fields["id"]


def _mask_leaves(graph: Graph, mask: torch.fx.Node, inside: set) -> list[torch.fx.Node]:
    """What an MHA's merged mask is made of: the tensors it reads from outside the module's nodes,
    and the largest constant parts (a mask the model built), each once."""
    leaves, todo, seen = [], [mask], set()
    while todo:
        node = todo.pop()
        if node in seen:
            continue
        seen.add(node)
        if node in graph.constant or node not in inside or node.target not in MHA_MASK_WALK:
            leaves.append(node)
            continue
        todo += [a for a in node.all_input_nodes if isinstance(a.meta.get("val"), torch.Tensor)]  # not the sizes a view reads
    return sorted(leaves, key=lambda n: list(graph.fx.nodes).index(n))


def _viewed_per_batch(mask: torch.fx.Node) -> bool:
    """A key padding mask (B, S): MultiheadAttention views it (B, 1, 1, S); a (T, S) attention mask is unsqueezed."""
    todo = [mask]
    while todo:
        node = todo.pop()
        for user in node.users:
            if user.target in (aten.view.default, aten.reshape.default):
                shape = user.meta["val"].shape
                return len(shape) == 4 and shape[1] == shape[2] == 1
            if user.target in (aten.zeros_like.default, aten.masked_fill_.Scalar, aten.masked_fill.Scalar, *CASTS):
                todo.append(user)  # made float (-inf where True) first; its sizes read elsewhere are not the mask
    return False


def _mha_sources(t: Translator, idiom: Idiom, masks: list[torch.fx.Node]) -> list[torch.fx.Node]:
    """query, key and value: the module's own inputs, or what a self- or cross-attention in a model reads."""
    if not idiom.facts["path"]:
        by_name = {n.name: n for n in t.graph.fx.nodes if n.op == "placeholder"}
        return [by_name[name] for name in ("query", "key", "value")]
    sources = [s for s in idiom.facts["sources"] if s not in masks]
    if len(sources) > 2:
        raise Unmapped(
            f"nn.MultiheadAttention '{idiom.facts['path']}' reads {len(sources)} tensors: self-attention (one) "
            "and cross-attention with key = value (two, the query first) are supported"
        )
    return [sources[0], sources[-1], sources[-1]]  # it reads the query first, then the key that is also the value


def _mha_projections(t: Translator, node, path: str, sources: list) -> list[str]:
    weight, bias = _join(path, "in_proj_weight"), _join(path, "in_proj_bias")
    names = [_join(path, n) for n in ("q", "k", "v")]
    if sources[0] is sources[1] is sources[2]:
        t.emit(
            node, {"op": "linear", "input": t.ref(sources[0]), "weight": weight, "bias": bias}, step_id=t._unique(_join(path, "in_proj"))
        )
        names = [t._unique(n) for n in names]
        t.emit(
            node, {"op": "split", "input": t.names[node], "dim": -1, "chunks": 3, "outputs": names}, step_id=t._unique(_join(path, "qkv"))
        )
        return names
    parts = {}
    for param, short in ((weight, "W"), (bias, "b")):
        parts[short] = [t._unique(_join(path, f"{short}_{n}")) for n in ("q", "k", "v")]
        t.emit(node, {"op": "split", "input": param, "dim": 0, "chunks": 3, "outputs": parts[short]}, step_id=t._unique(f"{param}_split"))
    for i, source in enumerate(sources):
        fields = {"op": "linear", "input": t.ref(source), "weight": parts["W"][i], "bias": parts["b"][i]}
        names[i] = t.emit(node, fields, step_id=t._unique(names[i])).fields["id"]
    return names


RULES = {
    **dict.fromkeys(UNARY, Translator._unary),
    **dict.fromkeys(BINARY, Translator._binary),
    **dict.fromkeys(SPLITS, Translator._split),
    **dict.fromkeys((aten.view.default, aten.reshape.default, aten.expand.default), Translator._shaped),
    **dict.fromkeys((aten.matmul.default, aten.bmm.default), Translator._product),
    **dict.fromkeys(LOGICAL, Translator._logical),
    **dict.fromkeys(COMPARES, Translator._compare),
    **dict.fromkeys(REDUCTIONS, Translator._reduce),
    **dict.fromkeys(WHERES, Translator._where),
    **dict.fromkeys(CASTS, Translator._cast),
    aten.pow.Tensor_Scalar: Translator._pow,
    aten.rsub.Scalar: Translator._rsub,
    aten.baddbmm.default: Translator._baddbmm,
    aten.unbind.int: Translator._unbind,
    aten.topk.default: Translator._topk,
    EXPERTS: Translator._experts,
    aten.flatten.using_ints: Translator._flatten,
    aten.cumsum.default: Translator._cumsum,
    aten.roll.default: Translator._roll,
    aten.diff.default: Translator._diff,
    aten.einsum.default: Translator._einsum,
    aten.conv1d.default: Translator._conv,
    aten.conv2d.default: Translator._conv,
    aten.repeat.default: Translator._repeat,
    aten.index.Tensor: Translator._index,
    aten.argmax.default: Translator._argmax,
    aten.argmin.default: Translator._argmax,
    aten.stack.default: Translator._stack,
    **dict.fromkeys(MASKED_FILLS, Translator._masked_fill),
    aten.zeros_like.default: Translator._zeros_like,
    aten.linear.default: Translator._linear,
    aten.embedding.default: Translator._embedding,
    aten.transpose.int: Translator._transpose,
    aten.permute.default: Translator._permute,
    aten.unsqueeze.default: Translator._unsqueeze,
    aten.cat.default: Translator._cat,
    aten.slice.Tensor: Translator._slice,
    aten.select.int: Translator._select,
    aten.softmax.int: Translator._softmax,
    aten.repeat_interleave.self_int: Translator._repeat_interleave,
    aten.layer_norm.default: Translator._layer_norm,
    aten.gelu.default: Translator._gelu,
    aten.contiguous.default: Translator._contiguous,
    aten.scaled_dot_product_attention.default: Translator._sdpa,
}
IDIOMS = {
    "rmsnorm": Translator._rmsnorm,
    "rope": Translator._rope,
    "repeat_kv": Translator._repeat_kv,
    "gelu_tanh": Translator._gelu_tanh,
    "merge": Translator._merge,
    "in_out_linear": Translator._in_out_linear,
    "mask": Translator._mask,
    "softcap": Translator._softcap,
    "mha": Translator._mha,
    "relative_bias": Translator._relative_bias,
    "position_bias": Translator._position_bias,
}


# -------------------------------------------------------------- helpers


def _number(value) -> int | float:
    """A Python number of the graph as YAML writes it: an int stays an int (its dtype promotion is an int's)."""
    return int(value) if isinstance(value, int | bool) and not isinstance(value, float) else float(value)


def _reads(names: list[str]) -> dict:
    return {"input": names[0]} if len(names) == 1 else {"inputs": names}


def _fill(fill: float, dtype: torch.dtype) -> float | str:
    """``min`` for the dtype's most negative number (``torch.finfo(scores.dtype).min``), else the number."""
    return "min" if dtype.is_floating_point and float(fill) == torch.finfo(dtype).min else float(fill)


def _sdpa_bias_reason(lookup: torch.fx.Node) -> str | None:
    """Why a lookup at constant ids that ``scaled_dot_product_attention`` reads as its float
    ``attn_mask`` is not mapped: a position bias whose lookup is not T5's (``relative_position_bias``
    computes ``table[buckets].permute(2, 0, 1).unsqueeze(0)``). None if no sdpa reads it as its mask."""
    sdpa = sdpa_reading_as_mask(lookup)
    if sdpa is None:
        return None
    return (
        f"its lookup of '{lookup.args[0].name}' is the float attn_mask of '{sdpa.name}': a position bias handed to "
        "scaled_dot_product_attention as its mask, not laid out as T5's (relative_position_bias computes "
        "table[buckets].permute(2, 0, 1).unsqueeze(0) at T5's buckets, the form transformers' sdpa path hands on)"
    )


def _arg(node: torch.fx.Node, position: int, default, keyword: str | None = None):
    if len(node.args) > position:
        return node.args[position]
    return node.kwargs.get(keyword, default) if keyword else default


def _label(node: torch.fx.Node) -> str:
    return str(node.target).replace("aten.", "torch.ops.aten.") if isinstance(node.target, torch._ops.OpOverload) else str(node.target)


def _calling_the_experts(node: torch.fx.Node) -> tuple[str, int, str] | None:
    """The line that called an experts module captured whole: the last frame is leaves.py's call of the operator."""
    callers = frames(node)[:-1]
    return (callers[-1][0], callers[-1][1], callers[-1][3]) if callers else None


def _join(path: str, name: str) -> str:
    return f"{path}.{name}" if path else name


def _cache_place(note: str) -> tuple[str, int, str]:
    """``past_key_values.layers[10].keys`` as (cache, 10, keys): layer 2 before layer 10."""
    cache, layer, attribute = re.fullmatch(r"(.+)\.layers\[(\d+)\]\.(\w+)", note).groups()
    return cache, int(layer), attribute


def _module_path(node) -> str:
    stack = module_stack(node) if isinstance(node, torch.fx.Node) else []
    return stack[-1][0] if stack else ""


def _same_statement(a: torch.fx.Node, b: torch.fx.Node) -> bool:
    """One source line run by one module: layer 1's run of a line is not layer 0's, so both name alike."""
    return source_line(a) == source_line(b) and _module_path(a) == _module_path(b)


def _comment(line: tuple[str, int, str] | None) -> str | None:
    """``file:line: code``; none for a line of a module `tracer export` wrote: that line is the step
    itself, tagged with its id, so export then import writes the file it started from."""
    if line is None or exported_step(line[0], line[2]):
        return None
    return f"{_file_name(line[0])}:{line[1]}: {line[2]}"


@functools.lru_cache(maxsize=1024)
def _file_name(file: str) -> str:
    return Path(file).name


def _exported_outputs(file: str, code: str) -> list[str]:
    """The names a line assigns; in a module `tracer export` wrote, a split's outputs as the file
    named them: export writes ``h.0.q`` as the variable ``h_0_q``, under the step ``h.0.qkv_split``."""
    names, tag = _assigned(code), exported_step(file, code)
    prefix = tag.rpartition(".")[0] + "." if tag and "." in tag else ""
    written = re.sub(r"\W", "_", prefix)
    return [prefix + name.removeprefix(written) if prefix and name.startswith(written) else name for name in names]


def _assigned(code: str) -> list[str]:
    found = ASSIGNED.match(code)
    return [name.strip().removeprefix("self.") for name in found.group(1).split(",")] if found else []


def _layer(node: torch.fx.Node) -> tuple[str, int] | None:
    """(container, index) of the outermost module with a numeric path part: ('layers', 3), ('model.layers', 0)."""
    for path, _ in module_stack(node):
        parts = path.split(".")
        for i, part in enumerate(parts):
            if part.isdigit():
                return ".".join(parts[:i]), int(part)
    return None


def _split_of(node: torch.fx.Node, dim: int) -> torch.fx.Node | None:
    """The split along ``dim`` whose piece ``node`` is computed from, through ops of one data input
    (a LayerNorm of the piece); None if none."""
    for _ in range(8):
        if node.op != "call_function" or not node.args or not isinstance(node.args[0], torch.fx.Node):
            return None
        if node.target == operator.getitem:
            split = node.args[0]
            along = _arg(split, 2, 0, "dim") if split.op == "call_function" and split.target in SPLITS else None
            rank = node.meta["val"].ndim
            return split if along is not None and along % rank == dim % rank else None
        node = node.args[0]
    return None


def _merged_names(before: list, after: list, sizes_before, sizes_after) -> list:
    """A view's shape with each dim that merges neighbouring dims of its input, and that has no name
    of its own (``4 * B``: no config names B·H), written as their product (``B * H``), as Bloom's
    ``reshape(batch_size * num_heads, …)`` says it: the view keeps the dims in order."""
    written, i = list(after), 0
    for j, size in enumerate(sizes_after):
        if size == 1 and (i == len(sizes_before) or sizes_before[i] != 1):  # an axis the view adds: Bloom's (B·H, 1, T) alibi
            continue
        run, product = [], 1
        while i < len(sizes_before) and (not run or product < size):
            run.append(before[i])
            product *= sizes_before[i]
            i += 1
        if product != size:
            return after
        plain = isinstance(after[j], str) and after[j].isidentifier()
        if len(run) > 1 and not plain and all(isinstance(n, str) and n.isidentifier() for n in run):
            written[j] = " * ".join(run)
    return written if i == len(sizes_before) else after


def _head_width(x: torch.fx.Node) -> int:
    """Dh of scores ``q @ k^T`` (through masks and other scales: a scale may come after the mask):
    the last dim of q, else the last dim of x."""
    source = x
    while source.op == "call_function" and source.target in (aten.masked_fill.Scalar, aten.add.Tensor, aten.mul.Tensor, aten.div.Tensor):
        source = source.args[0]
    if source.op == "call_function" and source.target in (aten.matmul.default, aten.bmm.default):
        return source.args[0].meta["val"].shape[-1]
    return x.meta["val"].shape[-1]


def _neutral(value: torch.Tensor, fn: str) -> bool:
    """True everywhere for ``and``, False everywhere for ``or``: the other operand comes through."""
    return bool(value.all()) if fn == "and" else fn == "or" and not bool(value.any())


def _consecutive_positions(graph: Graph, indices: list, shape) -> tuple[int, int, int] | None:
    """(dim, first, count) of ``x[..., [i, i+1, …], ...]``: one constant list of consecutive positions
    along one dim (all from the start, or all from the end: ``[-2, -1]``), every other index ``:``;
    None for any other indexing."""
    given = [(dim, i) for dim, i in enumerate(indices) if i is not None]
    if len(given) != 1 or given[0][1] not in graph.constant:
        return None
    dim, node = given[0]
    positions = graph.values[node]
    if positions.dtype.is_floating_point or positions.dtype == torch.bool or positions.ndim != 1 or not positions.numel():
        return None
    positions = positions.tolist()
    if positions != list(range(positions[0], positions[0] + len(positions))) or (positions[0] < 0 <= positions[-1]):
        return None
    if positions[0] < 0 and positions[0] < -int(shape[dim]) or positions[-1] >= int(shape[dim]):
        return None
    return dim, positions[0], len(positions)


def _range_axis(index: torch.Tensor, size: int) -> int | None:
    """The one axis along which ``index`` is ``0 .. size-1`` (size 1 on every other axis); None if it is not."""
    if index.dtype.is_floating_point or index.numel() != size:
        return None
    axes = [axis for axis, n in enumerate(index.shape) if n != 1] or [index.ndim - 1]
    if len(axes) != 1 or not torch.equal(index.reshape(-1), torch.arange(size)):
        return None
    return axes[0]


def exported_t5_settings(code: str) -> dict | None:
    """{max_distance, bidirectional} a line of a module ``tracer export`` wrote passes to
    ``t5_buckets(torch, t_q, t_k, num_buckets, max_distance, bidirectional, device)``; literals
    only, read with ``ast`` (the buckets are then computed from them and compared); None for any other line."""
    call = assigned_call(code)
    if call is None or call.func.id != t5_buckets.__name__ or len(call.args) < 6:
        return None
    max_distance, bidirectional = (literal(argument) for argument in call.args[4:6])
    if not isinstance(max_distance, int) or isinstance(max_distance, bool) or not isinstance(bidirectional, bool):
        return None
    return {"max_distance": max_distance, "bidirectional": bidirectional}


def exported_alibi_slopes(code: str) -> dict | None:
    """{} for a line of a module ``tracer export`` wrote that calls ``alibi_slopes(torch, H)``,
    {bias_max} for ``mpt_alibi_slopes(torch, H, bias_max)`` (a literal, read with ``ast``); None for any other."""
    try:
        tree = ast.parse(code.strip())
    except (SyntaxError, ValueError):
        return None
    for call in ast.walk(tree):
        name = call.func.id if isinstance(call, ast.Call) and isinstance(call.func, ast.Name) else None
        if name == alibi_slopes.__name__ and len(call.args) == 2:
            return {}
        if name == mpt_alibi_slopes.__name__ and len(call.args) == 3 and isinstance(bias_max := literal(call.args[2]), float):
            return {"bias_max": bias_max}
    return None


MAX_DISTANCE_SEARCHED = 1025  # T5 uses 128; buckets that no max_distance below this gives are no T5 buckets


def _t5_settings(owner: torch.nn.Module, buckets: torch.Tensor, num_buckets: int, written: dict) -> dict | None:
    """{bidirectional, max_distance} under which T5 computes these (T_q, T_kv) buckets: the owner's
    own settings (T5Attention's ``is_decoder`` and ``relative_attention_max_distance``), or those
    ``written`` in the ``t5_buckets`` call of a module `tracer export` wrote (it keeps no
    settings), else the one max_distance that gives them; None when none does, or several do at
    this length (no guess)."""
    if buckets.ndim != 2 or buckets.dtype.is_floating_point:
        return None
    own = getattr(owner, "relative_attention_max_distance", written.get("max_distance"))
    decoder = getattr(owner, "is_decoder", None if "bidirectional" not in written else not written["bidirectional"])
    found = []
    for bidirectional in (not decoder,) if isinstance(decoder, bool) else (True, False):
        exact = num_buckets // (4 if bidirectional else 2)
        for max_distance in (own,) if isinstance(own, int) else range(exact + 1, MAX_DISTANCE_SEARCHED):
            expected = t5_buckets(torch, *buckets.shape, num_buckets, max_distance, bidirectional)
            if torch.equal(expected, buckets.to(torch.long)):
                found.append({"bidirectional": bidirectional, "max_distance": max_distance})
    return found[0] if len(found) == 1 else None


def _copies_along_last(node: torch.fx.Node, part: torch.fx.Node) -> int:
    """How many copies of ``part`` a ``cat`` along the last axis joins (1 for any other op)."""
    if node.target != aten.cat.default or _arg(node, 1, 0, "dim") not in (-1, node.meta["val"].ndim - 1):
        return 1
    parts = node.args[0]
    return len(parts) if all(p is part for p in parts) else 1


def _router_weight(graph: Graph, chosen: torch.fx.Node) -> torch.fx.Node | None:
    """The weight of the linear whose logits chose the experts: ``topk(softmax(linear(x, W).float()))``."""
    node = chosen.args[0] if chosen.target == operator.getitem else None  # the topk
    for _ in range(4):
        if not isinstance(node, torch.fx.Node) or node.op != "call_function" or not node.args:
            return None
        if node.target == aten.linear.default and len(node.args) > 1 and graph.kind(node.args[1]) == "PARAMETER":
            return node.args[1]
        node = node.args[0]
    return None


def _normalized(values: torch.fx.Node, dim: int) -> tuple[torch.fx.Node, torch.fx.Node] | None:
    """(sum, in-place division) of ``values /= values.sum(dim, keepdim=True)``, the only readers of ``values``."""
    total = next((u for u in values.users if u.target == aten.sum.dim_IntList), None)
    divided = next((u for u in values.users if u.target in (aten.div_.Tensor, aten.div.Tensor)), None)
    if total is None or divided is None or len(values.users) != 2:
        return None
    if (
        list(total.args[1]) != [dim]
        or not _arg(total, 2, False, "keepdim")
        or divided.args != (values, total)
        or list(total.users) != [divided]
    ):
        return None
    return total, divided


def _fresh_zeros(node) -> bool:
    return isinstance(node, torch.fx.Node) and node.target == aten.zeros_like.default and isinstance(node.args[0], torch.fx.Node)


def _picks_a_row_per_batch(graph: Graph, indices: list, shape) -> bool:
    """``x[arange(B), positions]``: a constant 0 .. B-1 for the first dim, a computed (B,) integer
    tensor for the second, the other dims whole."""
    if len(indices) != 2 or len(shape) < 2 or indices[0] not in graph.constant or indices[1] in graph.constant:
        return False
    rows, positions = graph.values[indices[0]], indices[1].meta["val"]
    given = positions.ndim == 1 and not positions.dtype.is_floating_point and positions.dtype != torch.bool
    return given and rows.ndim == 1 and _range_axis(rows, int(shape[0])) == 0 and int(positions.shape[0]) == int(shape[0])


def _hides_any(value: torch.Tensor) -> bool:
    """Whether a constant attention mask hides a key: a bool one (True = attend) False somewhere, a float one not 0."""
    return bool((~value).any()) if value.dtype == torch.bool else bool(value.any())


def _additive_pattern(value: torch.Tensor) -> tuple[dict, float] | None:
    """(pattern, fill) of a float mask that is 0 where a key is kept and one value where it is hidden."""
    hidden = value != 0
    if value.dtype == torch.bool or value.ndim < 2 or not bool(hidden.any()):
        return None
    pattern, blocked = hidden_pattern(hidden), value[hidden]
    return (pattern, float(blocked[0])) if pattern is not None and bool((blocked == blocked[0]).all()) else None


def _outputs(graph: Graph) -> list[torch.fx.Node]:
    (output,) = [n for n in graph.fx.nodes if n.op == "output"]
    flat = torch.utils._pytree.tree_leaves(output.args[0])
    return [n for n in flat if isinstance(n, torch.fx.Node)]


def _op_name(node: torch.fx.Node) -> str:
    """``cos`` for ``aten.cos.default``: a name for what an op made."""
    return getattr(node.target, "__name__", "constant").partition(".")[0] or "constant"


def _reads_tensors(args) -> bool:
    return any(isinstance(a, torch.fx.Node) and isinstance(a.meta.get("val"), torch.Tensor) for a in args)


def _provenance(node: torch.fx.Node, line: tuple[str, int, str] | None, root: str) -> str:
    """``module path (file:line: code), op``: where a computed constant came from."""
    where = _module_path(node) or root
    return f"{where} ({Path(line[0]).name}:{line[1]}: {line[2]}), {_label(node)}" if line else f"{where}, {_label(node)}"


def plain_note(text: str) -> str:
    """A declaration's ``note`` (at most 500 characters), one printable line."""
    return "".join(ch if ch.isprintable() else " " for ch in text)[:500]


def _problem(node: torch.fx.Node, message: str, line: tuple[str, int, str] | None) -> Diagnostic:
    if line is None:
        return Diagnostic("<module>", None, "import-unmapped", f"'{node.name}': {message}")
    return Diagnostic(line[0], Position(line[1], 1), "import-unmapped", f"'{node.name}' ({line[2]}): {message}")
