"""The captured graph as tracer steps: one rule per ATen op or idiom, names a person would write.

A step's id is the module path of the leaf module that made it (``c_attn``,
``layers.0.self_attn.q_proj``), or else the variable the source line assigns (``att``,
``query_states``), under the path of the module whose code it is. Its comment is that line. An op
with no rule is reported with the line it came from; nothing is dropped.
"""

from __future__ import annotations

import math
import operator
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from .core.errors import Diagnostic, Position, TracerError
from .import_dims import Namer
from .import_graph import Graph, Idiom, aten, module_stack

FRAME = re.compile(r'File "([^"]+)", line (\d+), in (\S+)\n\s+(.*)')
ASSIGNED = re.compile(r"^\s*([A-Za-z_][\w.]*(?:\s*,\s*[A-Za-z_][\w.]*)*)\s*(?::[^=]+)?=(?!=)")
UNARY = {
    aten.silu.default: "silu",
    aten.relu.default: "relu",
    aten.tanh.default: "tanh",
    aten.neg.default: "neg",
    aten.exp.default: "exp",
    aten.sigmoid.default: "sigmoid",
}
BINARY = {aten.add.Tensor: "add", aten.mul.Tensor: "mul", aten.sub.Tensor: "sub", aten.div.Tensor: "div"}
ADVANCED_INDEXING = (
    "; advanced indexing (a list or tensor of positions) has no step: where the positions are a range, "
    "slice instead (x[:, -1:] for x[:, [-1]]), which imports as op: index with start/stop"
)
UNMAPPED_HINTS = {aten.index.Tensor: ADVANCED_INDEXING, aten.index_select.default: ADVANCED_INDEXING}
SPLITS = (aten.split.Tensor, aten.split_with_sizes.default, aten.chunk.default)


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


def frames(node: torch.fx.Node) -> list[tuple[str, int, str, str]]:
    """(file, line, function, code) of the node's stack trace outside torch, outermost first."""
    found = FRAME.findall(node.meta.get("stack_trace") or "")
    first = next((i for i, (_, _, function, _) in enumerate(found) if function == "forward"), len(found))  # the root module's forward
    return [(f, int(line), fn, code.strip()) for f, line, fn, code in found[first:] if not _internal(f)]


def _internal(file: str) -> bool:
    """A frame of torch's machinery, not of a module's code (torch.nn's modules are modules' code)."""
    file = file.replace("\\", "/")
    return "/torch/" in file and "/torch/nn/modules/" not in file


def source_line(node: torch.fx.Node) -> tuple[str, int, str] | None:
    found = frames(node)
    return (found[-1][0], found[-1][1], found[-1][3]) if found else None


