"""Layout steps: reshaping, reordering, slicing and joining tensors — and whether they copy."""

from __future__ import annotations

import math
from typing import Literal

from pydantic import Field, StrictInt, model_validator

from ..core import dimexpr
from ..core.dtypes import promote
from ..core.fields import DimText, TensorId
from ..core.layout import Meta, cat_layout, fresh, view, view_strides, with_root
from ..core.pysource import py_tuple
from ..core.static import reshaped, transposed
from .contract import Composite, Inner, Outputs, Slicing, StepBase, register
from .rules import DimCause, StepError, norm_dim, py_shape, show


def _target_shape(step, x, ctx):
    """Resolve a view/reshape target (at most one -1) and check it multiplies out."""
    dims, infer_at = [], None
    for i, text in enumerate(step.shape):
        if text == -1:
            if infer_at is not None:
                raise StepError("view-shape", "only one dim can be -1", "shape")
            infer_at = i
            dims.append(None)
        else:
            dims.append(ctx.dim(text, "shape"))
    total = math.prod(x.sizes)
    known = math.prod(d.value for d in dims if d is not None)
    if infer_at is not None:
        if known == 0 or total % known:
            raise StepError("view-shape", f"cannot infer -1: input {show(x)} has {total} elements, not a multiple of {known}", "shape")
        # only an inferred dim needs the symbolic products: (B*T*d_model) // (B*T) names itself d_model
        dims[infer_at] = ctx.alg.floordiv(ctx.alg.product(list(x.shape)), ctx.alg.product([d for d in dims if d is not None]))
    elif known != total:
        target = "(" + ", ".join(str(d) for d in dims) + ")"
        concrete = "[" + ", ".join(str(d.value) for d in dims) + "]"
        raise StepError(
            "view-shape",
            f"{step.op} to {target} {concrete} needs {known} elements, '{ctx.input_ids[0]}' {show(x)} has {total}",
            "shape",
            cause=_derived_cause(step.shape, dims, x, ctx),
        )
    return tuple(dims)


def _derived_cause(texts, dims, x, ctx) -> DimCause | None:
    """The one dim of the target written as a derived dim's name (``Dh``, defined ``d_model // 2``)
    whose value alone keeps the element counts apart: the value it would need, and the expression
    over the dims that has it, from the input's dims divided by the target's others (``d_model // H``)."""
    exprs = ctx.alg.exprs
    derived = [i for i, text in enumerate(texts) if isinstance(text, str) and text in exprs and not dimexpr.is_number(exprs[text])]
    if len(derived) != 1:
        return None
    at = derived[0]
    others = ctx.alg.product([d for i, d in enumerate(dims) if i != at])
    total = math.prod(x.sizes)
    if others.value == 0 or total % others.value:
        return None
    needed = total // others.value
    quotient = ctx.alg.product(list(x.shape)).poly.divide(others.poly)
    written = str(ctx.alg.make(quotient, needed)) if quotient is not None and quotient.constant is None else ""
    return DimCause(texts[at], needed, written)


@register
class View(StepBase):
    """``x.view(*shape)``: same storage, new shape; fails on layouts a view cannot express."""

    op: Literal["view"] = "view"
    keeps_values = True
    regroups = True
    shape: list[DimText] = Field(max_length=16, description="target shape; one entry may be -1")
    example = """\
- id: q_heads
  op: view
  input: q                 # (B, T, d_model)
  shape: [B, T, H, Dh]     # -> (B, T, H, Dh), shares q's storage"""

    def args(self):
        return ["(" + ", ".join(str(s) for s in self.shape) + ")"]

    def infer(self, ins, ctx):
        x = ins[0]
        shape = _target_shape(self, x, ctx)
        strides = view_strides(x.sizes, x.stride, tuple(d.value for d in shape))
        if strides is None:
            raise StepError(
                "view-non-contiguous",
                f"view to {'(' + ', '.join(map(str, shape)) + ')'} is impossible: '{ctx.input_ids[0]}' {show(x)} is not contiguous "
                f"(stride {x.stride}), so its elements cannot be regrouped without a copy",
                "op",
                "add `op: contiguous` before it (as tutorial 002 does), or use `op: reshape`, which copies when it must",
            )
        return view(x, shape, strides)

    def kernel(self, k):
        sizes = k.out.sizes
        return lambda x: x.view(sizes)

    def static(self, ins, sizes, value):
        return reshaped(ins[0], sizes)

    def emit(self, e):
        return f"{e.args[0]}.view({py_shape(e, self.shape)})"


