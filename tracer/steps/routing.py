"""Mixture of experts: ``topk`` picks each token's experts, ``moe`` runs the tokens through them."""

from __future__ import annotations

import inspect
from typing import Literal

from pydantic import Field, StrictBool, StrictInt, model_validator

from ..core.dtypes import FLOAT_DTYPES
from ..core.fields import DimText, TensorId
from ..core.layout import fresh, pointwise
from ..core.pysource import py_float
from .contract import Composite, Inner, Outputs, StepBase, register
from .rules import StepError, norm_dim, require_float, require_number_fits, show


@register
class Topk(StepBase):
    """``torch.topk(x, k, dim)``: the ``k`` largest (or smallest) entries along ``dim`` and where they
    are, as two tensors named in ``outputs``: the values (x's dtype) and their indices (int64).
    Not of a bool tensor: torch has no topk for it.

    A router's choice of experts: ``{op: topk, input: router_probs, k: K, outputs: [top_w, top_i]}``.
    ``normalize: true`` divides the values by their sum over the ``k`` (Mixtral renormalises the
    chosen experts' weights: ``top_w /= top_w.sum(dim=-1, keepdim=True)``)."""

    op: Literal["topk"] = "topk"
    k: DimText = Field(description="how many entries to keep along dim")
    dim: StrictInt = -1
    largest: bool = Field(True, description="the largest entries (false: the smallest)")
    sorted: bool = Field(True, description="in order, the largest first")
    normalize: bool = Field(False, description="divide the values by their sum over the k (Mixtral's renormalised routing weights)")
    outputs: list[TensorId] = Field(min_length=2, max_length=2, description="the names of the values and of their indices")
    output_field = "outputs"
    example = """\
- id: route
  op: topk
  input: router_probs      # (N, E) float32
  k: K
  normalize: true          # the K weights of each token sum to 1
  outputs: [top_w, top_i]  # (N, K) float32, (N, K) int64"""

    @model_validator(mode="after")
    def _distinct_outputs(self):
        if self.outputs[0] == self.outputs[1]:
            raise ValueError("the values and the indices need different names")
        return self

    def args(self):
        shown = [f"k={self.k}", f"dim={self.dim}"] + ([] if self.largest else ["smallest"])
        return shown + (["normalize"] if self.normalize else [])

    def infer(self, ins, ctx):
        x = ins[0]
        if self.normalize:
            require_float(x, ctx.input_ids[0], "topk with normalize")
        if x.dtype == "bool":
            raise StepError("dtype", f"torch has no topk of bool tensor '{ctx.input_ids[0]}'", "input", "cast it to int64 or float32 first")
        if not x.shape:
            raise StepError("shape", f"topk needs at least one dim, '{ctx.input_ids[0]}' is 0-d", "input")
        d = norm_dim(self.dim, len(x.shape))
        k = ctx.dim(self.k, "k")
        if not 0 <= k.value <= x.sizes[d]:
            raise StepError(
                "topk-range",
                f"k={k}={k.value} entries do not fit dim {self.dim} of '{ctx.input_ids[0]}' {show(x)} ({x.shape[d]}={x.sizes[d]})",
                "k",
            )
        shape = x.shape[:d] + (k,) + x.shape[d + 1 :]
        values = fresh(shape, x.dtype)
        if self.normalize:
            values = pointwise([values], shape, x.dtype)
        return Outputs({self.outputs[0]: values, self.outputs[1]: fresh(shape, "int64")})

    def kernel(self, k):
        topk, count, d, largest, ordered = k.torch.topk, k.value(self.k), self.dim, self.largest, self.sorted
        if not self.normalize:
            return lambda x: tuple(topk(x, count, d, largest, ordered))

        def renormalised(x):
            values, indices = topk(x, count, d, largest, ordered)
            return values / values.sum(dim=d, keepdim=True), indices

        return renormalised

    def emit(self, e):
        values, indices = e.targets
        call = f"torch.topk({e.args[0]}, {e.dim(self.k)}, dim={self.dim}, largest={self.largest}, sorted={self.sorted})"
        if not self.normalize:
            return f"tuple({call})"
        return [f"{values}, {indices} = {call}", f"{values} = {values} / {values}.sum(dim={self.dim}, keepdim=True)"]


