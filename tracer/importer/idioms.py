"""The captured graph of ``tracer.from_module``, made ready to read as steps.

``torch.export.export(strict=False)`` records pre-dispatch ATen (``aten.linear``,
``aten.scaled_dot_product_attention``, ``aten.layer_norm`` stay whole). This module removes the
nodes that are identities at the example (``.to`` to the same dtype, eval dropout, ``x * 1``,
full slices, same-shape views), evaluates every node once on the example to know the values of
the constant regions (masks, rotary tables: nodes that depend on no input and no parameter), and
finds the idioms that are one step in tracer (RMSNorm's pow/mean/rsqrt, rotate_half RoPE,
repeat_kv, GPT-2's tanh GELU, merging heads, Conv1D, ``nn.MultiheadAttention``) with
``torch.fx``'s ``SubgraphMatcher`` and small walkers.
"""

from __future__ import annotations

import collections
import contextlib
import functools
import math
import operator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.fx.experimental.proxy_tensor import make_fx
from torch.fx.passes.utils.matcher_utils import SubgraphMatcher

from ..core.errors import Diagnostic, TracerError
from ..steps.attention import causal_hidden
from .lines import source_line, whole_step
from .rotary import frequency_columns, scaled_table, tolerance

aten = torch.ops.aten
NO_OP_CASTS = {aten.to.dtype, aten.to.device, aten.to.dtype_layout, aten.type_as.default, aten.alias.default}
VIEWS = {aten.view.default, aten.reshape.default}
MHA_CLASS = "torch.nn.modules.activation.MultiheadAttention"
ORS = {aten.__or__.Tensor, aten.bitwise_or.Tensor, aten.logical_or.default}
NOTS = {aten.bitwise_not.default, aten.logical_not.default}
ANDS = {aten.__and__.Tensor, aten.bitwise_and.Tensor, aten.logical_and.default}
MASK_READERS = {aten.where.ScalarOther, aten.scaled_dot_product_attention.default}  # what _kept_masks reads a mask for


@dataclass
class Idiom:
    """Nodes that become one step: its kind, the node whose value it makes, the facts it needs."""

    kind: str
    node: torch.fx.Node
    facts: dict[str, Any] = field(default_factory=dict)
    inner: list[torch.fx.Node] = field(default_factory=list)  # the nodes it stands for, in graph order


class Graph:
    """The exported program, canonicalised and evaluated once on the example."""

    def __init__(self, program, example: list):
        self.program = program
        self.fx = program.graph_module.graph
        self.specs = {spec.arg.name: spec for spec in program.graph_signature.input_specs}
        canonicalize(self.fx)
        self.values = _evaluate(program.graph_module, example)
        self.constant = self._constants()
        self.live = self._live()
        self.idioms: dict[torch.fx.Node, Idiom] = {}
        self.consumed: set[torch.fx.Node] = set()
        self.kept: dict[torch.fx.Node, dict] = {}  # an SDPA's bool mask read as a pattern and a given mask: _kept_masks

    def kind(self, node: torch.fx.Node) -> str | None:
        """PARAMETER, BUFFER, CONSTANT_TENSOR or USER_INPUT for a placeholder."""
        spec = self.specs.get(node.name)
        return spec.kind.name if spec is not None else None

    def target(self, node: torch.fx.Node) -> str:
        """A parameter's or buffer's state_dict key."""
        return self.specs[node.name].target

    def calls(self) -> list[torch.fx.Node]:
        return [n for n in self.fx.nodes if n.op == "call_function"]

    def _constants(self) -> set[torch.fx.Node]:
        """Sizes, and nodes computed from buffers, lifted constants, non-tensor inputs and sizes only."""
        constant = set()
        for node in self.fx.nodes:
            if node.op == "placeholder":
                fixed = self.kind(node) in ("BUFFER", "CONSTANT_TENSOR") or not isinstance(node.meta.get("val"), torch.Tensor)
            else:
                sizes = isinstance(node.meta.get("val"), torch.SymInt | int)  # shape arithmetic: sym_size, s0 * s1
                fixed = node.op == "call_function" and (sizes or all(arg in constant for arg in node.all_input_nodes))
            if fixed:
                constant.add(node)
        return constant

    def _live(self) -> set[torch.fx.Node]:
        """The nodes an output's value depends on. A node read only for its shape (BART's
        ``embed_positions(inputs_embeds[:, :, -1])``, "needed for the shape only") is not one."""
        live, todo = set(), [n for n in self.fx.nodes if n.op == "output"]
        while todo:
            node = todo.pop()
            if node not in live and node not in self.constant:
                live.add(node)
                todo += node.all_input_nodes
        return live

    def claim(self, idiom: Idiom, inner) -> None:
        """Record an idiom; its inner nodes make no step of their own."""
        idiom.inner = sorted({*inner, idiom.node}, key=self.order.__getitem__)
        self.idioms[idiom.node] = idiom
        self.consumed.update(n for n in inner if n is not idiom.node)

    @functools.cached_property
    def order(self) -> dict[torch.fx.Node, int]:
        """Each node's place in the graph (canonicalised once, in ``__init__``)."""
        return {n: i for i, n in enumerate(self.fx.nodes)}

    def find_idioms(self) -> None:
        present = {n.target for n in self.fx.nodes if n.op == "call_function"}
        for kind, pattern in _patterns(present):
            for match in _Matcher(pattern).match(self.fx):
                inner = [n for p, n in match.nodes_map.items() if p.op not in ("placeholder", "output")]
                facts = VERIFY[kind](self, match)
                if facts is not None and not self.consumed & set(inner):
                    self.claim(Idiom(kind, match.returning_nodes[0], facts), inner)
        walkers = (_multi_head_attention, _complex_ropes, _merges, _conv1d, _in_out_linears, _mask_fills, _kept_masks, _softcaps)
        for walker in (*walkers, _relative_biases):
            walker(self)


