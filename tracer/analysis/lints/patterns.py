"""Lints about patterns a pipeline builds by hand from index arithmetic (arange, sub, compare,
logical): sliding-window bands, and ALiBi biases. The values are folded before running
(``tracer.analysis.values``) and held against what the file declares: a window dim, the heads."""

from __future__ import annotations

import math
import re

from ..config import declared
from ..values import static_value
from .registry import Lint, register, show, warning

# a dim that names the attention window (Mistral's sliding_window, ModernBERT's local_attention)
WINDOW_NAMES = re.compile(r"w|win|window|window_?size|sliding_?window|local_?window|attention_?window|local_?attention", re.I)
WINDOW_KEYS = ("sliding_window", "local_attention", "attention_window", "window_size")
TOTAL_HEADS = re.compile(r"h_?total|h_?global|total_?heads|n_?heads_?total|num_?heads_?total|global_?heads", re.I)
RANK = re.compile(r"rank|tp_?rank|shard|tp_?index", re.I)


@register
class WindowBand(Lint):
    """**What.** A sliding-window mask built by hand from comparisons (`arange`, `sub`,
    `compare`, `logical`) whose band is one key wider or narrower than the window the file
    declares: a dim named like a window (`W`, `window`, `sliding_window`, `local_attention`) or
    bound from the config's `sliding_window`. A causal window of W keeps the W keys `i-W+1 .. i`
    (transformers' `kv_idx > q_idx - W`); a symmetric one keeps `W // 2` keys on each side
    (ModernBERT's `|i - j| <= local_attention // 2`). The mask's values are folded before running.

    **Why it matters.** `i - j <= W` instead of `< W` attends to W + 1 keys: the model runs, the
    first W rows even match, and every later token sees one token its checkpoint never saw.

    **Fix.** The comparison the message names: `lt` for `le` (or the value one less), or the
    reverse; or `op: mask` with `window: W`, which has the convention built in.
    """

    code, example, origin = "window-band", "window_band", "sliding-window attention (Mistral, Gemma, ModernBERT)"

    def check(self, analysis):
        windows = _declared_windows(analysis)
        if not windows:
            return
        memo: dict = {}
        for site in analysis.attention:
            for step, masking in site.masks:
                kept = _kept(analysis, masking, memo)
                band = _band(kept) if kept else None
                if band is None:
                    continue
                kind, width = band
                for name, value in windows:
                    want = value if kind == "causal" else value // 2
                    if abs(width - want) == 1 and (kind == "causal" or width != value):
                        yield self._warning(analysis, step, masking, memo, kind, width, name, value, want)
                        break

    def _warning(self, analysis, step, masking, memo, kind, width, name, value, want):
        where = _window_comparison(analysis, masking.tensor, memo) or analysis.node(step)
        keys = f"{width} keys up to each query" if kind == "causal" else f"{width} keys on each side of each query"
        wanted = f"{want} (the window {name} = {value})" if kind == "causal" else f"{name} // 2 = {want}"
        side = "one key more" if width > want else "one key fewer"
        fix = (
            "use cmp lt for le (gt for ge), or move the value by one"
            if width > want
            else "use cmp le for lt (ge for gt), or move the value by one"
        )
        message = (
            f"the mask '{masking.tensor}' {show(analysis, masking.tensor)} keeps {keys}, {side} than {wanted} — {fix}, "
            f"or write op: mask with window: {name}"
        )
        return warning(analysis, where, self.code, message, "value" if _has_value(where) else None)


@register
class BandPolarity(Lint):
    """**What.** A mask built by hand from comparisons that hides every query's own position (the
    diagonal) while it keeps other keys: a causal or sliding-window pattern applied with its
    polarity flipped, so each query sees exactly the keys its window was meant to hide. This is
    `mask-polarity` for masks computed in the file rather than declared with `init: tril`/`triu`.

    **Why it matters.** Every row is still finite (other keys are kept), so nothing turns NaN; the
    model attends to the far past or the future and never to the token itself.

    **Fix.** `polarity: keep` for a mask that is True inside the window, `polarity: block` for one
    that is True outside it (or invert the comparison).
    """

    code, example, origin = "band-polarity", "band_polarity", "hand-built window masks"

    def check(self, analysis):
        memo: dict = {}
        for site in analysis.attention:
            for step, masking in site.masks:
                kept = _kept(analysis, masking, memo, with_pattern=False)
                if not kept or any(row[i] for i, row in enumerate(kept)) or not any(any(row) for row in kept):
                    continue
                other = "block" if masking.polarity == "keep" else "keep"
                message = (
                    f"with polarity {masking.polarity} the mask '{masking.tensor}' {show(analysis, masking.tensor)} hides every query's "
                    f"own position and keeps only keys away from it: the window is inverted — use polarity: {other}"
                )
                yield warning(analysis, analysis.node(step), self.code, message, "polarity")


