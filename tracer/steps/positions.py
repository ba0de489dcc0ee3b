"""Position information: rotary embeddings (``rope``), linear attention biases (``alibi``) and
T5's bucketed relative bias (``relative_bias``, added to scores; ``relative_position_bias``, the
bias alone, for a fused sdpa's mask).

Each builds its tables inside the step, as the public code does, and record them as inner
tensors (``ID/cos``, ``ID/sin``; ``ID/bias``; ``ID/buckets``), the way ``merge`` records its copy.
"""

from __future__ import annotations

import inspect
import math
from typing import Literal

from pydantic import Field, StrictBool, StrictInt, model_validator

from ..core.fields import DimText, TensorId
from ..core.layout import Meta, contiguous_strides, fresh, pointwise, view, with_root
from ..core.pysource import atom, py_float
from .contract import Composite, Inner, Rotation, StepBase, register
from .rope_scaling import FREQUENCIES, Scaling, fields, needs_seq_len, rope_default, sources, yarn_mscale
from .rules import StepError, broadcast_dims, norm_dim, require_float, show


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
    cached tokens. ``positions`` instead names an integer tensor of each token's position, (T,) or
    (B, T) (transformers' ``position_ids``: packed sequences, left padding); the tables are then
    (B, T, R) and ``freqs = positions[..., None].float() * inv_freq``. ``seq_dim`` names the
    positions' axis (default -2; -3 for (B, T, H, Dh)); a (B, T) ``positions`` pairs its B with dim 0.

    ``rope_scaling`` computes ``inv_freq`` as transformers' ``ROPE_INIT_FUNCTIONS`` for that
    ``rope_type`` (the keys of ``config.rope_parameters`` but ``rope_theta``; defaults in brackets),
    and multiplies cos and sin by its attention factor (yarn, longrope)::

        {type: linear, factor}                                   # inv_freq / factor
        {type: dynamic, factor, max_position_embeddings}         # NTK: theta grows past the context
        {type: llama3, factor, low_freq_factor [1], high_freq_factor [4], original_max_position_embeddings [8192]}
        {type: yarn, factor, original_max_position_embeddings, beta_fast [32], beta_slow [1],
         mscale, mscale_all_dim, attention_factor, truncate [true]}
        {type: longrope, short_factor, long_factor, original_max_position_embeddings, factor, attention_factor}

    ``dynamic`` and ``longrope`` read the largest position + 1 over the batch, as transformers does.

    ``mrope_section`` is Qwen2-VL's multimodal rope (M-RoPE): ``positions`` is (S, B, T), one
    stream of positions per section (temporal, height, width), and the frequencies of section i
    come from stream i, as ``apply_multimodal_rotary_pos_emb`` picks them::

        emb = cat([m[i % S] for i, m in enumerate(emb.split(mrope_section * 2, dim=-1))], dim=-1)
    """

    op: Literal["rope"] = "rope"
    theta: float = Field(10000.0, gt=0, description="the base of the frequencies (config.rope_theta)")
    style: Literal["half", "interleaved"] = Field(
        "half", description="half: rotate_half (Llama, NeoX); interleaved: rotate_every_two (GPT-J, RoFormer)"
    )
    offset: DimText = Field(0, description="position of the first token, a dim expression (e.g. past)")
    rotary_dim: DimText | None = Field(None, description="rotate only the first R features (partial rotary; default: all of Dh)")
    seq_dim: StrictInt = Field(-2, description="the axis of token positions (default -2: (…, T, Dh))")
    positions: TensorId | None = Field(None, description="an integer (T,) or (B, T) tensor of token positions, instead of offset")
    rope_scaling: Scaling | None = Field(None, description="frequency scaling, {type: linear, factor: 8.0} and the others above")
    mrope_section: list[StrictInt] | None = Field(
        None,
        min_length=1,
        max_length=8,
        description="M-RoPE (Qwen2-VL): frequencies per position stream of (S, B, T) positions; sums to R/2",
    )
    param_fields = ("positions",)
    table_records = ("cos", "sin")
    example = """\
- id: q_rot
  op: rope
  input: q_h               # (B, H, T, Dh)
  theta: 500000.0
  positions: position_ids  # (B, T) int64
  rope_scaling: {type: llama3, factor: 8.0, low_freq_factor: 1.0, high_freq_factor: 4.0, original_max_position_embeddings: 8192}"""

    @model_validator(mode="after")
    def _one_origin(self):
        if self.positions is not None and self.offset != 0:
            raise ValueError("give 'offset' or a 'positions' tensor, not both (positions already say where each token is)")
        if self.mrope_section is not None and (self.positions is None or self.style != "half" or min(self.mrope_section) < 1):
            raise ValueError("mrope_section needs (S, B, T) 'positions', style half and positive sections")
        return self

    def args(self):
        shown = [f"θ={self.theta:g}"] + ([] if self.style == "half" else ["interleaved"])
        shown += [] if self.offset == 0 else [f"+{self.offset}"]
        shown += [] if self.positions is None else [f"at {self.positions}"]
        shown += [] if self.rope_scaling is None else [self.rope_scaling.type]
        return shown + ([] if self.rotary_dim is None else [f"R={self.rotary_dim}"])

    def rotation(self):
        scaling = self.rope_scaling
        # DeepSeek-V3 multiplies its attention scale by yarn_get_mscale(factor, mscale_all_dim) ** 2
        mscale_all_dim = getattr(scaling, "mscale_all_dim", None)
        score_scale = yarn_mscale(scaling.factor, mscale_all_dim) ** 2 if mscale_all_dim else 1.0
        kind = None if scaling is None else scaling.type
        return Rotation(self.seq_dim, self.offset, self.positions, self.style, self.theta, kind, score_scale)

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
        self._check_scaling(rot)
        if self.mrope_section is not None and 2 * sum(self.mrope_section) != rot.value:
            raise StepError(
                "rope-dim",
                f"mrope_section {self.mrope_section} sums to {sum(self.mrope_section)}, not R/2 = {rot.value // 2}",
                "mrope_section",
            )
        lead = () if self.positions is None else self._positions_batch(x, seq, ins[1])
        table = fresh(lead + (x.shape[seq], rot), x.dtype)
        part = x if rot.value == head.value else Meta(x.shape[:-1] + (rot,), x.stride, x.dtype, x.offset, x.root)
        shape = _table_view(table.shape, seq, len(x.shape), ctx.alg.const(1))
        broadcast = view(table, shape, contiguous_strides(tuple(d.value for d in shape)))
        # x * cos + rotate(x) * sin: the rotation (a cat or stack) is a fresh row-major tensor
        with_cos = pointwise([part, broadcast], part.shape, x.dtype)
        with_sin = pointwise([fresh(part.shape, x.dtype), broadcast], part.shape, x.dtype)
        rotated = pointwise([with_cos, with_sin], part.shape, x.dtype)
        out = rotated if rot.value == head.value else fresh(x.shape, x.dtype)
        tables = () if self.positions is None else (1,)  # computed from the positions alone: x gives them a size and dtype
        return Composite(
            (Inner("cos", "cos", table, tables), Inner("sin", "sin", table, tables), Inner("rotated", "rope", out, (0, "cos", "sin")))
        )

    def _check_yarn_ramp(self, scaling, rot) -> None:
        """The dims where YaRN's ramp starts and ends (yarn_ramp's correction dims) must be finite
        numbers: floor and ceil of an infinite one fail in the kernel, as in transformers."""
        for name in ("beta_fast", "beta_slow"):
            rotations = getattr(scaling, name)
            turns = scaling.original_max_position_embeddings / (rotations * 2 * math.pi)
            if not (math.isfinite(turns) and turns > 0 and math.isfinite(rot.value * math.log(turns) / (2 * math.log(self.theta)))):
                raise StepError(
                    "rope-scaling",
                    f"yarn's ramp edge for {name}={rotations:g} (original_max_position_embeddings={scaling.original_max_position_embeddings}) "
                    "is not a finite dim: original / (2π·rotations) overflows",
                    "rope_scaling",
                    "use beta_fast and beta_slow of the model's config (32 and 1)",
                )

    def _check_scaling(self, rot) -> None:
        scaling = self.rope_scaling
        if scaling is None:
            return
        if scaling.type == "dynamic" and rot.value <= 2:
            raise StepError(
                "rope-scaling",
                f"dynamic scaling raises theta to R/(R-2): it needs a rotary dim above 2, found {rot}={rot.value}",
                "rope_scaling",
            )
        if scaling.type == "yarn" and self.theta == 1:
            raise StepError("rope-scaling", "yarn scaling divides by ln(theta): theta 1 has no frequencies to blend", "theta")
        if scaling.type == "yarn":
            self._check_yarn_ramp(scaling, rot)
        if scaling.type == "longrope" and len(scaling.short_factor) * 2 != rot.value:
            raise StepError(
                "rope-scaling",
                f"longrope needs one factor per frequency: {rot.value // 2} (rotary dim {rot}={rot.value} / 2), found {len(scaling.short_factor)}",
                "scaling",
            )

    def _positions_batch(self, x: Meta, seq: int, pos: Meta) -> tuple:
        """The batch dims the tables take from a (B, T) ``positions`` (none for (T,))."""
        name, length = self.positions, x.shape[seq]
        if self.mrope_section is not None:
            streams = len(self.mrope_section)
            if len(pos.shape) != 3 or pos.sizes[0] != streams:
                raise StepError(
                    "rope-positions",
                    f"M-RoPE positions '{name}' must be ({streams}, B, T), one stream per section, found {show(pos)}",
                    "positions",
                )
            pos = Meta(pos.shape[1:], pos.stride[1:], pos.dtype)
        if pos.dtype not in ("int64", "int32"):
            raise StepError(
                "rope-positions",
                f"positions '{name}' must hold integer positions, found {pos.dtype}",
                "positions",
                "declare it with dtype: int64",
            )
        if len(pos.shape) not in (1, 2) or pos.sizes[-1] != length.value:
            expected = f"(T,) or (B, T) with T = {length}={length.value} (the input's dim {self.seq_dim})"
            raise StepError("rope-positions", f"positions '{name}' must be {expected}, found {show(pos)}", "positions")
        if len(pos.shape) == 2 and (seq == 0 or pos.sizes[0] not in (1, x.sizes[0])):
            raise StepError(
                "rope-positions",
                f"(B, T) positions '{name}' {show(pos)} pair B with the input's dim 0, {x.shape[0]}={x.sizes[0]} of {show(x)}",
                "positions",
                "give (T,) positions for one sequence, or put the batch first",
            )
        return pos.shape[:1] if len(pos.shape) == 2 else ()

    def kernel(self, k):
        torch, x = k.torch, k.ins[0]
        seq = self.seq_dim % len(x.shape)
        length, head = x.sizes[seq], x.sizes[-1]
        rot = head if self.rotary_dim is None else k.value(self.rotary_dim)
        start, half, scaled = k.value(self.offset), self.style == "half", self.rope_scaling is not None
        section = self.mrope_section
        frequencies = self._frequencies(k, rot, start + length)
        dtype = getattr(torch, x.dtype)
        table_shape = _table_view(k.outs[0].sizes, seq, len(x.sizes), 1)

        def tables(device, positions):
            inv_freq, factor = frequencies(device, positions)
            if positions is None:
                freqs = torch.arange(start, start + length, device=device).float()[:, None] * inv_freq
            else:
                freqs = positions[..., None].float() * inv_freq
            emb = torch.cat((freqs, freqs), dim=-1) if half else torch.repeat_interleave(freqs, 2, dim=-1)
            emb = emb if section is None else _mrope(torch, emb, section)
            cos, sin = (emb.cos() * factor, emb.sin() * factor) if scaled else (emb.cos(), emb.sin())
            return cos.to(dtype), sin.to(dtype)

        shared = k.shared_table(tables)  # q and k of a layer (and every layer) read one table, as in transformers

        def rope(x, positions=None):
            cos, sin = shared(x.device, positions)
            part = x if rot == head else x[..., :rot]
            turned = _rotate_half(torch, part) if half else _rotate_every_two(torch, part)
            out = part * cos.view(table_shape) + turned * sin.view(table_shape)
            return cos, sin, out if rot == head else torch.cat((out, x[..., rot:]), dim=-1)

        return rope

    def table_key(self, value, reads, outs):
        cos = outs[0]  # the tables: (T, R) from the offset, or (B, T, R) from the positions tensor
        where = ("positions", reads[1]) if self.positions is not None else ("offset", value(self.offset))
        scaling = None if self.rope_scaling is None else self.rope_scaling.model_dump_json()
        section = None if self.mrope_section is None else tuple(self.mrope_section)
        return ("rope", self.theta, self.style, where, scaling, section, cos.sizes, cos.dtype)

    def _frequencies(self, k, rot: int, end: int):
        """``(device, positions) -> (inv_freq, attention factor)`` for this step's scaling."""
        torch, theta, scaling = k.torch, self.theta, self.rope_scaling
        if scaling is None:
            return lambda device, positions: (rope_default(torch, rot, theta, device), 1.0)
        compute, kwargs = FREQUENCIES[scaling.type], fields(scaling)
        if not needs_seq_len(scaling):
            return lambda device, positions: compute(torch, rot, theta, device, **kwargs)
        if self.positions is not None and k.device.type == "meta":
            raise k.error("rope-meta", f"{scaling.type} scaling reads the largest position, and a meta run has no values", "rope_scaling")

        def from_largest(device, positions):
            seq_len = torch.tensor(end) if positions is None else _largest(torch, positions)
            return compute(torch, rot, theta, device, seq_len=seq_len, **kwargs)

        return from_largest

    def emit(self, e):
        x, meta = e.args[0], e.ins[0]
        seq = self.seq_dim % len(meta.shape)
        length, head = e.size(meta.shape[seq]), e.size(meta.shape[-1])
        rot = head if self.rotary_dim is None else e.dim(self.rotary_dim)
        partial = self.rotary_dim is not None and e.outs[0].sizes[-1] != meta.sizes[-1]
        offset = e.dim(self.offset)
        if self.positions is not None:
            steps = f"{e.args[1]}[..., None].float()"
        else:
            steps = f"torch.arange({length}" if offset == "0" else f"torch.arange({offset}, {offset} + {length}"
            steps += f", device={e.device}).float()[:, None]"
        turn = _rotate_half if self.style == "half" else _rotate_every_two
        rotate = e.helper(turn.__name__, inspect.getsource(turn))
        part = f"{x}[..., :{rot}]" if partial else x
        table_shape = _table_view(tuple(e.size(d) for d in e.outs[0].shape), seq, len(meta.shape), "1")
        view = "" if len(table_shape) == len(e.outs[0].shape) else f".view({', '.join(table_shape)})"
        # q and k of one layer read one table, as transformers' rotary embedding computes it once
        lines, (cos, sin) = self._emit_table(e, rot, steps, f"{offset} + {length}")
        cos, sin = (f"{table}.to({x}.dtype){view}" for table in (cos, sin))
        rotated = f"{part} * {cos} + {rotate}(torch, {part}) * {sin}"
        if partial:
            return [*lines, f"{e.targets[0]} = torch.cat(({rotated}, {x}[..., {rot}:]), dim=-1)"]
        return [*lines, f"{e.targets[0]} = {rotated}"]

    def _emit_table(self, e, rot: str, steps: str, end: str) -> tuple[list[str], tuple[str, str]]:
        """The lines that compute the float32 cos and sin tables (none where an earlier step of the
        same forward computed the same ones) and the locals holding them."""
        inv_freq, factor, lines = self._emit_frequencies(e, rot, end)
        freqs, more = e.shared("freqs", f"{steps} * {inv_freq}")
        twice = f"torch.cat(({freqs}, {freqs}), dim=-1)" if self.style == "half" else f"torch.repeat_interleave({freqs}, 2, dim=-1)"
        emb, emb_lines = e.shared("emb", twice)
        if self.mrope_section is not None:  # each feature section from its own position stream
            mrope = e.helper("_mrope", inspect.getsource(_mrope))
            emb, sections = e.shared("emb_sections", f"{mrope}(torch, {emb}, {self.mrope_section!r})")
            emb_lines = [*emb_lines, *sections]
        scaled = "" if factor is None else f" * {factor}"
        cos, cos_lines = e.shared("cos", f"{emb}.cos(){scaled}")
        sin, sin_lines = e.shared("sin", f"{emb}.sin(){scaled}")
        return [*lines, *more, *emb_lines, *cos_lines, *sin_lines], (cos, sin)

    def _emit_frequencies(self, e, rot: str, end: str) -> tuple[str, str | None, list[str]]:
        """The inverse frequencies' local, the attention factor's (None without rope_scaling), and
        the lines computing them."""
        theta = py_float(self.theta)
        if self.rope_scaling is None:
            arange = f"torch.arange(0, {rot}, 2, dtype=torch.int64, device={e.device})"
            inv_freq, lines = e.shared("inv_freq", f"1.0 / ({theta} ** ({arange}.float() / {atom(rot)}))")
            return inv_freq, None, lines
        for name, source in sources(self.rope_scaling):
            e.helper(name, source)
        kwargs = [f"{key}={_literal(value)}" for key, value in fields(self.rope_scaling).items()]
        if needs_seq_len(self.rope_scaling):
            largest = (
                f"{e.helper('_largest', inspect.getsource(_largest))}(torch, {e.args[1]})" if self.positions else f"torch.tensor({end})"
            )
            kwargs.insert(0, f"seq_len={largest}")
        call = f"{FREQUENCIES[self.rope_scaling.type].__name__}(torch, {rot}, {theta}, {e.device}, {', '.join(kwargs)})"
        pair, lines = e.shared("frequencies", call)
        inv_freq, factor = f"{pair}[0]", f"{pair}[1]"
        return inv_freq, factor, lines