class Translator:
    """Walks the graph in order and writes a step for each node that computes something."""

    def __init__(self, graph: Graph, module: torch.nn.Module, namer: Namer):
        self.graph, self.module, self.namer = graph, module, namer
        self.names: dict[torch.fx.Node, str] = {}
        self.failed: set[torch.fx.Node] = set()
        self.steps: list[Step] = []
        self.inputs: dict[str, dict] = {}
        self.params: dict[str, dict] = {}
        self.outputs: list[str] = []
        self.taken: set[str] = set()

    def translate(self) -> None:
        self.graph.find_idioms()
        self._declare()
        problems = []
        for node in self.graph.calls():
            if node in self.graph.consumed or (node in self.graph.constant and node not in self.graph.idioms):
                continue
            try:
                self._translate(node)
            except Unmapped as exc:
                self.failed.add(node)
                problems.append(_problem(node, str(exc)))
            except _Downstream:
                self.failed.add(node)
        if problems:
            raise TracerError(problems)
        self.outputs = [self.ref(n) for n in _outputs(self.graph)]

    def _declare(self) -> None:
        state = self.module.state_dict(keep_vars=True)
        for node in self.graph.fx.nodes:
            kind, value = self.graph.kind(node), node.meta.get("val")
            if node.op != "placeholder" or not isinstance(value, torch.Tensor):
                continue
            if kind == "USER_INPUT":
                self.inputs[node.name] = self._declaration(value)
                self.names[node] = node.name
                self.taken.add(node.name)
            elif kind in ("PARAMETER", "BUFFER") and self.graph.target(node) in state:
                self.params[self.graph.target(node)] = self._declaration(value)
                self.names[node] = self.graph.target(node)
                self.taken.add(self.graph.target(node))

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
        if node in self.graph.constant:
            raise Unmapped(
                f"it reads '{node.name}', a tensor the module computes from constants ({_label(node)}), which tracer has no step for"
            )
        raise _Downstream

    def size(self, value, prefer: tuple[str, ...] = ()) -> int | str:
        if isinstance(value, torch.fx.Node):
            value = value.meta["val"]
        return self.namer.size(value, prefer)

    def step_id(self, node: torch.fx.Node, op: str) -> str:
        leaf = self._leaf_module(node)
        return self._unique(leaf if leaf is not None else _join(_module_path(node), self._variable(node, op) or op))

    def _leaf_module(self, node: torch.fx.Node) -> str | None:
        """The path of a childless module whose output this node is (a Linear, an Embedding, a norm)."""
        stack = module_stack(node)
        path = stack[-1][0] if stack else ""
        if not path or any(_module_path(user) == path for user in node.users):
            return None
        try:
            module = self.module.get_submodule(path)
        except AttributeError:
            return None
        return path if not list(module.children()) else None

    def _variable(self, node: torch.fx.Node, op: str) -> str | None:
        """The name the source line assigns; ``NAME_op`` for a node another node of the line reads."""
        line = source_line(node)
        names = _assigned(line[2]) if line else []
        if not names:
            return None
        same_line = [user for user in node.users if source_line(user) == line]
        if same_line:
            return f"{names[0]}_{op}"
        return names[min(self._position_on_line(node, line), len(names) - 1)] if len(names) > 1 else names[0]

    def _position_on_line(self, node, line) -> int:
        last = [n for n in self.graph.calls() if source_line(n) == line and not any(source_line(u) == line for u in n.users)]
        return last.index(node) if node in last else 0

    def _unique(self, base: str) -> str:
        base = re.sub(r"[^A-Za-z0-9_.\-]", "_", base)[:60]
        base = base if re.match(r"[A-Za-z_]", base) else f"t_{base}"
        name, i = base, 2
        while name in self.taken:
            name, i = f"{base}_{i}", i + 1
        self.taken.add(name)
        return name

    def emit(self, node: torch.fx.Node, fields: dict, op_name: str | None = None, step_id: str | None = None) -> Step:
        step_id = step_id or self.step_id(node, op_name or fields["op"])
        self.names[node] = step_id
        line = source_line(node)
        comment = f"{Path(line[0]).name}:{line[1]}: {line[2]}" if line else None
        value = node.meta.get("val")
        shape = self.namer.shape(value) if isinstance(value, torch.Tensor) else None
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
        if node.target == aten.add.Tensor and b in self.graph.constant:
            return self._additive_mask(node, a, b)
        self.emit(node, {"op": BINARY[node.target], "inputs": [self.ref(a), self.ref(b)]})

    def _scale(self, node, x, number):
        if node.target not in (aten.mul.Tensor, aten.div.Tensor):
            raise Unmapped(f"{_label(node)} of a number ({number}): tracer adds and subtracts tensors only")
        key = "multiply" if node.target == aten.mul.Tensor else "divide"
        head = _head_width(x)
        if math.isclose(float(number), head ** (-0.5 if key == "multiply" else 0.5), rel_tol=1e-6):
            fields = {"op": "scale", "input": self.ref(x), "divide": {"sqrt": self.size(head, ("Dh",))}}
        else:
            fields = {"op": "scale", "input": self.ref(x), key: float(number)}
        self.emit(node, fields, "scaled")

    def _additive_mask(self, node, x, mask):
        fill = _additive_causal(self.graph.values[mask])
        if fill is None:
            raise Unmapped(f"it adds '{mask.name}', a constant that is not a causal mask")
        self.emit(node, {"op": "mask", "input": self.ref(x), "causal": True, "fill": fill}, "masked")

    def _masked_fill(self, node):
        x, mask, fill = node.args[:3]
        if mask not in self.graph.constant:
            fields = {"op": "mask", "input": self.ref(x), "mask": self.ref(mask), "polarity": "block", "fill": float(fill)}
        elif _causal_polarity(self.graph.values[mask]) == "block":
            fields = {"op": "mask", "input": self.ref(x), "causal": True, "fill": float(fill)}
        else:
            raise Unmapped(f"masked_fill with '{mask.name}', a constant that is not a causal mask")
        self.emit(node, fields, "masked")

    def _linear(self, node):
        fields = {"op": "linear", "input": self.ref(node.args[0]), "weight": self.ref(node.args[1])}
        if len(node.args) > 2 and node.args[2] is not None:
            fields["bias"] = self.ref(node.args[2])
        self.emit(node, fields)

    def _embedding(self, node):
        table, ids = node.args[:2]
        if ids in self.graph.constant and ids not in self.names:
            self._positions(ids)
        self.emit(node, {"op": "embed", "input": self.ref(ids), "weight": self.ref(table)})

    def _positions(self, ids):
        value = self.graph.values[ids]
        if not torch.equal(value, torch.arange(value.numel()).reshape(value.shape)):
            raise Unmapped(f"it looks up '{ids.name}', constant positions that are not 0 .. T-1")
        name = self._unique(self._variable(ids, "positions") or "position_ids")
        self.inputs[name] = self._declaration(ids.meta["val"], "arange")
        self.names[ids] = name

    def _split(self, node):
        pieces = sorted(node.users, key=lambda user: user.args[1])
        line = source_line(node)
        assigned = _assigned(line[2]) if line else []
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

    def _shaped(self, node):
        op = {aten.view.default: "view", aten.reshape.default: "reshape", aten.expand.default: "expand"}[node.target]
        self.emit(node, {"op": op, "input": self.ref(node.args[0]), "shape": self.namer.shape(node.meta["val"])})

    def _transpose(self, node):
        self.emit(node, {"op": "transpose", "input": self.ref(node.args[0]), "dims": [node.args[1], node.args[2]]})

    def _permute(self, node):
        self.emit(node, {"op": "permute", "input": self.ref(node.args[0]), "dims": list(node.args[1])})

    def _unsqueeze(self, node):
        self.emit(node, {"op": "unsqueeze", "input": self.ref(node.args[0]), "dim": node.args[1]})

    def _cat(self, node):
        self.emit(node, {"op": "cat", "inputs": [self.ref(x) for x in node.args[0]], "dim": _arg(node, 1, 0)})

    def _slice(self, node):
        fields = {"op": "index", "input": self.ref(node.args[0]), "dim": _arg(node, 1, 0)}
        start, stop, step = _arg(node, 2, None), _arg(node, 3, None), _arg(node, 4, 1)
        if start not in (None, 0):
            fields["start"] = self.size(start)
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
        if mask is not None:
            if mask not in self.graph.constant or _sdpa_causal(self.graph.values[mask]) is None:
                raise Unmapped(f"scaled_dot_product_attention with the mask '{mask.name}', which is not a causal mask")
            options["causal"] = True
        if causal:
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
        self.emit(idiom.node, {"op": "rmsnorm", "input": self.ref(facts["x"]), "weight": self.ref(facts["weight"]), "eps": facts["eps"]})

    def _rope(self, idiom: Idiom):
        facts = idiom.facts
        fields = {"op": "rope", "input": self.ref(facts["x"]), "theta": facts["theta"]}
        if facts.get("style", "half") != "half":
            fields["style"] = facts["style"]
        if facts.get("seq_dim", -2) != -2:
            fields["seq_dim"] = facts["seq_dim"]
        self.emit(idiom.node, fields)

    def _repeat_kv(self, idiom: Idiom):
        repeats = self.size(idiom.facts["repeats"], ("n_rep",))
        fields = {"op": "repeat_interleave", "input": self.ref(idiom.facts["x"]), "repeats": repeats, "dim": idiom.facts["dim"]}
        self.emit(idiom.node, fields)

    def _gelu_tanh(self, idiom: Idiom):
        self.emit(idiom.node, {"op": "gelu", "input": self.ref(idiom.facts["x"]), "approximate": "tanh"})

    def _merge(self, idiom: Idiom):
        self.emit(idiom.node, {"op": "merge", "input": self.ref(idiom.facts["x"])}, "merged")

    def _conv1d(self, idiom: Idiom):
        facts = idiom.facts
        fields = {"op": "linear", "input": self.ref(facts["x"]), "weight": self.ref(facts["weight"]), "bias": self.ref(facts["bias"])}
        self.emit(idiom.node, {**fields, "layout": "in_out"})

    def _mha(self, idiom: Idiom):
        from_template(self, idiom)