@register
class Reshape(StepBase):
    """``x.reshape(*shape)``: a view when the layout allows it, otherwise a contiguous copy."""

    op: Literal["reshape"] = "reshape"
    keeps_values = True
    copies_data = True  # when the layout forces it; a view otherwise (the record says which)
    regroups = True
    shape: list[DimText] = Field(max_length=16, description="target shape; one entry may be -1")
    example = """\
- id: attention_heads
  op: reshape
  input: heads_t           # (B, T, H, d_k), not contiguous
  shape: [B, T, d_model]   # copies, because a view is impossible here"""

    def args(self):
        return ["(" + ", ".join(str(s) for s in self.shape) + ")"]

    def infer(self, ins, ctx):
        x = ins[0]
        shape = _target_shape(self, x, ctx)
        strides = view_strides(x.sizes, x.stride, tuple(d.value for d in shape))
        return fresh(shape, x.dtype) if strides is None else view(x, shape, strides)

    def kernel(self, k):
        sizes = k.out.sizes
        return lambda x: x.reshape(sizes)

    def static(self, ins, sizes, value):
        return reshaped(ins[0], sizes)

    def emit(self, e):
        return f"{e.args[0]}.reshape({py_shape(e, self.shape)})"


@register
class Transpose(StepBase):
    """``x.transpose(a, b)``: swaps two dims; a view, usually not contiguous."""

    op: Literal["transpose"] = "transpose"
    keeps_values = True
    axis_fields = ("dims",)
    dims: list[StrictInt] = Field(min_length=2, max_length=2, description="the two dims to swap, e.g. [1, 2] or [-2, -1]")
    example = """\
- id: k_t
  op: transpose
  input: k                 # (B, H, T, Dh)
  dims: [-2, -1]           # -> (B, H, Dh, T), a non-contiguous view"""

    def args(self):
        return [f"{self.dims[0]}, {self.dims[1]}"]

    def infer(self, ins, ctx):
        x = ins[0]
        a, b = (norm_dim(d, len(x.shape), "dims") for d in self.dims)
        shape, stride = list(x.shape), list(x.stride)
        shape[a], shape[b] = shape[b], shape[a]
        stride[a], stride[b] = stride[b], stride[a]
        return view(x, tuple(shape), tuple(stride))

    def kernel(self, k):
        a, b = self.dims
        return lambda x: x.transpose(a, b)

    def static(self, ins, sizes, value):
        rank = len(ins[0].sizes)
        return transposed(ins[0], self.dims[0] % rank, self.dims[1] % rank)

    def emit(self, e):
        return f"{e.args[0]}.transpose({self.dims[0]}, {self.dims[1]})"

    def canonical(self, input_rank, output_rank):
        op, fields = super().canonical(input_rank, output_rank)
        return op, {**fields, "dims": sorted(fields["dims"])}  # [-1, -2] swaps what [-2, -1] swaps