def _mrope(torch, emb, section):
    """Qwen2-VL's M-RoPE: the features of section i from position stream i (``emb`` is (S, …, R))."""
    return torch.cat([m[i % len(section)] for i, m in enumerate(emb.split(section * 2, dim=-1))], dim=-1)


def _largest(torch, positions):
    """The largest position + 1 over the batch (transformers' ``torch.max(position_ids) + 1``); 0 for none."""
    return positions.max() + 1 if positions.numel() else torch.tensor(0)


def _literal(value) -> str:
    """A scaling field as Python source: numbers that read back bit for bit."""
    if isinstance(value, list):
        return "[" + ", ".join(map(_literal, value)) + "]"
    return py_float(value) if isinstance(value, float) else repr(value)


def _table_view(table: tuple, seq: int, ndim: int, one) -> tuple:
    """The (T, R) or (B, T, R) table's shape (dims, sizes or source text) viewed to broadcast
    against an ndim-d input whose positions are on axis ``seq``: (B, 1, …, T, 1, …, R)."""
    lead = table[:-2]
    return lead + (one,) * (seq - len(lead)) + table[-2:-1] + (one,) * (ndim - 2 - seq) + table[-1:]


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


def mpt_alibi_slopes(torch, heads: int, bias_max: float, device=None):
    """MPT's ALiBi slopes, as transformers' ``build_mpt_alibi_tensor`` computes them: ``1 / 2^(k ·
    bias_max / n)`` for n the power of two at or above ``heads``; for another head count the odd
    then the even ones of those n, cut to ``heads``."""
    n = 2 ** math.ceil(math.log2(heads))
    base = torch.arange(1, n + 1, dtype=torch.int64, device=device).float() * (bias_max / n)
    slopes = 1.0 / torch.pow(2, base)
    return slopes if n == heads else torch.cat([slopes[1::2], slopes[::2]])[:heads]