ACTIVATIONS = ("silu", "gelu", "relu2", "clamped_swiglu")


@register
class Moe(StepBase):
    """A sparse mixture of experts (Mixtral's ``MixtralExperts``, GPT-OSS's ``GptOssExperts``): each
    token goes through the ``K`` experts its router chose, and their outputs, each times its
    routing weight, are summed.

    Inputs: the tokens ``(…, d)``, the routing weights ``(…, K)`` and the chosen experts ``(…, K)``
    (int64, from ``topk``). Expert ``e`` computes ``down[e] @ act(gate, up)`` where ``gate`` and
    ``up`` are the two halves of ``gate_up[e] @ x`` (the gate first), as transformers stores them:
    ``gate_up (E, 2F, d)``, ``down (E, d, F)``. The kernel is transformers' own loop, bit for bit:
    experts in ascending order, each on its tokens only, summed with ``index_add_``.

    The variants of other models: ``layout: in_out`` stores the weights ``(E, d, 2F)`` and ``(E, F,
    d)`` and computes ``x @ W + b`` (GPT-OSS); ``gate_up_bias (E, 2F)`` and ``down_bias (E, d)``
    are each expert's biases; ``interleave: true`` takes the gate and up from alternate features
    (``h[..., ::2]``, ``h[..., 1::2]``); ``gated: false`` has no gate, ``gate_up`` being the up
    projection ``(E, F, d)`` alone. Activations: ``silu(gate) * up`` (SwiGLU), ``gelu(gate) * up``,
    ``relu2`` (``relu(gate)**2 * up``, or ``relu(up)**2`` ungated: Nemotron-H), and
    ``clamped_swiglu``, GPT-OSS's::

        gate, up = gate.clamp(max=limit), up.clamp(-limit, limit)
        out = (up + 1) * (gate * sigmoid(gate * alpha))

    Records ``ID/tokens_per_expert`` (E,), how many tokens each expert took (the load a router
    balances), then ``ID/sum``, the output ``(…, d)``."""

    op: Literal["moe"] = "moe"
    arity = 3
    gate_up: TensorId = Field(description="(E, 2F, d) param: every expert's gate and up projections, stacked (gate first)")
    down: TensorId = Field(description="(E, d, F) param: every expert's down projection")
    gate_up_bias: TensorId | None = Field(None, description="(E, 2F) param: each expert's gate and up bias (GPT-OSS)")
    down_bias: TensorId | None = Field(None, description="(E, d) param: each expert's down bias (GPT-OSS)")
    activation: Literal[ACTIVATIONS] = Field("silu", description="silu (SwiGLU, as Mixtral), gelu, relu2, clamped_swiglu (GPT-OSS)")  # type: ignore[valid-type]
    layout: Literal["out_in", "in_out"] = Field("out_in", description="out_in: weights as nn.Linear stores them; in_out: x @ W (GPT-OSS)")
    interleave: StrictBool = Field(False, description="gate and up alternate along the features (GPT-OSS), instead of two halves")
    gated: StrictBool = Field(True, description="false: no gate, gate_up is the up projection (E, F, d) alone")
    alpha: float = Field(1.702, gt=0, description="clamped_swiglu's sigmoid sharpness (config.swiglu_alpha)")
    limit: float = Field(7.0, gt=0, description="clamped_swiglu's clamp (config.swiglu_limit)")
    param_fields = ("gate_up", "down", "gate_up_bias", "down_bias")
    example = """\
- id: moe_out
  op: moe
  inputs: [h, top_w, top_i] # (N, d) tokens, (N, K) weights, (N, K) experts
  gate_up: W_gate_up       # (E, 2F, d)
  down: W_down             # (E, d, F)"""

    @model_validator(mode="after")
    def _consistent(self):
        if not self.gated and (self.interleave or self.activation == "clamped_swiglu"):
            raise ValueError("interleave and clamped_swiglu split a gate from the up projection: they need gated: true")
        return self

    def args(self):
        shown = [] if self.activation == "silu" else [self.activation]
        shown += [] if self.gated else ["ungated"]
        return shown + (["in_out"] if self.layout == "in_out" else []) + (["interleaved"] if self.interleave else [])

    def widths(self, ins) -> tuple[int, int, int]:
        """(d, F, pieces): the model width, an expert's width, and the projections stacked in gate_up (2, or 1 ungated)."""
        gate_up = ins[3].sizes
        d, stacked = (gate_up[1], gate_up[2]) if self.layout == "in_out" else (gate_up[2], gate_up[1])
        pieces = 2 if self.gated else 1
        return d, stacked // pieces, pieces

    def infer(self, ins, ctx):
        x, weights, experts = ins[:3]
        names = ctx.input_ids
        require_float(x, names[0], "moe")
        if weights.dtype not in FLOAT_DTYPES:
            raise StepError("dtype", f"moe's routing weights '{names[1]}' must be floating point, got {weights.dtype}", "inputs")
        if experts.dtype not in ("int64", "int32"):
            raise StepError(
                "dtype", f"moe's chosen experts '{names[2]}' must be integer indices, got {experts.dtype}", "inputs", "take them from topk"
            )
        if not x.shape or weights.sizes != experts.sizes or weights.sizes[:-1] != x.sizes[:-1]:
            raise StepError(
                "moe-shape",
                f"moe needs tokens (…, d), weights (…, K) and experts (…, K) over the same tokens: "
                f"'{names[0]}' {show(x)}, '{names[1]}' {show(weights)}, '{names[2]}' {show(experts)}",
                "inputs",
            )
        self._check_experts(x, ins)
        n_experts = ins[3].shape[0]
        counts = fresh((n_experts,), "int64")
        counts_of_experts = Inner("tokens_per_expert", "bincount", counts, (2,))
        every_input = tuple(range(len(ins)))  # tokens, weights, experts, the expert weights and their biases
        return Composite((counts_of_experts, Inner("sum", "index_add", fresh(x.shape, x.dtype), every_input)))

    def _check_experts(self, x, ins) -> None:
        gate_up, down = ins[3], ins[4]
        d, pieces = x.sizes[-1], 2 if self.gated else 1
        stacked = "2F" if self.gated else "F"
        in_out = self.layout == "in_out"
        wanted = f"(E, {x.shape[-1]}, {stacked})" if in_out else f"(E, {stacked}, {x.shape[-1]})"
        if len(gate_up.shape) != 3 or gate_up.sizes[2 if in_out else 1] % pieces or gate_up.sizes[1 if in_out else 2] != d:
            raise StepError("moe-shape", f"gate_up '{self.gate_up}' must be {wanted} for tokens {show(x)}, got {show(gate_up)}", "gate_up")
        n, (_, f, _) = gate_up.sizes[0], self.widths(ins)
        expected = (n, f, d) if in_out else (n, d, f)
        if down.sizes != expected:
            shape = "(E, F, d)" if in_out else "(E, d, F)"
            raise StepError(
                "moe-shape",
                f"down '{self.down}' must be {shape} = {list(expected)} to match gate_up {show(gate_up)}, got {show(down)}",
                "down",
            )
        biases = [(self.gate_up_bias, "gate_up_bias", (n, pieces * f)), (self.down_bias, "down_bias", (n, d))]
        present = [(name, field, want) for name, field, want in biases if name is not None]
        for (name, field, want), meta in zip(present, ins[5:]):
            if meta.sizes != want:
                raise StepError("moe-shape", f"{field} '{name}' must be {list(want)}, got {show(meta)}", field)
        for name, p, field in zip(self.param_refs(), ins[3:], [f for f in self.param_fields if getattr(self, f) is not None]):
            if p.dtype != x.dtype:
                raise StepError("dtype", f"moe of {x.dtype} tokens with {p.dtype} '{name}'", field)

    def _options(self) -> dict:
        return {"in_out": self.layout == "in_out", "interleave": self.interleave, "gated": self.gated}

    def kernel(self, k):
        torch, F = k.torch, k.F
        act = expert_activation(self.activation, self.gated, self.alpha, self.limit, torch, F)
        n_experts, error, top = k.ins[3].sizes[0], k.error, self.gate_up
        has_up_bias, has_down_bias, options = self.gate_up_bias is not None, self.down_bias is not None, self._options()

        def moe(x, weights, experts, gate_up, down, *biases):
            biases = list(biases)
            up_bias = biases.pop(0) if has_up_bias else None
            down_bias = biases.pop(0) if has_down_bias else None
            if x.device.type == "meta":  # no values to route: the shapes are all a meta run can have
                return torch.empty(n_experts, dtype=torch.int64, device=x.device), torch.empty_like(x)
            if experts.numel() and (int(experts.min()) < 0 or int(experts.max()) >= n_experts):
                raise error("moe-range", f"an expert index is outside 0..{n_experts - 1} (the experts of '{top}')", "inputs")
            return moe_forward(x, weights, experts, (gate_up, down, up_bias, down_bias), torch, F, act, **options)

        return moe

    def emit(self, e):
        """One call of the module ``MoeExperts`` (made in ``__init__`` with this step's settings, given
        the params): ``tracer import`` captures it whole, as this step (``tracer_step = "moe"``)."""
        x, weights, experts, gate_up, down = e.args[:5]
        biases = list(e.args[5:])
        given = [f"gate_up_bias={biases.pop(0)}"] if self.gate_up_bias is not None else []
        given += [f"down_bias={biases.pop(0)}"] if self.down_bias is not None else []
        for helper in (moe_forward, moe_experts, expert_output, expert_activation, clamped_swiglu):  # what MoeExperts calls
            e.helper(helper.__name__, inspect.getsource(helper))
        cls = e.helper("MoeExperts", EXPERTS_MODULE)
        settings = [f'"{self.activation}"'] + [f"{name}={value!r}" for name, value in self._settings().items()]
        module = e.submodule(e.step_id, f"{cls}({', '.join(settings)})")
        return f"{module}({', '.join([x, weights, experts, gate_up, down, *given])})"

    def _settings(self) -> dict:
        """The module's constructor arguments besides the activation, those not at their defaults."""
        written = {**self._options(), "alpha": self.alpha, "limit": self.limit}
        defaults = {"in_out": False, "interleave": False, "gated": True, "alpha": 1.702, "limit": 7.0}
        return {name: value for name, value in written.items() if value != defaults[name]}