def canonicalize(graph: torch.fx.Graph) -> None:
    """Remove the nodes that return their input unchanged at the example, but a cast that is a step
    of a module ``tracer export`` wrote (``router_logits_f32 = router_logits.to(torch.float32)``):
    export then import keeps the steps of the file."""
    for node in list(graph.nodes):
        if node.op == "call_function" and node.target == aten._assert_tensor_metadata.default:
            graph.erase_node(node)
    written = _written_casts(graph)
    for node in list(graph.nodes):
        if node.op != "call_function" or node in written:
            continue
        source = _identity_of(node)
        if source is not None:
            node.replace_all_uses_with(source)
            graph.erase_node(node)
    graph.lint()


def _written_casts(graph: torch.fx.Graph) -> set[torch.fx.Node]:
    """The casts that are the only op of a line that is a whole step of a ``tracer export``ed module."""
    calls = [n for n in graph.nodes if n.op == "call_function"]
    if not any(n.target == aten.to.dtype for n in calls):
        return set()

    def statement(node):  # a line run by one module: each copy of a repeated block runs it apart
        stack = module_stack(node)
        return source_line(node), stack[-1][0] if stack else ""

    lines = collections.Counter(statement(n) for n in calls)
    return {
        n
        for n in calls
        if n.target == aten.to.dtype and (line := source_line(n)) is not None and lines[statement(n)] == 1 and whole_step(line)
    }


def _identity_of(node: torch.fx.Node) -> torch.fx.Node | None:
    target, args = node.target, node.args
    if target == aten.cat.default:
        return _cat_of_one(node)
    first = args[0] if args and isinstance(args[0], torch.fx.Node) else None
    if first is None:
        return None
    same = _same_meta(node, first)
    if target in NO_OP_CASTS or target == aten.contiguous.default or target in VIEWS:
        return first if same else None
    if target == aten.dropout.default:
        return first if len(args) < 3 or args[2] is False else None
    if target in (aten.add.Tensor, aten.sub.Tensor) and len(args) > 1 and _is_number(args[1], 0):
        return first if same else None
    if target in (aten.mul.Tensor, aten.div.Tensor) and len(args) > 1 and _is_number(args[1], 1):
        return first if same else None
    if target == aten.slice.Tensor:
        return first if _full_slice(node) else None
    return None


def _cat_of_one(node: torch.fx.Node) -> torch.fx.Node | None:
    """The one part of a ``cat`` whose other parts are empty 1-d tensors, which torch.cat skips: a
    ``DynamicCache`` rebuilt from its keys and values for the capture appends them to ``tensor([])``."""
    parts = [p for p in node.args[0] if not _empty_vector(p)]
    return parts[0] if len(parts) == 1 and isinstance(parts[0], torch.fx.Node) and _same_meta(node, parts[0]) else None


def _empty_vector(part) -> bool:
    value = part.meta.get("val") if isinstance(part, torch.fx.Node) else None
    return isinstance(value, torch.Tensor) and value.ndim == 1 and value.shape[0] == 0


def _is_number(value, number) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and value == number


def _full_slice(node: torch.fx.Node) -> bool:
    args = list(node.args) + [None] * (5 - len(node.args))
    _, dim, start, end, step = args
    size = node.args[0].meta["val"].shape[dim or 0]
    whole_from = start in (None, 0) or (isinstance(start, int) and start <= -size)  # x[-3:] of 3: a sliding cache kept whole
    return whole_from and (end is None or (isinstance(end, int) and end >= size)) and step in (None, 1)


def _same_meta(a: torch.fx.Node, b: torch.fx.Node) -> bool:
    va, vb = a.meta.get("val"), b.meta.get("val")
    if not (isinstance(va, torch.Tensor) and isinstance(vb, torch.Tensor)):
        return False
    return va.dtype == vb.dtype and va.device == vb.device and tuple(va.shape) == tuple(vb.shape) and va.stride() == vb.stride()


def _evaluate(module: torch.fx.GraphModule, example: list) -> dict[torch.fx.Node, Any]:
    values: dict[torch.fx.Node, Any] = {}
    running: list[torch.fx.Node] = []

    class Recording(torch.fx.Interpreter):
        def run_node(self, node):
            running[:] = [node]
            values[node] = super().run_node(node)
            return values[node]

    with torch.no_grad(), one_thread_if_small(example):  # the Interpreter reads the graph itself: no recompile after canonicalize
        try:
            Recording(module).run(*example)
        except Exception as exc:  # capture ran on fake tensors, which skip kernels' dtype checks (softmax of int64)
            raise TracerError(Diagnostic("<module>", None, "import-capture", _refusal(exc, running))) from None
    return values


SMALL_TENSOR = 1 << 18  # elements (a 512 x 512 weight): below it an op's kernel takes microseconds on one thread


@contextlib.contextmanager
def one_thread_if_small(tensors):
    """One intra-op thread while ops run on tensors that are all small (a config made for
    import, its example inputs): each op then takes microseconds, and handing it to a pool of
    threads costs more than it saves; on a machine busy with other work, waiting for the pool
    made a 2-layer BERT's evaluation 40x slower (0.52 s against 13 ms). Large tensors keep
    torch's threads."""
    if torch.get_num_threads() == 1 or any(isinstance(v, torch.Tensor) and v.numel() > SMALL_TENSOR for v in tensors):
        yield
        return
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def _refusal(exc: Exception, running: list[torch.fx.Node]) -> str:
    """What torch said running the captured graph on the example inputs, at the module's line that called it."""
    first = next(iter(str(exc).strip().splitlines()), "")
    frames = [ln.strip() for ln in (running[0].meta.get("stack_trace") or "").splitlines()] if running else []
    at = next((f" at {ln}" for ln in reversed(frames) if ln.startswith("File ")), "")
    return (
        f"the module fails on the example inputs{at}: {type(exc).__name__}: {first} — "
        "give --input the dtype its forward expects (:int for token ids, :float otherwise)"
    )


