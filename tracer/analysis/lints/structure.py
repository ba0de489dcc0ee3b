"""Lints about the graph's structure and layouts: results nobody reads, head splits that lose
features, views that regroup dims out of order."""

from __future__ import annotations

from ...core.symbolic import Poly
from .registry import Lint, register, show, warning

#: a dim larger than this is not counted position by position (a run refuses such sizes anyway)
MAX_POSITIONS = 1_000_000


@register
class DeadStep(Lint):
    """**What.** A step whose output no step reads and that is not listed in `outputs:`.

    **Why it matters.** Work that was meant to change the result does not. In tutorial 003,
    `construct_attention_heads` calls `dropout_layer(attention_scores)` and throws the result away,
    so the model is trained without attention dropout and nothing ever complains.

    **Fix.** Use the result (`attention_scores = dropout_layer(attention_scores)`: feed the dropout's
    id to the next step), delete the step, or list it in `outputs:` if you only want to look at it.
    """

    code, example, origin = "dead-step", "dead_step", "tutorial 003"

    def check(self, analysis):
        outputs = set(analysis.outputs)
        for node in analysis.nodes.values():
            if any(name in outputs or analysis.graph.users.get(name) for name in node.step.output_ids()):
                continue
            yield warning(
                analysis,
                node,
                self.code,
                "its output is never used and it is not an output; was its result meant to replace its input (e.g. `x = dropout(x)`)?",
            )


@register
class LossyHeadSplit(Lint):
    """**What.** Two or more equal-width, non-overlapping slices (`op: index` with `start`/`stop`) of
    the same tensor along the same dim, laid side by side (each starting where the one before
    stops, or strided with consecutive starts) — a head split — that leave some positions of that
    dim out. Scattered slices are not a head split: Qwen2-VL's M-RoPE takes sections of each
    position kind's cos and sin on purpose.

    **Why it matters.** The missing features silently never reach any head. Tutorial 000 splits its
    4-dim values into 3 heads of `4 // 3 = 1` column: column 3 is dropped and the "combined context"
    comes out (1, 3) instead of (1, 4).

    **Fix.** Use a head count that divides the dim (the message lists the divisors) and split with
    `view [..., H, D // H]`. tracer refuses a `//` dim that does not divide (`error[dim-divide]`) and
    checks that every `view` multiplies out, so a view split cannot be lossy.
    """

    code, example, origin = "lossy-head-split", "lossy_head_split", "tutorial 000"

    def check(self, analysis):
        groups: dict[tuple[str, int], list] = {}
        for node in analysis.nodes.values():
            cut = node.step.slicing()
            if cut is None or not node.outs:
                continue
            meta = analysis.metas[node.reads[0]]
            if meta.shape:
                groups.setdefault((node.reads[0], cut.dim % len(meta.shape)), []).append((node, cut))
        for (source, dim), members in groups.items():
            if len(members) > 1:
                yield from self._lossy(analysis, source, dim, members)

    def _lossy(self, analysis, source: str, dim: int, members: list):
        size_dim = analysis.metas[source].shape[dim]
        if size_dim.value > MAX_POSITIONS:
            return
        spans = []
        for node, cut in members:
            value = node.dims.dim
            start = value(cut.start).value if cut.start is not None else 0
            stop = value(cut.stop).value if cut.stop is not None else size_dim.value
            stride = value(cut.step).value if cut.step is not None else 1
            spans.append((start, stop, stride, set(range(max(start, 0), min(stop, size_dim.value), max(stride, 1)))))
        widths = {len(taken) for *_, taken in spans}
        covered = set().union(*(taken for *_, taken in spans))
        if len(widths) != 1 or 0 in widths or sum(len(t) for *_, t in spans) != len(covered) or not _side_by_side(spans):
            return  # not a head split: different widths, empty, overlapping or scattered slices (M-RoPE's sections)
        missing = sorted(set(range(size_dim.value)) - covered)
        if not missing:
            return
        n, width = len(members), widths.pop()
        shown = ", ".join(f"[{a}:{b}" + (f":{s}" if s != 1 else "") + "]" for a, b, s, _ in spans)
        lost = ", ".join(map(str, missing[:8])) + (" …" if len(missing) > 8 else "")
        size_text = str(size_dim) if str(size_dim) == str(size_dim.value) else f"{size_dim}={size_dim.value}"
        divisors = [h for h in range(1, size_dim.value + 1) if size_dim.value % h == 0]
        message = (
            f"{n} heads of width {width} slice '{source}' {show(analysis, source)} along dim {dim} ({size_text}) as {shown}: "
            f"position{'s' if len(missing) > 1 else ''} {lost} reach{'es' if len(missing) == 1 else ''} no head, "
            f"so {len(missing)} of {size_dim.value} features {'is' if len(missing) == 1 else 'are'} lost ({size_dim.value} does not split into {n} heads of {width}) — "
            f"use a head count that divides {size_dim.value} ({', '.join(map(str, divisors[:6]))}) and split with "
            f"view [..., H, {size_dim} // H]"
        )
        yield warning(analysis, members[0][0], self.code, message)


