"""Check a pipeline against PyTorch's own attention, on the same inputs and weights.

Two references, both run in eval mode (no dropout) and compared in the pipeline's dtype:

* :func:`against_sdpa` — the attention core, ``softmax(q @ k^T * scale [masked]) @ v``, against
  ``torch.nn.functional.scaled_dot_product_attention`` (``is_causal`` for ``causal: true``,
  a boolean ``attn_mask`` for a mask tensor, ``scale`` from the pipeline's scale steps).
* :func:`against_mha` — the whole block (projections, heads, core, merge, output projection)
  against ``torch.nn.MultiheadAttention(d_model, H, batch_first=True)`` whose packed
  ``in_proj_weight`` is ``cat([W_q, W_k, W_v])`` and whose ``out_proj`` is ``W_o``.

Both find what to compare on their own: the attention core is the softmax step, the matmul
that makes its scores, and the matmul that applies its weights to the values; the MHA block is
read off the ``linear`` steps that use ``W_q``, ``W_k``, ``W_v`` and ``W_o``. Each returns the
largest absolute difference and raises :class:`VerificationError` (an ``AssertionError``) when
it is above ``atol``.

>>> import tracer.verify as verify
>>> verify.against_sdpa("pipelines/causal_mha.yaml")     # doctest: +SKIP
2.384185791015625e-07
>>> verify.against_mha("pipelines/cross_attention.yaml") # doctest: +SKIP
4.76837158203125e-07
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .analysis.attention import unfused_site
from .api import Pipeline, load
from .presentation.trace import Trace
from .steps.attention import causal_hidden

__all__ = ["AttentionCore", "VerificationError", "against_mha", "against_module", "against_pipeline", "against_sdpa", "attention_core"]

#: a finite fill at or below this counts as "minus infinity" (-1e9 in tutorial 003)
MASK_FILL_LIMIT = -1e4


class VerificationError(AssertionError):
    """The pipeline and the PyTorch reference disagree (or cannot be compared)."""


@dataclass
class AttentionCore:
    """Where a pipeline's attention core lives, as tensor ids.

    ``query`` is (…, L, E), ``keys_t`` is (…, E, S) (the scores matmul's second operand),
    ``value`` is (…, S, Ev), ``weights`` the softmax output (…, L, S) and ``context`` (…, L, Ev).
    """

    softmax: str
    scores: str
    query: str
    keys_t: str
    value: str
    context: str
    scale: float = 1.0
    causal: bool = False
    mask: str | None = None  # a mask tensor id (None: no mask or causal)
    polarity: str | None = None  # 'keep' or 'block' for ``mask``
    fill: float = float("-inf")  # the masked score as softmax sees it (the fill times later scales)
    steps: list[str] = field(default_factory=list)  # mask/scale/dropout steps between scores and softmax
    mask_step: str | None = None  # the mask step (its causal pattern: alignment, window)
    biases: list[tuple[str, float]] = field(default_factory=list)  # (tensor, the scale after it) added to the scores


def attention_core(analysis, softmax: str | None = None) -> AttentionCore:
    """Locate the attention core of an analysed pipeline (``tracer.load(p).check()``), from the
    attention sites the analysis found (``tracer.analysis.attention``).

    ``softmax`` names the softmax step when there are several (one per head, say).
    """
    candidates = [n.id for n in analysis.nodes.values() if n.step.normalises() is not None]
    if softmax is None:
        if len(candidates) != 1:
            raise VerificationError(
                f"'{analysis.pipeline.name}' has {len(candidates)} softmax steps ({', '.join(candidates) or 'none'}); "
                "name the one to check with softmax=..."
            )
        softmax = candidates[0]
    if softmax not in candidates:
        raise VerificationError(f"'{softmax}' is not a softmax step (softmax steps: {', '.join(candidates) or 'none'})")
    site = unfused_site(analysis, analysis.node(softmax))
    if site is None:
        raise VerificationError(f"softmax '{softmax}' is not fed by a matmul of queries and keys (through mask/scale/dropout steps)")
    core = AttentionCore(softmax, site.scores, site.query, site.keys, value="", context="", steps=list(site.chain))
    after_mask = 1.0  # scales between the mask and the softmax also scale the fill
    after = 1.0  # and scales after an added bias scale the bias
    added = {}
    for step_id, operand in site.biases:
        added.setdefault(step_id, []).append(operand)
    for step_id in reversed(site.chain):  # nearest the softmax first
        node = analysis.node(step_id)
        factor = node.step.scaling(lambda text, node=node: node.dims.dim(text).value)
        masking = node.step.masking()
        if factor is not None:
            core.scale *= factor[0]
            after *= factor[0]
            if core.mask is None and not core.causal:
                after_mask *= factor[0]
        elif masking is not None:
            _take_mask(core, step_id, masking, site.product, softmax, after_mask)
        elif node.step.sums_inputs and step_id in added:  # BERT's additive padding mask, a bias tensor
            core.biases += [(operand, after) for operand in added[step_id]]
        elif node.step.adds_bias is not None:  # T5's relative bias, ALiBi: the step records the bias it adds
            core.biases.append((f"{step_id}/{node.step.adds_bias}", after))
        elif not node.step.is_identity():
            raise VerificationError(
                f"{node.op} step '{step_id}' between '{site.product}' and '{softmax}' has no scaled_dot_product_attention equivalent "
                "that tracer.verify knows"
            )
    if site.random:
        raise VerificationError(
            f"step '{site.random[0]}' runs in training mode (it draws from the RNG); the references are compared in eval mode"
        )
    if site.context is None or site.values is None:
        raise VerificationError(f"no matmul applies the weights of '{softmax}' to values")
    core.value, core.context = site.values, site.context
    return core


def _take_mask(core: AttentionCore, step_id: str, masking, scores: str, softmax: str, after_mask: float) -> None:
    if core.causal or core.mask is not None:
        raise VerificationError(f"more than one mask between '{scores}' and '{softmax}'")
    if masking.chunk is not None or masking.segments is not None or (masking.window is not None and not masking.causal):
        raise VerificationError(
            f"mask step '{step_id}' hides keys by band, chunk or document: tracer.verify compares causal, sliding-window and tensor masks only"
        )
    if masking.fill > MASK_FILL_LIMIT:
        raise VerificationError(
            f"mask step '{step_id}' fills {masking.fill:g}: only -inf or a large negative fill (<= {MASK_FILL_LIMIT:g}) "
            "is a mask that scaled_dot_product_attention can express"
        )
    core.causal, core.mask, core.polarity, core.mask_step = masking.causal, masking.tensor, masking.polarity, step_id
    core.fill = masking.fill * after_mask if math.isfinite(masking.fill) else masking.fill


def against_sdpa(
    pipeline: Any,
    *,
    softmax: str | None = None,
    dims: Mapping[str, int] | None = None,
    seed: int | None = None,
    tensors: Mapping[str, Any] | None = None,
    atol: float = 1e-5,
) -> float:
    """Compare the attention core with ``F.scaled_dot_product_attention``; return the max abs difference.

    ``pipeline`` is a path, a :class:`tracer.Pipeline`, or a :class:`tracer.Trace` (run with
    ``keep_values=True``, else it is re-run at its dims and seed). Shapes, e.g. causal_mha::

        q = trace[core.query]          (B, H, T, Dh)
        k = trace[core.keys_t].mT      (B, H, T, Dh)
        v = trace[core.value]          (B, H, T, Dh)
        F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=1/sqrt(Dh))
                                       (B, H, T, Dh)  vs  trace[core.context]

    A mask tensor becomes a boolean ``attn_mask`` (True = attend): the mask itself for
    ``polarity: keep``, its negation for ``polarity: block``. Tensors added to the scores (BERT's
    additive padding mask, T5's relative bias, ALiBi) become a float ``attn_mask``: their sum, each
    times the scales after its ``add``, with masked positions at the mask's fill.
    """
    import torch
    import torch.nn.functional as F

    trace = _values(pipeline, dims, seed, tensors)
    core = attention_core(trace.analysis, softmax)
    q, k_t, v = (_tensor(trace, name) for name in (core.query, core.keys_t, core.value))
    if q.dim() < 2 or k_t.dim() < 2:
        raise VerificationError(
            f"queries '{core.query}' and keys '{core.keys_t}' must have at least 2 dims for scaled_dot_product_attention"
        )
    attn_mask, hide = None, None
    if core.mask is not None:
        mask = _tensor(trace, core.mask).bool()
        hide = ~mask if core.polarity == "keep" else mask
    pattern = _causal_pattern(trace, core, q.shape[-2], k_t.shape[-1], q.device)
    is_causal = core.causal and pattern is None and hide is None and not core.biases
    if core.causal and not is_causal:  # SDPA's is_causal is top-left and takes no other mask
        pattern = pattern if pattern is not None else _causal_pattern(trace, core, q.shape[-2], k_t.shape[-1], q.device, always=True)
        hide = pattern if hide is None else hide | pattern
    if core.biases:  # a float attn_mask is what SDPA adds to the scaled scores
        attn_mask = sum(_tensor(trace, name).to(q.dtype) * after for name, after in core.biases)
        if hide is not None:
            attn_mask = torch.where(hide, torch.tensor(core.fill, dtype=q.dtype, device=q.device), attn_mask)
    elif hide is not None:
        attn_mask = _additive(hide, core, q.dtype)
        if attn_mask.dtype == torch.bool:
            attn_mask = ~attn_mask  # SDPA's boolean mask means "attend"
    with torch.no_grad():
        expected = F.scaled_dot_product_attention(
            q, k_t.transpose(-2, -1), v, attn_mask=attn_mask, dropout_p=0.0, is_causal=is_causal, scale=core.scale
        )
    return _compare(
        f"'{trace.name}': context '{core.context}' vs F.scaled_dot_product_attention", _tensor(trace, core.context), expected, atol
    )


def against_mha(
    pipeline: Any,
    *,
    weights: tuple[str, str, str, str] = ("W_q", "W_k", "W_v", "W_o"),
    num_heads: int | None = None,
    output: str | None = None,
    softmax: str | None = None,
    dims: Mapping[str, int] | None = None,
    seed: int | None = None,
    tensors: Mapping[str, Any] | None = None,
    atol: float = 1e-5,
    check_weights: bool = True,
) -> float:
    """Compare the whole block with ``torch.nn.MultiheadAttention``; return the max abs difference.

    ``weights`` names the query, key, value and output projection weights; the ``linear`` steps
    that use them give the inputs, the biases (their ``bias`` fields) and the output. Heads come
    from ``num_heads`` or the dim ``H``. Shapes, e.g. cross_attention::

        mha = nn.MultiheadAttention(d_model, H, batch_first=True)   # eval mode, dropout 0
        mha.in_proj_weight = cat([W_q, W_k, W_v])                    (3*d_model, d_model)
        mha.in_proj_bias   = cat([b_q, b_k, b_v])                    (3*d_model,)
        mha.out_proj       = W_o, b_o                                (d_model, d_model), (d_model,)
        out, w = mha(x_q, x_kv, x_kv, key_padding_mask=~pad_mask.view(B, T_kv))
                 (B, T_q, d_model), (B, H, T_q, T_kv)

    The mask follows the pipeline's: ``causal: true`` becomes a (L, S) ``attn_mask``, a keep/
    block mask of shape (B, 1, 1, S) a ``key_padding_mask``, any other mask a (B*H, L, S)
    ``attn_mask``. With ``check_weights`` the per-head attention weights are compared with the
    softmax output as well.
    """
    import torch

    trace = _values(pipeline, dims, seed, tensors)
    analysis = trace.analysis
    linears, projections = {}, {}
    for role, name in zip("qkvo", weights):
        found = [n for n in analysis.nodes.values() if (p := n.step.projection()) is not None and p.weight == name]
        if len(found) != 1:
            raise VerificationError(f"'{trace.name}': expected one linear step with weight '{name}', found {len(found)}")
        linears[role], projections[role] = found[0], found[0].step.projection()

    def weight(role: str):
        w = _tensor(trace, projections[role].weight)
        return w.T if projections[role].transposed else w

    def bias(role: str, width: int):
        name = projections[role].bias
        return _tensor(trace, name) if name is not None else torch.zeros(width, dtype=w_q.dtype)

    w_q, w_k, w_v, w_o = (weight(r) for r in "qkvo")
    d_model = w_q.shape[0]
    heads = num_heads if num_heads is not None else analysis.dims.get("H")
    if heads is None:
        raise VerificationError(f"'{trace.name}' has no dim H; pass num_heads=")
    query, key, value = (_tensor(trace, linears[r].reads[0]) for r in "qkv")
    kdim, vdim = w_k.shape[1], w_v.shape[1]
    has_bias = any(projections[r].bias is not None for r in "qkvo")
    mha = torch.nn.MultiheadAttention(d_model, heads, dropout=0.0, bias=has_bias, batch_first=True, kdim=kdim, vdim=vdim, dtype=w_q.dtype)
    mha.eval()
    with torch.no_grad():
        if mha._qkv_same_embed_dim:
            mha.in_proj_weight.copy_(torch.cat([w_q, w_k, w_v]))
        else:
            mha.q_proj_weight.copy_(w_q)
            mha.k_proj_weight.copy_(w_k)
            mha.v_proj_weight.copy_(w_v)
        mha.out_proj.weight.copy_(w_o)
        if has_bias:
            mha.in_proj_bias.copy_(torch.cat([bias("q", d_model), bias("k", d_model), bias("v", d_model)]))
            mha.out_proj.bias.copy_(bias("o", w_o.shape[0]))
        core = attention_core(analysis, softmax)
        attn_mask, key_padding_mask = _mha_masks(trace, core, query, key, heads)
        out, attn = mha(
            query,
            key,
            value,
            key_padding_mask=key_padding_mask,
            attn_mask=attn_mask,
            need_weights=check_weights,
            average_attn_weights=False,
        )
    out_id = output or linears["o"].id
    diff = _compare(f"'{trace.name}': output '{out_id}' vs nn.MultiheadAttention", _tensor(trace, out_id), out, atol)
    if check_weights:
        mine = _tensor(trace, core.softmax)
        if tuple(mine.shape) == tuple(attn.shape):
            diff = max(diff, _compare(f"'{trace.name}': weights '{core.softmax}' vs nn.MultiheadAttention's", mine, attn, atol))
    return diff


def against_pipeline(
    pipeline: Any,
    reference: Any,
    *,
    output: str | None = None,
    reference_output: str | None = None,
    dims: Mapping[str, int] | None = None,
    seed: int | None = None,
    tensors: Mapping[str, Any] | None = None,
    atol: float = 1e-5,
) -> float:
    """Compare two pipelines on the same inputs and weights; return the max abs difference.

    ``pipeline`` runs first; every input and param of ``reference`` that ``pipeline`` also
    declares gets ``pipeline``'s tensor (by name), so a fused design (one ``sdpa`` step) and the
    unfused one it replaces see the same numbers::

        verify.against_pipeline("fused.yaml", "pipelines/models/mistral_sliding_window.yaml")

    ``output`` (default: the first output of ``pipeline``) is compared with ``reference_output``
    (default: the same id).
    """

    trace = _values(pipeline, dims, seed, tensors)
    if isinstance(reference, (str, Path)):
        reference = load(reference)
    if not isinstance(reference, Pipeline):
        raise TypeError(f"expected a path or a tracer.Pipeline as the reference, got {type(reference).__name__}")
    declared = list(reference.spec.inputs) + list(reference.spec.params)
    shared = {name: _tensor(trace, name) for name in declared if name in trace}
    expected = reference.run(dims=dims, seed=seed, tensors=shared, keep_values=True)
    mine = output or trace.analysis.outputs[0]
    theirs = reference_output or mine
    return _compare(f"'{trace.name}': '{mine}' vs '{expected.name}': '{theirs}'", _tensor(trace, mine), _tensor(expected, theirs), atol)


def against_module(
    pipeline: Any,
    module: Any,
    *,
    weights: Mapping[str, Any] | None = None,
    inputs: Mapping[str, Any] | None = None,
    names: Mapping[str, str] | None = None,
    call: Any = None,
    dims: Mapping[str, int] | None = None,
    seed: int | None = None,
    atol: float = 1e-5,
) -> dict[str, float]:
    """Run the pipeline and any ``nn.Module`` on the same inputs; per output, the max abs difference.

    ``weights`` are the pipeline's params by id (``/`` or ``.``), e.g. the module's state_dict
    renamed by :func:`tracer.runtime.weights.rename`; ``inputs`` by name (default: the pipeline's own).
    The module, in eval mode, is called with the inputs in declaration order, or as
    ``call(module, *inputs)`` (``lambda m, x: m(x, x, x)[0]`` for nn.MultiheadAttention); several
    outputs are compared in order. Above ``atol`` it raises :class:`VerificationError` naming every
    output's difference and the first recorded tensor, in run order, whose values differ from the
    output of the module's submodule of the same name (forward hooks): ``names`` maps record ids to
    submodule names (``{"encoder/normed_1": "norm1"}``); otherwise a submodule matches a record
    whose id, with ``.`` for ``/``, is its name, and a block copy's output (``layers/3/out``) the
    submodule of the copy (``layers.3``), as in an exported module::

        layer = nn.TransformerEncoderLayer(2, 2, 4, dropout=0.0, batch_first=True)
        verify.against_module("pipelines/encoder_block.yaml", layer, weights=weights.rename(layer.state_dict(), MAP))
    """

    if isinstance(pipeline, (str, Path)):
        pipeline = load(pipeline)
    if not isinstance(pipeline, Pipeline):
        raise TypeError(f"expected a path or a tracer.Pipeline, got {type(pipeline).__name__}")
    trace = pipeline.run(dims=dims, seed=seed, keep_values=True, params=weights, inputs=inputs)
    captured: dict[str, Any] = {}

    def capture(name: str):
        def hook(_module, _args, out) -> None:  # a hook that returns something replaces the submodule's output
            captured.setdefault(name, _first_tensor(out))

        return hook

    hooks = [sub.register_forward_hook(capture(name)) for name, sub in module.named_modules() if name]
    args = [_tensor(trace, name) for name in pipeline.spec.inputs]
    if call is None:
        _check_call(trace, module, list(pipeline.spec.inputs))
    try:
        module.eval()
        result = call(module, *args) if call is not None else module(*args)  # grad on: fused fast paths would skip the hooks
    finally:
        for hook in hooks:
            hook.remove()
    results = result if isinstance(result, (tuple, list)) else (result,)
    diffs = {}
    for name, theirs in zip(trace.analysis.outputs, results):
        mine, theirs = _tensor(trace, name), theirs.detach()
        if tuple(mine.shape) != tuple(theirs.shape):
            raise VerificationError(f"'{trace.name}': output '{name}' is {list(mine.shape)}, the module's is {list(theirs.shape)}")
        diffs[name] = _max_diff(mine, theirs)
    if all(d <= atol for d in diffs.values()):
        return diffs
    shown = ", ".join(f"'{name}' {d:.3g}" for name, d in diffs.items())
    raise VerificationError(
        f"'{trace.name}' vs {type(module).__name__}: max abs difference per output {shown} > atol {atol:g}; "
        + _divergence(trace, captured, names or {}, atol)
    )


def _check_call(trace, module, names: list[str]) -> None:
    """The module's forward must accept the pipeline's inputs, in declaration order; otherwise say
    which inputs those are and how to pass them (``call=``), before torch raises from inside it."""
    import inspect

    try:
        signature = inspect.signature(module.forward)
    except (TypeError, ValueError):  # no signature to read (a builtin forward): let the call speak
        return
    try:
        signature.bind(*names)
    except TypeError as exc:
        shapes = ", ".join(f"{name} {trace[name].symbolic}" for name in names)
        raise VerificationError(
            f"'{trace.name}' declares {len(names)} input{'s' if len(names) != 1 else ''} ({shapes}), passed in that order, "
            f"but {type(module).__name__}.forward{signature} cannot take them ({exc}); say how to call it with "
            f"call=lambda module, {', '.join(names)}: module(...)"
        ) from None


def _first_tensor(out):
    import torch

    if isinstance(out, (tuple, list)):
        out = next((o for o in out if isinstance(o, torch.Tensor)), None)
    return out.detach() if isinstance(out, torch.Tensor) else None


def _max_diff(a, b) -> float:
    diff = (a.double() - b.double()).abs()
    both_nan = a.isnan() & b.isnan()
    return float(diff[~both_nan].max()) if bool((~both_nan).any()) else 0.0


def _divergence(trace, captured: dict, names: Mapping[str, str], atol: float) -> str:
    """The first record (in run order) that differs from the submodule of the same name."""
    blocks = {record: block for block, record in trace.analysis.aliases.items()}  # a block copy's output: its submodule's
    matched = 0
    for record in trace.records:
        sub = names.get(record.id) or blocks.get(record.id, record.id).replace("/", ".")
        theirs = captured.get(sub)
        if theirs is None or record.tensor is None or tuple(theirs.shape) != tuple(record.tensor.shape):
            continue
        matched += 1
        worst = _max_diff(record.tensor, theirs)
        if not worst <= atol:
            return f"the first recorded tensor that differs is '{record.id}' vs submodule '{sub}' (max abs difference {worst:.3g})"
    if not matched:
        return "no recorded tensor matched a submodule by name: pass names={record id: submodule name}"
    return f"the {matched} recorded tensors matched to submodules agree: the difference arises between them and the outputs"


def _mha_masks(trace, core: AttentionCore, query, key, heads: int):
    """(attn_mask, key_padding_mask) for nn.MultiheadAttention: True there means *do not attend*."""
    import torch

    batched = query.dim() == 3
    length, source = query.shape[-2], key.shape[-2]
    causal = _causal_pattern(trace, core, length, source, query.device, always=True) if core.causal else None
    if core.mask is None:
        return causal, None
    mask = _tensor(trace, core.mask).bool()
    hide = ~mask if core.polarity == "keep" else mask
    if causal is not None:
        hide = hide | causal
    if batched and hide.dim() == 4 and hide.shape[1] == 1 and hide.shape[2] == 1 and hide.shape[0] == query.shape[0]:
        return None, _additive(hide.reshape(hide.shape[0], hide.shape[3]), core, query.dtype)  # key_padding_mask (B, S)
    if not batched:
        while hide.dim() > 3 and hide.shape[0] == 1:
            hide = hide[0]
        return _additive(torch.broadcast_to(hide, (heads, length, source)), core, query.dtype), None
    full = torch.broadcast_to(hide, (query.shape[0], heads, length, source))
    return _additive(full.reshape(query.shape[0] * heads, length, source), core, query.dtype), None


def _causal_pattern(trace, core: AttentionCore, length: int, source: int, device, always: bool = False):
    """The mask step's causal pattern (True = hidden), or None when it is SDPA's own ``is_causal``
    (top-left, no window; the same as bottom-right for square scores) and ``always`` is False."""
    if not core.causal:
        return None
    node = trace.analysis.node(core.mask_step)
    masking = node.step.masking()
    window = node.dims.dim(masking.window).value if masking.window is not None else None
    top_left = masking.align == "top-left"
    if not always and window is None and (length == source or top_left):
        return None
    import torch

    return causal_hidden(torch, length, source, window, top_left, device)


def _additive(hide, core: AttentionCore, dtype):
    """A boolean "hide" mask as the references take it: as is for a -inf fill; for a finite fill
    (tutorial 003's -1e9) a float mask added to the scaled scores, so that a row with every key
    hidden gets the same uniform weights as in the pipeline instead of NaN."""
    import torch

    if not math.isfinite(core.fill):
        return hide
    return torch.zeros(hide.shape, dtype=dtype, device=hide.device).masked_fill(hide, core.fill)


def _values(pipeline: Any, dims, seed, tensors):
    """A trace with every tensor kept, from a path, a Pipeline or a Trace."""

    if isinstance(pipeline, Trace):
        if pipeline.keep_values and dims is None and seed is None and tensors is None:
            return pipeline
        declared = pipeline.analysis.pipeline.dims
        dims = dims if dims is not None else {k: v for k, v in pipeline.dims.items() if isinstance(declared.get(k), int)}
        seed = seed if seed is not None else pipeline.seed
        pipeline = pipeline.pipeline
    if isinstance(pipeline, (str, Path)):
        pipeline = load(pipeline)
    if not isinstance(pipeline, Pipeline):
        raise TypeError(f"expected a path, a tracer.Pipeline or a tracer.Trace, got {type(pipeline).__name__}")
    return pipeline.run(dims=dims, seed=seed, keep_values=True, tensors=tensors)


def _tensor(trace, name: str):
    tensor = trace[name].tensor
    if tensor is None:
        raise VerificationError(f"no value for '{name}' (run with keep_values=True)")
    return tensor


def _compare(what: str, actual, expected, atol: float) -> float:
    if tuple(actual.shape) != tuple(expected.shape):
        raise VerificationError(f"{what}: shapes differ, {list(actual.shape)} vs {list(expected.shape)}")
    nan_a, nan_e = actual.isnan(), expected.isnan()
    if not bool((nan_a == nan_e).all()):
        raise VerificationError(
            f"{what}: NaN in {int(nan_a.sum())} entries of the pipeline's result and {int(nan_e.sum())} of the reference's"
        )
    diff = (actual.double() - expected.double()).abs()
    diff = diff[~nan_a] if bool(nan_a.any()) else diff
    worst = float(diff.max()) if diff.numel() else 0.0
    if not worst <= atol:  # also catches NaN
        where = (
            tuple(int(i) for i in divmod_index(int(diff.argmax()), tuple(actual.shape))) if diff.numel() and not bool(nan_a.any()) else ()
        )
        raise VerificationError(f"{what}: max abs difference {worst:.3g} > atol {atol:g}" + (f" at index {list(where)}" if where else ""))
    return worst if math.isfinite(worst) else math.inf


def divmod_index(flat: int, shape: tuple[int, ...]) -> tuple[int, ...]:
    """The multi-index of a flat (row-major) position: ``divmod_index(5, (2, 3)) == (1, 2)``."""
    index = []
    for size in reversed(shape):
        flat, rest = divmod(flat, size) if size else (flat, 0)
        index.append(rest)
    return tuple(reversed(index))