@register
class Alibi(StepBase):
    """ALiBi: add a per-head linear bias to (…, H, T_q, T_kv) scores (Press et al.; BLOOM, MPT).

    The bias is ``slope[h] * j`` for key position ``j`` (the reference code's and transformers'
    ``build_alibi_tensor``; softmax is unchanged by a per-row shift), or with ``relative: true``
    the paper's ``slope[h] * (j - i)`` with query ``i`` aligned bottom-right (the last query is the
    last key). Slopes: :func:`alibi_slopes`. The bias is recorded as ``ID/bias``.

    ``bias_max`` is MPT's ``alibi_bias_max`` (its config's 8): MPT's slopes
    (:func:`mpt_alibi_slopes`) and its key positions counted back from the last key,
    ``slope[h] * (j - (T_kv - 1))``, as transformers' ``build_mpt_alibi_tensor`` makes them.
    """

    op: Literal["alibi"] = "alibi"
    relative: StrictBool = Field(False, description="bias slope * (j - i) instead of slope * j")
    bias_max: float | None = Field(
        None, gt=0, le=1024, description="MPT's alibi_bias_max: its slopes, keys counted back from the last (none: BLOOM's slopes)"
    )
    passes_scores = True
    adds_bias = "bias"  # ID/bias
    example = """\
- id: biased
  op: alibi
  input: scores            # (B, H, T, T), H of any size (slopes as in the ALiBi paper)"""

    def args(self):
        return (["j - i"] if self.relative else []) + ([f"bias_max={self.bias_max:g}"] if self.bias_max is not None else [])

    def infer(self, ins, ctx):
        scores = ins[0]
        require_float(scores, ctx.input_ids[0], "alibi")
        if len(scores.shape) < 3:
            raise StepError("alibi-shape", f"alibi needs (…, H, T_q, T_kv) scores, got {show(scores)}", "input")
        heads, t_q, t_k = scores.shape[-3:]
        if heads.value < 1:
            raise StepError("alibi-shape", f"alibi needs at least one head, got {heads}={heads.value}", "input")
        bias = fresh((heads, t_q if self.relative else ctx.alg.const(1), t_k), scores.dtype)
        biased = pointwise([scores, bias], scores.shape, scores.dtype)
        return Composite((Inner("bias", "alibi", bias, ()), Inner("biased", "alibi", biased, (0, "bias"))))  # slopes and positions only

    def kernel(self, k):
        torch, relative, bias_max = k.torch, self.relative, self.bias_max
        heads, t_q, t_k = k.ins[0].sizes[-3:]
        dtype = getattr(torch, k.ins[0].dtype)

        def alibi(scores):
            bias = alibi_bias(torch, heads, t_q, t_k, relative, bias_max, scores.device).to(dtype)
            return bias, scores + bias

        return alibi

    def emit(self, e):
        scores, meta = e.args[0], e.ins[0]
        heads, t_q, t_k = (e.size(d) for d in meta.shape[-3:])
        slopes, bias = e.local("slopes"), e.local("bias")
        keys = f"torch.arange({t_k}, device={scores}.device)"
        if self.bias_max is not None and not self.relative:
            keys = f"({keys} - ({t_k} - 1))"
        if self.relative:
            shift = "" if meta.shape[-2].same_symbol(meta.shape[-1]) else f" + ({t_k} - {atom(t_q)})"
            distance = f"({keys}[None, :] - (torch.arange({t_q}, device={scores}.device)[:, None]{shift}))[None]"
        else:
            distance = f"{keys}[None, None, :]"
        if self.bias_max is None:
            made = f"{e.helper('alibi_slopes', inspect.getsource(alibi_slopes))}(torch, {heads})"
        else:
            made = f"{e.helper('mpt_alibi_slopes', inspect.getsource(mpt_alibi_slopes))}(torch, {heads}, {py_float(self.bias_max)})"
        return [
            f"{slopes} = {made}.to({scores}.device)",
            f"{bias} = ({slopes}[:, None, None] * {distance}).to({scores}.dtype)",
            f"{e.targets[0]} = {scores} + {bias}",
        ]


