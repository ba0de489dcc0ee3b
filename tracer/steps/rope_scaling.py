"""RoPE frequency scaling (``rope``'s ``rope_scaling:`` field), as transformers' ``ROPE_INIT_FUNCTIONS``
compute it (``modeling_rope_utils.py``), op for op so the frequencies are the same floats.

Each ``rope_<type>(torch, rot, theta, device, **fields)`` returns ``(inv_freq, attention_factor)``:
the ``(rot/2,)`` float32 frequencies and the number cos and sin are multiplied by. ``dynamic`` and
``longrope`` also take ``seq_len``, a 0-d int64 tensor: the largest position + 1 over the whole
batch, as transformers' ``dynamic_rope_update`` computes it. ``tracer export`` copies these functions
into the module it writes (``inspect.getsource``), so they use only ``torch`` and ``math``.
"""

from __future__ import annotations

import inspect
import math
from typing import Annotated, Literal

from pydantic import Field, StrictBool, StrictInt, model_validator

from ..core.fields import Strict

Positive = Annotated[float, Field(gt=0, allow_inf_nan=False)]
Context = Annotated[StrictInt, Field(gt=0, description="a context length in tokens")]


def rope_default(torch, rot, theta, device):
    """``_compute_default_rope_parameters``: ``1 / theta ** (2i / rot)``."""
    return 1.0 / (theta ** (torch.arange(0, rot, 2, dtype=torch.int64, device=device).float() / rot))


def rope_linear(torch, rot, theta, device, *, factor):
    # the frequencies are divided, not the positions: the two differ in the last bit
    return rope_default(torch, rot, theta, device) / factor, 1.0


def rope_dynamic(torch, rot, theta, device, *, seq_len, factor, max_position_embeddings):
    if seq_len <= max_position_embeddings:  # the frequencies made at init, in Python floats
        base = theta * ((factor * max_position_embeddings / max_position_embeddings) - (factor - 1)) ** (rot / (rot - 2))
    else:  # remade at call time from the tensor seq_len, in float32
        base = theta * ((factor * seq_len / max_position_embeddings) - (factor - 1)) ** (rot / (rot - 2))
    return rope_default(torch, rot, base, device), 1.0