# ------------------------------------------------------------------ idioms written as patterns


class _RMSNorm(torch.nn.Module):  # transformers' LlamaRMSNorm, the weight as an input
    def forward(self, x, weight):
        h = x.to(torch.float32)
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6)
        return weight * h.to(torch.float32)


class _RMSNormWeightLast(torch.nn.Module):  # Meta's llama RMSNorm: _norm(x.float()).type_as(x) * weight
    def forward(self, x, weight):
        h = x.float()
        return (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6)).type_as(x) * weight


class _UnitOffsetRMSNorm(torch.nn.Module):  # transformers' GemmaRMSNorm: (1 + weight), in float32
    def forward(self, x, weight):
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6)
        return (h * (1.0 + weight.float())).type_as(x)


class _RMSNormNoWeight(torch.nn.Module):  # Llama 4's qk norm; after the weighted forms, which contain it
    def forward(self, x):
        h = x.to(torch.float32)
        return (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6)).type_as(x)


class _RotateHalf(torch.nn.Module):  # apply_rotary_pos_emb for one tensor
    def forward(self, x, cos, sin):
        half = x.shape[-1] // 2
        return x * cos + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin


class _RotateEveryTwo(torch.nn.Module):  # rope style: interleaved, as GPT-J and `tracer export` write it
    def forward(self, x, cos, sin):
        return x * cos + torch.stack((-x[..., 1::2], x[..., ::2]), dim=-1).flatten(-2) * sin


class _RepeatKV(torch.nn.Module):  # transformers' repeat_kv
    def forward(self, x):
        b, h, t, d = x.shape
        return x[:, :, None, :, :].expand(b, h, 2, t, d).reshape(b, h * 2, t, d)


class _TanhGELU(torch.nn.Module):  # GPT-2's gelu_new (NewGELUActivation)
    def forward(self, x):
        return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))


def _rope_example() -> tuple:  # zeros: tracing reads shapes only, and leaves the global RNG alone
    return torch.zeros(2, 4, 7, 8), torch.zeros(1, 1, 7, 8), torch.zeros(1, 1, 7, 8)


def _norm_example(weighted: bool = True) -> tuple:
    return (torch.zeros(2, 7, 32), torch.ones(32)) if weighted else (torch.zeros(2, 7, 32),)


# (idiom kind, its module, its example inputs, an op every graph it matches holds): a kind written two
# ways has two patterns (fx matching is not commutative). Each pattern is traced the first time a
# graph holds its op (0.01-0.05 s each; a module with no RMSNorm never traces the four norms).
PATTERNS = (
    ("rmsnorm", _RMSNorm, _norm_example, aten.rsqrt.default),
    ("rmsnorm", _RMSNormWeightLast, _norm_example, aten.rsqrt.default),
    ("rmsnorm", _UnitOffsetRMSNorm, _norm_example, aten.rsqrt.default),
    ("rmsnorm", _RMSNormNoWeight, functools.partial(_norm_example, weighted=False), aten.rsqrt.default),
    ("rope", _RotateHalf, _rope_example, aten.neg.default),
    ("rope", _RotateEveryTwo, _rope_example, aten.stack.default),
    ("repeat_kv", _RepeatKV, lambda: (torch.zeros(2, 2, 7, 8),), aten.expand.default),
    ("gelu_tanh", _TanhGELU, lambda: (torch.zeros(2, 7, 16),), aten.tanh.default),
)


def _patterns(present: set) -> list[tuple[str, torch.fx.Graph]]:
    """(idiom kind, pattern graph) of the patterns whose ops are all among ``present``, in ``PATTERNS``' order."""
    found = []
    for index, (kind, _, _, needed) in enumerate(PATTERNS):
        if needed in present:
            pattern = _pattern(index)
            if _targets(pattern) <= present:  # an op of the pattern is nowhere in the graph: no match to look for
                found.append((kind, pattern))
    return found


@functools.cache
def _pattern(index: int) -> torch.fx.Graph:
    """The canonical graph of ``PATTERNS[index]``, traced once per process."""
    _, module, example, _ = PATTERNS[index]
    graph = _traced(module(), example())
    canonicalize(graph)
    return graph


def _targets(pattern: torch.fx.Graph) -> set:
    return {n.target for n in pattern.nodes if n.op == "call_function"}


def _traced(module: torch.nn.Module, example: tuple) -> torch.fx.Graph:
    """The pre-dispatch ATen graph ``torch.export.export(strict=False)`` records, without export's
    machinery around it (half the time: ~0.1 s for the patterns, built once per process)."""
    return make_fx(lambda *args: (module(*args),), pre_dispatch=True)(*example).graph


class _Matcher(SubgraphMatcher):
    """Literals match any literal (eps, the repeat count: checked afterwards), a size node matches
    a literal size; a node never matches a literal (torch 2.13's ``ignore_literals`` lets it)."""

    def __init__(self, pattern: torch.fx.Graph):
        super().__init__(pattern, match_output=False, match_placeholder=False, remove_overlapping_matches=True, ignore_literals=False)

    def _match_literals(self, pn, gn, match) -> bool:
        if not isinstance(pn, torch.fx.Node) and not isinstance(gn, torch.fx.Node):
            return True
        if not isinstance(pn, torch.fx.Node) and isinstance(gn, torch.fx.Node) and isinstance(gn.meta.get("val"), torch.SymInt):
            return True
        return super()._match_literals(pn, gn, match)


