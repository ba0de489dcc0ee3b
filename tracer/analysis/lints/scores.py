"""Lints about attention scores: how they are scaled, and over which axis they are normalised."""

from __future__ import annotations

import math

from ...core import dimexpr
from ..attention import prescales, rotations
from ..config import MULTIPLIER_KEYS, SCALE_DIM_KEYS, axis_names, declared, is_quantity
from ..roles import FEATURES, HEAD_DIM, HEADS, dim_role
from .registry import Lint, register, show, warning


@register
class ScaleMismatch(Lint):
    """**What.** The scores that reach a softmax are scaled by something other than what the model
    calls for. Every factor counts: `scale` steps between the product and the softmax (through
    `mask` and `dropout` steps), `scale` steps on q or k after their projection
    (`q_proj(x) * scaling`), and a fused kernel's own scale (`sdpa`: 1/√Dh unless `scale:` says
    otherwise); splitting the factor over several steps is fine. What the model calls for:

    - with a `checkpoint:` section, the config's scale: a dim bound from `query_pre_attn_scalar`
      (Gemma: 1/√S), or a scale step's field bound from a config key (Granite's
      `attention_multiplier`), or a required `attention_multiplier`;
    - otherwise 1/√d_k, d_k the dim the QK product contracts over (the keys' last dim), times
      mscale² when the queries' rope is YaRN with `mscale_all_dim` (DeepSeek-V3).

    A scale written in a declared quantity is the design and is not judged without a config: a dim
    that is no tensor's axis and whose name says no axis role (`{sqrt: query_pre_attn_scalar}`,
    DeBERTa's `{sqrt: scale_factor * Dh}` or `{sqrt: 3 * Dh}`). A scale written as numbers alone
    is judged only when it reads as a slip: 1/√n, √n or 1/n for the value n of a head dim or a
    model width, or d_k's root applied by two factors (Granite's `multiply: 0.0078125` is its `attention_multiplier`, not a slip).
    Scores with no scale at all are not flagged (T5 scales nothing, by design; tutorial 001's
    first part uses raw dot products), and a contraction over a head count is left to
    `head-split-order`, whose fix is the real one.

    **Why it matters.** The scale sets the softmax temperature: too small a divisor makes the
    weights peakier than intended (and gradients smaller), too large a divisor flattens them. It is
    also exactly the kind of constant that survives a refactor: tutorial 004's
    `scaled_dot_product_attention(Q, K, V, d_k=4)` divides by √4 while its keys are 3-dim, and a
    query pre-scaled by 1/√Dh before SDPA is scaled twice.

    **Fix.** One factor of 1/√d_k: `divide: {sqrt: D}` with D the keys' last dim as a dim name
    (`Dh`, `d_k`, …) so it follows `--dim` overrides, or SDPA's default with no pre-scaling; or
    the config's scale, written in the dim or field the checkpoint binds from it.
    """

    code, example, origin = "scale-mismatch", "scale_mismatch", "tutorial 004"

    def check(self, analysis):
        config, axes = declared(analysis), {}
        for site in analysis.attention:
            d_k = site.head_dim
            if d_k is None or analysis.axis_roles(site.query)[-1:] == (HEADS,):
                continue
            factors = prescales(analysis, site.query) + prescales(analysis, site.keys) + list(site.scales)
            explicit = site.fused and analysis.node(site.product).step.fused_attention().scale is not None
            if not factors and not explicit:
                continue  # no scale written anywhere: raw dot products, or the kernel's default
            got = math.prod(f.multiplier for f in factors) * (site.implicit_scale if site.fused else 1.0)
            wanted = _configured(analysis, site, factors, config)
            if wanted is None:
                if _declared_quantity(analysis, site, factors, axes):
                    continue
                wanted = _by_head_dim(analysis, site)
                if not _judged(analysis, site, factors, got, wanted[0], explicit):
                    continue
            want, reason, fix = wanted
            if not (math.isfinite(want) and math.isclose(got, want, rel_tol=1e-6)):
                yield self._warning(analysis, site, factors, got, want, reason, fix)

    def _warning(self, analysis, site, factors, got: float, want: float, reason: str, fix: str | None):
        written = [f.text for f in factors] + ([f"{site.product}'s own {site.implicit_scale:.4g}"] if site.fused else [])
        if fix is None and site.fused:
            fix = "drop the extra factor: SDPA already scales by 1/√Dh" if factors else "leave `scale:` out: SDPA's default is 1/√Dh"
        elif fix is None:
            fix = f"use `divide: {{sqrt: {site.head_dim}}}`"
        message = f"{reason} = {want:.4g}; they are scaled by {' * '.join(written)} = {got:.4g} — {fix}"
        if not factors:
            return warning(analysis, analysis.node(site.product), self.code, message, "scale")
        first = analysis.node(factors[0].step)
        return warning(analysis, first, self.code, message, "divide" if first.step.divide is not None else "multiply")


