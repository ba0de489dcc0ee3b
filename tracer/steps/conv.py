"""Convolutions: ``conv1d`` (Whisper's audio front end) and ``conv2d`` (ViT's patch embedding)."""

from __future__ import annotations

from fractions import Fraction
from typing import ClassVar, Literal

from pydantic import Field, StrictInt

from ..core.fields import DimText, TensorId
from ..core.layout import Meta, channels_last_strides, fresh, suggests_channels_last
from ..core.symbolic import Dim, DimAlgebra, Poly
from .contract import StepBase, register
from .rules import StepError, require_float, show

Pair = DimText | list[DimText]
INT64_MAX = 2**63 - 1
TORCH_MAX_PADDING = 2**62 - 1  # F.conv*d: "expected padding to be at most 4611686018427387903"  # one for every spatial dim, or one each


class _Conv(StepBase):
    """``F.conv{n}d(x, weight, bias, stride, padding, dilation, groups)`` on (B, C_in, *spatial)
    or an unbatched (C_in, *spatial): the weight is (C_out, C_in / groups, *kernel)."""

    weight: TensorId = Field(description="the (C_out, C_in / groups, *kernel) param, as nn.Conv stores it")
    bias: TensorId | None = Field(None, description="optional (C_out,) bias param")
    stride: Pair = Field(1, description="step of the kernel: one number, or one per spatial dim")
    padding: Literal["same", "valid"] | Pair = Field(
        0,
        union_mode="left_to_right",  # 'same' is a word, not a dim named same
        description="zeros added on both sides (one number, or one per spatial dim); 'same' keeps the length (stride 1), 'valid' is 0",
    )
    dilation: Pair = Field(1, description="spacing between kernel taps")
    groups: StrictInt = Field(1, ge=1, description="channel groups, each convolved separately (C_in and C_out divide by it)")
    param_fields = ("weight", "bias")
    spatial: ClassVar[int] = 1

    def args(self):
        shown = [f"stride={self.stride}"] if self.stride != 1 else []
        shown += [f"padding={self.padding}"] if self.padding not in (0, "valid") else []
        shown += [f"dilation={self.dilation}"] if self.dilation != 1 else []
        return shown + ([f"groups={self.groups}"] if self.groups != 1 else [])

    def _texts(self, field: str) -> list:
        value = getattr(self, field)
        return value if isinstance(value, list) else [value] * self.spatial

    def _per_dim(self, ctx, field: str) -> list:
        """A field's dims, one per spatial dim, checked."""
        texts = self._texts(field)
        if len(texts) != self.spatial:
            raise StepError("conv-field", f"'{field}' gives {len(texts)} values for {self.spatial} spatial dim(s)", field)
        dims, low = [ctx.dim(t, field) for t in texts], 0 if field == "padding" else 1
        for d in dims:
            if d.value < low:
                raise StepError("conv-field", f"'{field}' must be at least {low}, got {d}={d.value}", field)
        return dims

    def infer(self, ins, ctx):
        x, w = ins[0], ins[1]
        names = ctx.input_ids
        require_float(x, names[0], self.op)
        n = self.spatial
        if len(x.shape) not in (n + 1, n + 2):
            raise StepError(
                "conv-shape", f"{self.op} needs (B, C_in, {self._spatial_names()}) or unbatched, got '{names[0]}' {show(x)}", "input"
            )
        if len(w.shape) != n + 2:
            raise StepError(
                "conv-shape", f"weight '{self.weight}' must be (C_out, C_in / groups, {self._kernel_names()}), got {show(w)}", "weight"
            )
        for name, p, field in ((self.weight, w, "weight"), (self.bias, ins[2] if len(ins) > 2 else None, "bias")):
            if p is not None and p.dtype != x.dtype:  # torch refuses mixed dtypes rather than promoting
                raise StepError("dtype", f"{self.op} of {x.dtype} '{names[0]}' with {p.dtype} '{name}'", field)
        channels = x.shape[-n - 1]
        self._check_channels(channels, w, names[0], x)
        if len(ins) > 2 and ins[2].sizes != (w.sizes[0],):
            raise StepError("conv-shape", f"bias '{self.bias}' must be ({w.shape[0]}) [{w.sizes[0]}], got {show(ins[2])}", "bias")
        lengths = tuple(self._length(ctx, x.shape[-n + i], w.shape[2 + i], i) for i in range(n))
        shape = x.shape[: -n - 1] + (w.shape[0],) + lengths
        if n == 2 and len(shape) == 4 and (suggests_channels_last(x.sizes, x.stride) or suggests_channels_last(w.sizes, w.stride)):
            return Meta(shape, channels_last_strides(tuple(d.value for d in shape)), x.dtype)
        return fresh(shape, x.dtype)

    def _check_channels(self, channels, w, name: str, x: Meta) -> None:
        per_group, out = w.shape[1], w.shape[0]
        if per_group.value == 0 or out.value == 0:  # torch refuses no output channels, and drops them all for no input
            raise StepError(
                "conv-channels",
                f"weight '{self.weight}' {show(w)} has no {'output' if out.value == 0 else 'input'} channels; a convolution needs both",
                "weight",
            )
        if channels.value % self.groups or out.value % self.groups:
            raise StepError(
                "conv-groups",
                f"groups={self.groups} must divide both C_in ({channels}={channels.value}) and C_out ({out}={out.value})",
                "groups",
            )
        if per_group.value * self.groups != channels.value:
            raise StepError(
                "conv-channels",
                f"weight '{self.weight}' {show(w)} expects {per_group.value * self.groups} input channels "
                f"({per_group} per group x {self.groups} groups), '{name}' {show(x)} has {channels}={channels.value}",
                "weight",
                hint=f"the channels are dim -{self.spatial + 1} of the input: transpose them into place first",
            )

    def _length(self, ctx, size, kernel, i: int):
        """The output length along spatial dim ``i``: ``(L + 2p - d(K - 1) - 1) // s + 1``, symbolic
        where it can be (a patch embedding's ``H // P``)."""
        stride, dilation = self._per_dim(ctx, "stride")[i], self._per_dim(ctx, "dilation")[i]
        if self.padding == "same":
            if stride.value != 1:
                raise StepError("conv-field", "padding: same needs stride 1 (torch refuses it otherwise)", "padding")
            if size.value == 0:
                raise StepError(
                    "conv-shape", f"padding: same cannot keep spatial dim {i} at {size}=0: the kernel needs one position", "input"
                )
            return size
        alg = ctx.alg
        pad = alg.const(0) if self.padding == "valid" else self._per_dim(ctx, "padding")[i]
        if pad.value > TORCH_MAX_PADDING or size.value + 2 * pad.value > INT64_MAX:  # torch's CPU kernel refuses or overflows
            raise StepError(
                "conv-field",
                f"padding {_shown(pad)} on spatial dim {i} ({size}={size.value}) is beyond torch's limits: padding at most 2**62 - 1, "
                "and the padded length L + 2·padding within int64",
                "padding",
            )
        # (L + 2p - d*K + d - 1 + s) // s, one floor division so an exact one (H // P) stays a clean dim
        grown = alg.add(alg.add(alg.mul(alg.const(2), pad), dilation), alg.add(stride, alg.const(-1)))
        numerator = alg.add(alg.add(size, alg.mul(alg.mul(alg.const(-1), dilation), kernel)), grown)
        if numerator.value < stride.value:
            raise StepError(
                "conv-shape",
                f"the kernel ({_shown(kernel)}, dilation {_shown(dilation)}) is larger than spatial dim {i} "
                f"({size}={size.value}) padded by {pad.value} on each side",
                "weight",
            )
        return numerator if stride.value == 1 else _floor_div(alg, numerator, stride)

    def _spatial_names(self) -> str:
        return "L" if self.spatial == 1 else "H, W"

    def _kernel_names(self) -> str:
        return "K" if self.spatial == 1 else "K_h, K_w"

    def kernel(self, k):
        conv, groups = getattr(k.F, self.op), self.groups
        stride, dilation = (tuple(k.value(t) for t in self._texts(f)) for f in ("stride", "dilation"))
        padding = self.padding if self.padding in ("same", "valid") else tuple(k.value(t) for t in self._texts("padding"))
        return lambda x, w, b=None: conv(x, w, b, stride, padding, dilation, groups)

    def emit(self, e):
        bias = e.args[2] if self.bias is not None else "None"
        stride, dilation = ("(" + "".join(e.dim(t) + ", " for t in self._texts(f)) + ")" for f in ("stride", "dilation"))
        padding = (
            repr(self.padding)
            if self.padding in ("same", "valid")
            else "(" + "".join(e.dim(t) + ", " for t in self._texts("padding")) + ")"
        )
        return f"F.{self.op}({e.args[0]}, {e.args[1]}, {bias}, {stride}, {padding}, {dilation}, {self.groups})"