def _inner(match, target):
    return next(n for p, n in match.nodes_map.items() if p.op == "call_function" and p.target == target)


def _verify_rmsnorm(graph: Graph, match) -> dict | None:
    nodes = sorted(match.placeholder_nodes, key=lambda n: graph.kind(n) != "PARAMETER")
    weight, x = (nodes[0], nodes[1]) if len(nodes) == 2 else (None, nodes[0])
    mean = _inner(match, aten.mean.dim)
    if (weight is not None and graph.kind(weight) != "PARAMETER") or list(mean.args[1]) != [-1] or mean.args[2] is not True:
        return None
    eps = next(n for p, n in match.nodes_map.items() if p.op == "call_function" and p.target == aten.add.Tensor and n.args[0] is mean)
    offset = weight is not None and any(
        n.target == aten.add.Tensor and weight in n.args for n in match.nodes_map.values() if n.op == "call_function"
    )
    return {"x": x, "weight": weight, "eps": float(eps.args[1]), **({"unit_offset": True} if offset else {})}


def _verify_rope(graph: Graph, match) -> dict | None:
    """A rotation by constant cos and sin tables of RoPE's angles: rotate_half's pairs (i, i + D/2)
    with the frequencies concatenated twice, or the interleaved pairs (2i, 2i + 1) of a ``stack``
    with each frequency repeated in place."""
    x, cos, sin = match.placeholder_nodes
    if not {cos, sin} <= graph.constant:
        return None
    interleaved = any(n.op == "call_function" and n.target == aten.stack.default for n in match.nodes_map.values())
    (rows, seq_dim), (sines, _) = (_table_rows(graph.values[n].double()) for n in (cos, sin))
    facts = {"x": x, "style": "interleaved" if interleaved else "half", "seq_dim": seq_dim}
    atol = tolerance(graph.values[cos].dtype)  # a float16 table is float32's cos rounded
    if rows.shape[0] >= 2:  # theta is read at position 1
        facts.update(_computed_table(graph, cos, rows, sines, interleaved))
        theta = _theta(graph, cos, rows, sines, interleaved) if rows.shape[-1] >= 4 else 10000.0  # one frequency, theta ** 0: any theta
        if torch.allclose(rows, _rotary_cos(rows.shape[0], rows.shape[-1], theta, interleaved), atol=atol):
            return {**facts, "theta": theta}
    offset = _at_an_offset(graph, cos, rows, sines, interleaved, atol)
    if offset is not None:
        return {**facts, **offset}
    return facts if "table" in facts else None


def _at_an_offset(graph: Graph, cos: torch.fx.Node, rows: torch.Tensor, sines: torch.Tensor, interleaved: bool, atol: float) -> dict | None:
    """{offset, theta} of a table of positions ``offset .. offset + P - 1``, the offset a size of
    an input (a decode step's cache length ``past``: its one row is position past). Theta is the
    ``inv_freq`` buffer's, else read from the lowest frequency's angle, ``offset · theta ** (2/D - 1)``,
    which stays below π; every column of cos and sin is then held against it. None unless exactly
    one size gives the table."""
    size, buffer = rows.shape[-1], _ancestor_buffer(graph, cos, "inv_freq")
    inputs = [n for n in graph.fx.nodes if n.op == "placeholder" and graph.kind(n) == "USER_INPUT"]
    offsets = sorted({int(s) for n in inputs if isinstance(graph.values.get(n), torch.Tensor) for s in graph.values[n].shape if int(s) > 0})
    lowest = frequency_columns(torch.atan2(sines[0], rows[0]), interleaved)[-1]
    found = []
    for offset in offsets:
        if buffer is not None:
            theta = float(graph.values[buffer].double()[1] ** (-size / 2)) if size >= 4 else 10000.0
        else:
            theta = float((lowest / offset) ** (-size / (size - 2))) if size >= 4 and lowest > 0 else 10000.0
        theta = float(round(theta)) if abs(theta - round(theta)) < 1e-4 * theta else theta
        angles = _rotary_angles(offset, rows.shape[0], size, theta, interleaved)
        if torch.allclose(rows, angles.cos(), atol=atol) and torch.allclose(sines, angles.sin(), atol=atol):
            found.append({"offset": offset, "theta": theta})
    return found[0] if len(found) == 1 else None


def _computed_table(graph: Graph, cos: torch.fx.Node, rows: torch.Tensor, sines: torch.Tensor, interleaved: bool) -> dict:
    """``table`` (a ``rotary.Table``), ``owner`` (the module holding its ``inv_freq``) and ``cos`` (its node) of a rotation
    table, for the rule to find its scaling in the module's config (``rotary.scaling_of``: Llama 3,
    YaRN, LongRoPE, linear, dynamic NTK, whose table at the example may also be plain RoPE of
    another theta); none for a table that is no rotation."""
    table = scaled_table(rows, sines, graph.values[cos].dtype, interleaved)
    if table is None:
        return {}
    buffer = _ancestor_buffer(graph, cos, "inv_freq")
    return {"table": table, "owner": graph.target(buffer).rpartition(".")[0] if buffer is not None else None, "cos": cos}


def _table_rows(table: torch.Tensor) -> tuple[torch.Tensor, int]:
    """(positions, D) of a rotary table broadcast over its other axes, and its positions axis counted
    from the end: -2 for (…, T, D), -3 for Llama 4's (1, T, 1, D) beside (B, T, H, Dh)."""
    leading = [axis for axis, size in enumerate(table.shape[:-2]) if size != 1]
    if table.shape[-2] != 1 or not leading:
        return table.reshape(-1, table.shape[-2], table.shape[-1])[0], -2
    axis = leading[-1]
    return table.movedim(axis, -2).reshape(-1, table.shape[axis], table.shape[-1])[0], axis - table.ndim


