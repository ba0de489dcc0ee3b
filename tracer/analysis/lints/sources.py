"""Where the tensors of an attention site come from, for the lints about direction, caches,
masks and positions: which declared inputs a tensor was computed from (its token sources), the
dims its scores run along, which operands of a cache cat are the new tokens, and what a mask
tensor holds along the keys when the file fixes it (through layout steps, casts and negations).

Queries and keys computed from the same tokens (self-attention, a KV cache whose new keys come
from the queries' hidden states) share a source; cross-attention's keys come from another
sequence (the encoder's output) and are as long as it (`S`, not `T`).
"""

from __future__ import annotations

from dataclasses import dataclass

from ...core.symbolic import Dim
from ...spec.inits import INITS
from ..positions import ancestry
from ..positions import flat_values as flatten

#: a mask larger than this many elements is not expanded by the lints
MAX_PATTERN = 1_000_000
#: steps walked back from a tensor to the inputs it was computed from
MAX_SOURCES_WALK = 4096


def token_sources(analysis, tensor_id: str) -> frozenset[str]:
    """The declared inputs (not params) that ``tensor_id`` was computed from, through data inputs."""
    inputs = analysis.pipeline.inputs
    return frozenset(name for name, node in ancestry(analysis, tensor_id) if node is None and name in inputs)


def symbols(dim: Dim) -> frozenset[str]:
    """The dim names a dim is computed from (``past + T``: past and T)."""
    return frozenset(name for mono, _ in dim.poly.terms for name, _ in mono)


def score_dims(analysis, site) -> tuple[Dim, Dim] | None:
    """The dims of the site's (possibly implicit) scores along the queries and along the keys."""
    if site.scores is not None and site.query_axis is not None and site.key_axis is not None:
        shape = analysis.meta(site.scores).shape
        return shape[site.query_axis], shape[site.key_axis]
    query, keys = analysis.meta(site.query), analysis.meta(site.keys)
    if query is None or keys is None or len(query.shape) < 2 or len(keys.shape) < 2:
        return None
    return query.shape[-2], keys.shape[-2]


def is_cross(analysis, site) -> bool:
    """Queries and keys from different sequences: keys whose length is not written with the
    queries' (``S`` against ``T``; a cache's ``past + T`` is not), and no declared input in common."""
    dims = score_dims(analysis, site)
    if dims is None:
        return False
    query, keys = dims
    if query.poly.constant is not None or keys.poly.constant is not None or symbols(query) & symbols(keys):
        return False  # literal sizes say nothing about which sequence they count; shared dims say self-attention
    return not token_sources(analysis, site.query) & token_sources(analysis, site.keys)


def along_keys_only(analysis, site, tensor: str) -> bool:
    """Whether ``tensor`` has size 1 under the scores' query axis (broadcasting aligns the right)."""
    if site.query_axis is None:
        return False
    rank = len(analysis.meta(site.scores).shape) if site.scores is not None else len(analysis.meta(site.query).shape)
    sizes = analysis.meta(tensor).sizes
    under = site.query_axis % rank - (rank - len(sizes))
    return under < 0 or sizes[under] == 1


def new_tokens(analysis, join, site) -> tuple[bool, ...]:
    """For each operand of a cat that joins a KV cache with new tokens: whether it holds the new
    tokens — as long as the queries along the cat dim, or computed from the queries' inputs."""
    dims = score_dims(analysis, site)
    query_sources = token_sources(analysis, site.query)
    found = []
    for operand in join.inputs:
        meta = analysis.meta(operand)
        length = meta.shape[join.step.joins() % len(meta.shape)]
        same_length = dims is not None and length.poly == dims[0].poly and length.poly.constant is None
        found.append(same_length or bool(token_sources(analysis, operand) & query_sources))
    return tuple(found)


def cache_join(analysis, site):
    """The cat that appends the new keys to a KV cache on the keys' way to the site (through
    single-input steps), cache first; None without one."""
    current = site.keys
    for _ in range(MAX_SOURCES_WALK):
        node = analysis.producer(current)
        if node is None or not node.inputs:
            return None
        if node.step.joins() is not None and len(node.inputs) >= 2:
            fresh = new_tokens(analysis, node, site)
            return node if fresh[-1] and not all(fresh) else None
        if len(node.inputs) != 1:
            return None
        current = node.inputs[0]
    return None


def cache_after_new(analysis, join, site) -> bool:
    """Whether a cache cat puts the new tokens before the cached ones (``cat([new, cache])``)."""
    fresh = new_tokens(analysis, join, site)
    return not fresh[-1] and any(fresh[:-1])