class _Downstream(Exception):
    """A node that reads one already reported."""


def from_template(t: Translator, idiom: Idiom) -> None:
    """``nn.MultiheadAttention`` (no masks, ``need_weights=False``) as the steps it stands for."""
    path, node = idiom.facts["path"], idiom.node
    mha = t.module.get_submodule(path)
    sdpa = [n for n in t.graph.calls() if n in t.graph.consumed | {node} and n.target == aten.scaled_dot_product_attention.default]
    sdpa = [n for n in sdpa if any(p == path for p, _ in module_stack(n))]
    if len(sdpa) != 1 or len(idiom.facts["leaving"]) != 1 or _arg(sdpa[0], 3, None, "attn_mask") is not None:
        raise Unmapped(
            f"nn.MultiheadAttention '{path or 'the module'}' with an attention mask or need_weights=True (average weights): not supported"
        )
    if mha.bias_k is not None or mha.add_zero_attn or not mha._qkv_same_embed_dim:
        raise Unmapped(f"nn.MultiheadAttention '{path or 'the module'}' with add_bias_kv, add_zero_attn or kdim/vdim: not supported")
    sources = _mha_sources(t, idiom)
    projected = _mha_projections(t, node, path, sources)
    batch, tokens, width = t.namer.shape(sources[0].meta["val"])
    heads, head_width = t.size(mha.num_heads, ("H",)), t.size(mha.head_dim, ("Dh",))
    order = [batch, tokens] if mha.batch_first else [tokens, batch]
    split = {"op": "transpose", "dims": [1, 2]} if mha.batch_first else {"op": "permute", "dims": [1, 2, 0, 3]}
    heads_of = []
    for name in projected:
        t.emit(node, {"op": "view", "input": name, "shape": [*order, heads, head_width]}, step_id=t._unique(f"{name}_heads"))
        heads_of.append(t.emit(node, {**split, "input": t.names[node]}, step_id=t._unique(f"{name}_h")).fields["id"])
    t.emit(node, {"op": "sdpa", "inputs": heads_of, **t._sdpa_options(sdpa[0])}, step_id=t._unique(_join(path, "context")))
    if mha.batch_first:
        t.emit(node, {"op": "merge", "input": t.names[node]}, step_id=t._unique(_join(path, "merged")))
    else:
        t.emit(node, {"op": "permute", "input": t.names[node], "dims": [2, 0, 1, 3]}, step_id=t._unique(_join(path, "context_t")))
        t.emit(node, {"op": "reshape", "input": t.names[node], "shape": [tokens, batch, width]}, step_id=t._unique(_join(path, "merged")))
    out = {"op": "linear", "input": t.names[node], "weight": _join(path, "out_proj.weight"), "bias": _join(path, "out_proj.bias")}
    t.emit(node, out, step_id=t._unique(path or "attn_output"))