def alibi_bias(torch, heads: int, t_q: int, t_k: int, relative: bool, bias_max: float | None, device=None):
    """An ``alibi`` step's (H, 1, T_kv) bias, or (H, T_q, T_kv) with ``relative`` (float32)."""
    if bias_max is None:
        slopes = alibi_slopes(torch, heads, device)  # on meta, no real memory for 2**33 heads
    else:
        slopes = mpt_alibi_slopes(torch, heads, bias_max, device)
    keys = torch.arange(t_k, device=device) - (t_k - 1 if bias_max is not None and not relative else 0)
    if relative:
        distance = keys[None, :] - (torch.arange(t_q, device=device)[:, None] + (t_k - t_q))
        return slopes[:, None, None] * distance[None]
    return slopes[:, None, None] * keys[None, None, :]


def t5_buckets(torch, t_q: int, t_k: int, num_buckets: int, max_distance: int, bidirectional: bool, device=None):
    """T5's bucket of each (query, key) pair, as transformers' ``T5Attention._relative_position_bucket``
    computes it for ``compute_bias``: the query's position is ``i + t_k - t_q`` (after a cache)."""
    query = torch.arange(t_q, dtype=torch.long, device=device)[:, None] + (t_k - t_q)
    key = torch.arange(t_k, dtype=torch.long, device=device)[None, :]
    relative = key - query
    buckets = 0
    if bidirectional:  # keys after the query use the upper half of the buckets
        num_buckets //= 2
        buckets += (relative > 0).to(torch.long) * num_buckets
        relative = torch.abs(relative)
    else:
        relative = -torch.min(relative, torch.zeros_like(relative))
    max_exact = num_buckets // 2  # exact buckets for near keys, logarithmically wider ones up to max_distance
    is_small = relative < max_exact
    large = max_exact + (torch.log(relative.float() / max_exact) / math.log(max_distance / max_exact) * (num_buckets - max_exact)).to(
        torch.long
    )
    large = torch.min(large, torch.full_like(large, num_buckets - 1))
    return buckets + torch.where(is_small, relative, large)