# The module an exported moe step calls. Its class attribute ``tracer_step`` is the marker ``tracer
# import`` recognises (tracer/importer/leaves.py): the module is captured whole, as one moe step with
# the settings it holds, since its loop over the experts the tokens chose is data-dependent control
# flow torch.export cannot trace. It holds no weights: they are the pipeline's params, its caller's.
EXPERTS_MODULE = '''class MoeExperts(nn.Module):
    """A sparse mixture of experts, as tracer's moe step runs it (transformers' MixtralExperts.forward,
    op for op), on the weights it is given. `tracer import` captures a module whose class says
    tracer_step = "moe" whole, as one moe step with these settings."""

    tracer_step = "moe"

    def __init__(self, activation="silu", in_out=False, interleave=False, gated=True, alpha=1.702, limit=7.0):
        super().__init__()
        self.activation, self.in_out, self.interleave, self.gated = activation, in_out, interleave, gated
        self.alpha, self.limit = alpha, limit

    def forward(self, x, weights, chosen, gate_up, down, gate_up_bias=None, down_bias=None):
        act = expert_activation(self.activation, self.gated, self.alpha, self.limit, torch, F)
        projections = (gate_up, down, gate_up_bias, down_bias)
        return moe_forward(x, weights, chosen, projections, torch, F, act, self.in_out, self.interleave, self.gated)[1]
'''