def _rotary_cos(positions: int, size: int, theta: float, interleaved: bool = False) -> torch.Tensor:
    return _rotary_angles(0, positions, size, theta, interleaved).cos()


def _rotary_angles(offset: int, positions: int, size: int, theta: float, interleaved: bool) -> torch.Tensor:
    """RoPE's angle of each (position offset + p, feature), in float64."""
    inv_freq = 1.0 / theta ** (torch.arange(0, size, 2, dtype=torch.float64) / size)
    freqs = torch.arange(offset, offset + positions, dtype=torch.float64)[:, None] * inv_freq
    return freqs.repeat_interleave(2, -1) if interleaved else torch.cat([freqs, freqs], -1)


def _theta(graph: Graph, cos: torch.fx.Node, rows: torch.Tensor, sines: torch.Tensor, interleaved: bool) -> float:
    """RoPE's base: exact from an ``inv_freq`` buffer (inv_freq[1] = theta ** (-2 / D)), else from
    the angle at position 1 of frequency 1 (column 2 interleaved, 1 otherwise), read with atan2 from
    sin and cos (acos of a cosine near 1 loses digits)."""
    size, column = rows.shape[-1], 2 if interleaved else 1
    buffer = _ancestor_buffer(graph, cos, "inv_freq")
    second = graph.values[buffer].double()[1] if buffer is not None else torch.atan2(sines[1, column], rows[1, column])
    theta = float(second ** (-size / 2))
    return float(round(theta)) if abs(theta - round(theta)) < 1e-4 * theta else theta


def _ancestor_buffer(graph: Graph, node: torch.fx.Node, word: str) -> torch.fx.Node | None:
    seen, todo = set(), [node]
    while todo:
        current = todo.pop()
        if current in seen:
            continue
        seen.add(current)
        if current.op == "placeholder" and graph.kind(current) == "BUFFER" and graph.target(current).endswith(word):
            return current
        todo += current.all_input_nodes
    return None


def _verify_repeat_kv(graph: Graph, match) -> dict | None:
    """Heads repeated in place: a new axis right after the heads axis (2 for transformers' (B, H, T, Dh),
    3 for Meta's (B, T, H, Dh)), expanded and folded into the heads."""
    unsqueeze, expand = _inner(match, aten.unsqueeze.default), _inner(match, aten.expand.default)
    axis = unsqueeze.args[1]
    if axis not in (2, 3):
        return None
    return {"x": match.placeholder_nodes[0], "repeats": expand.meta["val"].shape[axis], "dim": axis - 1}


VERIFY = {
    "rmsnorm": _verify_rmsnorm,
    "rope": _verify_rope,
    "repeat_kv": _verify_repeat_kv,
    "gelu_tanh": lambda graph, match: {"x": match.placeholder_nodes[0]},
}


# ------------------------------------------------------------------ idioms found by walking


def _merges(graph: Graph) -> None:
    """(…, H, T, Dh) -> transpose(1, 2) [-> contiguous] -> view/reshape (…, T, H·Dh): one ``merge``."""
    for node in graph.calls():
        if node.target not in VIEWS or node in graph.consumed or node in graph.idioms:
            continue
        chain, source = [], node.args[0]
        while source.op == "call_function" and source.target == aten.contiguous.default and len(source.users) == 1:
            chain.append(source)
            source = source.args[0]
        if _swaps_heads(source) and _joins_last_two(graph, source, node) and len(source.users) == 1:
            graph.claim(Idiom("merge", node, {"x": source.args[0]}), [*chain, source])


def _joins_last_two(graph: Graph, source: torch.fx.Node, node: torch.fx.Node) -> bool:
    """``node`` is (…, T, H, Dh) ``source`` with its last two axes joined: (…, T, H·Dh), not
    another reshape of as many elements (``.reshape(2, 5, 16)`` of (2, 4, 5, 4), Bloom's (B, H, T, Dh)
    as (B·H, T, Dh))."""
    before, after = graph.values[source].shape, graph.values[node].shape
    return len(after) == 3 and tuple(after) == (before[0], before[1], before[2] * before[3])


def _swaps_heads(node: torch.fx.Node) -> bool:
    if node.op != "call_function" or node.target != aten.transpose.int or node.args[0].meta["val"].ndim != 4:
        return False
    return sorted(int(d) % 4 for d in node.args[1:3]) == [1, 2]


def _complex_ropes(graph: Graph) -> None:
    """Meta's llama ``apply_rotary_emb``: reshape to (…, D/2, 2) -> view_as_complex -> times a constant
    ``freqs_cis`` (``torch.polar``) -> view_as_real -> flatten: ``rope style: interleaved``."""
    for node in graph.calls():
        if node.target != aten.view_as_complex.default or len(node.users) != 1:
            continue
        pairs, (product,) = node.args[0], node.users
        if pairs.target not in VIEWS or pairs.meta["val"].shape[-1] != 2 or product.target != aten.mul.Tensor:
            continue
        table = product.args[1] if product.args[0] is node else product.args[0]
        real = next(iter(product.users), None)
        if table not in graph.constant or len(product.users) != 1 or real.target != aten.view_as_real.default or len(real.users) != 1:
            continue
        (flat,) = real.users
        if flat.target not in (aten.flatten.using_ints, *VIEWS) or flat.meta["val"].shape != pairs.args[0].meta["val"].shape:
            continue
        facts = _complex_rotary(graph.values[table], pairs.args[0].meta["val"].ndim)
        if facts is not None:
            graph.claim(Idiom("rope", flat, {"x": pairs.args[0], **facts}), [pairs, node, product, real, flat])