def _t5_records(op: str, table: Meta, read: int, t_q, t_k, bidirectional: bool, max_distance: int, ctx) -> tuple[Inner, Inner, Inner]:
    """The records of T5's ``compute_bias`` from an (num_buckets, H) table, the step's input
    ``read``: the (T_q, T_kv)
    buckets, the lookup (T_q, T_kv, H) and the (1, H, T_q, T_kv) bias, a view of the lookup as
    ``permute(2, 0, 1).unsqueeze(0)`` strides it. A table too small for T5's exact buckets, or a
    max_distance within them, is refused at ``max_distance``."""
    exact = table.sizes[0] // (4 if bidirectional else 2)
    if exact < 1 or max_distance <= exact:
        raise StepError(
            "value",
            f"{table.sizes[0]} buckets make {exact} exact ones, and max_distance {max_distance} must be above that",
            "max_distance",
            "T5 uses 32 buckets and max_distance 128",
        )
    heads = table.shape[1]
    values = with_root(fresh((t_q, t_k, heads), table.dtype), ctx.record("values"))
    along_q, along_k, along_h = values.stride  # permute(2, 0, 1), then unsqueeze(0) as torch strides it
    bias = view(values, (ctx.alg.const(1), heads, t_q, t_k), (heads.value * along_h, along_h, along_q, along_k))
    return (
        Inner("buckets", op, fresh((t_q, t_k), "int64"), ()),  # from positions alone
        Inner("values", "embedding", values, ("buckets", read)),
        Inner("bias", "permute", bias, ("values",)),
    )


