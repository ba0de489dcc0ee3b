"""Lints about positions against the masks in play: a left-padded batch rotated at positions that
count from the first column, and packed documents whose positions do not restart where their
document mask says (or restart with no document mask).

The positions' source (tracer.analysis.positions.Source: a count such as rope's ``offset`` or an
``arange``, a declared tensor's values, or something computed from a mask) is held against the
padding rows (tracer.analysis.lints.sources.padding_rows) and the document ids of ``segments``.
"""

from __future__ import annotations

from ..positions import COUNT, VALUES, index_source, rotation_source
from .registry import Lint, register, show, warning
from .sources import along_keys_only, padding_rows, position_lookups, reversed_padding

MAX_WALK = 64


def _ropes(analysis, site) -> list:
    """The rope nodes the queries and the keys passed through on their way to the site (single-input
    steps only: a cache cat stops the walk), one per source of positions."""
    found = {}
    for tensor in (site.query, site.keys):
        current = tensor
        for _ in range(MAX_WALK):
            node = analysis.producer(current)
            if node is None or len(node.inputs) != 1:
                break
            if node.step.rotation() is not None:
                found.setdefault(rotation_source(analysis, node).step, node)
            current = node.inputs[0]
    return list(found.values())


def _position_users(analysis, site) -> list:
    """(step, the source of its positions) of the ropes on the queries and keys, and of the learned
    position lookups (embeddings of counting or declared ``*pos*`` ids) the queries come from."""
    found = [(rope, rotation_source(analysis, rope)) for rope in _ropes(analysis, site)]
    for lookup in position_lookups(analysis, site.query):
        source = index_source(analysis, lookup.inputs[0])
        if source.kind == COUNT or source.kind == VALUES and "pos" in source.step.lower():
            found.append((lookup, source))
    return found


def _where(analysis, user, source):
    """The node and field to edit for a source of positions: the arange that counts, or the rope
    (or lookup) that reads them."""
    if source.kind == COUNT and source.step != user.id:
        return analysis.node(source.step), None
    if source.kind == COUNT:
        return user, "offset" if "offset" in user.step.model_fields_set else None
    return user, "input" if user.step.looks_up else "positions"


def _row(rows, r: int):
    return rows[r] if len(rows) > 1 else rows[0]


@register
class PositionsIgnorePadding(Lint):
    """**What.** RoPE positions that count from the first column — rope's `offset` (no `positions`),
    an `arange`, or declared positions whose left-padded rows do not start at 0 at the first real
    token — while the padding mask in play pads a row on the left. Judged where the file fixes the
    padding mask's content; positions computed from the mask (`cumsum`) are never judged.

    **Why it matters.** With left padding (batched generation) row r's first real token sits in
    column p, so it is rotated at position p instead of 0: its relative distances are right, but
    every absolute position is off by p, unlike training and unlike the same prompt unpadded. The
    generated text changes with the batch it is in.

    **Fix.** Rotate at positions from the mask, as transformers does: `position_ids =
    attention_mask.cumsum(-1) - 1` (then `masked_fill(attention_mask == 0, 1)`), and `positions:
    position_ids` on the rope of the queries and of the keys.
    """

    code, example, origin = "positions-ignore-padding", "positions_ignore_padding", "batched generation with left padding"

    def check(self, analysis):
        reported = set()
        for site in analysis.attention:
            padded = _left_padded(analysis, site)
            if padded is None:
                continue
            wrong = []
            for rope, source in _position_users(analysis, site):
                found = _counting_rows(source, padded[1])
                if found is not None and source.step not in reported:
                    reported.add(source.step)
                    wrong.append((rope, source, found))
            if wrong:
                yield self._warning(analysis, wrong, padded[0])

    def _warning(self, analysis, wrong: list, mask: str):
        rope, source, (row, first, position) = wrong[0]
        node, field = _where(analysis, rope, source)
        ropes = " and ".join(f"'{r.id}'" for r, _, _ in wrong)
        fix = "a position table looked up at" if rope.step.looks_up else "the rope"
        message = (
            f"row {row} of the padding mask '{mask}' {show(analysis, mask)} is padded on the left (its first real token is in "
            f"column {first}), but {ropes} read{'s' if len(wrong) == 1 else ''} positions counted from the first column: that "
            f"token sits at position {position}, not 0 — give {fix} positions from the mask (position_ids = "
            f"attention_mask.cumsum(-1) - 1, as transformers does)"
        )
        return warning(analysis, node, self.code, message, field)


