"""Position information: rotary embeddings (``rope``) and linear attention biases (``alibi``).

Both build their tables inside the step, as the public code does, and record them as inner
tensors (``ID/cos``, ``ID/sin``; ``ID/bias``), the way ``merge`` records its copy.
"""

from __future__ import annotations

import inspect
import math
from typing import Literal

from pydantic import Field, StrictBool, StrictInt

from ..core.fields import DimText
from ..core.layout import Meta, fresh, pointwise, view
from ..core.pysource import atom, py_float
from .contract import Composite, Inner, Rotation, StepBase, register
from .rules import StepError, norm_dim, require_float, show


@register
class Rope(StepBase):
    """Rotary position embedding of (…, T, Dh) queries or keys, as transformers computes it::

        inv_freq = 1.0 / (theta ** (torch.arange(0, R, 2).float() / R))        # R = rotary_dim
        freqs = torch.arange(offset, offset + T).float()[:, None] * inv_freq   # (T, R/2)
        emb = cat(freqs, freqs)          # style: half (Llama, Mistral, Qwen, GPT-NeoX: rotate_half)
        emb = freqs.repeat_interleave(2) # style: interleaved (GPT-J, RoFormer: rotate_every_two)
        cos, sin = emb.cos().to(x.dtype), emb.sin().to(x.dtype)                # (T, R), recorded
        out = x_rot * cos + rotate(x_rot) * sin                                # x_rot = x[..., :R]
        out = cat([out, x[..., R:]], -1)                                        # partial rotary only

    ``offset`` is the position of the first token: ``past`` for a decode step after ``past``
    cached tokens. ``seq_dim`` names the positions' axis (default -2; -3 for (B, T, H, Dh)).
    """

    op: Literal["rope"] = "rope"
    theta: float = Field(10000.0, gt=0, description="the base of the frequencies (config.rope_theta)")
    style: Literal["half", "interleaved"] = Field(
        "half", description="half: rotate_half (Llama, NeoX); interleaved: rotate_every_two (GPT-J, RoFormer)"
    )
    offset: DimText = Field(0, description="position of the first token, a dim expression (e.g. past)")
    rotary_dim: DimText | None = Field(None, description="rotate only the first R features (partial rotary; default: all of Dh)")
    seq_dim: StrictInt = Field(-2, description="the axis of token positions (default -2: (…, T, Dh))")
    example = """\
- id: q_rot
  op: rope
  input: q_h               # (B, H, T, Dh)
  theta: 10000.0
  offset: past             # decode: positions past .. past + T - 1"""

    def args(self):
        shown = [f"θ={self.theta:g}"] + ([] if self.style == "half" else ["interleaved"])
        shown += [] if self.offset == 0 else [f"+{self.offset}"]
        return shown + ([] if self.rotary_dim is None else [f"R={self.rotary_dim}"])

    def rotation(self):
        return Rotation(self.seq_dim, self.offset)

    def infer(self, ins, ctx):
        x = ins[0]
        require_float(x, ctx.input_ids[0], "rope")
        if len(x.shape) < 2:
            raise StepError("rope-shape", f"rope needs (…, T, Dh), got {show(x)}", "input")
        seq = norm_dim(self.seq_dim, len(x.shape), "seq_dim")
        if seq == len(x.shape) - 1:
            raise StepError("rope-shape", "seq_dim is the feature dim; positions must be another axis", "seq_dim")
        head = x.shape[-1]
        rot = head if self.rotary_dim is None else ctx.dim(self.rotary_dim, "rotary_dim")
        if rot.value % 2 or not 0 < rot.value <= head.value:
            raise StepError(
                "rope-dim",
                f"rotary_dim {rot}={rot.value} must be even and within 1..{head}={head.value}",
                "rotary_dim" if self.rotary_dim else "input",
            )
        if ctx.dim(self.offset, "offset").value < 0:
            raise StepError("rope-offset", f"offset {self.offset} is negative", "offset")
        table = fresh((x.shape[seq], rot), x.dtype)
        part = x if rot.value == head.value else Meta(x.shape[:-1] + (rot,), x.stride, x.dtype, x.offset, x.root)
        broadcast = _table_view(table, len(x.shape) - 1 - seq, ctx)
        # x * cos + rotate(x) * sin: the rotation (a cat or stack) is a fresh row-major tensor
        with_cos = pointwise([part, broadcast], part.shape, x.dtype)
        with_sin = pointwise([fresh(part.shape, x.dtype), broadcast], part.shape, x.dtype)
        rotated = pointwise([with_cos, with_sin], part.shape, x.dtype)
        out = rotated if rot.value == head.value else fresh(x.shape, x.dtype)
        return Composite((Inner("cos", "cos", table), Inner("sin", "sin", table), Inner("rotated", "rope", out)))

    def kernel(self, k):
        torch, x = k.torch, k.ins[0]
        seq = self.seq_dim % len(x.shape)
        length, head = x.sizes[seq], x.sizes[-1]
        rot = head if self.rotary_dim is None else k.value(self.rotary_dim)
        start, theta, half = k.value(self.offset), self.theta, self.style == "half"
        dtype = getattr(torch, x.dtype)
        table_shape = (length,) + (1,) * (len(x.sizes) - 2 - seq) + (rot,)

        def rope(x):
            inv_freq = 1.0 / (theta ** (torch.arange(0, rot, 2, dtype=torch.int64, device=x.device).float() / rot))
            freqs = torch.arange(start, start + length, device=x.device).float()[:, None] * inv_freq
            emb = torch.cat((freqs, freqs), dim=-1) if half else torch.repeat_interleave(freqs, 2, dim=-1)
            cos, sin = emb.cos().to(dtype), emb.sin().to(dtype)
            part = x if rot == head else x[..., :rot]
            turned = _rotate_half(torch, part) if half else _rotate_every_two(torch, part)
            out = part * cos.view(table_shape) + turned * sin.view(table_shape)
            return cos, sin, out if rot == head else torch.cat((out, x[..., rot:]), dim=-1)

        return rope

    def emit(self, e):
        x, meta = e.args[0], e.ins[0]
        seq = self.seq_dim % len(meta.shape)
        length, head = e.size(meta.shape[seq]), e.size(meta.shape[-1])
        rot = head if self.rotary_dim is None else e.dim(self.rotary_dim)
        partial = self.rotary_dim is not None and e.outs[0].sizes[-1] != meta.sizes[-1]
        offset = e.dim(self.offset)
        positions = f"torch.arange({length}" if offset == "0" else f"torch.arange({offset}, {offset} + {length}"
        inv_freq, freqs, emb, cos, sin = (e.local(n) for n in ("inv_freq", "freqs", "emb", "cos", "sin"))
        turn = _rotate_half if self.style == "half" else _rotate_every_two
        rotate = e.helper(turn.__name__, inspect.getsource(turn))
        part = f"{x}[..., :{rot}]" if partial else x
        table = ", ".join([length] + ["1"] * (len(meta.shape) - 2 - seq) + [rot])
        view = "" if seq == len(meta.shape) - 2 else f".view({table})"
        rotated = f"{part} * {cos}{view} + {rotate}(torch, {part}) * {sin}{view}"
        return [
            f"{inv_freq} = 1.0 / ({py_float(self.theta)} ** (torch.arange(0, {rot}, 2, dtype=torch.int64, device={x}.device).float() / {atom(rot)}))",
            f"{freqs} = {positions}, device={x}.device).float()[:, None] * {inv_freq}",
            f"{emb} = torch.cat(({freqs}, {freqs}), dim=-1)"
            if self.style == "half"
            else f"{emb} = torch.repeat_interleave({freqs}, 2, dim=-1)",
            f"{cos}, {sin} = {emb}.cos().to({x}.dtype), {emb}.sin().to({x}.dtype)",
            f"{e.targets[0]} = torch.cat(({rotated}, {x}[..., {rot}:]), dim=-1)" if partial else f"{e.targets[0]} = {rotated}",
        ]


