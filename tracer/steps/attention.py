"""The attention core: scaling, masking, softmax and dropout."""

from __future__ import annotations

import functools
import math
import operator
from typing import Literal

from pydantic import Field, StrictBool, StrictInt, field_validator, model_validator

from ..core.dtypes import DTYPE_MAX, fits
from ..core.fields import DimText, TensorId
from ..core.layout import fresh, pointwise, preserve_format
from ..core.pysource import atom, py_float
from ..core.static import unary
from .contract import Masking, StepBase, register
from .operands import OPERAND_DESCRIPTION, Operand, Rsqrt, Sqrt, operand_source, operand_text, operand_value
from .rules import StepError, broadcast, norm_dim, require_float, show


@register
class Scale(StepBase):
    """Multiply or divide by a number, a dim expression, ``{sqrt: DIM}`` or ``{rsqrt: DIM}``:
    ``scores / sqrt(Dh)``, or ``scores * Dh ** -0.5`` as transformers writes it (``multiply:
    {rsqrt: Dh}`` rounds exactly as ``head_dim ** -0.5`` does, which ``divide: {sqrt: Dh}`` need not)."""

    op: Literal["scale"] = "scale"
    passes_scores = True
    elementwise = True
    divide: Operand | None = Field(None, description=f"divide by {OPERAND_DESCRIPTION}")
    multiply: Operand | None = Field(None, description=f"multiply by {OPERAND_DESCRIPTION}")
    example = """\
- id: scaled
  op: scale
  input: scores            # (B, H, T, T)
  divide: {sqrt: Dh}       # scores / sqrt(Dh)"""

    @model_validator(mode="after")
    def _one_factor(self):
        if (self.divide is None) == (self.multiply is None):
            raise ValueError("give exactly one of 'divide' or 'multiply'")
        return self

    @property
    def _by(self) -> Operand:
        return self.divide if self.divide is not None else self.multiply

    def args(self):
        return [f"{'/' if self.divide is not None else '*'} {operand_text(self._by)}"]

    def factor(self, value) -> float:
        """The number written (``divide`` by it or ``multiply`` by it); ``value`` evaluates dim expressions."""
        return float(operand_value(self._by, value))

    def scaling(self, value):
        return self.multiplier(value)

    def static(self, ins, sizes, value):
        number = self.factor(value)
        if self.divide is not None:
            return None if number == 0 else unary(ins[0], lambda x: x / number)
        return unary(ins[0], lambda x: x * number)

    def scaled_by(self):
        by = self.divide if self.divide is not None else self.multiply
        return str(by.sqrt) if isinstance(by, Sqrt) else None

    def multiplier(self, value) -> tuple[float, str]:
        """What the scores are multiplied by, and how the file wrote it: ``(0.577, '1/√d_k (d_k=3)')``."""
        by, number = self._by, self.factor(value)
        text = operand_text(by)
        written = by.sqrt if isinstance(by, Sqrt) else by.rsqrt if isinstance(by, Rsqrt) else by if isinstance(by, str) else None
        if written is not None and str(written) != str(value(written)):
            text += f" ({written}={value(written)})"
        if self.divide is not None:
            return (1.0 / number if number else math.inf), f"1/{text}"
        return number, text

    def infer(self, ins, ctx):
        x = ins[0]
        require_float(x, ctx.input_ids[0], "scale")
        number = self.factor(lambda t: ctx.dim(t, "divide" if self.divide is not None else "multiply").value)
        if self.divide is not None and number == 0:
            raise StepError("scale-zero", "division by zero", "divide")
        # x / number: TensorIterator sees a 0-d operand, so no fast path: strides follow x's order, size-1 dims too
        return pointwise([x, fresh((), x.dtype)], x.shape, x.dtype)

    def kernel(self, k):
        number = self.factor(k.value)
        if self.divide is not None:
            return lambda x: x / number
        return lambda x: x * number

    def emit(self, e):
        number = operand_source(self._by, e.dim)
        number = number if isinstance(self._by, Sqrt | Rsqrt | str) else py_float(float(self._by))
        return f"{e.args[0]} {'/' if self.divide is not None else '*'} {number}"


