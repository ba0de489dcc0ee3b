"""Attention lints: warnings about pipelines that run but are probably wrong.

Each lint is a small function ``lint(analysis) -> list[Diagnostic]`` over a finished, error-free
:class:`~tracer.analysis.shapes.Analysis` (every tensor's shape and stride known, nothing run). Each
one reproduces a bug from the seed tutorials (``docs/lints.md``, ``pipelines/lint_examples/``):

============================  ====================================================================
``dead-step``                 a step whose result nobody reads (tutorial 003's discarded dropout)
``scale-mismatch``            scores scaled by something other than 1/sqrt(keys' last dim) (004)
``lossy-head-split``          equal slices ("heads") that do not cover the dim they split (000)
``nan-risk-mask``             a -inf fill that hides every key of some query row: NaN (003)
``mask-polarity``             a causal pattern used with the polarity that keeps the future
``view-scrambles-dims``       a view that regroups named dims out of order (merge without transpose)
``gqa-head-order``            kv heads tiled by ``repeat`` where grouped-query attention interleaves
``softmax-over-queries``      attention weights normalised over the queries instead of the keys
============================  ====================================================================

``view-non-contiguous`` is not here: a view of a non-contiguous tensor is a shape-rule *error*.
Lints never import torch; :func:`runtime_warnings` (after a run) does.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

from ..core.errors import Diagnostic, merge_copies
from ..core.symbolic import Poly
from ..steps.attention import Mask, Scale, Softmax
from ..steps.fused import Sdpa
from ..steps.layout import Index, Repeat, Reshape, View

#: a mask pattern larger than this many elements is not expanded by the lints
_MAX_PATTERN = 1_000_000


# --------------------------------------------------------------------------------------------
# helpers


def _warn(analysis, path: tuple, code: str, message: str, step_id: str | None, prefer_key: bool = False) -> Diagnostic:
    return analysis.source.error(path, code, message, step_id, prefer_key=prefer_key, severity="warning")


def _steps(analysis, kind: type) -> Iterator[tuple[int, Any]]:
    """(position, step) of every step of this kind, in file order."""
    for i, step in enumerate(analysis.pipeline.steps):
        if isinstance(step, kind) and analysis.graph.index.get(step.id) == i and step.id in analysis.metas:
            yield i, step


def _step_or_none(analysis, tensor_id: str):
    i = analysis.graph.index.get(tensor_id)
    return None if i is None else analysis.pipeline.steps[i]


def _score_chain(analysis, step) -> tuple[list, Any]:
    """Walk up from ``step`` (usually a softmax) through mask/scale/dropout steps.

    Returns ``(chain, source)``: the pass-through steps, nearest first, and the step that made
    the scores (a ``matmul``/``bmm``), or ``None`` when the chain starts elsewhere.
    """
    chain = []
    current = analysis.graph.data_inputs[step.id][0]
    while True:
        upstream = _step_or_none(analysis, current)
        if upstream is None:
            return chain, None
        if upstream.makes_scores:
            return chain, upstream
        if not upstream.passes_scores or len(chain) > 64:
            return chain, None
        chain.append(upstream)
        current = analysis.graph.data_inputs[upstream.id][0]


def _multiplier(analysis, scale_step) -> tuple[float, str]:
    """The number a ``scale`` step multiplies by, and how the file wrote it (``1/√d_k``)."""
    alg = analysis.alg_of(scale_step.id)
    return scale_step.multiplier(lambda text: alg.dim(text).value)


def declared_mask_rows(analysis, name: str) -> list[list[bool]] | None:
    """The rows (last-dim vectors, leading dims flattened) of a declared mask tensor as bools.

    Known only for tensors whose content the file fixes: ``values`` literals and ``init`` ones,
    zeros, triu (strictly upper ones) and tril (lower ones, diagonal included). Anything else
    (random inits, masks computed by steps) returns ``None``: its content is only known at run
    time, where :func:`runtime_warnings` looks at the softmax outputs instead.
    """
    decl = analysis.pipeline.inputs.get(name) or analysis.pipeline.params.get(name)
    meta = analysis.metas.get(name)
    if decl is None or meta is None or meta.numel > _MAX_PATTERN:
        return None
    sizes = meta.sizes
    cols = sizes[-1] if sizes else 1
    n_rows = meta.numel // cols if cols else 0
    if decl.values is not None:
        flat = list(_flatten(decl.values))
        return [[bool(v) for v in flat[r * cols : (r + 1) * cols]] for r in range(n_rows)]
    if decl.init in ("ones", "zeros"):
        return [[decl.init == "ones"] * cols for _ in range(n_rows)]
    if decl.init in ("triu", "tril") and len(sizes) == 2:
        if decl.init == "triu":
            return [[j > i for j in range(cols)] for i in range(sizes[0])]
        return [[j <= i for j in range(cols)] for i in range(sizes[0])]
    return None


def _flatten(values) -> Iterator:
    if isinstance(values, list):
        for v in values:
            yield from _flatten(v)
    else:
        yield values


def _triangle(analysis, name: str) -> str | None:
    """``'future'`` if every trailing (R, C) slice of the mask is True exactly above the diagonal
    (``triu(ones, 1)``: what a causal mask must hide), ``'past'`` if exactly on and below it
    (``tril(ones)``: what it must keep); ``None`` for any other pattern or for R < 2."""
    meta = analysis.metas.get(name)
    rows = declared_mask_rows(analysis, name)
    if rows is None or len(meta.sizes) < 2 or meta.sizes[-2] < 2 or meta.sizes[-1] < 2:
        return None
    height = meta.sizes[-2]
    for kind, rule in (("future", lambda i, j: j > i), ("past", lambda i, j: j <= i)):
        if all(row == [rule(r % height, j) for j in range(len(row))] for r, row in enumerate(rows)):
            return kind
    return None


def _show(analysis, tensor_id: str) -> str:
    meta = analysis.metas[tensor_id]
    return f"{meta.symbolic} {meta.concrete}"


# --------------------------------------------------------------------------------------------
# the lints


def dead_steps(analysis) -> list[Diagnostic]:
    """``dead-step``: a step whose output nobody reads and that is not an output.

    Tutorial 003 calls ``dropout_layer(attention_scores)`` and throws the result away, so its
    model never applies dropout. Fix: use the result (``x = dropout(x)``) or delete the step.
    """
    users, outputs = analysis.graph.users, set(analysis.outputs)
    found = []
    for step_id, i in analysis.graph.index.items():
        made = analysis.pipeline.steps[i].output_ids()
        if any(name in outputs or users.get(name) for name in made):
            continue
        found.append(
            _warn(
                analysis,
                ("steps", i),
                "dead-step",
                "its output is never used and it is not an output; was its result meant to replace its input (e.g. `x = dropout(x)`)?",
                step_id,
                prefer_key=True,
            )
        )
    return found


def scale_mismatch(analysis) -> list[Diagnostic]:
    """``scale-mismatch``: scores reach a softmax scaled by something other than 1/√d_k.

    d_k is the dim the QK matmul contracts over (the keys' last dim). Tutorial 004's
    ``scaled_dot_product_attention(Q, K, V, d_k=4)`` divides by √4 although its keys are 3-dim.
    Unscaled scores (no ``scale`` step at all, as in tutorial 001's first part) are not flagged.
    """
    found = []
    for _, softmax in _steps(analysis, Softmax):
        chain, scores = _score_chain(analysis, softmax)
        scales = [s for s in chain if isinstance(s, Scale)]
        if scores is None or not scales:
            continue
        left = analysis.metas[analysis.graph.data_inputs[scores.id][0]]
        d_k = left.shape[-1]
        want = 1.0 / math.sqrt(d_k.value) if d_k.value > 0 else math.inf
        got, texts = 1.0, []
        for s in reversed(scales):  # in execution order
            number, text = _multiplier(analysis, s)
            got *= number
            texts.append(text)
        if math.isfinite(want) and math.isclose(got, want, rel_tol=1e-6):
            continue
        first = scales[-1]
        field = "divide" if first.divide is not None else "multiply"
        key_dim = str(d_k) if str(d_k) == str(d_k.value) else f"{d_k}={d_k.value}"
        message = (
            f"scores '{scores.id}' {_show(analysis, scores.id)} contract over the keys' last dim, {key_dim}, so softmax "
            f"'{softmax.id}' should see them scaled by 1/√{d_k.value} = {want:.4g}; they are scaled by "
            f"{' * '.join(texts)} = {got:.4g} — use `divide: {{sqrt: {d_k}}}`"
        )
        found.append(_warn(analysis, ("steps", analysis.graph.index[first.id], field), "scale-mismatch", message, first.id))
    return found


def lossy_head_split(analysis) -> list[Diagnostic]:
    """``lossy-head-split``: equal-width slices of one tensor ("heads") that miss some positions.

    Tutorial 000 splits its 4-dim values into 3 heads of ``4 // 3 = 1`` column: column 3 never
    reaches any head. Two or more non-overlapping slices of the same width, of the same tensor,
    along the same dim, are taken to be a head split. (A ``view`` split cannot be lossy: tracer
    checks that it multiplies out, and refuses a ``//`` dim that does not divide.)
    """
    groups: dict[tuple[str, int], list] = {}
    for i, step in _steps(analysis, Index):
        if step.index is not None:
            continue
        source = analysis.graph.data_inputs[step.id][0]
        meta = analysis.metas.get(source)
        if meta is None or not meta.shape:
            continue
        groups.setdefault((source, step.dim % len(meta.shape)), []).append((i, step))
    found = []
    for (source, dim), members in groups.items():
        if len(members) < 2:
            continue
        size_dim = analysis.metas[source].shape[dim]
        if size_dim.value > _MAX_PATTERN:
            continue  # the positions are counted one by one: no lint for absurd sizes (a run refuses them anyway)
        spans, covered = [], set()
        for _, step in members:
            alg = analysis.alg_of(step.id)
            start = alg.dim(step.start).value if step.start is not None else 0
            stop = alg.dim(step.stop).value if step.stop is not None else size_dim.value
            stride = alg.dim(step.step).value if step.step is not None else 1
            taken = set(range(max(start, 0), min(stop, size_dim.value), max(stride, 1)))
            spans.append((start, stop, stride, taken))
        widths = {len(t) for *_, t in spans}
        overlapping = sum(len(t) for *_, t in spans) != len(set().union(*(t for *_, t in spans)))
        if len(widths) != 1 or 0 in widths or overlapping:
            continue  # not a head split: different widths, empty or overlapping slices
        covered = set().union(*(t for *_, t in spans))
        missing = sorted(set(range(size_dim.value)) - covered)
        if not missing:
            continue
        n, width = len(members), widths.pop()
        shown = ", ".join(f"[{a}:{b}" + (f":{s}" if s != 1 else "") + "]" for a, b, s, _ in spans)
        lost = ", ".join(map(str, missing[:8])) + (" …" if len(missing) > 8 else "")
        size_text = str(size_dim) if str(size_dim) == str(size_dim.value) else f"{size_dim}={size_dim.value}"
        divisors = [h for h in range(1, size_dim.value + 1) if size_dim.value % h == 0]
        message = (
            f"{n} heads of width {width} slice '{source}' {_show(analysis, source)} along dim {dim} ({size_text}) as {shown}: "
            f"position{'s' if len(missing) > 1 else ''} {lost} reach{'es' if len(missing) == 1 else ''} no head, "
            f"so {len(missing)} of {size_dim.value} features {'is' if len(missing) == 1 else 'are'} lost ({size_dim.value} does not split into {n} heads of {width}) — "
            f"use a head count that divides {size_dim.value} ({', '.join(map(str, divisors[:6]))}) and split with "
            f"view [..., H, {size_dim} // H]"
        )
        i, first = members[0]
        found.append(_warn(analysis, ("steps", i), "lossy-head-split", message, first.id, prefer_key=True))
    return found


def nan_risk_mask(analysis) -> list[Diagnostic]:
    """``nan-risk-mask``: a ``fill: -inf`` mask that hides every key of at least one query row.

    softmax of a row that is all -inf is 0/0 = NaN, and the NaN spreads through every later
    step. Tutorial 003 warns about it ("Please do not set this to '-inf'") and fills with -1e9,
    which gives such a row uniform weights instead. Checked on the mask's declared content
    (literal values, ones/zeros/triu/tril). ``causal: true`` keeps key 0 for every query, except
    aligned bottom-right with more queries than keys: then the first T_q - T_kv queries see none.
    Masks known only at run time are checked by :func:`runtime_warnings`.
    """
    found = []
    for i, step in _steps(analysis, Mask):
        if step.fill != float("-inf"):
            continue
        if step.mask is None:
            found.extend(_causal_without_keys(analysis, i, step))
            continue
        if step.causal:
            continue
        rows = declared_mask_rows(analysis, step.mask)
        if rows is None:
            continue
        keep = step.polarity == "keep"
        shape = analysis.metas[step.mask].sizes
        empty = [r for r, row in enumerate(rows) if not any(v == keep for v in row)]
        if not empty:
            continue
        where = _row_index(empty[0], shape)
        message = (
            f"fill -inf, and mask '{step.mask}' {_show(analysis, step.mask)} with polarity {step.polarity} hides every key in "
            f"{len(empty)} of {len(rows)} rows (first: mask{where}); softmax of an all -inf row is NaN and the NaN "
            f"spreads to every later step — fill with -1e9 (such a row then gets uniform weights, as tutorial 003 does), "
            f"or make every query keep at least one key"
        )
        found.append(_warn(analysis, ("steps", i, "fill"), "nan-risk-mask", message, step.id))
    return found


def _causal_without_keys(analysis, i: int, step) -> list[Diagnostic]:
    t_q, t_k = analysis.metas[analysis.graph.data_inputs[step.id][0]].sizes[-2:]
    if step.align == "top-left" or t_q <= t_k:
        return []
    message = (
        f"causal: true aligns the last query with the last key, and the scores have T_q={t_q} > T_kv={t_k}: the first "
        f"{t_q - t_k} queries see no key, so their -inf rows become NaN — use align: top-left if query i is key i, or fill with -1e9"
    )
    return [_warn(analysis, ("steps", i, "causal"), "nan-risk-mask", message, step.id)]


def _row_index(row: int, shape: tuple[int, ...]) -> str:
    lead = shape[:-1]
    index = []
    for size in reversed(lead):
        index.append(row % size if size else 0)
        row //= size if size else 1
    return "[" + ", ".join(map(str, reversed(index))) + (", :]" if lead else ":]")


def mask_polarity(analysis) -> list[Diagnostic]:
    """``mask-polarity``: a causal (triangular) mask applied with the opposite polarity.

    ``triu(ones, diagonal=1)`` marks the future: it must be applied with ``polarity: block``
    (tutorial 002: ``masked_fill(mask.bool(), -inf)``). ``tril(ones)`` marks what a query may see:
    it must be applied with ``polarity: keep`` (tutorial 003's convention: ``mask == False`` is
    filled). The other way round every query attends only to the future, and the last one to
    nothing at all.
    """
    found = []
    for i, step in _steps(analysis, Mask):
        if step.mask is None:
            continue
        kind = _triangle(analysis, step.mask)
        right = {"future": "block", "past": "keep"}.get(kind)
        if right is None or step.polarity == right:
            continue
        shown = _show(analysis, step.mask)
        if kind == "future":
            message = (
                f"mask '{step.mask}' {shown} is True above the diagonal (triu(ones, diagonal=1): the future), but polarity: keep "
                f"attends only where it is True: every query sees only later tokens and the last query sees none — "
                f"use polarity: block (tutorial 002's masked_fill(mask.bool(), -inf)), or a tril mask with polarity: keep"
            )
        else:
            message = (
                f"mask '{step.mask}' {shown} is True on and below the diagonal (tril(ones): what each query may see), but "
                f"polarity: block hides exactly those keys: every query sees only later tokens and the last query sees none — "
                f"use polarity: keep (tutorial 003's masked_fill(mask == False, -1e9)), or a triu(…, 1) mask with polarity: block"
            )
        found.append(_warn(analysis, ("steps", i, "polarity"), "mask-polarity", message, step.id))
    return found


def view_scrambles_dims(analysis) -> list[Diagnostic]:
    """``view-scrambles-dims``: a view or reshape that regroups named dims out of order.

    A view only splits a dim into neighbours or merges neighbouring dims, in memory order. Merging
    heads with ``view`` straight from (B, H, T, Dh) to (B, T, H·Dh) is legal (the sizes multiply
    out) but each new row mixes tokens and heads: the transpose back to (B, T, H, Dh) is missing.
    Dims are compared as symbols (``d_model = H * Dh``; ``n_rep = H // H_kv``), so equal sizes do
    not hide the mistake; size-1 dims are skipped and shapes with literal numbers are not judged.
    """
    found = []
    for kind in (View, Reshape):
        for i, step in _steps(analysis, kind):
            source = analysis.graph.data_inputs[step.id][0]
            before, after = analysis.metas[source].shape, analysis.metas[step.id].shape
            if _in_order(analysis.alg_of(step.id), before, after) is not False:
                continue
            message = (
                f"{step.op} regroups '{source}' {_show(analysis, source)} into {_show(analysis, step.id)}, but a view only merges "
                f"or splits neighbouring dims in order: the dims of '{source}' are not in the order the new shape names them, "
                f"so every row mixes them up (it runs, with wrong numbers) — bring them into that order first (e.g. transpose, "
                f"then contiguous or reshape; `op: merge` does all three for (…, H, T, Dh))"
            )
            found.append(_warn(analysis, ("steps", i, "shape"), "view-scrambles-dims", message, step.id))
    return found


def _in_order(alg, before, after) -> bool | None:
    """Whether ``after`` merges/splits consecutive dims of ``before`` in order, as symbols; None
    when a literal number (other than 1) makes that unknowable. Size-1 dims hold no order: one
    that does not line up is skipped (an unsqueezed batch, a head of width 1)."""
    one = Poly.const(1)
    src = [(d.poly, d.value) for d in before if d.poly != one]
    dst = [(d.poly, d.value) for d in after if d.poly != one]
    if any(p.constant is not None for p, _ in src + dst):
        return None
    for want, size in dst:
        if size == 1 and (not src or src[0][0] != want):
            continue
        have, have_size = one, 1
        while have != want:
            if not src:
                return False
            head, head_size = src[0]
            if have * head == want:
                have = want
                src.pop(0)
                break
            need = want.divide(have)
            rest = head.divide(need) if need is not None else None
            if rest is None:
                return None  # a sum of dims (H + 2) does not divide: not judged
            if _natural(alg, need) and _natural(alg, rest):
                src[0], have = (rest, head_size * have_size // max(size, 1)), want  # ``want`` ends inside ``head``: its outer part
                break
            left = want.divide(have * head)
            if left is None:
                return None
            if _natural(alg, left):
                have, have_size = have * head, have_size * head_size
            elif head_size != 1:  # a size-1 dim that does not fit holds no data order: skip it
                return False
            src.pop(0)
    return all(size == 1 for _, size in src)


def _natural(alg, poly, depth: int = 0) -> bool:
    """A size a dim can be: a product of dims and a whole number, where declared quotients count
    as dims (``3 * d_model // H`` is ``3 * Dh``); ``H // T`` is not."""
    if poly in alg.names:
        return True
    if len(poly.terms) != 1:
        return False
    mono, coeff = poly.terms[0]
    if coeff <= 0 or coeff.denominator != 1:
        return False
    if all(exp > 0 for _, exp in mono):
        return True
    quotients = (p for p in alg.names if len(p.terms) == 1 and any(exp < 0 for _, exp in p.terms[0][0]))
    return depth < 4 and any((rest := poly.divide(p)) is not None and _natural(alg, rest, depth + 1) for p in quotients)


def gqa_head_order(analysis) -> list[Diagnostic]:
    """``gqa-head-order``: kv heads tiled by ``repeat`` on their way to attention.

    Grouped-query attention gives query head ``h`` the kv head ``h // n_rep`` (transformers'
    ``repeat_kv``, SDPA's ``enable_gqa``): kv heads 0, 1 become 0, 0, 1, 1. ``repeat`` tiles
    them, 0, 1, 0, 1: it runs, every shape is right, and the numbers are wrong. Flagged: a
    ``repeat`` that multiplies an existing dim of size > 1 whose result reaches a product of
    queries and keys or an ``sdpa`` step.
    """
    found = []
    for i, step in _steps(analysis, Repeat):
        source = analysis.graph.data_inputs[step.id][0]
        meta = analysis.metas[source]
        alg = analysis.alg_of(step.id)
        reps = [alg.dim(r).value for r in step.repeats][len(step.repeats) - len(meta.shape) :]
        tiled = [d for d, (r, size) in enumerate(zip(reps, meta.sizes)) if r > 1 and size > 1]
        if not tiled or not _reaches_attention(analysis, step.id):
            continue
        d, r = tiled[0], reps[tiled[0]]
        heads = meta.shape[d]
        order = ", ".join(str(h % heads.value) for h in range(min(heads.value * r, 8)))
        wanted = ", ".join(str(h // r) for h in range(min(heads.value * r, 8)))
        message = (
            f"repeat tiles the {heads}={heads.value} heads of '{source}' {_show(analysis, source)} along dim {d} as {order}…; "
            f"grouped-query attention gives query head h the kv head h // n_rep ({wanted}…, transformers' repeat_kv) — "
            f"use {{op: repeat_interleave, repeats: {step.repeats[len(step.repeats) - len(meta.shape) + d]}, dim: {d}}}"
        )
        found.append(_warn(analysis, ("steps", i, "repeats"), "gqa-head-order", message, step.id))
    return found


def _reaches_attention(analysis, start: str, depth: int = 8) -> bool:
    frontier = [start]
    for _ in range(depth):
        frontier = [user for t in frontier for user in analysis.graph.users.get(t, ())]
        for user in frontier:
            step = _step_or_none(analysis, user)
            if step is not None and (step.makes_scores or isinstance(step, Sdpa)):
                return True
    return False


def softmax_over_queries(analysis) -> list[Diagnostic]:
    """``softmax-over-queries``: softmax of attention scores along the query axis.

    For scores (…, T_q, T_kv) = q @ k^T each query's weights over the keys must sum to 1:
    ``dim: -1``. ``dim: -2`` normalises every key over the queries instead; for square scores
    the shapes cannot tell. The query axis is the first operand's rows (for einsum, the last
    output letter only the first operand has).
    """
    found = []
    for i, softmax in _steps(analysis, Softmax):
        _, scores = _score_chain(analysis, softmax)
        if scores is None:
            continue
        ndim = len(analysis.metas[scores.id].shape)
        query, key = scores.score_axes(ndim) if hasattr(scores, "score_axes") else (ndim - 2, ndim - 1)
        if query is None or ndim < 2 or softmax.dim % ndim != query % ndim:
            continue
        message = (
            f"softmax over dim {softmax.dim} normalises the scores '{scores.id}' {_show(analysis, scores.id)} over the queries: "
            f"each key's column sums to 1, not each query's row — use dim: {key - ndim if key is not None else -1} (the keys)"
        )
        found.append(_warn(analysis, ("steps", i, "dim"), "softmax-over-queries", message, softmax.id))
    return found


LINTS = [
    dead_steps,
    scale_mismatch,
    lossy_head_split,
    nan_risk_mask,
    mask_polarity,
    view_scrambles_dims,
    gqa_head_order,
    softmax_over_queries,
]


def run_lints(analysis) -> list[Diagnostic]:
    if analysis.errors:
        return []
    return [d for lint in LINTS for d in lint(analysis)]


# --------------------------------------------------------------------------------------------
# after a run


class SoftmaxNaNs:
    """A run hook (``run(observe=...)``) that counts NaN rows in every softmax output as it is
    produced, keeping no tensor alive; ``warnings()`` then gives the ``nan-risk-mask`` warnings.

    A row is one softmax distribution (a slice along the softmax dim); one that holds a NaN is
    almost always a query whose every key was masked with -inf.

    >>> p = tracer.load("pipelines/lint_examples/nan_risk_mask.yaml")   # doctest: +SKIP
    >>> nans = SoftmaxNaNs(p.check()); p.run(observe=nans)              # doctest: +SKIP
    >>> [str(d) for d in nans.warnings()]                               # doctest: +SKIP
    ["...: warning[nan-risk-mask]: step 'attention_weights': softmax produced 2 NaN rows of 12 ..."]
    """

    def __init__(self, analysis):
        self.analysis = analysis
        self.softmax = {step.id: (i, step) for i, step in _steps(analysis, Softmax)}
        self.rows: dict[str, tuple[int, int]] = {}  # step id -> (NaN rows, rows)

    def __call__(self, record_id: str, tensor) -> None:
        found = self.softmax.get(record_id)
        if found is None or getattr(tensor, "device", None) is None or tensor.device.type == "meta" or tensor.dim() == 0:
            return
        # softmax values lie in [0, 1], so a row sums to NaN exactly when it holds one; summing first
        # keeps the hook ~10x cheaper than isnan() and allocates one number per row, not a bool tensor
        bad = tensor.sum(dim=found[1].dim).isnan()
        self.rows[record_id] = (int(bad.sum()), bad.numel())

    def warnings(self) -> list[Diagnostic]:
        found = []
        for step_id, (n_bad, n_rows) in self.rows.items():
            if not n_bad:
                continue
            i, step = self.softmax[step_id]
            chain, _ = _score_chain(self.analysis, step)
            masks = [s for s in chain if isinstance(s, Mask)]
            cause = (
                (
                    f"; mask step '{masks[0].id}' fills {'-inf' if masks[0].fill == float('-inf') else f'{masks[0].fill:g}'}"
                    " — fill with -1e9 or keep at least one key per query"
                )
                if masks
                else ""
            )
            message = (
                f"softmax produced {n_bad} NaN row{'s' if n_bad != 1 else ''} of {n_rows} (rows whose every score was -inf or NaN){cause}"
            )
            found.append(_warn(self.analysis, ("steps", i), "nan-risk-mask", message, step_id, prefer_key=True))
        return merge_copies(found)


def runtime_warnings(trace, tensors: dict | None = None) -> list[Diagnostic]:
    """The ``nan-risk-mask`` warnings of a finished run, from the softmax outputs it still has:
    in ``tensors`` (id -> tensor), in ``trace.outputs``, or in its records when it was run with
    ``keep_values=True``. To see every softmax of any run, pass ``SoftmaxNaNs`` as its hook."""
    nans = SoftmaxNaNs(trace.analysis)
    given = dict(tensors or {})
    for step_id in nans.softmax:
        tensor = given.get(step_id)
        if tensor is None:
            tensor = trace.outputs.get(step_id)
        if tensor is None and step_id in trace:
            tensor = trace[step_id].tensor
        if tensor is not None:
            nans(step_id, tensor)
    return nans.warnings()