def _complex_rotary(table: torch.Tensor, ndim: int) -> dict | None:
    """theta, style and the positions axis of a ``freqs_cis`` table: e^(i·p·theta^(-2j/D)) at position p."""
    positions = [axis for axis, size in enumerate(table.shape) if size != 1][:-1]
    if len(positions) != 1 or not table.is_complex() or not torch.allclose(table.abs(), torch.ones(())):
        return None
    angles = torch.angle(table.to(torch.complex128)).reshape(-1, table.shape[-1])  # (T, D/2)
    size = 2 * table.shape[-1]
    if angles.shape[0] < 2 or angles.shape[1] < 2:
        return None
    theta = float(angles[1, 1] ** (-size / 2))
    theta = float(round(theta)) if abs(theta - round(theta)) < 1e-4 * theta else theta
    expected = torch.arange(angles.shape[0], dtype=torch.float64)[:, None] / theta ** (torch.arange(0, size, 2, dtype=torch.float64) / size)
    if not torch.allclose(torch.polar(torch.ones_like(expected), expected), table.reshape(angles.shape).to(torch.complex128), atol=1e-5):
        return None
    return {"theta": theta, "style": "interleaved", "seq_dim": positions[0] - table.ndim if table.ndim == ndim else -2}


def _relative_biases(graph: Graph) -> None:
    """T5's ``compute_bias``: a learned (num_buckets, H) table looked up at constant buckets and
    ``permute(2, 0, 1).unsqueeze(0)`` to (1, H, T_q, T_kv). Added to the scores (eager; every
    layer adds the first one's): a ``relative_bias`` step at each add. Handed to an sdpa as its
    float mask (transformers' sdpa path: ``where(keep, bias, min)`` or ``bias + mask``, in every
    layer from the first one's bias): a ``relative_position_bias`` step in the layer of each op
    that reads it, then that op. Rules checks the buckets."""
    for node in graph.calls():
        if node.target != aten.embedding.default or graph.kind(node.args[0]) != "PARAMETER" or node.args[1] not in graph.constant:
            continue
        chain = _single_users(node, (aten.permute.default, aten.unsqueeze.default))
        if chain is None or list(chain[0].args[1]) != [2, 0, 1] or chain[1].args[1] != 0:
            continue
        bias, facts = chain[1], {"table": node.args[0], "ids": node.args[1], "buckets": graph.values[node.args[1]]}
        adds = [u for u in bias.users if u.target == aten.add.Tensor and u.args[1] is bias and u.args[0] not in graph.constant]
        if adds and len(adds) == len(bias.users):
            for add in adds:
                graph.claim(Idiom("relative_bias", add, {"x": add.args[0], **facts}), [node, *chain, add])
        elif sdpa_reading_as_mask(bias) is not None:
            for reader in list(bias.users):  # an idiom of its own (a masked_fill's mask step) is translated after the bias
                sdpa = reader if mask_argument(reader) is bias else sdpa_reading_as_mask(reader) or sdpa_reading_as_mask(bias)
                known = {"bias": bias, "lookup": node, "sdpa": sdpa, "then": graph.idioms.get(reader)}
                graph.claim(Idiom("position_bias", reader, {**known, **facts}), [node, *chain])


BIAS_CARRIERS = {aten.permute.default, aten.unsqueeze.default, aten.expand.default, aten.contiguous.default, aten.add.Tensor}
BIAS_CARRIERS |= {aten.where.self, aten.where.ScalarSelf, aten.where.ScalarOther, aten.where.Scalar, aten.masked_fill.Scalar}


def sdpa_reading_as_mask(node: torch.fx.Node) -> torch.fx.Node | None:
    """The first ``scaled_dot_product_attention`` (breadth first: the first layer's) that reads
    ``node``'s values as its float ``attn_mask``, through views, copies, masks and additions; None if none."""
    todo, seen = [node], {node}
    while todo:
        current = todo.pop(0)
        for user in current.users:
            if mask_argument(user) is current:
                return user
            if user.target in BIAS_CARRIERS and user not in seen:
                seen.add(user)
                todo.append(user)
    return None


def mask_argument(node: torch.fx.Node):
    """An sdpa's ``attn_mask``; None for any other node."""
    if node.target != aten.scaled_dot_product_attention.default:
        return None
    return node.args[3] if len(node.args) > 3 else node.kwargs.get("attn_mask")


def _single_users(node: torch.fx.Node, targets: tuple) -> list[torch.fx.Node] | None:
    """The chain of ops ``targets`` that reads ``node``, each the only reader of the one before (the last may have several)."""
    chain = []
    for target in targets:
        if len(node.users) != 1 or next(iter(node.users)).target != target:
            return None
        node = next(iter(node.users))
        chain.append(node)
    return chain


def _conv1d(graph: Graph) -> None:
    """transformers' Conv1D (GPT-2): view(-1, in) -> addmm(bias, x, W) -> view(…, out): ``linear layout: in_out``."""
    for node in graph.calls():
        if node.target != aten.addmm.default or len(node.users) != 1:
            continue
        flat, (after,) = node.args[1], node.users
        if flat.op == "call_function" and flat.target in VIEWS and after.target in VIEWS and len(flat.users) == 1:
            graph.claim(
                Idiom("in_out_linear", after, {"x": flat.args[0], "bias": node.args[0], "weight": node.args[2]}), [flat, node, after]
            )