@register
class Softcap(StepBase):
    """``torch.tanh(x / cap) * cap``: scores (or logits) squashed into (-cap, cap), in Gemma 2's op
    order (``attn_weights / softcap``, ``tanh``, ``* softcap``; after the scale, before the mask)."""

    op: Literal["softcap"] = "softcap"
    cap: float = Field(gt=0, allow_inf_nan=False, description="the bound (config.attn_logit_softcapping, final_logit_softcapping)")
    passes_scores = True
    squashes = True
    elementwise = True
    example = """\
- id: capped
  op: softcap
  input: scores            # (B, H, T, T), after the scale
  cap: 50.0"""

    def args(self):
        return [f"cap={self.cap:g}"]

    def infer(self, ins, ctx):
        x = ins[0]
        require_float(x, ctx.input_ids[0], "softcap")
        # each op has a 0-d operand or none: strides follow x's order, as for scale
        return pointwise([x, fresh((), x.dtype)], x.shape, x.dtype)

    def kernel(self, k):
        tanh, cap = k.torch.tanh, self.cap
        return lambda x: tanh(x / cap) * cap

    def emit(self, e):
        cap = py_float(self.cap)
        return f"torch.tanh({e.args[0]} / {cap}) * {cap}"


def _fill_value(value):
    if isinstance(value, str):
        try:
            value = float(value.strip())
        except ValueError:
            raise ValueError(f"fill must be a number, -inf or -1e9; found '{value[:40]}'") from None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"fill must be a number, -inf or -1e9; found {type(value).__name__}")
    if value != value:
        raise ValueError("fill must not be NaN")
    try:
        return float(value)
    except OverflowError:  # an int beyond any float: that is what -inf means
        return float("-inf") if value < 0 else float("inf")