def declared_mask_rows(analysis, name: str) -> list[list[bool]] | None:
    """The rows (last-dim vectors, leading dims flattened) of a declared mask tensor as bools.

    Known only for tensors whose content the file fixes: ``values`` literals, and the inits whose
    content is fixed (ones, zeros, triu, tril: ``Init.known_rows``). Anything else (random inits,
    masks computed by steps) returns ``None``: its content is only known at run time, where
    ``tracer.runtime.watch.SoftmaxNaNs`` looks at the softmax outputs instead.
    """
    declared = analysis.declared.get(name)
    if declared is None or declared.meta.numel > MAX_PATTERN:
        return None
    decl, sizes = declared.decl, declared.meta.sizes
    if decl.values is not None:
        cols = sizes[-1] if sizes else 1
        flat = list(flatten(decl.values))
        return [[bool(v) for v in flat[r * cols : (r + 1) * cols]] for r in range(declared.meta.numel // cols if cols else 0)]
    return INITS[decl.init].known_rows(sizes, decl) if decl.init is not None else None


@dataclass(frozen=True)
class KeyRows:
    """What a mask tensor holds for the keys, followed back to a declared tensor whose content the
    file fixes: each row of the declared tensor (its last dim, which stays the keys' dim on the
    way) as bools, negated where the way negates it (``mask == 0``, ``logical_not``)."""

    declared: str
    rows: tuple[tuple[bool, ...], ...]
    negated_by: tuple[str, ...]  # the steps that negated it, nearest first

    @property
    def varies(self) -> bool:
        """Whether it holds both values (a padding mask with padding somewhere)."""
        return len({value for row in self.rows for value in row}) == 2

    def visible(self, polarity: str) -> list[list[bool]]:
        """Per row, whether each key stays visible under a mask step's polarity."""
        return [[value == (polarity == "keep") for value in row] for row in self.rows]


def key_rows(analysis, tensor_id: str, keys: Dim) -> KeyRows | None:
    """The rows a mask tensor holds along the keys (``keys``: the scores' key dim), when the file
    fixes them: followed back through layout steps, casts and negations that keep the last dim."""
    current, negated = analysis.record_of(tensor_id), []
    for _ in range(MAX_SOURCES_WALK):
        node = analysis.producer(current)
        meta = analysis.metas[current]
        if not meta.shape or meta.shape[-1].poly != keys.poly:
            return None
        if node is None:
            return _declared_rows(analysis, current, tuple(negated))
        logic = "same" if node.step.keeps_values and node.step.slicing() is None else node.step.on_binary()
        if logic is None or len(node.inputs) != 1:
            return None
        if logic == "not":
            negated.append(node.id)
        current = analysis.record_of(node.inputs[0])
    return None


def _declared_rows(analysis, name: str, negated: tuple[str, ...]) -> KeyRows | None:
    rows = declared_mask_rows(analysis, name)
    declared = analysis.declared.get(name)
    if rows is None or declared is None or (declared.decl.values is not None and not set(flatten(declared.decl.values)) <= {0, 1}):
        return None  # unknown, or not a 0/1 mask (token ids, positions)
    flip = len(negated) % 2 == 1
    return KeyRows(name, tuple(tuple(value != flip for value in row) for row in rows), negated)


def padding_rows(analysis, site, tensor_id: str) -> KeyRows | None:
    """The key rows of a padding mask: one the file fixes, the same for every query (size 1 under
    the scores' query axis, perhaps expanded since)."""
    dims = score_dims(analysis, site)
    if dims is None or dims[1].value < 2 or not _same_for_every_query(analysis, site, tensor_id):
        return None
    return key_rows(analysis, tensor_id, dims[1])


def _same_for_every_query(analysis, site, tensor_id: str) -> bool:
    """Size 1 under the query axis, here or before steps that keep values and rank (expand, cast)."""
    current = analysis.record_of(tensor_id)
    rank = len(analysis.metas[current].shape)
    for _ in range(MAX_SOURCES_WALK):
        if along_keys_only(analysis, site, current):
            return True
        node = analysis.producer(current)
        if node is None or len(node.inputs) != 1 or not (node.step.keeps_values or node.step.on_binary()):
            return False
        current = analysis.record_of(node.inputs[0])
        if len(analysis.metas[current].shape) != rank:
            return False
    return False


def reversed_padding(analysis, site, masking) -> KeyRows | None:
    """The key rows of a padding mask whose polarity hides every key of some row while the other
    polarity would hide every key of none; None otherwise."""
    found = padding_rows(analysis, site, masking.tensor) if masking.tensor is not None and masking.polarity is not None else None
    if found is None or not found.varies:
        return None  # a mask of one value (an importer's zeros) says nothing about which value means a token
    other = "block" if masking.polarity == "keep" else "keep"
    blind = [not any(row) for row in found.visible(masking.polarity)]
    if any(blind) and not any(not any(row) for row in found.visible(other)):
        return found
    return None


def position_lookups(analysis, tensor_id: str) -> list:
    """The table lookups (``looks_up``: embeddings) the tensor was computed from."""
    walked = ancestry(analysis, tensor_id, through=lambda node: not node.step.looks_up)
    return [node for _, node in walked if node is not None and node.step.looks_up and node.inputs]