def _by_head_dim(analysis, site) -> tuple[float, str, str | None]:
    """1/√d_k (times the mscale² a YaRN rope asks for), why, and the fix (None: the default one)."""
    d_k = site.head_dim
    key_dim = str(d_k) if str(d_k) == str(d_k.value) else f"{d_k}={d_k.value}"
    want = 1.0 / math.sqrt(d_k.value) if d_k.value > 0 else math.inf
    reason = f"'{site.product}' contracts q·k over the keys' last dim, {key_dim}, so its scores should be scaled by 1/√{d_k.value}"
    ropes = rotations(analysis, site.query) or rotations(analysis, site.keys)
    mscale = ropes[0].step.rotation().score_scale if ropes else 1.0
    if mscale == 1.0:
        return want, reason, None
    reason += f" times the mscale² {mscale:.4g} of the YaRN rope '{ropes[0].id}' (DeepSeek's mscale_all_dim)"
    return want * mscale, reason, f"multiply by {want * mscale!r}"


def _configured(analysis, site, factors, config) -> tuple[float, str, str] | None:
    """What the checkpoint's config says the scale is, why, and the fix; None when it says nothing."""
    bound = config.dim_for(SCALE_DIM_KEYS)
    if bound is not None:
        dim, key = bound
        node = analysis.node(factors[0].step) if factors else analysis.node(site.product)
        value = node.dims.dim(dim).value
        if value <= 0:
            return None  # no square root to take: the shape pass has its own word on a dim of 0
        reason = (
            f"the checkpoint binds {dim} from config.{key}, so the scores of '{site.product}' should be scaled by 1/√{dim} (1/√{value})"
        )
        return 1.0 / math.sqrt(value), reason, f"use `divide: {{sqrt: {dim}}}` and no other factor"
    for f in factors:
        key = config.field_key(f.step, "multiply") or config.field_key(f.step, "divide")
        if key is not None:
            reason = f"'{f.step}' takes its factor from config.{key}, so the scores of '{site.product}' should be scaled by it alone"
            return f.multiplier, reason, f"drop every other factor, keep '{f.step}'"
    key = config.field_key(site.product, "scale") if site.fused else None
    if key is not None:
        reason = f"'{site.product}' takes its scale from config.{key}, so its scores should be scaled by it alone"
        return site.implicit_scale, reason, "drop every other factor"
    required = config.required_of(MULTIPLIER_KEYS)
    if required is not None and isinstance(required[1], int | float) and not isinstance(required[1], bool):
        key, value = required
        reason = f"the checkpoint requires config.{key} = {value}, so the scores of '{site.product}' should be scaled by it"
        return float(value), reason, f"`multiply: {float(value)!r}` (the config's {key}) and no other factor"
    return None


def _declared_quantity(analysis, site, factors, axes: dict) -> bool:
    """A factor written in a declared quantity: ``{sqrt: query_pre_attn_scalar}``, or the head dim
    with a constant (DeBERTa's ``{sqrt: 3 * Dh}``). ``axes`` keeps the file's axis names once found."""
    head = _names_of(site.head_dim.label)
    for f in factors:
        names = _names_of(f.expr) if f.expr is not None else frozenset()
        if not names or f.expr in head:
            continue  # a number, or the head dim itself: judged as written
        others = names - head
        if not others:
            return True
        if "names" not in axes:
            axes["names"] = axis_names(analysis)
        if all(is_quantity(name, axes["names"]) for name in others):
            return True
    return False