@register
class Mask(StepBase):
    """``masked_fill``: built-in patterns (causal, a sliding window or a band, chunks, documents),
    a boolean mask input with an explicit polarity, or several of them (a key hidden by any is hidden).

    ``polarity: block`` fills where the mask is True (tutorial 002: ``masked_fill(mask.bool(), -inf)``);
    ``polarity: keep`` fills where it is False (tutorial 003: ``masked_fill(mask == False, -1e9)``).

    ``causal: true`` aligns the last query with the last key (bottom-right, as flash-attention
    >= 2.1 and transformers' KV cache do): query ``i`` of ``T_q`` sees keys ``j <= i + T_kv - T_q``.
    For square scores that is ``triu(ones(T, T), 1)``; for a decode step (``T_q = 1``) the query
    sees every cached key. ``align: top-left`` is ``scaled_dot_product_attention(is_causal=True)``'s
    rule, ``j <= i``. ``window: W`` with ``causal`` also hides keys more than ``W - 1`` behind the
    query (Mistral's ``sliding_window``: query ``i`` sees keys ``i-W+1 .. i``); without ``causal`` it
    is a band, ``|i - j| < W`` (ModernBERT's local layers: ``W = local_attention // 2 + 1``).
    ``chunk: C`` hides keys outside the query's chunk of C positions, ``j // C != i // C`` (Llama 4,
    with ``causal``). ``segments`` names an integer (T,) or (B, T) tensor of document ids (packed
    sequences, square scores): a query sees only keys of its own document::

        T_q = T_kv = 4, causal        T_q = 2, T_kv = 4, causal        window: 2, causal   window: 2   chunk: 2, causal
        q0  x . . .                   bottom-right  x x x .           x . . .             x x . .     x . . .
        q1  x x . .                   q1 = key 3    x x x x           x x . .             x x x .     x x . .
        q2  x x x .                   top-left      x . . .           . x x .             . x x x     . . x .
        q3  x x x x                   q1 = key 1    x x . .           . . x x             . . x x     . . x x

    ``fill: min`` writes ``torch.finfo(scores.dtype).min``, what transformers' eager masks add: a
    query whose every key is hidden then gets uniform weights, where ``-inf`` gives NaN.
    """

    op: Literal["mask"] = "mask"
    passes_scores = True
    causal: StrictBool = Field(False, description="block every key after its query (no mask input needed)")
    window: DimText | None = Field(
        None, description="with causal: each query sees only its last W keys, itself included; without: keys less than W away (a band)"
    )
    chunk: DimText | None = Field(None, description="each query sees only keys of its own chunk of C positions (Llama 4)")
    align: Literal["bottom-right", "top-left"] = Field(
        "bottom-right", description="query positions when T_q != T_kv: the last query is the last key, or the first is the first"
    )
    mask: TensorId | None = Field(None, description="a mask tensor broadcastable to the scores (may be combined with the patterns)")
    polarity: Literal["keep", "block"] | None = Field(None, description="with 'mask': True means keep, or True means block")
    segments: TensorId | None = Field(
        None, description="an integer (T,) or (B, T) tensor of document ids: keys of other documents are hidden"
    )
    fill: float | Literal["min"] = Field(
        float("-inf"), description="value written at blocked positions: -inf, min (the dtype's finfo.min), -1e9 or any number"
    )
    param_fields = ("mask", "segments")
    example = """\
- id: masked
  op: mask
  input: scores            # (B, H, T, T)
  causal: true             # future positions -> -inf
  fill: -inf"""

    _fill = field_validator("fill", mode="before")(classmethod(lambda cls, v: v if v == "min" else _fill_value(v)))

    @model_validator(mode="after")
    def _one_pattern(self):
        if not (self.causal or self.mask or self.window is not None or self.chunk is not None or self.segments):
            raise ValueError("give what to hide: 'causal: true', 'window: W', 'chunk: C', 'segments', a 'mask' tensor, or several")
        if self.mask is not None and self.polarity is None:
            raise ValueError(
                "a mask tensor needs 'polarity: keep' (True = attend) or 'polarity: block' (True = hide); the tutorials disagree, so tracer asks"
            )
        if self.mask is None and self.polarity is not None:
            raise ValueError("'polarity' only applies to a mask tensor")
        if self.align != "bottom-right" and not self.positional():
            raise ValueError("'align' places the queries of a causal, window or chunk pattern: add one")
        return self

    def positional(self) -> bool:
        """Whether it hides keys by position (causal, window, chunk)."""
        return self.causal or self.window is not None or self.chunk is not None

    def args(self):
        fill = "-inf" if self.fill == float("-inf") else self.fill if self.fill == "min" else f"{self.fill:g}"
        pattern = (["causal"] if self.causal else []) + ([f"window={self.window}"] if self.window is not None else [])
        pattern += ([f"chunk={self.chunk}"] if self.chunk is not None else []) + ([f"segments={self.segments}"] if self.segments else [])
        pattern += ["top-left"] if self.align == "top-left" else []
        return pattern + ([f"{self.polarity}"] if self.mask is not None else []) + [f"fill={fill}"]

    def masking(self):
        fill = FLOAT32_MIN if self.fill == "min" else self.fill
        return Masking(self.causal, self.window, self.align, self.mask, self.polarity, fill, self.chunk, self.segments)

    def infer(self, ins, ctx):
        scores = ins[0]
        require_float(scores, ctx.input_ids[0], "mask")
        if len(scores.shape) < 2:
            raise StepError("mask-shape", f"masking needs (…, T_q, T_k) scores, got {show(scores)}", "input")
        for field in ("window", "chunk"):
            if getattr(self, field) is not None and ctx.dim(getattr(self, field), field).value < 1:
                raise StepError(f"mask-{field}", f"{field} {getattr(self, field)} must be at least 1 (the query's own key)", field)
        if self.fill != "min" and not fits(self.fill, scores.dtype):  # torch's masked_fill refuses it at run time
            raise StepError(
                "mask-fill",
                f"fill {self.fill:g} overflows the {scores.dtype} scores of '{ctx.input_ids[0]}' (largest: {DTYPE_MAX[scores.dtype]:g})",
                "fill",
                "use fill: min (the dtype's most negative number) or fill: -inf",
            )
        if self.mask is not None:
            out = broadcast(scores, ins[1], f"mask '{self.mask}' against scores", "mask", ctx)
            if tuple(d.value for d in out) != scores.sizes:
                raise StepError("broadcast", f"mask '{self.mask}' {show(ins[1])} would enlarge the scores {show(scores)}", "mask")
        if self.segments is not None:
            _check_segments(self.segments, scores, ins[-1])
        return fresh(scores.shape, scores.dtype)

    def kernel(self, k):
        torch, device, scores = k.torch, k.device, k.ins[0]
        fill = torch.finfo(getattr(torch, scores.dtype)).min if self.fill == "min" else self.fill
        window = k.value(self.window) if self.window is not None else None
        chunk = k.value(self.chunk) if self.chunk is not None else None
        positional, top_left, causal = self.positional(), self.align == "top-left", self.causal
        to_bool, keep = self.mask is not None and k.ins[1].dtype != "bool", self.polarity == "keep"
        heads = (slice(None),) + (None,) * (len(scores.sizes) - 3)  # (B, T, T) -> (B, 1, …, T, T)

        t_q, t_k = scores.sizes[-2:]
        built = functools.cache(lambda: causal_hidden(torch, t_q, t_k, window, top_left, device, causal, chunk))
        # A small pattern is kept, as a model keeps its mask buffer (building it is most of a toy-size
        # step); a large one is built per call. The memory estimate counts both (costs.kept).
        pattern = built if t_q * t_k <= KEPT_PATTERN else built.__wrapped__
        if positional and self.mask is None and self.segments is None:
            return lambda scores: scores.masked_fill(pattern(), fill)  # causal (or window, chunk) alone: one kernel call

        def masked(scores, *extra):
            hide = []
            if self.mask is not None:
                mask = extra[0].bool() if to_bool else extra[0]
                hide.append(~mask if keep else mask)
            if positional:
                hide.append(pattern())
            if self.segments is not None:
                other = extra[-1][..., :, None] != extra[-1][..., None, :]
                hide.append(other[heads] if other.dim() == 3 else other)
            return scores.masked_fill(functools.reduce(operator.or_, hide), fill)

        return masked

    def emit(self, e):
        scores, meta = e.args[0], e.ins[0]
        hide = []
        if self.mask is not None:
            mask = e.args[1] if e.ins[1].dtype == "bool" else f"{e.args[1]}.bool()"
            hide.append(f"~{mask}" if self.polarity == "keep" else mask)
        if self.positional():
            t_q, t_k = meta.shape[-2:]
            hide.append(causal_source(e, scores, t_q, t_k, self.window, self.align == "top-left", self.causal, self.chunk))
        if self.segments is not None:
            segments, lead = e.args[-1], ", None" * (len(meta.shape) - 3) if len(e.ins[-1].shape) == 2 else ""
            hide.append(f"({segments}[..., :, None] != {segments}[..., None, :])" + (f"[:{lead}]" if lead else ""))
        fill = f"torch.finfo({scores}.dtype).min" if self.fill == "min" else py_float(self.fill)
        return f"{scores}.masked_fill({' | '.join(hide)}, {fill})"