def _shown(dim: Dim) -> str:
    return str(dim) if str(dim) == str(dim.value) else f"{dim}={dim.value}"


def _floor_div(alg: DimAlgebra, numerator: Dim, stride: Dim) -> Dim:
    """``numerator // stride``, still a clean dim when a constant stride leaves a constant
    remainder: Whisper's strided conv makes (2·P + 1) // 2, which is P for every P."""
    const = stride.poly.constant
    if const is None or const.denominator != 1:
        return alg.floordiv(numerator, stride)
    offset = sum((c for mono, c in numerator.poly.terms if mono == ()), start=Fraction(0))
    quotient = (numerator.poly + Poly.const(int(-offset))).divide(Poly.const(int(const)))
    if offset.denominator != 1 or quotient is None or any(c.denominator != 1 for _, c in quotient.terms):
        return alg.floordiv(numerator, stride)
    return alg.make(quotient + Poly.const(int(offset) // int(const)), numerator.value // stride.value)


@register
class Conv1d(_Conv):
    """``F.conv1d``: (B, C_in, L) → (B, C_out, L_out), ``L_out = (L + 2·padding − dilation·(K − 1) − 1) // stride + 1``.

    Whisper's front end is two of them: ``{weight: conv1_w, bias: conv1_b, padding: 1}`` then
    ``{stride: 2, padding: 1}``, each followed by ``gelu``."""

    op: Literal["conv1d"] = "conv1d"
    spatial = 1
    example = """\
- id: frames
  op: conv1d
  input: mel               # (B, n_mels, L)
  weight: conv_w           # (d_model, n_mels, 3)
  bias: conv_b             # (d_model,)
  stride: 2
  padding: 1               # -> (B, d_model, L // 2)"""


@register
class Conv2d(_Conv):
    """``F.conv2d``: (B, C_in, H, W) → (B, C_out, H_out, W_out), each spatial dim as ``conv1d``'s.

    ViT's patch embedding is one with ``stride`` equal to the kernel: (B, 3, H, W) with a
    (d_model, 3, P, P) weight gives (B, d_model, H // P, W // P), the patches in rows.
    A ``stride``, ``padding`` or ``dilation`` is one number for both dims or ``[h, w]``."""

    op: Literal["conv2d"] = "conv2d"
    spatial = 2
    example = """\
- id: patches
  op: conv2d
  input: pixels            # (B, 3, H, W)
  weight: patch_w          # (d_model, 3, P, P)
  bias: patch_b
  stride: P                # -> (B, d_model, H // P, W // P)"""