def _table_view(table: Meta, gap: int, ctx) -> Meta:
    """The (T, R) table viewed as (T, 1, …, 1, R) so it broadcasts against (…, T, …, R)."""
    shape = table.shape[:1] + (ctx.alg.const(1),) * (gap - 1) + table.shape[1:]
    stride = table.stride[:1] + (table.stride[1] * table.sizes[1],) * (gap - 1) + table.stride[1:]
    return view(table, shape, stride)


def _rotate_half(torch, x):
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def _rotate_every_two(torch, x):
    return torch.stack((-x[..., 1::2], x[..., ::2]), dim=-1).flatten(-2)


def alibi_slopes(torch, heads: int, device=None):
    """The ALiBi slopes of ``heads`` heads, as transformers' ``build_alibi_tensor`` computes them
    (the paper's reference code: a geometric sequence from 2^(-8/n); for a head count that is not a
    power of two, the closest power's slopes followed by every other slope of twice that many)."""
    closest = 2 ** math.floor(math.log2(heads))
    base = torch.tensor(2 ** (-(2 ** -(math.log2(closest) - 3))), dtype=torch.float32, device=device)
    slopes = torch.pow(base, torch.arange(1, 1 + closest, dtype=torch.int32, device=device))
    if closest != heads:
        extra_base = torch.tensor(2 ** (-(2 ** -(math.log2(2 * closest) - 3))), dtype=torch.float32, device=device)
        remaining = min(closest, heads - closest)
        slopes = torch.cat([slopes, torch.pow(extra_base, torch.arange(1, 1 + 2 * remaining, 2, dtype=torch.int32, device=device))], dim=0)
    return slopes