@register
class Permute(StepBase):
    """``x.permute(*dims)``: reorders all dims; a view."""

    op: Literal["permute"] = "permute"
    keeps_values = True
    axis_fields = ("dims",)
    dims: list[StrictInt] = Field(max_length=16, description="a permutation of the input's dims")
    example = """\
- id: multihead_keys_p
  op: permute
  input: multihead_keys    # (h, d_k, T)
  dims: [0, 2, 1]          # -> (h, T, d_k)"""

    def args(self):
        return [", ".join(map(str, self.dims))]

    def infer(self, ins, ctx):
        x = ins[0]
        dims = [norm_dim(d, len(x.shape), "dims") for d in self.dims]
        if sorted(dims) != list(range(len(x.shape))):
            raise StepError("permute-dims", f"dims {self.dims} are not a permutation of the {len(x.shape)} dims of {show(x)}", "dims")
        return view(x, tuple(x.shape[d] for d in dims), tuple(x.stride[d] for d in dims))

    def kernel(self, k):
        dims = tuple(self.dims)
        return lambda x: x.permute(dims)

    def emit(self, e):
        return f"{e.args[0]}.permute({', '.join(map(str, self.dims)) or '()'})"

    def canonical(self, input_rank, output_rank):
        op, fields = super().canonical(input_rank, output_rank)
        moved = [axis for axis, source in enumerate(fields["dims"]) if axis != source]
        if input_rank is not None and len(moved) == 2:  # it swaps two axes: that transpose
            return "transpose", {"dims": moved}
        return op, fields


@register
class Contiguous(StepBase):
    """``x.contiguous()``: copies into row-major order, or returns ``x`` itself if it already is."""

    op: Literal["contiguous"] = "contiguous"
    keeps_values = True
    copies_data = True
    example = """\
- id: ctx_c
  op: contiguous
  input: ctx_t             # (B, T, H, Dh) non-contiguous -> contiguous copy"""

    def infer(self, ins, ctx):
        x = ins[0]
        return x if x.contiguous else fresh(x.shape, x.dtype)

    def kernel(self, k):
        return lambda x: x.contiguous()

    def static(self, ins, sizes, value):
        return reshaped(ins[0], sizes)

    def emit(self, e):
        return f"{e.args[0]}.contiguous()"


@register
class Unsqueeze(StepBase):
    """``x.unsqueeze(dim)``: inserts a size-1 dim; a view."""

    op: Literal["unsqueeze"] = "unsqueeze"
    keeps_values = True
    counts_output_axes = True
    dim: StrictInt
    example = """\
- id: x_in
  op: unsqueeze
  input: embedded_sentence # (T, d)
  dim: 0                   # -> (1, T, d)"""

    def args(self):
        return [f"dim={self.dim}"]

    def infer(self, ins, ctx):
        x = ins[0]
        n = len(x.shape) + 1
        d = norm_dim(self.dim, n)
        sizes, strides = list(x.sizes), list(x.stride)
        new_stride = 1 if d >= len(sizes) else sizes[d] * strides[d]
        shape = x.shape[:d] + (ctx.alg.const(1),) + x.shape[d:]
        return view(x, shape, tuple(strides[:d] + [new_stride] + strides[d:]))

    def kernel(self, k):
        d = self.dim
        return lambda x: x.unsqueeze(d)

    def static(self, ins, sizes, value):
        return reshaped(ins[0], sizes)

    def emit(self, e):
        return f"{e.args[0]}.unsqueeze({self.dim})"


@register
class Repeat(StepBase):
    """``x.repeat(*repeats)``: tiles the tensor (a copy); extra leading repeats add dims."""

    op: Literal["repeat"] = "repeat"
    keeps_values = True
    copies_data = True
    repeats: list[DimText] = Field(max_length=16)
    example = """\
- id: stacked_inputs
  op: repeat
  input: x_t               # (d, T)
  repeats: [h, 1, 1]       # -> (h, d, T)"""

    def args(self):
        return [", ".join(map(str, self.repeats))]

    def tiling(self):
        return list(self.repeats)

    def infer(self, ins, ctx):
        x = ins[0]
        reps = [ctx.dim(r, "repeats") for r in self.repeats]
        if len(reps) < len(x.shape):
            raise StepError("repeat-dims", f"repeat needs at least {len(x.shape)} repeats for {show(x)}, got {len(reps)}", "repeats")
        if any(r.value < 0 for r in reps):
            raise StepError("repeat-dims", "repeats must not be negative", "repeats")
        one = ctx.alg.const(1)
        padded = (one,) * (len(reps) - len(x.shape)) + x.shape
        shape = tuple(d if r.value == 1 else (r if d.value == 1 else ctx.alg.mul(r, d)) for r, d in zip(reps, padded))
        return fresh(shape, x.dtype)

    def kernel(self, k):
        reps = tuple(k.value(r) for r in self.repeats)
        return lambda x: x.repeat(reps)

    def emit(self, e):
        return f"{e.args[0]}.repeat({py_shape(e, self.repeats)})"