def rope_llama3(torch, rot, theta, device, *, factor, low_freq_factor, high_freq_factor, original_max_position_embeddings):
    inv_freq = rope_default(torch, rot, theta, device)
    low_freq_wavelen = original_max_position_embeddings / low_freq_factor
    high_freq_wavelen = original_max_position_embeddings / high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    inv_freq_llama = torch.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
    smooth = (original_max_position_embeddings / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
    smoothed = (1 - smooth) * inv_freq_llama / factor + smooth * inv_freq_llama
    medium = ~(wavelen < high_freq_wavelen) * ~(wavelen > low_freq_wavelen)
    return torch.where(medium, smoothed, inv_freq_llama), 1.0


def yarn_mscale(scale: float, m: float = 1.0) -> float:
    """YaRN's ``0.1 m ln(s) + 1`` (transformers' ``get_mscale``/``yarn_get_mscale``)."""
    return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0


def yarn_attention_factor(factor, mscale, mscale_all_dim):
    """YaRN's ``0.1 ln(s) + 1``, or DeepSeek's ratio of two such scales (``mscale``, ``mscale_all_dim``)."""
    if mscale and mscale_all_dim:
        return float(yarn_mscale(factor, mscale) / yarn_mscale(factor, mscale_all_dim))
    return yarn_mscale(factor)


def yarn_ramp(torch, rot, theta, original, beta_fast, beta_slow, truncate, device):
    """How much each frequency keeps its own value (1) or is interpolated (0): a linear ramp between
    the dims that turn ``beta_fast`` and ``beta_slow`` times over the original context."""

    def correction_dim(rotations):
        return (rot * math.log(original / (rotations * 2 * math.pi))) / (2 * math.log(theta))

    low, high = correction_dim(beta_fast), correction_dim(beta_slow)
    if truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, rot - 1)
    if low == high:
        high += 0.001  # transformers' guard against a zero-width ramp
    ramp = torch.clamp((torch.arange(rot // 2, dtype=torch.float32, device=device) - low) / (high - low), 0, 1)
    return 1 - ramp


def rope_yarn(
    torch,
    rot,
    theta,
    device,
    *,
    factor,
    original_max_position_embeddings,
    beta_fast,
    beta_slow,
    mscale,
    mscale_all_dim,
    attention_factor,
    truncate,
):
    if attention_factor is None:
        attention_factor = yarn_attention_factor(factor, mscale, mscale_all_dim)
    keep = yarn_ramp(torch, rot, theta, original_max_position_embeddings, beta_fast, beta_slow, truncate, device)
    pos_freqs = theta ** (torch.arange(0, rot, 2, device=device).float() / rot)
    return (1.0 / (factor * pos_freqs)) * (1 - keep) + (1.0 / pos_freqs) * keep, attention_factor


def rope_longrope(
    torch, rot, theta, device, *, seq_len, short_factor, long_factor, original_max_position_embeddings, factor, attention_factor
):
    if attention_factor is None:
        small = factor <= 1.0
        attention_factor = 1.0 if small else math.sqrt(1 + math.log(factor) / math.log(original_max_position_embeddings))
    # the long factors once any position of the batch is past the original context
    chosen = long_factor if seq_len > original_max_position_embeddings else short_factor
    ext_factors = torch.tensor(chosen, dtype=torch.float32, device=device)
    shape = torch.arange(0, rot, 2, dtype=torch.int64, device=device).float() / rot
    return 1.0 / (ext_factors * theta**shape), attention_factor


class Linear(Strict):
    """Position interpolation: the frequencies divided by ``factor`` (Gemma 3 global layers)."""

    type: Literal["linear"]
    factor: Positive


class Dynamic(Strict):
    """Dynamic NTK: theta grows once positions pass ``max_position_embeddings``."""

    type: Literal["dynamic"]
    factor: Positive
    max_position_embeddings: Context


class Llama3(Strict):
    """Llama 3.1: low frequencies divided by ``factor``, high ones kept, a smooth band between."""

    type: Literal["llama3"]
    factor: Positive
    low_freq_factor: Positive = 1.0
    high_freq_factor: Positive = 4.0
    original_max_position_embeddings: Context = 8192

    @model_validator(mode="after")
    def _band(self):
        if self.high_freq_factor <= self.low_freq_factor:
            raise ValueError("llama3 scaling needs high_freq_factor > low_freq_factor (4.0 and 1.0 in Llama 3.1)")
        return self


class Yarn(Strict):
    """YaRN (DeepSeek-V3, Qwen long context): frequencies blended by a ramp, cos and sin scaled."""

    type: Literal["yarn"]
    factor: Positive
    original_max_position_embeddings: Context
    beta_fast: Positive = 32.0
    beta_slow: Positive = 1.0
    mscale: Positive | None = None
    mscale_all_dim: Positive | None = None
    attention_factor: Positive | None = Field(None, description="default: from factor (and mscale, mscale_all_dim)")
    truncate: StrictBool = True


class Longrope(Strict):
    """LongRoPE (Phi-3): per-frequency factors, the long ones past the original context."""

    type: Literal["longrope"]
    short_factor: list[Positive]
    long_factor: list[Positive]
    # its attention factor divides by ln(original_max_position_embeddings)
    original_max_position_embeddings: Annotated[StrictInt, Field(ge=2)]
    factor: Positive | None = Field(None, description="max_position_embeddings / original_max_position_embeddings")
    attention_factor: Positive | None = None

    @model_validator(mode="after")
    def _factors(self):
        if self.factor is None and self.attention_factor is None:
            raise ValueError("longrope needs 'factor' (max_position_embeddings / original_max_position_embeddings) or 'attention_factor'")
        if len(self.short_factor) != len(self.long_factor):
            raise ValueError(f"short_factor has {len(self.short_factor)} numbers and long_factor {len(self.long_factor)}: give rot/2 each")
        return self


Scaling = Annotated[Linear | Dynamic | Llama3 | Yarn | Longrope, Field(discriminator="type")]
FREQUENCIES = {
    "linear": rope_linear,
    "dynamic": rope_dynamic,
    "llama3": rope_llama3,
    "yarn": rope_yarn,
    "longrope": rope_longrope,
}


HELPERS = (yarn_mscale, rope_default, yarn_attention_factor, yarn_ramp)  # what the frequency functions call, callees first


def fields(scaling: Strict) -> dict:
    """The keyword arguments of the scaling's frequency function."""
    return scaling.model_dump(exclude={"type"})


def needs_seq_len(scaling: Strict) -> bool:
    """Whether the frequencies depend on the largest position (a run-time value with ``positions``)."""
    return "seq_len" in inspect.signature(FREQUENCIES[scaling.type]).parameters


def sources(scaling: Strict) -> list[tuple[str, str]]:
    """``(name, source)`` of the scaling's frequency function and of the helpers it calls, for export."""
    main = FREQUENCIES[scaling.type]
    text = inspect.getsource(main)
    texts = {f: inspect.getsource(f) for f in HELPERS}
    used = {f for f in HELPERS if f"{f.__name__}(" in text}
    while True:  # and the helpers those call (yarn_attention_factor calls yarn_mscale)
        more = {g for f in used for g in HELPERS if g not in used and f"{g.__name__}(" in texts[f]}
        if not more:
            break
        used |= more
    return [(f.__name__, texts[f]) for f in HELPERS if f in used] + [(main.__name__, text)]