def _side_by_side(spans: list) -> bool:
    """Slices laid next to each other as heads are: each starts where the one before stops, or,
    strided, with one step and consecutive starts. Qwen2-VL's M-RoPE picks sections [0:16] and
    [64:80] of one position's cos on purpose (the others come from the other positions)."""
    ordered = sorted(spans)
    if len({stride for _, _, stride, _ in spans}) != 1:
        return False
    if ordered[0][2] == 1:
        return all(after[0] == before[1] for before, after in zip(ordered, ordered[1:]))
    return all(after[0] == before[0] + 1 for before, after in zip(ordered, ordered[1:]))


@register
class ViewScramblesDims(Lint):
    """**What.** A `view` or `reshape` that regroups named dims out of order. A view can only merge
    neighbouring dims or split a dim into neighbours, in memory order; `context.view(B, T, H * Dh)`
    of a `(B, H, T, Dh)` context is legal (the sizes multiply out) but each new "token" row holds
    pieces of several tokens of one head. Dims are compared as symbols, with the pipeline's dim
    expressions (`Dh = d_model // H` makes `H * Dh` read as `d_model`, `n_rep = H // H_kv` makes
    `(H_kv, n_rep)` merge into `H`), so `T = d_model = 6` cannot hide the mistake. Size-1 dims are
    skipped (an unsqueezed batch holds no order) and shapes written with literal numbers are not
    judged.

    **Why it matters.** It runs, every later shape is right, and the table even labels the result
    `(B, T, d_model)`. Only the numbers are wrong.

    **Fix.** Bring the dims into the order the new shape names them first: `transpose` dims
    `[1, 2]`, then `contiguous` + `view` or a `reshape` — or `op: merge`, which does all three.
    """

    code, example, origin = "view-scrambles-dims", "view_scrambles_dims", "merging heads (GPT-2, BERT, Llama)"

    def check(self, analysis):
        judged: dict[tuple, bool | None] = {}  # every copy of a block regroups the same dims: judge them once
        for node in analysis.nodes.values():
            if not node.step.regroups or not node.outs:
                continue
            source = node.reads[0]
            before, after = analysis.metas[source].shape, node.outs[-1].meta.shape
            key = (id(node.dims), before, after)
            if key not in judged:
                judged[key] = in_order(node.dims, before, after)
            if judged[key] is not False:
                continue
            message = (
                f"{node.op} regroups '{source}' {show(analysis, source)} into {show(analysis, node.value)}, but a view only merges "
                f"or splits neighbouring dims in order: the dims of '{source}' are not in the order the new shape names them, "
                f"so every row mixes them up (it runs, with wrong numbers) — bring them into that order first (e.g. transpose, "
                f"then contiguous or reshape; `op: merge` does all three for (…, H, T, Dh))"
            )
            yield warning(analysis, node, self.code, message, "shape")