KEPT_PATTERN = 1 << 16  # positions (bools) up to which a mask kernel keeps its causal or window pattern between runs


def _same(x):
    return x


FLOAT32_MIN = -3.4028234663852886e38  # torch.finfo(torch.float32).min: what 'fill: min' means to lints and verify


def _check_segments(name: str, scores, segments) -> None:
    """Document ids: integers, (T,) or (B, T), for square scores whose batch dim 0 they pair with."""
    t_q, t_k = scores.shape[-2:]
    if segments.dtype not in ("int64", "int32"):
        raise StepError("mask-segments", f"segments '{name}' must hold integer document ids, found {segments.dtype}", "segments")
    square = t_q.value == t_k.value
    if not square or len(segments.shape) not in (1, 2) or segments.sizes[-1] != t_k.value:
        raise StepError(
            "mask-segments",
            f"segments '{name}' must be (T,) or (B, T) for square (…, T, T) scores, found {show(segments)} for scores {show(scores)}",
            "segments",
        )
    if len(segments.shape) == 2 and (len(scores.shape) < 3 or segments.sizes[0] not in (1, scores.sizes[0])):
        raise StepError(
            "mask-segments",
            f"(B, T) segments '{name}' {show(segments)} pair B with dim 0 of the scores {show(scores)}",
            "segments",
            "give (T,) segments for one sequence, or put the batch first",
        )