@register
class AlibiSlopes(Lint):
    """**What.** An ALiBi bias built by hand (slopes times key or relative positions, added to the
    scores) whose slopes are not ALiBi's: negative (the bias grows with distance, favouring far
    keys), in reversed head order (ALiBi's head 0 has the steepest slope, 2^(-8/H)), or, in a
    tensor-parallel shard that declares its rank and the total head count, the first heads' slopes
    rather than those of the shard's own heads (`slopes[rank * H : (rank + 1) * H]`). The bias is
    folded before running; a bias that is not linear in the key position is not judged.

    **Why it matters.** Shapes cannot show it. Flipped slopes make attention prefer the most
    distant tokens; reversed or unshifted slopes give each head another head's reach, so the
    checkpoint's heads attend over the wrong spans.

    **Fix.** Slopes `2 ** (-8 * (h + 1) / H)` for the global head h (BLOOM's
    `build_alibi_tensor`, or `op: alibi`), positive, times `j` or `j - i`.
    """

    code, example, origin = "alibi-slopes", "alibi_slopes", "ALiBi (BLOOM, MPT), tensor-parallel shards"

    def check(self, analysis):
        memo: dict = {}
        for site in analysis.attention:
            heads = analysis.metas[site.scores].sizes[-3] if site.scores and len(analysis.metas[site.scores].sizes) >= 3 else None
            for step, tensor in site.biases:
                slopes = _slopes(static_value(analysis, tensor, memo), heads) if heads else None
                if slopes is None:
                    continue
                problem = _slope_problem(analysis, slopes)
                if problem is not None:
                    maker = analysis.producer(tensor) or analysis.node(step)  # the product of slopes and positions
                    yield warning(analysis, maker, self.code, f"the bias '{tensor}' {show(analysis, tensor)} added by '{step}': {problem}")


def _declared_windows(analysis) -> list[tuple[str, int]]:
    config = declared(analysis)
    names = [dim for dim, key in config.dims.items() if key.rsplit(".", 1)[-1] in WINDOW_KEYS]
    names += [n for n in analysis.alg.values if WINDOW_NAMES.fullmatch(n) and n not in names]
    return [(n, analysis.alg.values[n]) for n in names if n in analysis.alg.values and analysis.alg.values[n] > 0]


def _kept(analysis, masking, memo, with_pattern: bool = True) -> list[list[bool]] | None:
    """Which keys each query keeps, for a square mask tensor known before running (and the step's
    own causal pattern when ``with_pattern``)."""
    if masking.tensor is None or masking.polarity is None:
        return None
    value = static_value(analysis, masking.tensor, memo)
    rows = value.rows() if value is not None else []
    if len(rows) < 2 or len(rows) != len(rows[0]):
        return None
    keep = masking.polarity == "keep"
    kept = [[bool(v) == keep for v in row] for row in rows]
    if with_pattern and masking.causal:
        kept = [[k and j <= i for j, k in enumerate(row)] for i, row in enumerate(kept)]
    return kept


def _band(kept: list[list[bool]]) -> tuple[str, int] | None:
    """("causal", keys per full row) for keys i-w+1 .. i, ("symmetric", h) for i-h .. i+h; else None."""
    spans = []
    for i, row in enumerate(kept):
        keys = [j for j, k in enumerate(row) if k]
        if not keys or keys != list(range(keys[0], keys[-1] + 1)) or not keys[0] <= i <= keys[-1]:
            return None
        spans.append((i - keys[0], keys[-1] - i, keys[0] > 0, keys[-1] < len(row) - 1))
    full = [(before, after) for before, after, left, right in spans if left]
    if all(after == 0 for _, after, _, _ in spans) and full and len({b for b, _ in full}) == 1:
        return "causal", full[0][0] + 1
    inner = [(before, after) for before, after, left, right in spans if left and right]
    if inner and len(set(inner)) == 1 and inner[0][0] == inner[0][1]:
        return "symmetric", inner[0][0]
    return None