def in_order(alg, before, after) -> bool | None:
    """Whether ``after`` merges/splits consecutive dims of ``before`` in order, as symbols; None
    when a literal number (other than 1) makes that unknowable. Size-1 dims hold no order: one
    that does not line up is skipped (an unsqueezed batch, a head of width 1)."""
    one = Poly.const(1)
    sizes = _Sizes(alg.names.keys() | {d.poly for d in (*before, *after)})  # every size written as an axis is one a dim can be
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
            if sizes.natural(need) and sizes.natural(rest):
                src[0], have = (rest, head_size * have_size // max(size, 1)), want  # ``want`` ends inside ``head``: its outer part
                break
            left = want.divide(have * head)
            if left is None:
                return None
            if sizes.natural(left):
                have, have_size = have * head, have_size * head_size
            elif head_size != 1:  # a size-1 dim that does not fit holds no data order: skip it
                return False
            src.pop(0)
    return all(size == 1 for _, size in src)


class _Sizes:
    """The sizes a dim can be: a product of dims and a whole number, where quotients that are
    ``known`` (declared dims such as ``Dh: d_model // H``, and sizes the shapes write, such as ViT's
    ``IMG // P`` patches per side) count as dims (``3 * d_model // H`` is ``3 * Dh``); ``H // T``
    is not."""

    def __init__(self, known: set):
        self.known = known
        self.quotients = tuple(p for p in known if len(p.terms) == 1 and any(exp < 0 for _, exp in p.terms[0][0]))
        self._judged: dict[tuple, bool] = {}  # the search below meets the same (poly, depth) again and again

    def natural(self, poly, depth: int = 0) -> bool:
        key = (poly, depth)
        if key not in self._judged:
            self._judged[key] = self._natural(poly, depth)
        return self._judged[key]

    def _natural(self, poly, depth: int) -> bool:
        if poly in self.known:
            return True
        if len(poly.terms) != 1:
            return False
        mono, coeff = poly.terms[0]
        if coeff <= 0 or coeff.denominator != 1:
            return False
        if all(exp > 0 for _, exp in mono):
            return True
        return depth < 4 and any((rest := poly.divide(p)) is not None and self.natural(rest, depth + 1) for p in self.quotients)


@register
class UnusedTensor(Lint):
    """**What.** An input or param that the file declares and no step reads (and that is not an
    output); or an output of a multi-output step (`split`) that no step reads.

    **Why it matters.** A declared tensor is declared to be used. A padding mask that no `mask`
    step names means the model attends to padding; a `v` split off a fused projection that nothing
    reads usually means another tensor is being used in its place. It runs, and every shape is
    right.

    **Fix.** Feed it to the step that was meant to read it (`mask: attention_mask`), or delete it.
    """

    code, example, origin = "unused-tensor", "unused_tensor", "padding masks and fused qkv splits (public issue trackers)"

    def check(self, analysis):
        used = set(analysis.outputs)
        for name, declared in analysis.declared.items():
            if not _in_block(analysis, name):  # a block's own tensors are judged in the block's file
                yield from self._declared(analysis, name, declared, name in used or bool(analysis.graph.users.get(name)))
        for node in analysis.nodes.values():
            names = node.step.output_ids()
            unread = [n for n in names if n not in used and not analysis.graph.users.get(n)]
            if len(names) > 1 and unread and len(unread) < len(names):  # all unread: dead-step says so
                message = (
                    f"output{'s' if len(unread) > 1 else ''} {', '.join(map(repr, unread))} of this {node.op} "
                    f"{'are' if len(unread) > 1 else 'is'} never read and not an output: is another tensor used in "
                    f"{'their' if len(unread) > 1 else 'its'} place?"
                )
                yield warning(analysis, node, self.code, message, node.step.output_field)

    def _declared(self, analysis, name: str, declared, read: bool):
        """A declaration's own ``allow: {unused-tensor: reason}`` reports it as allowed (and goes
        stale, with a warning, once a step reads it)."""
        reason = (declared.decl.allow or {}).get(self.code)
        where = (declared.section, name)
        if read:
            if reason is not None:
                message = f"allow: '{self.code}' no longer applies: a step reads '{name}'; remove the allow (its reason: {reason})"
                yield analysis.source.error(where + ("allow",), "unused-allow", message, severity="warning")
            return
        message = (
            f"{declared.section[:-1]} '{name}' {show(analysis, name)} is declared but no step reads it — feed it to the step "
            f"meant to use it (a mask step's mask:, a linear's weight:) or delete it"
        )
        if reason is None:
            yield analysis.source.error(where, self.code, message, severity="warning")
        else:
            yield analysis.source.error(where, self.code, f"{message} — allowed: {reason}", severity="allowed")


def _in_block(analysis, name: str) -> bool:
    """Whether a declared tensor is a block's own (``layers/0/W_q``), not the file's."""
    return any(name.startswith(f"{block}/") for block in analysis.blocks)


def unread_declarations(analysis) -> list[str]:
    """The file's own inputs and params that no step reads and no output names."""
    used = set(analysis.outputs)
    return [n for n in analysis.declared if not _in_block(analysis, n) and n not in used and not analysis.graph.users.get(n)]