@register
class Index(StepBase):
    """``x.select(dim, index)`` (drops the dim) or ``x[..., start:stop:step]`` along ``dim``; a view."""

    op: Literal["index"] = "index"
    keeps_values = True
    dim: StrictInt = 0
    index: DimText | None = Field(None, description="select one position (the dim disappears)")
    start: DimText | None = Field(None, description="slice start (default 0)")
    stop: DimText | None = Field(None, description="slice stop (default the dim's size)")
    step: DimText | None = Field(None, description="slice step (default 1)")
    example = """\
- id: x_2
  op: index
  input: embedded_sentence # (T, d)
  dim: 0
  index: 1                 # -> (d,), the second token"""

    @model_validator(mode="after")
    def _select_or_slice(self):
        if self.index is not None and any(v is not None for v in (self.start, self.stop, self.step)):
            raise ValueError("give 'index' (select) or 'start'/'stop'/'step' (slice), not both")
        return self

    def slicing(self):
        return None if self.index is not None else Slicing(self.dim, self.start, self.stop, self.step)

    def args(self):
        if self.index is not None:
            return [f"dim={self.dim}", f"[{self.index}]"]
        return [
            f"dim={self.dim}",
            f"[{'' if self.start is None else self.start}:{'' if self.stop is None else self.stop}"
            + ("" if self.step is None else f":{self.step}")
            + "]",
        ]

    def infer(self, ins, ctx):
        x = ins[0]
        d = norm_dim(self.dim, len(x.shape))
        size, stride = x.shape[d], x.stride[d]
        if self.index is not None:
            i = ctx.dim(self.index, "index").value
            if not -size.value <= i < size.value:
                raise StepError("index-range", f"index {i} is out of range for dim {self.dim} of size {size}={size.value}", "index")
            i %= size.value
            return view(x, x.shape[:d] + x.shape[d + 1 :], x.stride[:d] + x.stride[d + 1 :], x.offset + i * stride)
        start = ctx.dim(self.start, "start") if self.start is not None else ctx.alg.const(0)
        stop = ctx.dim(self.stop, "stop") if self.stop is not None else size
        step = ctx.dim(self.step, "step") if self.step is not None else ctx.alg.const(1)
        if step.value <= 0:
            raise StepError("index-range", "slice step must be positive", "step")
        lo, hi = _clamp(start.value, size.value), _clamp(stop.value, size.value)
        if not 0 <= start.value <= size.value or not 0 <= stop.value <= size.value or lo > hi:
            raise StepError(
                "index-range", f"slice {start.value}:{stop.value} does not fit dim {self.dim} of size {size}={size.value}", "start"
            )
        if step.value == 1:
            length = ctx.alg.add(stop, ctx.alg.mul(start, ctx.alg.const(-1)))
        else:
            length = ctx.alg.const(-(-(hi - lo) // step.value))
        shape = x.shape[:d] + (length,) + x.shape[d + 1 :]
        strides = x.stride[:d] + (stride * step.value,) + x.stride[d + 1 :]
        return view(x, shape, strides, x.offset + lo * stride)

    def kernel(self, k):
        d = self.dim
        if self.index is not None:
            i = k.value(self.index)
            return lambda x: x.select(d, i)
        start = k.value(self.start) if self.start is not None else None
        stop = k.value(self.stop) if self.stop is not None else None
        step = k.value(self.step) if self.step is not None else None
        where = (slice(None),) * (d % len(k.ins[0].shape)) + (slice(start, stop, step),)
        return lambda x: x[where]

    def emit(self, e):
        if self.index is not None:
            return f"{e.args[0]}.select({self.dim}, {e.dim(self.index)})"
        bounds = ["" if t is None else e.dim(t) for t in (self.start, self.stop)]
        cut = ":".join(bounds) + ("" if self.step is None else f":{e.dim(self.step)}")
        return f"{e.args[0]}[{':, ' * (self.dim % len(e.ins[0].shape))}{cut}]"


@register
class Unbind(StepBase):
    """``x.unbind(dim)``: every position along ``dim`` as a tensor of its own, the dim dropped
    (views): ``q, k, v = qkv.unbind(2)`` of a stacked (B, T, 3, H, Dh) projection. ``outputs``
    names one tensor per position."""

    op: Literal["unbind"] = "unbind"
    keeps_values = True
    dim: StrictInt = 0
    outputs: list[TensorId] = Field(min_length=1, max_length=64, description="the names of the pieces, one per position along dim")
    output_field = "outputs"
    example = """\
- id: qkv_unbind
  op: unbind
  input: qkv               # (3, B, H, T, Dh)
  dim: 0
  outputs: [q, k, v]       # three (B, H, T, Dh) views"""

    @model_validator(mode="after")
    def _distinct(self):
        if len(set(self.outputs)) != len(self.outputs):
            raise ValueError("every name in 'outputs' must be different")
        return self

    def args(self):
        return [f"dim={self.dim}"]

    def infer(self, ins, ctx):
        x = ins[0]
        d = norm_dim(self.dim, len(x.shape))
        if x.shape[d].value != len(self.outputs):
            raise StepError(
                "split-outputs",
                f"dim {self.dim} of {show(x)} has {x.shape[d].value} positions, but 'outputs' names {len(self.outputs)}",
                "outputs",
            )
        shape, stride = x.shape[:d] + x.shape[d + 1 :], x.stride[:d] + x.stride[d + 1 :]
        return Outputs({name: view(x, shape, stride, x.offset + i * x.stride[d]) for i, name in enumerate(self.outputs)})

    def kernel(self, k):
        d = self.dim
        return lambda x: x.unbind(d)

    def emit(self, e):
        return f"{e.args[0]}.unbind({self.dim})"


def _clamp(i: int, size: int) -> int:
    return max(0, min(i, size))


@register
class Cat(StepBase):
    """``torch.cat(inputs, dim)``: joins tensors along an existing dim (a copy).

    The joined dim is the sum of the inputs' (``d + d``, ``1 + 1 + 1 + 1`` = 4). ``size`` names it
    where the parts are a dim taken apart: StableLM's per-head norm splits the H heads into H
    tensors of one head, normalises each with its own weights and joins them back, ``size: H``;
    the shape pass checks that the parts add up to it."""

    op: Literal["cat"] = "cat"
    copies_data = True
    arity = None
    dim: StrictInt = 0
    size: DimText | None = Field(
        None, description="the joined dim as a dim expression (H for heads split and joined back); default: the sum"
    )
    example = """\
- id: combined_context
  op: cat
  inputs: [context_h0, context_h1, context_h2]   # 3 x (1, 1) -> (1, 3)
  dim: 1"""

    def args(self):
        return [f"dim={self.dim}"] + ([] if self.size is None else [f"size={self.size}"])

    def joins(self):
        return self.dim

    def infer(self, ins, ctx):
        first = ins[0]
        d = norm_dim(self.dim, len(first.shape))
        for name, other in zip(ctx.input_ids[1:], ins[1:]):
            same_rank = len(other.shape) == len(first.shape)
            if not same_rank or any(a.value != b.value for i, (a, b) in enumerate(zip(first.shape, other.shape)) if i != d):
                raise StepError(
                    "cat-shape",
                    f"cat along dim {self.dim} needs equal shapes elsewhere: '{ctx.input_ids[0]}' {show(first)} vs '{name}' {show(other)}",
                    "inputs",
                )
        total = first.shape[d]
        for other in ins[1:]:
            total = ctx.alg.add(total, other.shape[d])
        if self.size is not None:
            total = self._named(total, ctx)
        return cat_layout(ins, first.shape[:d] + (total,) + first.shape[d + 1 :], promote(ins))  # torch.cat promotes: f32 + f64 is f64

    def _named(self, total, ctx):
        named = ctx.dim(self.size, "size")
        if named.value != total.value:
            joined = str(total) if str(total) == str(total.value) else f"{total}={total.value}"
            raise StepError(
                "cat-shape",
                f"cat along dim {self.dim} joins {len(ctx.input_ids)} inputs into {joined}, not size {named}={named.value}",
                "size",
                f"give as many inputs as {named} is (or drop size: the sum is the joined dim)",
            )
        return named

    def kernel(self, k):
        cat, d = k.torch.cat, self.dim
        return lambda *xs: cat(xs, d)

    def emit(self, e):
        return f"torch.cat({py_tuple(e.args)}, dim={self.dim})"


@register
class Roll(StepBase):
    """``torch.roll(x, shifts, dims)``: elements shifted along each dim, those that leave one end
    coming back at the other (a copy). Each shift is a dim expression (``-1``, ``W``)."""

    op: Literal["roll"] = "roll"
    copies_data = True
    keeps_values = True
    shifts: DimText | list[DimText] = Field(description="how far along each dim (negative: towards the start)")
    dims: StrictInt | list[StrictInt] = Field(description="the dim or dims, one per shift")
    axis_fields = ("dims",)
    example = """\
- id: previous_token
  op: roll
  input: x                 # (B, T, d)
  shifts: 1
  dims: 1                  # token t reads token t - 1 (the first reads the last)"""

    def _pairs(self) -> list[tuple[int | str, int]]:
        shifts = self.shifts if isinstance(self.shifts, list) else [self.shifts]
        dims = self.dims if isinstance(self.dims, list) else [self.dims]
        if len(shifts) != len(dims):
            raise StepError("roll", f"{len(shifts)} shifts for {len(dims)} dims: give one shift per dim", "shifts")
        return list(zip(shifts, dims))

    def args(self):
        return [f"shifts={self.shifts}", f"dims={self.dims}"]

    def infer(self, ins, ctx):
        x = ins[0]
        for shift, dim in self._pairs():
            norm_dim(dim, len(x.shape), "dims")
            ctx.dim(shift, "shifts")
        return fresh(x.shape, x.dtype)

    def kernel(self, k):
        roll, pairs = k.torch.roll, self._pairs()
        shifts, dims = tuple(k.value(s) for s, _ in pairs), tuple(d for _, d in pairs)
        return lambda x: roll(x, shifts, dims)

    def emit(self, e):
        pairs = self._pairs()
        return f"torch.roll({e.args[0]}, {py_tuple([e.dim(s) for s, _ in pairs])}, {py_tuple([str(d) for _, d in pairs])})"


@register
class Stack(StepBase):
    """``torch.stack(inputs, dim)``: joins equal-shaped tensors along a new dim (a copy)."""

    op: Literal["stack"] = "stack"
    copies_data = True
    counts_output_axes = True
    arity = None
    dim: StrictInt = 0
    example = """\
- id: attn_weights
  op: stack
  inputs: [weights_h0, weights_h1]   # 2 x (B, T, T) -> (2, B, T, T)
  dim: 0"""

    def args(self):
        return [f"dim={self.dim}"]

    def infer(self, ins, ctx):
        first = ins[0]
        for name, other in zip(ctx.input_ids[1:], ins[1:]):
            if other.sizes != first.sizes:
                raise StepError(
                    "stack-shape", f"stack needs equal shapes: '{ctx.input_ids[0]}' {show(first)} vs '{name}' {show(other)}", "inputs"
                )
        d = norm_dim(self.dim, len(first.shape) + 1)
        shape, dtype = first.shape[:d] + (ctx.alg.const(len(ins)),) + first.shape[d:], promote(ins)
        if d == len(first.shape):  # ATen: cat of the inputs unsqueezed at the end (the new dim's stride is 1)
            return cat_layout([Meta(m.shape + (ctx.alg.const(1),), m.stride + (1,), m.dtype) for m in ins], shape, dtype)
        # ATen: cat along d, then a view that splits d into (len(ins), size)
        joined = cat_layout(ins, first.shape[:d] + (ctx.alg.const(len(ins) * first.sizes[d]),) + first.shape[d + 1 :], dtype)
        return Meta(shape, view_strides(joined.sizes, joined.stride, tuple(x.value for x in shape)), dtype)

    def kernel(self, k):
        stack, d = k.torch.stack, self.dim
        return lambda *xs: stack(xs, d)

    def emit(self, e):
        return f"torch.stack({py_tuple(e.args)}, dim={self.dim})"


@register
class Merge(StepBase):
    """Heads back to the model dim: (…, H, T, Dh) → transpose → contiguous → view (…, T, H·Dh).

    Records its inner tensors as ``ID/transpose``, ``ID/contiguous`` and ``ID/view`` so the copy
    that ``contiguous`` makes is visible.
    """

    op: Literal["merge"] = "merge"
    keeps_values = True
    example = """\
- id: context
  op: merge
  input: ctx               # (B, H, T, Dh) -> (B, T, d_model)"""

    def infer(self, ins, ctx):
        x = ins[0]
        if len(x.shape) < 3:
            raise StepError("merge-shape", f"merge needs (…, H, T, Dh), got {show(x)}", "input")
        shape, stride = list(x.shape), list(x.stride)
        shape[-3], shape[-2] = shape[-2], shape[-3]
        stride[-3], stride[-2] = stride[-2], stride[-3]
        transposed = view(x, tuple(shape), tuple(stride))
        copied = transposed if transposed.contiguous else with_root(fresh(transposed.shape, x.dtype), ctx.record("contiguous"))
        merged_shape = copied.shape[:-2] + (ctx.alg.mul(copied.shape[-2], copied.shape[-1]),)
        merged = view(copied, merged_shape, view_strides(copied.sizes, copied.stride, tuple(d.value for d in merged_shape)))
        return Composite(
            (Inner("transpose", "transpose", transposed), Inner("contiguous", "contiguous", copied), Inner("view", "view", merged))
        )

    def kernel(self, k):
        sizes = k.out.sizes

        def merge(x):
            t = x.transpose(-3, -2)
            c = t.contiguous()
            return t, c, c.view(sizes)

        return merge

    def emit(self, e):
        # tutorial 002 / nanoGPT: y.transpose(1, 2).contiguous().view(B, T, C)
        return f"{e.args[0]}.transpose(-3, -2).contiguous().view({', '.join(e.size(d) for d in e.out.shape)})"


@register
class Split(StepBase):
    """``x.split(sizes, dim)`` or ``x.chunk(chunks, dim)``: views of consecutive slices, each a tensor of its own.

    GPT-2's fused projection, ``q, k, v = self.c_attn(x).split(self.n_embd, dim=2)``, is
    ``{op: split, dim: 2, sizes: d_model, outputs: [q, k, v]}``. ``sizes`` is one size for equal
    pieces (torch.split's int) or a list, one per output; ``chunks`` divides the dim evenly.
    Every name in ``outputs`` is a tensor id later steps, ``expect:`` and ``outputs:`` read; the
    step's own ``id`` names the split in diagrams and errors.
    """

    op: Literal["split"] = "split"
    dim: StrictInt = -1
    sizes: DimText | list[DimText] | None = Field(None, description="size of every piece, or a list with one size per output")
    chunks: DimText | None = Field(None, description="number of equal pieces (torch.chunk); must divide the dim")
    outputs: list[TensorId] = Field(min_length=1, max_length=64, description="the names of the pieces, in order")
    output_field = "outputs"
    example = """\
- id: qkv_split
  op: split
  input: qkv               # (B, T, 3·d_model)
  dim: 2
  sizes: d_model           # three pieces of (B, T, d_model), views of qkv
  outputs: [q, k, v]"""

    @model_validator(mode="after")
    def _one_way_to_split(self):
        if (self.sizes is None) == (self.chunks is None):
            raise ValueError("give exactly one of 'sizes' (a size, or one per output) or 'chunks'")
        if len(set(self.outputs)) != len(self.outputs):
            raise ValueError("every name in 'outputs' must be different")
        return self

    def splitting(self):
        return self.dim

    def args(self):
        how = f"chunks={self.chunks}" if self.chunks is not None else f"sizes={self.sizes}"
        return [f"dim={self.dim}", how]

    def _pieces(self, x, ctx, d: int) -> list:
        total, n = x.shape[d], len(self.outputs)
        if isinstance(self.sizes, list):
            pieces = [ctx.dim(t, "sizes") for t in self.sizes]
            if len(pieces) != n:
                raise StepError("split-outputs", f"{len(pieces)} sizes for {n} outputs; give one size per name in 'outputs'", "sizes")
            found = sum(p.value for p in pieces)
            if found != total.value:
                listed = " + ".join(f"{p}={p.value}" if str(p) != str(p.value) else str(p) for p in pieces)
                raise StepError("split-sizes", f"sizes {listed} = {found}, but dim {d} of {show(x)} is {total}={total.value}", "sizes")
            return pieces
        field, count = ("chunks", ctx.dim(self.chunks, "chunks")) if self.chunks is not None else ("sizes", None)
        if count is None:
            piece = ctx.dim(self.sizes, "sizes")
            if piece.value <= 0 or total.value % piece.value:
                raise StepError(
                    "split-sizes",
                    f"pieces of {piece}={piece.value} do not tile dim {d} of {show(x)} evenly",
                    "sizes",
                    "give one size per output as a list",
                )
            count = ctx.alg.floordiv(total, piece)
        elif count.value <= 0 or total.value % count.value:
            raise StepError(
                "split-sizes",
                f"{count}={count.value} chunks do not divide dim {d} of {show(x)} evenly",
                "chunks",
                "give one size per output as 'sizes: [...]'",
            )
        else:
            piece = ctx.alg.floordiv(total, count)
        if count.value != n:
            raise StepError(
                "split-outputs", f"dim {d} of {show(x)} splits into {count.value} pieces of {piece}, but 'outputs' names {n}", "outputs"
            )
        return [piece] * n

    def infer(self, ins, ctx):
        x = ins[0]
        d = norm_dim(self.dim, len(x.shape))
        offset, outs = x.offset, {}
        for name, piece in zip(self.outputs, self._pieces(x, ctx, d)):
            shape = x.shape[:d] + (piece,) + x.shape[d + 1 :]
            outs[name] = view(x, shape, x.stride, offset)
            offset += piece.value * x.stride[d]
        return Outputs(outs)

    def kernel(self, k):
        sizes = [m.sizes[self.dim] for m in k.outs]
        dim = self.dim
        return lambda x: x.split(sizes, dim)

    def emit(self, e):
        if self.chunks is not None:
            return f"{e.args[0]}.chunk({e.dim(self.chunks)}, dim={self.dim})"
        if isinstance(self.sizes, list):
            return f"{e.args[0]}.split({py_tuple([e.dim(t) for t in self.sizes])}, dim={self.dim})"
        return f"{e.args[0]}.split({e.dim(self.sizes)}, dim={self.dim})"