def expert_activation(name, gated, alpha, limit, torch, F):
    """The expert's activation as the kernel calls it: ``act(gate, up)``, or ``act(up)`` ungated."""
    if name == "clamped_swiglu":
        return lambda gate, up: clamped_swiglu(torch, gate, up, alpha, limit)
    one = {"silu": F.silu, "gelu": F.gelu, "relu2": lambda h: torch.square(torch.relu(h))}[name]
    return (lambda gate, up: one(gate) * up) if gated else one


def clamped_swiglu(torch, gate, up, alpha, limit):
    """GPT-OSS's ``GptOssExperts._apply_gate``, op for op."""
    gate = gate.clamp(min=None, max=limit)
    up = up.clamp(min=-limit, max=limit)
    return (up + 1) * (gate * torch.sigmoid(gate * alpha))


def moe_forward(x, weights, chosen, projections, torch, F, act, in_out=False, interleave=False, gated=True):
    """(tokens per expert, output): the tokens of ``x`` (…, d) through the experts ``chosen`` (…, K), each
    times its weight; the step's kernel and an exported module's ``MoeExperts`` both run it."""
    rows = x.shape[:-1].numel()  # not -1: a reshape cannot infer it beside a 0-sized dim
    tokens, chosen = x.reshape(rows, x.shape[-1]), chosen.reshape(rows, chosen.shape[-1])
    counts = torch.bincount(chosen.flatten(), minlength=projections[0].shape[0])
    out = moe_experts(tokens, weights.reshape(chosen.shape), chosen, projections, counts, torch, F, act, in_out, interleave, gated)
    return counts, out.view(x.shape)