def _in_out_linears(graph: Graph) -> None:
    """``x @ W`` [``+ b``] with W a 2-D parameter and b a 1-D one: ``linear layout: in_out``, the
    weight stored (in, out) as GPT-2's Conv1D and `tracer export` write it; ``x @ W.T`` [``+ b``]
    (Falcon's ``FalconLinear``) is a plain ``linear``, the weight stored (out, in) as nn.Linear's."""
    for node in graph.calls():
        if node.target != aten.matmul.default or node in graph.consumed:
            continue
        weight, transposed = node.args[1], _transposed_parameter(graph, node.args[1])
        if transposed is None and not _parameter(graph, weight, 2):
            continue
        facts, inner, last = {"x": node.args[0], "weight": transposed or weight, "in_out": transposed is None}, [node], node
        inner += [weight] if transposed is not None else []
        (user,) = node.users if len(node.users) == 1 else (None,)
        if user is not None and user.target == aten.add.Tensor and len(user.args) == 2:
            bias = user.args[1] if user.args[0] is node else user.args[0]
            if _parameter(graph, bias, 1) and bias.meta["val"].shape[0] == node.meta["val"].shape[-1]:
                facts["bias"], last = bias, user
                inner.append(user)
        graph.claim(Idiom("in_out_linear", last, facts), inner)


def _transposed_parameter(graph: Graph, node) -> torch.fx.Node | None:
    """The 2-D parameter ``node`` transposes (``W.T``, ``W.t()``, ``W.transpose(0, 1)``), read by this node only."""
    if not isinstance(node, torch.fx.Node) or node.op != "call_function" or len(node.users) != 1:
        return None
    if node.target in (aten.t.default, aten.numpy_T.default):
        swaps = True
    elif node.target == aten.transpose.int:
        swaps = node.args[1] % 2 != node.args[2] % 2
    else:
        swaps = node.target == aten.permute.default and [d % 2 for d in node.args[1]] == [1, 0]
    return node.args[0] if swaps and _parameter(graph, node.args[0], 2) else None


def _softcaps(graph: Graph) -> None:
    """``tanh(x / cap) * cap`` (Gemma 2's attention and final logits): ``softcap``."""
    for node in graph.calls():
        if node.target != aten.tanh.default or len(node.users) != 1 or node in graph.consumed:
            continue
        divided, (scaled,) = node.args[0], node.users
        if divided.op != "call_function" or divided.target != aten.div.Tensor or len(divided.users) != 1:
            continue
        cap = divided.args[1]
        if scaled.target == aten.mul.Tensor and isinstance(cap, float | int) and list(scaled.args) == [node, cap] and cap > 0:
            graph.claim(Idiom("softcap", scaled, {"x": divided.args[0], "cap": float(cap)}), [divided, node, scaled])


def _parameter(graph: Graph, node, ndim: int) -> bool:
    return isinstance(node, torch.fx.Node) and graph.kind(node) == "PARAMETER" and node.meta["val"].ndim == ndim


def _mask_fills(graph: Graph) -> None:
    """``masked_fill(scores, hide, fill)`` where ``hide`` ors constant patterns (causal, a sliding
    window, a band) with at most one mask the module is given, as is or inverted (``~keep``): one
    ``mask`` step. The pattern is read from the constant's value at the example sizes."""
    for node in graph.calls():
        if node.target != aten.masked_fill.Scalar or node in graph.consumed:
            continue
        terms, inner = _or_terms(graph, node.args[1])
        fixed, given = [t for t in terms if t in graph.constant], [t for t in terms if t not in graph.constant]
        pattern = hidden_pattern(functools.reduce(operator.or_, (graph.values[t].bool() for t in fixed))) if fixed else {}
        if len(given) > 1 or pattern is None:
            continue
        facts = {"x": node.args[0], "fill": node.args[2], **pattern}
        if given:
            (mask,) = given
            inverted = mask.op == "call_function" and mask.target in NOTS and len(mask.users) == 1
            facts["mask"], facts["polarity"] = (mask.args[0], "keep") if inverted else (mask, "block")
            inner += [mask] if inverted else []
            if _bool_of_integers(facts["mask"]):  # `~mask.bool()`: the step reads an integer mask as .bool() itself
                inner.append(facts["mask"])
                facts["mask"] = facts["mask"].args[0]
        graph.claim(Idiom("mask", node, facts), inner)


def _bool_of_integers(node: torch.fx.Node) -> bool:
    """``m.bool()`` of an integer mask, read by nothing else: the ``mask`` step casts it so itself."""
    if node.op != "call_function" or node.target not in (aten.to.dtype, aten._to_copy.default) or len(node.users) != 1:
        return False
    source = node.args[0]
    value = source.meta.get("val") if isinstance(source, torch.fx.Node) else None
    return node.meta["val"].dtype == torch.bool and isinstance(value, torch.Tensor) and not value.dtype.is_floating_point


def _kept_masks(graph: Graph) -> None:
    """transformers' ``masking_utils`` masks of a padded batch: the vmapped ``and_masks`` of
    index comparisons (causal, a sliding window: constants) and ``padding_mask[batch_idx, kv_idx]``
    (the given mask), True where a key is kept, broadcast with ``expand``. Read as a pattern and the
    given mask: added to eager scores as ``where(keep, 0, min)`` (one ``mask`` step), or an SDPA's
    ``attn_mask`` (its ``sdpa`` step's pattern and mask, in ``graph.kept``). Every layer reads the
    same mask: each gets its own step, and nothing else may read the nodes it stands for."""
    for node in graph.calls():
        if node in graph.consumed or node in graph.constant:
            continue
        if node.target == aten.scaled_dot_product_attention.default and len(node.args) > 3 and isinstance(node.args[3], torch.fx.Node):
            found = _kept(graph, node.args[3])
            if found is not None:
                facts, inner = found
                graph.kept[node] = facts
                graph.consumed.update(inner)
        elif node.target == aten.add.Tensor and len(node.args) == 2 and all(isinstance(a, torch.fx.Node) for a in node.args):
            scores, where = node.args
            if where.op != "call_function" or where.target != aten.where.ScalarOther:
                continue
            cond, zero, fill = where.args[:3]
            if zero not in graph.constant or bool(graph.values[zero].any()) or not isinstance(fill, int | float):
                continue
            found = _kept(graph, cond) if all(u.target == aten.add.Tensor and u.args[1] is where for u in where.users) else None
            if found is not None:
                facts, inner = found
                graph.claim(Idiom("mask", node, {"x": scores, "fill": fill, **facts}), [*inner, where])