def _mha_sources(t: Translator, idiom: Idiom) -> list[torch.fx.Node]:
    """query, key and value: the module's own inputs, or the one tensor a self-attention reads."""
    if not idiom.facts["path"]:
        by_name = {n.name: n for n in t.graph.fx.nodes if n.op == "placeholder"}
        return [by_name[name] for name in ("query", "key", "value")]
    sources = idiom.facts["sources"]
    if len(sources) != 1:
        raise Unmapped(
            f"nn.MultiheadAttention '{idiom.facts['path']}' reads several tensors: only self-attention inside a model is supported"
        )
    return sources * 3


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
    aten.masked_fill.Scalar: Translator._masked_fill,
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
    "conv1d": Translator._conv1d,
    "mha": Translator._mha,
}


# -------------------------------------------------------------- helpers


def _arg(node: torch.fx.Node, position: int, default, keyword: str | None = None):
    if len(node.args) > position:
        return node.args[position]
    return node.kwargs.get(keyword, default) if keyword else default


def _label(node: torch.fx.Node) -> str:
    return str(node.target).replace("aten.", "torch.ops.aten.") if isinstance(node.target, torch._ops.OpOverload) else str(node.target)


def _join(path: str, name: str) -> str:
    return f"{path}.{name}" if path else name


def _module_path(node) -> str:
    stack = module_stack(node) if isinstance(node, torch.fx.Node) else []
    return stack[-1][0] if stack else ""


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