def _t5_bias(torch, embedding, table, t_q: int, t_k: int, max_distance: int, bidirectional: bool):
    """(buckets, values, bias) as ``compute_bias`` makes them, on the table's device."""
    buckets = t5_buckets(torch, t_q, t_k, table.shape[0], max_distance, bidirectional, device=table.device)
    values = embedding(buckets, table)
    return buckets, values, values.permute(2, 0, 1).unsqueeze(0)


def _emit_t5_bias(e, table: str, t_q: str, t_k: str, max_distance: int, bidirectional: bool) -> tuple[list[str], str]:
    """The lines of ``compute_bias`` for export, and the expression of the (1, H, T_q, T_kv) bias."""
    buckets, values = e.local("buckets"), e.local("values")
    helper = e.helper("t5_buckets", inspect.getsource(t5_buckets))
    lines = [
        f"{buckets} = {helper}(torch, {t_q}, {t_k}, {table}.shape[0], {max_distance}, {bidirectional}, {table}.device)",
        f"{values} = F.embedding({buckets}, {table})",
    ]
    return lines, f"{values}.permute(2, 0, 1).unsqueeze(0)"


T5_FIELDS = {
    "table": "(num_buckets, H) param: one learned bias per bucket and head (relative_attention_bias)",
    "bidirectional": "true: the encoder's buckets (keys on both sides); false: the decoder's",
    "max_distance": "relative_attention_max_distance: distances from here share the last bucket",
}


