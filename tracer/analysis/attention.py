"""The attention core, found once: where a pipeline computes softmax(q·kᵀ · scale + mask) · v.

A :class:`Site` is one attention computation, found from the kinds' declared meaning alone (the
step contract's ``makes_scores``, ``passes_scores``, ``normalises``, ``scaling``, ``masking`` and
``fused_attention``), never from their names: the product that makes the scores, the scale and
mask steps between it and the softmax, the product that applies the weights to the values, or
one fused kernel (``sdpa``) that does all of it. Lints, ``tracer.verify`` and the HTML report read
sites; none of them walks the graph for attention on its own.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..core.symbolic import Dim
from ..steps.contract import Masking
from .graph import Node

MAX_CHAIN = 64  # steps between the scores and the softmax that are followed


@dataclass(frozen=True)
class Scaled:
    """A step that multiplies the scores on their way to the softmax."""

    step: str
    multiplier: float
    text: str  # as the file wrote it: '1/√d_k (d_k=4)'
    expr: str | None = None  # the dim expression under the square root ('d_k'), None for a number


@dataclass(frozen=True)
class Site:
    """One attention computation, as tensor and step ids (records are what the steps read)."""

    product: str  # the step that makes the scores (a product of queries and keys), or the fused step
    fused: bool  # one kernel (sdpa): no scores or weights are ever stored
    query: str  # the product's first operand, (…, T_q, Dh)
    keys: str  # its second: (…, Dh, T_kv) for a matmul of q and kᵀ, as the product reads it
    values: str | None  # (…, T_kv, Dv), when the weights are applied to values
    scores: str | None  # the product's result (…, T_q, T_kv); None when fused
    softmax: str | None  # the step normalising the scores into weights; None when fused
    context: str | None  # the weights applied to the values (…, T_q, Dv): a product, or the fused step
    query_axis: int | None  # of the (implicit) scores: the queries' positions
    key_axis: int | None  # ... and the keys'
    head_dim: Dim | None  # the dim the scores contract over (the queries' last)
    chain: tuple[str, ...] = ()  # steps between the product and the softmax, in execution order
    scales: tuple[Scaled, ...] = ()  # the scale steps in the chain, in execution order
    masks: tuple[tuple[str, Masking], ...] = ()  # (step, what it hides): the chain's masks, or the fused step's own
    random: tuple[str, ...] = ()  # steps that draw from the RNG between the scores and the values (training dropout)
    implicit_scale: float | None = None  # a fused kernel's own scale: explicit, or 1/sqrt(head dim) by default
    after: tuple[str, ...] = ()  # steps between the softmax and the product with the values (dropout)
    biases: tuple[tuple[str, str], ...] = ()  # (step, tensor) added to the scores in the chain: additive masks, position biases

    @property
    def multiplier(self) -> float:
        """Everything the scores are multiplied by before the softmax."""
        total = 1.0 if self.implicit_scale is None else self.implicit_scale
        for scaled in self.scales:
            total *= scaled.multiplier
        return total


def find_sites(analysis) -> tuple[Site, ...]:
    """Every attention computation in execution order: each softmax fed by a product of queries
    and keys (through scale, mask and dropout steps), and each fused attention step."""
    sites = []
    for node in analysis.nodes.values():
        if not node.outs:
            continue
        if node.step.fused_attention() is not None:
            sites.append(_fused(analysis, node))
        elif node.step.normalises() is not None:
            site = unfused_site(analysis, node)
            if site is not None:
                sites.append(site)
    return tuple(sites)


def unfused_site(analysis, softmax: Node) -> Site | None:
    """The site whose weights ``softmax`` makes, or None when no product of queries and keys feeds it."""
    chain, product = score_chain(analysis, softmax)
    if product is None:
        return None
    query, keys = product.reads[:2]
    scores = product.value
    ndim = len(analysis.metas[scores].shape)
    query_axis, key_axis = product.step.score_axes(ndim)
    scales, masks, random = [], [], []
    for node in chain:
        factor = node.step.scaling(lambda text, node=node: node.dims.dim(text).value)
        if factor is not None:
            scales.append(Scaled(node.id, *factor, node.step.scaled_by()))
        masking = node.step.masking()
        if masking is not None:
            masks.append((node.id, masking))
        if node.step.is_random():
            random.append(node.id)
    biases = _biases(analysis, chain, product)
    context, after = _applied(analysis, softmax)
    values = context.reads[1] if context is not None and len(context.reads) > 1 else None
    return Site(
        product.id,
        False,
        query,
        keys,
        values,
        scores,
        softmax.id,
        None if context is None else context.value,
        query_axis,
        key_axis,
        analysis.metas[query].shape[-1] if analysis.metas[query].shape else None,
        tuple(n.id for n in chain),
        tuple(scales),
        tuple(masks),
        tuple(random) + tuple(n.id for n in after if n.step.is_random()),
        None,
        tuple(n.id for n in after),
        biases,
    )


def _biases(analysis, chain: list[Node], product: Node) -> tuple[tuple[str, str], ...]:
    """(step, operand) for every operand of a chain step that is not the scores passing through
    (compared as records: a composite step's id names its last record)."""
    found, scores = [], product.value
    for node in chain:
        found += [(node.id, operand) for operand in node.inputs if analysis.record_of(operand) != scores]
        scores = node.value
    return tuple(found)


def prescales(analysis, tensor_id: str) -> list[Scaled]:
    """Scale steps a query or key tensor passed through since its projection made it
    (``q_proj(x) * scaling`` before the head split), walking back through single-input steps,
    nearest first."""
    found, current = [], tensor_id
    for _ in range(MAX_CHAIN):
        node = analysis.producer(current)
        if node is None or len(node.inputs) != 1 or not node.outs or node.step.projection() is not None:
            break
        factor = node.step.scaling(lambda text, node=node: node.dims.dim(text).value)
        if factor is not None:
            found.append(Scaled(node.id, *factor, node.step.scaled_by()))
        current = node.inputs[0]
    return found


def score_chain(analysis, softmax: Node) -> tuple[list[Node], Node | None]:
    """The steps that pass scores between a product and ``softmax`` (execution order), and the
    product; (the steps, None) when the chain starts anywhere else. A step with several inputs (scores
    plus an additive bias) is followed through whichever input leads back to a product."""
    if not softmax.inputs:
        return [], None
    return _chain_from(analysis, softmax.inputs[0], 0, set())


def _chain_from(analysis, current: str, depth: int, dead_ends: set[str]) -> tuple[list[Node], Node | None]:
    node = analysis.producer(current)
    if node is None or not node.outs or depth > MAX_CHAIN or current in dead_ends:
        return [], None
    if node.step.makes_scores and len(node.reads) >= 2:  # a one-operand einsum is a reduction, not q·k
        return [], node
    if not node.step.passes_scores:
        return [], None
    walked = []
    for operand in node.inputs:
        chain, product = _chain_from(analysis, operand, depth + 1, dead_ends)
        if product is not None:
            return chain + [node], product
        walked = walked or chain
    dead_ends.add(current)  # an add of two adds of … is walked once per tensor, not once per path
    return walked + [node], None


def _applied(analysis, softmax: Node) -> tuple[Node | None, list[Node]]:
    """The product that applies the weights to values (its first operand the weights, perhaps
    through dropout), and the steps passed on the way."""
    current, passed = softmax, []
    for _ in range(MAX_CHAIN):
        readers = [n for n in analysis.users(current.id) if n.inputs[:1] == (current.id,)]
        product = next((n for n in readers if n.step.makes_scores and n.outs), None)
        if product is not None:
            return product, passed
        onward = next((n for n in readers if n.step.passes_scores and n.outs), None)
        if onward is None:
            return None, passed
        passed.append(onward)
        current = onward
    return None, passed


def _fused(analysis, node: Node) -> Site:
    fused = node.step.fused_attention()
    query, keys, values = node.reads[:3]
    q = analysis.metas[query]
    head = q.shape[-1] if q.shape else None
    scale = fused.scale if fused.scale is not None else (1 / math.sqrt(head.value) if head is not None and head.value else math.inf)
    ndim = len(q.shape)
    masks = ((node.id, fused.masking),) if fused.masking is not None else ()
    random = (node.id,) if node.step.is_random() else ()
    return Site(node.id, True, query, keys, values, None, None, node.value, ndim - 2, ndim - 1, head, (), (), masks, random, scale)


def rotations(analysis, tensor_id: str) -> list[Node]:
    """The rope steps a query or key tensor went through since its projection (any input of any
    step, nearest first): what positions it carries, and what its rope asks of the scale."""
    found, frontier, seen = [], [tensor_id], set()
    while frontier and len(seen) < MAX_CHAIN:
        node = analysis.producer(frontier.pop(0))
        if node is None or node.id in seen or not node.outs or node.step.projection() is not None:
            continue
        seen.add(node.id)
        if node.step.rotation() is not None:
            found.append(node)
        frontier += list(node.inputs)
    return found