def _names_of(text: str) -> frozenset[str]:
    return frozenset([text]) if text.isidentifier() else dimexpr.names(dimexpr.parse(text))


def _width(analysis, name: str) -> bool:
    """A dim a scale could have been meant to take the root of: a head dim or a model width (not a
    vocabulary, a token count or a batch, whose roots a configured multiplier may equal by chance)."""
    return dim_role(analysis.alg.dim(name), analysis.alg.exprs) in (HEAD_DIM, FEATURES)


def _judged(analysis, site, factors, got: float, want: float, explicit: bool) -> bool:
    """A scale written in dims is always judged; one written as numbers only when it reads as a
    slip: 1/√n or √n for a head dim's or width's value n, 1/n for a divisor (the root forgotten), or the right root
    twice. A multiplier of 1/n is a configured one (Granite's attention_multiplier is 1/Dh)."""
    if any(f.expr is not None for f in factors):
        return True
    if site.fused and not explicit and factors:
        return True  # a pre-scaled query into SDPA's own 1/√Dh: scaled twice
    values = {value for name, value in analysis.alg.values.items() if value > 0 and _width(analysis, name)}
    values |= {site.head_dim.value} if site.head_dim.value > 0 else set()
    divides = any(analysis.node(f.step).step.divide is not None for f in factors)
    slips = {1 / math.sqrt(n) for n in values} | {math.sqrt(n) for n in values}
    slips |= {want * want} if len(factors) > 1 else set()  # one number of 1/Dh is Granite's multiplier
    slips |= {1 / n for n in values} if divides else set()
    return any(math.isclose(got, slip, rel_tol=1e-6) for slip in slips)


@register
class ScaleAfterSoftmax(Lint):
    """**What.** A `scale` step between the softmax and the product with the values.

    **Why it matters.** The 1/√d_k scale belongs on the scores, where it sets the softmax's
    temperature. Applied to the weights it only shrinks the output (each row no longer sums to
    1), and the softmax runs unscaled: peaky attention, a smaller output, no error.

    **Fix.** Move the scale between the QK product and the softmax.
    """

    code, example, origin = "scale-after-softmax", "scale_after_softmax", "attention ports"

    def check(self, analysis):
        for site in analysis.attention:
            for step in site.after:
                node = analysis.node(step)
                if node.step.scaling(lambda text, node=node: node.dims.dim(text).value) is not None:
                    message = (
                        f"it scales the weights of softmax '{site.softmax}', after the softmax: their rows no longer sum to 1 and "
                        f"the softmax saw unscaled scores — scale the scores '{site.scores}' before the softmax instead"
                    )
                    yield warning(analysis, node, self.code, message)


@register
class SoftmaxOverQueries(Lint):
    """**What.** A softmax over the query axis of attention scores. Scores `q @ k^T` are
    `(…, T_q, T_kv)`: each query's weights over the keys must sum to 1, `dim: -1`. The query axis
    is the first operand's rows; for `einsum` scores it is the last output letter that only the
    first operand has (`'bqd,bkd->bkq'` puts it last).

    **Why it matters.** With `dim: -2` every key's column sums to 1 instead; for square scores no
    shape betrays it.

    **Fix.** `dim: -1` (the keys' axis).
    """

    code, example, origin = "softmax-over-queries", "softmax_over_queries", "any attention"

    def check(self, analysis):
        for site in analysis.attention:
            if site.fused or site.query_axis is None:
                continue
            softmax = analysis.node(site.softmax)
            ndim = len(analysis.metas[site.scores].shape)
            dim = softmax.step.normalises()
            if ndim < 2 or dim % ndim != site.query_axis % ndim:
                continue
            key = site.key_axis - ndim if site.key_axis is not None else -1
            message = (
                f"softmax over dim {dim} normalises the scores '{site.product}' {show(analysis, site.scores)} over the queries: "
                f"each key's column sums to 1, not each query's row — use dim: {key} (the keys)"
            )
            yield warning(analysis, softmax, self.code, message, "dim")