def _left_padded(analysis, site) -> tuple[str, list[tuple[int, int]]] | None:
    """(the padding mask, [(row, its first real column)]) of the rows padded on the left."""
    for _, masking in site.masks:
        if masking.tensor is None or masking.polarity is None or reversed_padding(analysis, site, masking) is not None:
            continue
        found = padding_rows(analysis, site, masking.tensor)
        if found is None:
            continue
        left = [(r, row.index(True)) for r, row in enumerate(found.visible(masking.polarity)) if any(row) and not row[0]]
        if left:
            return masking.tensor, left
    return None


def _counting_rows(source, left: list[tuple[int, int]]) -> tuple[int, int, int] | None:
    """(row, first real column, its position) of a left-padded row whose first real token is not at 0."""
    if source.kind == COUNT:
        row, first = left[0]
        return None if source.start.constant is None else (row, first, int(source.start.constant) + first)
    if source.kind == VALUES:
        for row, first in left:
            values = _row(source.rows, row)
            if first < len(values) and values[first] != 0:
                return row, first, values[first]
    return None


@register
class PositionsDocuments(Lint):
    """**What.** Packed documents (several sequences in one row) whose positions and document mask
    disagree: attention hides other documents (`segments:`) but the rope's positions do not restart
    at 0 where a document starts (rope's `offset`, an `arange`, or declared positions that run on);
    or the declared positions restart mid-row (a new document) while the attention has no document
    mask. Judged where the file fixes the document ids and the positions.

    **Why it matters.** A packed document rotated at the positions of its place in the row looks
    hundreds of tokens into a context it never had, unlike training on it alone; and restarting
    positions without a document mask let every token attend to the previous document as if it
    were its own context, at nonsense distances. transformers derives the document mask from the
    positions (`find_packed_sequence_indices`): the two must agree.

    **Fix.** Positions that restart at each document (`position_ids` counting from 0 per
    document) together with `segments: document_ids` on the mask (Llama 3.1's packed attention,
    pipelines/models/llama31_packed_attention.yaml).
    """

    code, example, origin = "positions-documents", "positions_documents", "packed sequences (public issue trackers)"

    def check(self, analysis):
        reported = set()
        for site in analysis.attention:
            documents = next((m.segments for _, m in site.masks if m.segments is not None), None)
            found = []
            for rope in _ropes(analysis, site):
                source = rotation_source(analysis, rope)
                if source.step in reported:
                    continue
                problem = self._run_on(analysis, source, documents) if documents else self._unmasked_restart(analysis, site, source)
                if problem is not None:
                    reported.add(source.step)
                    found.append((rope, source, problem))
            if found:
                rope, source, problem = found[0]
                node, field = _where(analysis, rope, source)
                others = "".join(f" (so does '{other.id}')" for other, _, _ in found[1:])
                yield warning(analysis, node, self.code, problem + others, field)

    @staticmethod
    def _run_on(analysis, source, documents: str) -> str | None:
        ids = index_source(analysis, documents)
        if ids.kind != VALUES or source.kind not in (COUNT, VALUES):
            return None
        for r, row in enumerate(ids.rows):
            for t in range(1, len(row)):
                if row[t] == row[t - 1]:
                    continue
                position = _position(source, r, t)
                if position is not None and position != 0:
                    return (
                        f"document {row[t]} of row {r} starts at token {t} (segments '{documents}'), but its positions do not restart "
                        f"there: it is rotated from position {position}, not 0 — give positions that count from 0 in each document "
                        f"(position_ids per document, as the document ids say)"
                    )
        return None

    @staticmethod
    def _unmasked_restart(analysis, site, source) -> str | None:
        if source.kind != VALUES or any(m.segments or m.tensor and not along_keys_only(analysis, site, m.tensor) for _, m in site.masks):
            return None  # a full mask tensor may hide other documents
        if any(not along_keys_only(analysis, site, tensor) for _, tensor in site.biases):
            return None
        for r, row in enumerate(source.rows):
            for t in range(2, len(row) - 1):  # a count that ran, then 0, 1: a new document (padding at 0, 0, … is not one)
                if row[t] == 0 and row[t + 1] == 1 and row[t - 1] >= 1 and row[t - 1] == row[t - 2] + 1:
                    return (
                        f"the positions '{source.step}' restart at 0 in row {r} at token {t} (a new packed document), but this "
                        f"attention has no document mask: every token also attends to the documents before it — add segments: "
                        f"document ids to the mask step (or give positions that do not restart)"
                    )
        return None


def _position(source, row: int, t: int) -> int | None:
    if source.kind == COUNT:
        return None if source.start.constant is None else int(source.start.constant) + t
    values = _row(source.rows, row)
    return values[t] if t < len(values) else None