def moe_experts(tokens, weights, chosen, projections, counts, torch, F, act, in_out=False, interleave=False, gated=True):
    """transformers' ``MixtralExperts.forward`` (eager; ``GptOssExperts.forward`` likewise), op for
    op: the experts in ascending order, each token's rows in their order (by rank, then token),
    summed with ``index_add_``."""
    out = tokens.new_zeros(tokens.shape)  # zeros_like would copy the layout of a token view; the sums are the same
    for expert in counts.nonzero().flatten().tolist():
        rank, token = torch.where(chosen.t() == expert)
        own = [None if p is None else p[expert] for p in projections]
        y = expert_output(tokens[token], own, F, act, in_out, interleave, gated) * weights[token, rank, None]
        out.index_add_(0, token, y.to(out.dtype))
    return out


def expert_output(x, projections, F, act, in_out, interleave, gated):
    """One expert on its tokens; its temporaries die when it returns, before the next expert runs."""
    gate_up, down, up_bias, down_bias = projections
    if in_out:  # GPT-OSS: current_state @ W + b
        h = x @ gate_up if up_bias is None else x @ gate_up + up_bias
    else:
        h = F.linear(x, gate_up, up_bias)
    if not gated:
        y = act(h)
    elif interleave:
        y = act(h[..., ::2], h[..., 1::2])
    else:
        y = act(*h.chunk(2, dim=-1))
    if in_out:
        return y @ down if down_bias is None else y @ down + down_bias
    return F.linear(y, down, down_bias)


def _index_check(k, index_field: str, dim: int):
    """A run-time check that torch would answer with a bare RuntimeError: every index inside the dim."""
    sizes, error = k.ins[0].sizes, k.error
    size = sizes[dim % len(sizes)] if sizes else 1

    def check(index):
        if index.numel() and index.device.type != "meta":
            low, high = int(index.min()), int(index.max())
            if low < 0 or high >= size:
                raise error(
                    "index-range", f"index {low if low < 0 else high} is outside dim {dim} (size {size}: 0..{size - 1})", index_field
                )

    return check


def _check_index(x, index, dim: int, names: list[str], op: str, compare_all: bool):
    """torch's rule for gather and scatter: an int64 index of the same rank, no larger than the
    input along every other dim (than ``src`` too, for scatter)."""
    if index.dtype != "int64":
        raise StepError("dtype", f"{op} needs an int64 index, '{names[1]}' is {index.dtype}", "inputs", "cast it: {op: cast, dtype: int64}")
    if len(index.shape) != len(x.shape):
        raise StepError(
            "shape", f"{op} needs an index of the same rank as '{names[0]}' {show(x)}, got '{names[1]}' {show(index)}", "inputs"
        )
    d = norm_dim(dim, len(x.shape)) if x.shape else 0
    for i, (have, want) in enumerate(zip(x.sizes, index.sizes)):
        if (i != d or compare_all) and want > have:
            raise StepError(
                "shape", f"{op}: index '{names[1]}' {show(index)} is larger than '{names[0]}' {show(x)} along dim {i}", "inputs"
            )


