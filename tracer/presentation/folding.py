"""Repeated blocks at a glance: copy 0 of a ``repeat:`` block is shown in full, the other copies
as one "×N" marker. Diagrams and tables both fold this way unless asked to ``expand``. And the
groups that ``--collapse`` names, for both.

A block with ``repeat: 48`` expands into tensors ``layers/0/...`` to ``layers/47/...``; the copies
are identical but for their params, so drawing or listing all of them only repeats copy 0.
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass
from typing import Any

from ..core.errors import Diagnostic, TracerError


@dataclass(frozen=True)
class Fold:
    """Copies 1..N-1 of one repeated block, shown as one marker."""

    block: str  # the block step's id: 'layers'
    use: str  # the block file: 'blocks/encoder_layer.yaml'
    shown: str  # the copy shown in full: 'layers/0'
    hidden: tuple[str, ...]  # the id prefixes of the folded copies: 'layers/1' ... 'layers/47'

    @property
    def key(self) -> str:
        """The marker's name, 'layers/1…47': no tensor id has a '…', so it names no tensor."""
        return f"{self.hidden[0]}…{self.hidden[-1].rsplit('/', 1)[-1]}" if len(self.hidden) > 1 else self.hidden[0]

    @property
    def copies(self) -> int:
        return len(self.hidden) + 1

    @property
    def title(self) -> str:
        return f"{self.hidden[0]} … {self.hidden[-1]}" if len(self.hidden) > 1 else self.hidden[0]

    @property
    def about(self) -> str:
        n = len(self.hidden)
        return f"copies 1–{n} of {self.copies} of {self.use}, each like {self.shown}" if n > 1 else f"copy 1 of 2 of {self.use}"


def repeat_folds(analysis: Any) -> dict[str, Fold]:
    """Tensor id (steps, their inner records, params) -> the fold that hides it. A copy nested in a
    folded copy belongs to the outer fold; inside copy 0, a nested repeated block folds on its own."""
    prefixes: dict[str, Fold] = {}
    for info in analysis.blocks.values():
        if info.repeat and len(info.copies) > 1:
            fold = Fold(info.id, info.use, info.copies[0], tuple(info.copies[1:]))
            prefixes.update(dict.fromkeys(fold.hidden, fold))
    if not prefixes:
        return {}
    ids = list(analysis.metas) + list(analysis.nodes)
    folds = {}
    for tensor_id in ids:
        fold = _outermost(tensor_id, prefixes)
        if fold is not None:
            folds[tensor_id] = fold
    return folds


def _outermost(tensor_id: str, prefixes: dict[str, Fold]) -> Fold | None:
    parts = tensor_id.split("/")
    for n in range(1, len(parts)):
        fold = prefixes.get("/".join(parts[:n]))
        if fold is not None:
            return fold
    return None


def collapse_keys(groups: list[str], collapse: tuple[str, ...], pipeline_file: str) -> list[str]:
    """The groups each ``--collapse`` entry folds into one node or row. Group names are paths
    ('layers/3/attn' is nested in 'layers/3', which is in 'layers'), and an entry is a group or a
    path prefix ('layers' folds all 48 copies of a block into one, 'layers/3' one copy), or else a
    glob matched segment by segment ('layers/*': one per copy)."""
    keys: list[str] = []
    for pattern in collapse:
        matched = [pattern] if any(within(g, pattern) for g in groups) else _glob_prefixes(groups, pattern)
        if not matched:
            tops = list(dict.fromkeys(g.split("/")[0] for g in groups))
            known = ", ".join(f"'{g}'" for g in tops) or "none"
            raise TracerError(
                Diagnostic(
                    pipeline_file,
                    None,
                    "unknown-group",
                    f"--collapse {pattern!r}: no step has that group (groups: {known}; "
                    "a group path such as 'layers/3' or a glob such as 'layers/*' also works)",
                )
            )
        keys += matched
    return list(dict.fromkeys(keys))


def depth_keys(groups: list[str], depth: int) -> list[str]:
    """The groups ``--depth N`` shows as one node or row each: every group path N levels deep,
    with what is nested in it (1: each top-level group, as the glob '*'; 2: the level below,
    '*/*': a block's copies). A group shallower than N shows its steps."""
    return _glob_prefixes(groups, "/".join(["*"] * depth))


def within(group: str, key: str) -> bool:
    """``group`` is ``key`` or nested under it ('layers/3/attn' is within 'layers' and 'layers/3')."""
    return group == key or group.startswith(key + "/")


def _glob_prefixes(groups: list[str], pattern: str) -> list[str]:
    """The group path prefixes whose segments match the glob's, in order: 'layers/*' gives
    'layers/0', 'layers/1', ... (from 'layers/0/attn' too); a '*' never crosses a '/'."""
    parts = pattern.split("/")
    found = {}
    for group in groups:
        segments = group.split("/")
        if len(segments) >= len(parts) and all(fnmatch.fnmatchcase(s, p) for s, p in zip(segments, parts)):
            found["/".join(segments[: len(parts)])] = True
    return list(found)