@register
class Alibi(StepBase):
    """ALiBi: add a per-head linear bias to (…, H, T_q, T_kv) scores (Press et al.; BLOOM, MPT).

    The bias is ``slope[h] * j`` for key position ``j`` (the reference code's and transformers'
    ``build_alibi_tensor``; softmax is unchanged by a per-row shift), or with ``relative: true``
    the paper's ``slope[h] * (j - i)`` with query ``i`` aligned bottom-right (the last query is the
    last key). Slopes: :func:`alibi_slopes`. The bias is recorded as ``ID/bias``.
    """

    op: Literal["alibi"] = "alibi"
    relative: StrictBool = Field(False, description="bias slope * (j - i) instead of slope * j")
    passes_scores = True
    example = """\
- id: biased
  op: alibi
  input: scores            # (B, H, T, T), H of any size (slopes as in the ALiBi paper)"""

    def args(self):
        return ["j - i"] if self.relative else []

    def infer(self, ins, ctx):
        scores = ins[0]
        require_float(scores, ctx.input_ids[0], "alibi")
        if len(scores.shape) < 3:
            raise StepError("alibi-shape", f"alibi needs (…, H, T_q, T_kv) scores, got {show(scores)}", "input")
        heads, t_q, t_k = scores.shape[-3:]
        if heads.value < 1:
            raise StepError("alibi-shape", f"alibi needs at least one head, got {heads}={heads.value}", "input")
        bias = fresh((heads, t_q if self.relative else ctx.alg.const(1), t_k), scores.dtype)
        return Composite((Inner("bias", "alibi", bias), Inner("biased", "alibi", pointwise([scores, bias], scores.shape, scores.dtype))))

    def kernel(self, k):
        torch, relative = k.torch, self.relative
        heads, t_q, t_k = k.ins[0].sizes[-3:]
        dtype = getattr(torch, k.ins[0].dtype)

        def alibi(scores):
            slopes = alibi_slopes(torch, heads, scores.device)  # on meta, no real memory for 2**33 heads
            keys = torch.arange(t_k, device=scores.device)
            if relative:
                distance = keys[None, :] - (torch.arange(t_q, device=scores.device)[:, None] + (t_k - t_q))
                bias = slopes[:, None, None] * distance[None]
            else:
                bias = slopes[:, None, None] * keys[None, None, :]
            bias = bias.to(dtype)
            return bias, scores + bias

        return alibi

    def emit(self, e):
        scores, meta = e.args[0], e.ins[0]
        heads, t_q, t_k = (e.size(d) for d in meta.shape[-3:])
        slopes, bias = e.local("slopes"), e.local("bias")
        keys = f"torch.arange({t_k}, device={scores}.device)"
        if self.relative:
            shift = "" if meta.shape[-2].same_symbol(meta.shape[-1]) else f" + ({t_k} - {atom(t_q)})"
            distance = f"({keys}[None, :] - (torch.arange({t_q}, device={scores}.device)[:, None]{shift}))[None]"
        else:
            distance = f"{keys}[None, None, :]"
        return [
            f"{slopes} = {e.helper('alibi_slopes', inspect.getsource(alibi_slopes))}(torch, {heads}).to({scores}.device)",
            f"{bias} = ({slopes}[:, None, None] * {distance}).to({scores}.dtype)",
            f"{e.targets[0]} = {scores} + {bias}",
        ]