@register
class RelativeBias(StepBase):
    """T5's relative position bias added to (…, H, T_q, T_kv) scores, exactly as transformers'
    ``T5Attention.compute_bias``::

        relative = j - i                               # int64 (T_q, T_kv); query i at i + T_kv - T_q
        buckets = _relative_position_bucket(relative, bidirectional, num_buckets, max_distance)
        bias = table[buckets].permute(2, 0, 1).unsqueeze(0)     # (1, H, T_q, T_kv), table (num_buckets, H)
        out = scores + bias

    ``bidirectional: true`` is the encoder's (half the buckets for keys after the query),
    ``false`` the decoder's (only keys before it). The number of buckets is the table's first dim.
    Recorded: ``ID/buckets``, ``ID/values`` (the table lookup, (T_q, T_kv, H)) and ``ID/bias``.
    T5 does not scale its scores: the pipeline needs no ``scale`` step. Where a fused ``sdpa``
    takes the bias as its float ``mask`` (there are no scores to add it to), compute it with
    ``relative_position_bias``."""

    op: Literal["relative_bias"] = "relative_bias"
    table: TensorId = Field(description=T5_FIELDS["table"])
    bidirectional: StrictBool = Field(description=T5_FIELDS["bidirectional"])
    max_distance: StrictInt = Field(128, ge=2, description=T5_FIELDS["max_distance"])
    param_fields = ("table",)
    passes_scores = True
    adds_bias = "bias"  # ID/bias
    example = """\
- id: biased
  op: relative_bias
  input: scores            # (B, H, T, T), not scaled
  table: rel_bias          # (num_buckets, H)
  bidirectional: true
  max_distance: 128"""

    def args(self):
        return ["bidirectional" if self.bidirectional else "causal", f"max_distance={self.max_distance}"]

    def infer(self, ins, ctx):
        scores, table = ins
        require_float(scores, ctx.input_ids[0], "relative_bias")
        if len(scores.shape) < 3 or len(table.shape) != 2 or table.sizes[1] != scores.sizes[-3]:
            raise StepError(
                "shape",
                f"relative_bias needs (…, H, T_q, T_kv) scores and an (num_buckets, H) table, got {show(scores)} and {show(table)}",
                "table",
            )
        if table.dtype != scores.dtype:
            raise StepError("dtype", f"relative_bias of {scores.dtype} scores with a {table.dtype} table", "table")
        records = _t5_records(self.op, table, 1, *scores.shape[-2:], self.bidirectional, self.max_distance, ctx)
        bias = records[-1].meta
        biased = pointwise([scores, bias], broadcast_dims(scores.shape, bias.shape), scores.dtype)
        return Composite((*records, Inner("biased", "add", biased, (0, "bias"))))

    def kernel(self, k):
        torch, embedding = k.torch, k.F.embedding
        t_q, t_k = k.ins[0].sizes[-2:]
        settings = (self.max_distance, self.bidirectional)

        def relative_bias(scores, table):
            records = _t5_bias(torch, embedding, table, t_q, t_k, *settings)
            return (*records, scores + records[-1])

        return relative_bias

    def emit(self, e):
        scores, table = e.args
        t_q, t_k = (e.size(d) for d in e.ins[0].shape[-2:])
        lines, bias = _emit_t5_bias(e, table, t_q, t_k, self.max_distance, self.bidirectional)
        return [*lines, f"{e.targets[0]} = {scores} + {bias}"]