def _head_width(x: torch.fx.Node) -> int:
    """Dh of scores ``q @ k^T`` (through masks and other scales: a scale may come after the mask):
    the last dim of q, else the last dim of x."""
    source = x
    while source.op == "call_function" and source.target in (aten.masked_fill.Scalar, aten.add.Tensor, aten.mul.Tensor, aten.div.Tensor):
        source = source.args[0]
    if source.op == "call_function" and source.target in (aten.matmul.default, aten.bmm.default):
        return source.args[0].meta["val"].shape[-1]
    return x.meta["val"].shape[-1]


def _causal_keep(value: torch.Tensor) -> torch.Tensor:
    rows, cols = value.shape[-2], value.shape[-1]
    return torch.ones(rows, cols, dtype=torch.bool).tril(cols - rows).expand(value.shape)


def _causal_polarity(value: torch.Tensor) -> str | None:
    """'keep' if a bool mask is True on the causal triangle, 'block' if True above it."""
    keep = _causal_keep(value)
    if torch.equal(value.bool(), keep) and value.dtype == torch.bool:
        return "keep"
    return "block" if torch.equal(value.bool(), ~keep) else None


def _additive_causal(value: torch.Tensor) -> float | None:
    """The fill of a float mask that is 0 on the causal triangle and one value above it."""
    keep = _causal_keep(value)
    if value.dtype == torch.bool or not torch.equal(value == 0, keep) or keep.all():
        return None
    blocked = value[~keep]
    return float(blocked[0]) if bool((blocked == blocked[0]).all()) else None


def _sdpa_causal(value: torch.Tensor) -> bool | None:
    if value.dtype == torch.bool:
        return True if _causal_polarity(value) == "keep" else None
    return True if _additive_causal(value) is not None else None


def _outputs(graph: Graph) -> list[torch.fx.Node]:
    (output,) = [n for n in graph.fx.nodes if n.op == "output"]
    flat = torch.utils._pytree.tree_leaves(output.args[0])
    return [n for n in flat if isinstance(n, torch.fx.Node)]


def _problem(node: torch.fx.Node, message: str) -> Diagnostic:
    line = source_line(node)
    if line is None:
        return Diagnostic("<module>", None, "import-unmapped", f"'{node.name}': {message}")
    return Diagnostic(line[0], Position(line[1], 1), "import-unmapped", f"'{node.name}' ({line[2]}): {message}")