def causal_hidden(torch, t_q: int, t_k: int, window: int | None = None, top_left: bool = False, device=None, causal=True, chunk=None):
    """True where query ``i`` may not see key ``j``, at query position ``q = i + shift`` (shift =
    T_k - T_q aligns the last query with the last key; 0 the first with the first): causal hides
    ``j > q``; a window ``j <= q - W`` (transformers' ``sliding_window_overlay`` keeps ``kv_idx > q_idx - W``),
    and without causal also ``j >= q + W`` (a band); a chunk ``j // C != q // C`` (``chunked_overlay``)."""
    shift = 0 if top_left else t_k - t_q
    query = torch.arange(t_q, device=device)[:, None] + shift
    key = torch.arange(t_k, device=device)[None, :]
    hidden = [key > query] if causal else []
    if window is not None:
        hidden += [key <= query - window] + ([] if causal else [key >= query + window])
    if chunk is not None:
        hidden.append(key // chunk != query // chunk)
    return functools.reduce(operator.or_, hidden)


def causal_source(e, like: str, t_q, t_k, window, top_left: bool, causal: bool = True, chunk=None) -> str:
    """Source for ``causal_hidden``: ``ones(T_q, T_kv).triu(shift + 1)`` hides keys after each query
    (nanoGPT's ``tril`` buffer, negated), ``.tril(shift - W)`` the keys before its window and
    ``.triu(shift + W)`` those after a band; chunks compare ``position // C``."""
    shift = "" if top_left or t_q.same_symbol(t_k) else f"{e.size(t_k)} - {atom(e.size(t_q))}"
    ones = f"torch.ones({e.size(t_q)}, {e.size(t_k)}, dtype=torch.bool, device={like}.device)"
    hidden = [f"{ones}.triu({shift + ' + 1' if shift else '1'})"] if causal else []
    if window is not None:
        w = atom(e.dim(window))
        hidden.append(f"{ones}.tril({shift + ' - ' if shift else '-'}{w})")
        hidden += [] if causal else [f"{ones}.triu({shift + ' + ' if shift else ''}{w})"]
    if chunk is not None:
        c, query = atom(e.dim(chunk)), f"torch.arange({e.size(t_q)}, device={like}.device)[:, None]"
        query = f"({query} + ({shift}))" if shift else query
        hidden.append(f"(torch.arange({e.size(t_k)}, device={like}.device)[None, :] // {c} != {query} // {c})")
    return hidden[0] if len(hidden) == 1 else "(" + " | ".join(hidden) + ")"


@register
class Softmax(StepBase):
    """``torch.softmax(x, dim)``."""

    op: Literal["softmax"] = "softmax"
    dim: StrictInt = -1
    example = """\
- id: weights
  op: softmax
  input: scaled            # (B, H, T, T)
  dim: -1"""

    def args(self):
        return [f"dim={self.dim}"]

    def normalises(self):
        return self.dim

    def infer(self, ins, ctx):
        x = ins[0]
        require_float(x, ctx.input_ids[0], "softmax")
        norm_dim(self.dim, len(x.shape))
        return fresh(x.shape, x.dtype)

    def kernel(self, k):
        softmax, d = k.torch.softmax, self.dim
        return lambda x: softmax(x, d)

    def emit(self, e):
        return f"torch.softmax({e.args[0]}, dim={self.dim})"


@register
class Dropout(StepBase):
    """``F.dropout(x, p, training)``; in eval mode (the default) it returns ``x`` itself."""

    op: Literal["dropout"] = "dropout"
    passes_scores = True
    drops = True
    elementwise = True
    p: float = Field(0.1, ge=0.0, le=1.0)
    training: StrictBool = Field(False, description="apply dropout (uses the RNG); false returns the input unchanged")
    example = """\
- id: weights_d
  op: dropout
  input: weights
  p: 0.2"""

    def args(self):
        return [f"p={self.p:g}"] + (["training"] if self.training else [])

    def is_random(self):
        return self.training and self.p > 0

    def is_identity(self):
        return not self.is_random()

    def infer(self, ins, ctx):
        x = ins[0]
        require_float(x, ctx.input_ids[0], "dropout")
        if not self.training or self.p == 0 or x.numel == 0:
            return x  # ATen's _dropout returns the input itself
        # p = 1: x * zeros({}); otherwise x * noise, noise = empty_like(x).bernoulli_(1 - p)
        other = fresh((), x.dtype) if self.p == 1 else preserve_format(x)
        return pointwise([x, other], x.shape, x.dtype)

    def kernel(self, k):
        dropout, p = k.F.dropout, self.p
        training = self.training if k.training is None else k.training
        if not training or p == 0:
            return _same  # what F.dropout returns then (the input itself), without its per-call dispatch
        return lambda x: dropout(x, p, training)

    def emit(self, e):
        return f"F.dropout({e.args[0]}, p={py_float(self.p)}, training={e.training})"