@register
class Gather(StepBase):
    """``torch.gather(x, dim, index)``: ``out[i][j] = x[index[i][j]][j]`` along ``dim``; the shape of
    the index. DeepSeek-V3 reads each chosen expert's weight from the scores without the bias
    the choice was made with: ``{op: gather, inputs: [scores, top_i], dim: 1}``."""

    op: Literal["gather"] = "gather"
    arity = 2
    dim: StrictInt = -1
    example = """\
- id: top_w
  op: gather
  inputs: [scores, top_i]  # (N, E) float, (N, K) int64
  dim: 1                   # -> (N, K)"""

    def args(self):
        return [f"dim={self.dim}"]

    def infer(self, ins, ctx):
        x, index = ins
        _check_index(x, index, self.dim, ctx.input_ids, "gather", compare_all=False)
        return fresh(index.shape, x.dtype)

    def kernel(self, k):
        gather, d, check = k.torch.gather, self.dim, _index_check(k, "inputs", self.dim)

        def run(x, index):
            check(index)
            return gather(x, d, index)

        return run

    def emit(self, e):
        return f"torch.gather({e.args[0]}, {self.dim}, {e.args[1]})"


@register
class Scatter(StepBase):
    """``base.scatter(dim, index, src)`` as a new tensor (base is left as it was):
    ``out[index[i][j]][j] = src[i][j]`` along ``dim``, or ``value`` instead of ``src``;
    ``reduce: add`` adds into the base instead (``scatter_add``). Mixtral's routing weights as a
    dense (N, E) table: ``{op: scatter, inputs: [zeros, top_i, top_w], dim: 1}``."""

    op: Literal["scatter"] = "scatter"
    arity = None
    dim: StrictInt = -1
    value: float | None = Field(None, description="a number written at every index, instead of a src tensor")
    reduce: Literal["none", "add"] = Field("none", description="add: sum into the base (scatter_add) rather than overwrite")
    example = """\
- id: dense_w
  op: scatter
  inputs: [zeros, top_i, top_w]   # base (N, E), index (N, K) int64, src (N, K)
  dim: 1                   # -> (N, E): each token's weights at its experts, 0 elsewhere"""

    def args(self):
        shown = [f"dim={self.dim}"] + ([f"value={self.value:g}"] if self.value is not None else [])
        return shown + (["add"] if self.reduce == "add" else [])

    def infer(self, ins, ctx):
        names = ctx.input_ids
        wanted = 2 if self.value is not None else 3
        if len(ins) != wanted:
            form = "[base, index] with value" if self.value is not None else "[base, index, src] (or [base, index] and value:)"
            raise StepError("arity", f"scatter takes inputs {form}, got {len(ins)}", "inputs")
        base, index = ins[0], ins[1]
        _check_index(base, index, self.dim, names, "scatter", compare_all=False)
        if self.value is not None:
            require_number_fits(self.value, base.dtype, "scatter's value", "value")
        if len(ins) == 3:
            src = ins[2]
            if src.dtype != base.dtype:
                raise StepError("dtype", f"scatter of {src.dtype} '{names[2]}' into {base.dtype} '{names[0]}'", "inputs")
            _check_index(src, index, self.dim, [names[2], names[1]], "scatter", compare_all=True)
        return fresh(base.shape, base.dtype)

    def kernel(self, k):
        d, value, add, check = self.dim, self.value, self.reduce == "add", _index_check(k, "inputs", self.dim)

        def run(base, index, src=None):
            check(index)
            if src is None:
                return base.scatter(d, index, value, reduce="add") if add else base.scatter(d, index, value)
            return base.scatter_add(d, index, src) if add else base.scatter(d, index, src)

        return run

    def emit(self, e):
        base, index = e.args[:2]
        operand = e.args[2] if self.value is None else py_float(self.value)
        if self.reduce == "add":
            return (
                f"{base}.scatter_add({self.dim}, {index}, {operand})"
                if self.value is None
                else f'{base}.scatter({self.dim}, {index}, {operand}, reduce="add")'
            )
        return f"{base}.scatter({self.dim}, {index}, {operand})"
