"""``expect:``, checked in one place: against the static analysis (``tracer check``, every load)
and against the records of a run whose layouts differ from the prediction.

An entry pins a tensor's shape, written in dims (``[B, H, T, T]``), its contiguity, or both.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..core import dimexpr
from ..core.errors import Diagnostic
from ..core.layout import CONTIGUITY_RULE, meets_contiguity
from ..core.symbolic import Dim, DimAlgebra
from ..spec.pipeline import Expect


@dataclass(frozen=True)
class Expectation:
    """One ``expect:`` entry and the dims it is written in (a block file's own, for its entries)."""

    name: str
    expected: Any  # a list of dim texts, or an Expect
    dims: DimAlgebra

    @property
    def shape(self) -> list | None:
        return self.expected if isinstance(self.expected, list) else self.expected.shape

    @property
    def contiguous(self) -> bool | None:
        return self.expected.contiguous if isinstance(self.expected, Expect) else None


@dataclass(frozen=True)
class Layout:
    """What an expectation is held against: a tensor's symbolic and concrete shape and its strides."""

    symbolic: str
    sizes: tuple[int, ...]
    stride: tuple[int, ...]
    dims: tuple[Dim, ...] | None = None  # the symbolic dims, when they are in the entry's own algebra


def check_expectations(analysis, layout_of: Callable[[str], Layout | None] | None = None) -> list[Diagnostic]:
    """Every ``expect:`` entry that does not hold, located at its key. Statically (``layout_of``
    None) each entry is checked against the analysis; after a run, against ``layout_of(record)``."""
    problems = []
    for entry in analysis.expectations:
        path = ("expect", entry.name)
        if layout_of is None:
            unknown = _unknown(analysis, entry.name)
            if unknown:
                problems.append(analysis.source.error(path, unknown[0], unknown[1], unknown[2], prefer_key=True))
                continue
            meta = analysis.meta(entry.name)
            if meta is None:
                continue  # an upstream error explains it
            node = analysis.producer(analysis.record_of(entry.name))
            same_algebra = (node.dims if node is not None else analysis.alg) is entry.dims
            found = Layout(meta.symbolic + " " + meta.concrete, meta.sizes, meta.stride, meta.shape if same_algebra else None)
        else:
            found = layout_of(analysis.record_of(entry.name))
            if found is None:
                continue
        problem = expectation_problem(entry, found)
        if problem:
            message = " ".join(filter(None, (problem, analysis.bindings(entry.dims)))) + _block_dims_hint(analysis, entry)
            step = entry.name if entry.name in analysis.nodes else None
            problems.append(analysis.source.error(path, "expect", message, step, prefer_key=True))
    return problems


def expectation_problem(entry: Expectation, found: Layout) -> str | None:
    """Why ``found`` does not meet the entry, else None."""
    name = entry.name
    if entry.shape is not None:
        try:
            want = tuple(entry.dims.dim(t) for t in entry.shape)
        except dimexpr.DimError as exc:
            return f"expect '{name}': {exc}"
        wanted = "(" + ", ".join(map(str, want)) + ") [" + ", ".join(str(d.value) for d in want) + "]"
        if tuple(d.value for d in want) != found.sizes:
            return f"expected '{name}' to be {wanted}, found {found.symbolic}"
        differ = _different_names(want, found.dims)
        if differ:
            return f"expected '{name}' to be {wanted}, found {found.symbolic}: {differ} — the sizes agree only at these dims"
    if entry.contiguous is not None:
        return contiguity_problem(name, found, entry.contiguous)
    return None


def contiguity_problem(name: str, found: Layout, contiguous: bool) -> str | None:
    """Why a layout does not meet ``contiguous`` (None when it does): the one rule, for ``expect:``
    and ``tracer.testing.assert_contiguous`` alike (see ``meets_contiguity``)."""
    if meets_contiguity(found.sizes, found.stride, contiguous):
        return None
    rule = f" ({CONTIGUITY_RULE})" if 1 in found.sizes else ""
    state = "contiguous" if contiguous else "non-contiguous"
    return f"expected '{name}' to be {state}, found stride {found.stride} for {found.symbolic}{rule}"


def _different_names(want: tuple[Dim, ...], found: tuple[Dim, ...] | None) -> str:
    """jaxtyping's rule for ``expect:``: a dim written by name must be that dim, not one equal to it
    today (``T`` where the tensor has ``hs``, both 4). A literal number, written or found (a
    stack of 2, an unsqueezed 1), pins a size only."""
    if found is None:
        return ""
    pairs = [(w, f) for w, f in zip(want, found) if w.poly.constant is None and f.poly.constant is None and w.poly != f.poly]
    return ", ".join(f"{w} where the tensor has {f} (both {w.value})" for w, f in pairs)


def _unknown(analysis, name: str) -> tuple[str, str, str | None] | None:
    """(code, message, step) when the entry names no single tensor of this pipeline."""
    if not analysis.graph.knows(name) and name not in analysis.metas:  # metas: composites' inner records too
        owner = analysis.graph.producer(name.rsplit("/", 1)[0])
        if owner is not None and analysis.meta(owner) is None:
            return None  # a composite whose rule failed: its error explains it
        return "unknown-ref", f"expect: '{name}' is not a tensor of this pipeline", None
    node = analysis.nodes.get(name)
    if node is not None and node.step.output_field is not None:
        made = ", ".join(node.step.output_ids())
        return "several-outputs", f"expect: '{name}' has several outputs ({made}); pin each by its name", name
    return None


def _block_dims_hint(analysis, entry: Expectation) -> str:
    """When this file's entry for a block's tensor reads dims only the block has, say so."""
    node = analysis.producer(analysis.record_of(entry.name))
    block_alg = node.dims if node is not None else entry.dims
    if block_alg is entry.dims or not entry.shape:
        return ""
    if _readable(entry.dims, entry.shape) or not _readable(block_alg, entry.shape):
        return ""
    return (
        f" — '{entry.name}' is inside a block, whose dims are {analysis.bindings(block_alg)}: this file's expect: reads "
        "this file's dims, the block file's own expect: reads the block's"
    )


def _readable(alg: DimAlgebra, shape: list) -> bool:
    try:
        for text in shape:
            alg.dim(text)
    except dimexpr.DimError:
        return False
    return True