def _kept(graph: Graph, node: torch.fx.Node) -> tuple[dict, list[torch.fx.Node]] | None:
    """({mask: the given mask, polarity: keep, the pattern's fields}, the nodes they stand for) of a
    bool mask that ands constant patterns with exactly one mask computed from the inputs."""
    inner = []
    while node.op == "call_function" and node.target == aten.expand.default:
        inner.append(node)
        node = node.args[0]
    terms, ands = _terms(graph, node, ANDS, shared=True)
    fixed, given = [t for t in terms if t in graph.constant], [t for t in terms if t not in graph.constant]
    if len(given) != 1 or not fixed or given[0].meta["val"].dtype != torch.bool:
        return None
    region = set(inner + ands)
    if any(u not in region and u.target not in MASK_READERS for n in region for u in n.users):
        return None  # another op reads the mask itself: it stays as the module computes it
    keep = functools.reduce(operator.and_, (graph.values[t].bool() for t in fixed))
    if bool(keep.all()):  # BERT's bidirectional mask: `True & padding`, the padding alone
        pattern = {}
    else:  # a pattern is read off the (queries, keys) planes: a constant that broadcasts over them is no pattern
        full = tuple(node.meta["val"].shape[-2:])
        pattern = hidden_pattern(~keep) if keep.ndim >= 2 and tuple(keep.shape[-2:]) == full else None
    if pattern is None:
        return None
    return {"mask": given[0], "polarity": "keep", **pattern}, inner + ands


def _or_terms(graph: Graph, node: torch.fx.Node) -> tuple[list[torch.fx.Node], list[torch.fx.Node]]:
    """(the terms ``a | b | …`` ors, the or nodes); a constant is one term, however it is built."""
    return _terms(graph, node, ORS)


def _terms(graph: Graph, node: torch.fx.Node, ops: set, shared: bool = False) -> tuple[list[torch.fx.Node], list[torch.fx.Node]]:
    """``shared``: a node read by several others is walked too (a mask every layer reads)."""
    if node in graph.constant or node.op != "call_function" or node.target not in ops or (len(node.users) != 1 and not shared):
        return [node], []
    terms, inner = [], [node]
    for arg in node.args[:2]:
        more, nested = _terms(graph, arg, ops, shared)
        terms, inner = terms + more, inner + nested
    return terms, inner


def hidden_pattern(hidden: torch.Tensor) -> dict | None:
    """The mask step's fields (causal, window, chunk, align) that hide where ``hidden`` is True on its last
    two axes, alike for every leading index; None if no pattern does. A window as wide as the
    example's keys hides nothing more than causal does, so it reads as causal."""
    rows, cols = hidden.shape[-2:]
    planes = hidden.reshape(-1, rows, cols)
    if not bool((planes == planes[0]).all()):
        return None
    for fields in _hiding_patterns(rows, cols):
        args = {
            "window": fields.get("window"),
            "chunk": fields.get("chunk"),
            "top_left": "align" in fields,
            "causal": fields.get("causal", False),
        }
        if torch.equal(causal_hidden(torch, rows, cols, **args), planes[0]):
            return fields
    return None


def _hiding_patterns(rows: int, cols: int):
    yield {"causal": True}
    if rows != cols:
        yield {"causal": True, "align": "top-left"}
    for window in range(1, cols):
        yield {"causal": True, "window": window}
    for window in range(1, cols):
        yield {"window": window}
    for chunk in range(1, cols):  # Llama 4's chunked attention: keys in the query's chunk of C
        yield {"causal": True, "chunk": chunk}


def _multi_head_attention(graph: Graph) -> None:
    """``nn.MultiheadAttention`` folds heads into the batch (``view(T, B·H, Dh)``): read it as a
    module, from its nodes' ``nn_module_stack``, and write the computation it stands for."""
    regions: dict[str, list[torch.fx.Node]] = {}
    for node in graph.calls():
        path = next((p for p, cls in module_stack(node) if cls == MHA_CLASS), None)
        if path is not None and node not in graph.constant:
            regions.setdefault(path, []).append(node)
    for path, nodes in regions.items():
        inside = set(nodes)
        read = (a for n in nodes for a in n.all_input_nodes if a not in inside and a not in graph.constant)
        sources = [a for a in dict.fromkeys(read) if graph.kind(a) != "PARAMETER"]
        leaving = [n for n in nodes if any(u not in inside for u in n.users)]
        graph.claim(Idiom("mha", leaving[-1], {"path": path, "sources": sources, "leaving": leaving}), nodes)


def module_stack(node: torch.fx.Node) -> tuple[tuple[str, str], ...]:
    """``nn_module_stack`` as (path, qualified class name), outermost first."""
    return _module_stack(tuple((node.meta.get("nn_module_stack") or {}).values()))


@functools.lru_cache(maxsize=4096)
def _module_stack(stack: tuple[tuple[str, Any], ...]) -> tuple[tuple[str, str], ...]:
    """Written once per distinct stack: each node's is read for its id, its layer and its idioms,
    and the nodes of one module share it."""
    return tuple((path, cls if isinstance(cls, str) else f"{cls.__module__}.{cls.__qualname__}") for path, cls in stack)
