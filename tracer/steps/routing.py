"""Mixture of experts: ``topk`` picks each token's experts, ``moe`` runs the tokens through them."""

from __future__ import annotations

import inspect
import math
from typing import Literal

from pydantic import Field, StrictInt, model_validator

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


@register
class Moe(StepBase):
    """A sparse mixture of gated experts (Mixtral's ``MixtralExperts``): each token goes through the
    ``K`` experts its router chose, and their outputs, each times its routing weight, are summed.

    Inputs: the tokens ``(…, d)``, the routing weights ``(…, K)`` and the chosen experts ``(…, K)``
    (int64, from ``topk``). Expert ``e`` computes ``down[e] @ (act(gate) * up)`` where ``gate`` and
    ``up`` are the two halves of ``gate_up[e] @ x`` (the gate first), as transformers stores them:
    ``gate_up (E, 2F, d)``, ``down (E, d, F)``. The kernel is transformers' own loop, bit for bit:
    experts in ascending order, each on its tokens only, summed with ``index_add_``.

    Records ``ID/tokens_per_expert`` (E,), how many tokens each expert took (the load a router
    balances), then ``ID/sum``, the output ``(…, d)``."""

    op: Literal["moe"] = "moe"
    arity = 3
    gate_up: TensorId = Field(description="(E, 2F, d) param: every expert's gate and up projections, stacked (gate first)")
    down: TensorId = Field(description="(E, d, F) param: every expert's down projection")
    activation: Literal["silu", "gelu"] = Field("silu", description="applied to the gate half (silu: SwiGLU, as Mixtral)")
    param_fields = ("gate_up", "down")
    example = """\
- id: moe_out
  op: moe
  inputs: [h, top_w, top_i] # (N, d) tokens, (N, K) weights, (N, K) experts
  gate_up: W_gate_up       # (E, 2F, d)
  down: W_down             # (E, d, F)"""

    def args(self):
        return [] if self.activation == "silu" else [self.activation]

    def infer(self, ins, ctx):
        x, weights, experts, gate_up, down = ins
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
        self._check_experts(x, gate_up, down)
        n_experts = gate_up.shape[0]
        counts = fresh((n_experts,), "int64")
        counts_of_experts = Inner("tokens_per_expert", "bincount", counts, (2,))
        return Composite((counts_of_experts, Inner("sum", "index_add", fresh(x.shape, x.dtype), (0, 1, 2, 3, 4))))

    def _check_experts(self, x, gate_up, down) -> None:
        if len(gate_up.shape) != 3 or gate_up.sizes[1] % 2 or gate_up.sizes[2] != x.sizes[-1]:
            raise StepError(
                "moe-shape",
                f"gate_up '{self.gate_up}' must be (E, 2F, {x.shape[-1]}) for tokens {show(x)}, got {show(gate_up)}",
                "gate_up",
            )
        expected = (gate_up.sizes[0], x.sizes[-1], gate_up.sizes[1] // 2)
        if down.sizes != expected:
            raise StepError(
                "moe-shape",
                f"down '{self.down}' must be (E, d, F) = {list(expected)} to match gate_up {show(gate_up)}, got {show(down)}",
                "down",
            )
        for name, p, field in ((self.gate_up, gate_up, "gate_up"), (self.down, down, "down")):
            if p.dtype != x.dtype:
                raise StepError("dtype", f"moe of {x.dtype} tokens with {p.dtype} '{name}'", field)

    def kernel(self, k):
        torch, F = k.torch, k.F
        act = F.silu if self.activation == "silu" else F.gelu
        n_experts, error, top = k.ins[3].sizes[0], k.error, self.gate_up

        def moe(x, weights, experts, gate_up, down):
            rows = math.prod(x.shape[:-1])  # not -1: a reshape cannot infer it beside a 0-sized dim
            tokens, chosen = x.reshape(rows, x.shape[-1]), experts.reshape(rows, experts.shape[-1])
            if x.device.type == "meta":  # no values to route: the shapes are all a meta run can have
                return torch.empty(n_experts, dtype=torch.int64, device=x.device), torch.empty_like(x)
            if chosen.numel() and (int(chosen.min()) < 0 or int(chosen.max()) >= n_experts):
                raise error("moe-range", f"an expert index is outside 0..{n_experts - 1} (the experts of '{top}')", "inputs")
            counts = torch.bincount(chosen.flatten(), minlength=n_experts)
            out = moe_experts(tokens, weights.reshape(chosen.shape), chosen, gate_up, down, counts, torch, F, act)
            return counts, out.view(x.shape)

        return moe

    def emit(self, e):
        (out,), counts = e.targets, e.local("counts")  # a composite's source computes its last tensor
        rows = " * ".join(e.size(d) for d in e.ins[0].shape[:-1]) or "1"
        x, weights, experts, gate_up, down = e.args
        e.helper(gated_expert.__name__, inspect.getsource(gated_expert))
        helper = e.helper(moe_experts.__name__, inspect.getsource(moe_experts))
        act = "F.silu" if self.activation == "silu" else "F.gelu"
        return [
            f"{counts} = torch.bincount({experts}.flatten(), minlength={gate_up}.shape[0])",
            f"{out} = {helper}({x}.reshape({rows}, {x}.shape[-1]), {weights}.reshape({rows}, {weights}.shape[-1]), "
            f"{experts}.reshape({rows}, {experts}.shape[-1]), {gate_up}, {down}, {counts}, torch, F, {act}).view({x}.shape)",
        ]


def moe_experts(tokens, weights, chosen, gate_up, down, counts, torch, F, act):
    """transformers' ``MixtralExperts.forward`` (eager), op for op: the experts in ascending order,
    each token's rows in their order (by rank, then token), summed with ``index_add_``."""
    out = tokens.new_zeros(tokens.shape)  # zeros_like would copy the layout of a token view; the sums are the same
    for expert in counts.nonzero().flatten().tolist():
        rank, token = torch.where(chosen.t() == expert)
        y = gated_expert(tokens[token], gate_up[expert], down[expert], F, act) * weights[token, rank, None]
        out.index_add_(0, token, y.to(out.dtype))
    return out


def gated_expert(x, gate_up, down, F, act):
    """One expert on its tokens; its temporaries die when it returns, before the next expert runs."""
    gate, up = F.linear(x, gate_up).chunk(2, dim=-1)
    return F.linear(act(gate) * up, down)


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