def _window_comparison(analysis, tensor: str, memo):
    """The comparison that draws the window's far edge: upstream of the mask, the compare whose
    own result is not a plain triangle (the causal half every window also has)."""
    frontier, seen = [tensor], set()
    while frontier and len(seen) < 32:
        node = analysis.producer(frontier.pop(0))
        if node is None or node.id in seen:
            continue
        seen.add(node.id)
        value = static_value(analysis, node.id, memo)
        rows = value.rows() if value is not None else []
        if _has_value(node) and rows and not _triangle(rows):
            return node
        frontier += list(node.inputs)
    return None


def _has_value(node) -> bool:
    """A comparison with a number (``compare: dist, cmp: le, value: 3``): the value is the edge."""
    return len(node.inputs) == 1 and getattr(node.step, "value", None) is not None


def _triangle(rows) -> bool:
    n = len(rows)
    cells = [[bool(v) for v in row] for row in rows]
    return any(all(cells[i][j] == test(i, j) for i in range(n) for j in range(len(cells[i]))) for test in _TRIANGLES)


_TRIANGLES = (
    lambda i, j: j <= i,
    lambda i, j: j < i,
    lambda i, j: j >= i,
    lambda i, j: j > i,
)


def _slopes(value, heads: int) -> list[float] | None:
    """Each head's slope along the keys of a bias linear in the key position, or None."""
    if value is None or len(value.sizes) < 2:
        return None
    sizes = (1,) * max(0, 3 - len(value.sizes)) + value.sizes[-3:]
    lead = math.prod(value.sizes[:-3]) if len(value.sizes) > 3 else 1
    if lead != 1 or sizes[0] != heads or sizes[2] < 2:
        return None
    flat = value.flat
    slopes = []
    for h in range(heads):
        row = [flat[(h * sizes[1] + sizes[1] - 1) * sizes[2] + j] for j in range(sizes[2])]
        steps = [b - a for a, b in zip(row, row[1:])]
        if not all(isinstance(s, int | float) for s in steps) or not math.isclose(min(steps), max(steps), rel_tol=1e-5, abs_tol=1e-9):
            return None
        slopes.append(steps[0])
    return slopes if all(s != 0 for s in slopes) else None


def paper_slopes(n: int) -> list[float]:
    """ALiBi's slopes for n heads: the paper's get_slopes (and BLOOM's build_alibi_tensor for any n)."""

    def powers(k: int) -> list[float]:
        start = 2 ** (-(2 ** -(math.log2(k) - 3)))
        return [start * start**i for i in range(k)]

    if math.log2(n).is_integer():
        return powers(n)
    closest = 2 ** math.floor(math.log2(n))
    return powers(closest) + paper_slopes(2 * closest)[0::2][: n - closest]


def _slope_problem(analysis, slopes: list[float]) -> str | None:
    heads = len(slopes)
    shown = ", ".join(f"{s:.4g}" for s in slopes[:4]) + (" …" if heads > 4 else "")
    if all(s < 0 for s in slopes):
        return f"slopes {shown} are negative: the bias grows with distance and favours far keys — negate them"
    if heads > 1 and all(abs(a) < abs(b) for a, b in zip(slopes, slopes[1:])):
        return f"slopes {shown} grow with the head index: ALiBi's head 0 has the steepest, 2^(-8/H) — reverse their order"
    total = next(((n, v) for n, v in analysis.alg.values.items() if TOTAL_HEADS.fullmatch(n)), None)
    rank = next(((n, v) for n, v in analysis.alg.values.items() if RANK.fullmatch(n)), None)
    if total is None or rank is None or total[1] <= heads:
        return None
    everyone = paper_slopes(total[1])
    own = everyone[rank[1] * heads : (rank[1] + 1) * heads]
    if len(own) == heads and rank[1] > 0 and not _close(slopes, own) and _close(slopes, everyone[:heads]):
        return (
            f"slopes {shown} are those of the first {heads} of {total[0]}={total[1]} heads, but this shard ({rank[0]}={rank[1]}) "
            f"holds heads {rank[1] * heads}..{(rank[1] + 1) * heads - 1}, slopes {', '.join(f'{s:.4g}' for s in own[:4])} — "
            f"offset the head index by {rank[0]} * {heads}"
        )
    return None


def _close(a: list[float], b: list[float]) -> bool:
    return all(math.isclose(x, y, rel_tol=1e-4) for x, y in zip(a, b))