@register
class RelativePositionBias(StepBase):
    """T5's relative position bias as a tensor of its own, (1, H, T_q, T_kv), exactly as
    transformers' ``T5Attention.compute_bias(queries, keys)`` returns it::

        relative = j - i                               # int64 (T_q, T_kv); query i at i + T_kv - T_q
        buckets = _relative_position_bucket(relative, bidirectional, num_buckets, max_distance)
        out = table[buckets].permute(2, 0, 1).unsqueeze(0)      # table (num_buckets, H)

    It reads no data input: ``queries`` and ``keys`` are dim expressions (``keys: past + T`` after
    a cache). This is the form a fused ``sdpa`` takes as its float ``mask`` (transformers' sdpa
    path for T5: ``where(keep, position_bias, min)``, or ``position_bias + mask``); to add the bias
    to scores, use ``relative_bias``. Fields and buckets as ``relative_bias``'s. Recorded:
    ``ID/buckets`` and ``ID/values`` (the table lookup, (T_q, T_kv, H)); the bias is a view of it."""

    op: Literal["relative_position_bias"] = "relative_position_bias"
    table: TensorId = Field(description=T5_FIELDS["table"])
    queries: DimText = Field(description="a dim expression: the number of queries, T_q")
    keys: DimText = Field(description="a dim expression: the number of keys, T_kv (the queries are the last T_q of them)")
    bidirectional: StrictBool = Field(description=T5_FIELDS["bidirectional"])
    max_distance: StrictInt = Field(128, ge=2, description=T5_FIELDS["max_distance"])
    arity = 0
    param_fields = ("table",)
    example = """\
- id: position_bias
  op: relative_position_bias
  table: rel_bias          # (num_buckets, H)
  queries: T
  keys: T
  bidirectional: true
  max_distance: 128        # -> (1, H, T, T): the sdpa's float mask"""

    def args(self):
        return [f"{self.queries}x{self.keys}", "bidirectional" if self.bidirectional else "causal", f"max_distance={self.max_distance}"]

    def infer(self, ins, ctx):
        (table,) = ins
        if len(table.shape) != 2:
            raise StepError("shape", f"relative_position_bias needs an (num_buckets, H) table, got {show(table)}", "table")
        require_float(table, ctx.input_ids[0], "relative_position_bias")
        t_q, t_k = ctx.dim(self.queries, "queries"), ctx.dim(self.keys, "keys")
        if t_q.value > t_k.value:
            raise StepError(
                "value",
                f"{t_q.value} queries ({self.queries}) and {t_k.value} keys ({self.keys}): the queries are the last of the keys' positions",
                "keys",
                "keys: past + T for a query block after a cache",
            )
        return Composite(_t5_records(self.op, table, 0, t_q, t_k, self.bidirectional, self.max_distance, ctx))

    def kernel(self, k):
        torch, embedding = k.torch, k.F.embedding
        t_q, t_k = k.value(self.queries), k.value(self.keys)
        settings = (self.max_distance, self.bidirectional)
        return lambda table: _t5_bias(torch, embedding, table, t_q, t_k, *settings)

    def emit(self, e):
        (table,) = e.args
        lines, bias = _emit_t5_bias(e, table, e.dim(self.queries), e.dim(self.keys), self.max_distance, self.bidirectional)
        return [*lines, f"{e.targets[0]} = {bias}"]
