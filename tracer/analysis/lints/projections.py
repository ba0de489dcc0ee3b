"""Lints about fused projections: how a packed q|k|v output is cut, against its axes and the
layout its checkpoint stores."""

from __future__ import annotations

from ..config import declared
from .heads import reaches_attention
from .registry import Lint, register, show, warning

# checkpoint keys of fused projections stored per head or per kv group, not as three blocks:
# GPT-NeoX and BLOOM interleave q, k, v per head; Falcon's new architecture per kv group
INTERLEAVED_KEYS = ("query_key_value.weight",)


@register
class FusedQkvSplit(Lint):
    """**What.** The output of a fused q|k|v projection cut in a way its weight was not packed:

    - along an axis other than the features it projects to (the last): a `(B, T, 3·d)` result
      split or chunked along T, which only fits when T happens to divide;
    - as three consecutive blocks when the checkpoint stores it per head or per kv group: a
      `query_key_value.weight` (GPT-NeoX, BLOOM: `[q, k, v]` per head; Falcon with
      `new_decoder_architecture`: per kv group, `n_rep` queries then a key and a value).

    **Why it matters.** Every shape is right; each "query" holds pieces of keys and values of
    other heads, and a loaded checkpoint computes something else entirely.

    **Fix.** Split along the last dim (`dim: -1`); for an interleaved checkpoint view the features
    as its layout, `(B, T, H, 3, Dh)` (NeoX) or `(B, T, H_kv, n_rep + 2, Dh)` (Falcon), and index
    the packed axis.
    """

    code, example, origin = "fused-qkv-split", "fused_qkv_split", "fused projections (GPT-2, GPT-NeoX, Falcon)"

    def check(self, analysis):
        config = declared(analysis)
        for node in analysis.nodes.values():
            dim = node.step.splitting()
            if dim is None or len(node.outs) < 2:
                continue
            source = node.reads[0]
            projection = analysis.producer(source)
            if projection is None or projection.step.projection() is None or not _into_attention(analysis, node):
                continue
            meta = analysis.metas[source]
            axis = dim % len(meta.shape)
            if axis != len(meta.shape) - 1:
                yield self._across(analysis, node, source, axis)
            elif len(node.outs) == 3:
                yield from self._blocks(analysis, config, node, source, projection)

    def _across(self, analysis, node, source, axis):
        role = analysis.axis_roles(source)[axis] or "a non-feature axis"
        dim = analysis.metas[source].shape[axis]
        message = (
            f"it cuts the fused projection '{source}' {show(analysis, source)} along dim {axis} ({dim}, {role}), but q, k and v "
            f"are packed along its features, the last dim — use dim: -1"
        )
        return warning(analysis, node, self.code, message, "dim")

    def _blocks(self, analysis, config, node, source, projection):
        weight = projection.step.projection().weight
        key = next((k for k, target in _param_keys(analysis).items() if target == weight), None)
        widths = [out.meta.sizes[-1] for out in node.outs]
        grouped = bool(config.layer_value("new_decoder_architecture")) and widths[1] == widths[2] < widths[0]
        kv_heads = next((analysis.alg.values.get(d) for d, k in config.dims.items() if k.endswith("num_kv_heads")), None)
        if grouped and kv_heads == 1:
            return  # one kv group: its n_rep queries, key and value are three consecutive blocks
        per_head = key is not None and key.endswith(INTERLEAVED_KEYS) and widths[0] == widths[1] == widths[2]
        if not (grouped or per_head and not config.layer_value("new_decoder_architecture")):
            return
        layout = (
            "per kv group, n_rep queries then a key and a value: view (B, T, H_kv, n_rep + 2, Dh) and index dim 3"
            if grouped
            else "per head, [q, k, v]: view (B, T, H, 3, Dh) (or (B, T, H, 3·Dh)) and index the packed axis"
        )
        message = (
            f"it cuts the fused projection '{source}' {show(analysis, source)} into three consecutive blocks of {', '.join(map(str, widths))}, "
            f"but the checkpoint{f' key {key}' if key else ''} stores it {layout}"
        )
        yield warning(analysis, node, self.code, message)


def _into_attention(analysis, node) -> bool:
    return any(reaches_attention(analysis, out.id) for out in node.outs)


def _param_keys(analysis) -> dict[str, str]:
    """Checkpoint key -> the one param it fills (keys cut into several params are left out)."""
    section = analysis.pipeline.checkpoint
    if section is None:
        return {}
    return {key: target for key, target in section.params.items() if isinstance(target, str)}


@register
class GateUpSwap(Lint):
    """**What.** A gated MLP (`down(act(gate(x)) * up(x))`: SwiGLU, GeGLU) whose activated branch is
    the projection its checkpoint calls `up`: the param filled from `mlp.up_proj.weight` goes
    through the activation and the one from `mlp.gate_proj.weight` does not; or, for a fused
    `gate_up_proj`, the second half activated where transformers activates the first
    (`gate, up = gate_up.chunk(2, dim=-1)`).

    **Why it matters.** Both projections have the same shape, so the file runs and a random init
    cannot tell; with the checkpoint's weights the MLP computes `act(up) * gate`, a different
    function.

    **Fix.** Apply the activation to the gate: swap the two params in the steps (or in
    `checkpoint: params:`), or take the first piece of a fused `gate_up_proj` as the gate.
    """

    code, example, origin = "gate-up-swap", "gate_up_swap", "gated MLPs with checkpoints (Llama, Gemma, Phi-3)"

    def check(self, analysis):
        keys = {target: key for key, target in _param_keys(analysis).items()}
        if not keys:
            return
        for node in analysis.nodes.values():
            if len(node.inputs) != 2 or not node.step.elementwise or node.step.passes_scores or not node.outs:
                continue
            branches = [_branch(analysis, tensor) for tensor in node.inputs]
            if None in branches or sorted(b[0] for b in branches) != [False, True]:
                continue
            activated, plain = sorted(branches, key=lambda b: not b[0])
            message = _swapped(keys, activated, plain)
            if message is not None:
                yield warning(analysis, activated[3], self.code, message)


def _branch(analysis, tensor: str):
    """(activated, the projection, the piece of a split projection or None, the activation or the
    projection) for a product's operand that is a projection, perhaps cut and activated; else None."""
    node, activation = analysis.producer(tensor), None
    if node is not None and len(node.inputs) == 1 and node.step.elementwise and not node.step.keeps_values and node.outs:
        activation, node = node, analysis.producer(node.inputs[0])
        tensor = activation.inputs[0]
    piece = None
    if node is not None and node.step.splitting() is not None:
        names = node.step.output_ids()
        piece = names.index(tensor) if tensor in names else None
        node = analysis.producer(node.inputs[0])
    if node is None or node.step.projection() is None:
        return None
    return activation is not None, node, piece, activation or node


def _swapped(keys: dict[str, str], activated, plain) -> str | None:
    gate_key, up_key = keys.get(activated[1].step.projection().weight), keys.get(plain[1].step.projection().weight)
    if activated[1] is plain[1]:  # one fused projection, cut in two
        if gate_key is None or "gate_up" not in gate_key or (activated[2], plain[2]) != (1, 0):
            return None
        return (
            f"'{activated[3].id}' activates the second half of the fused '{activated[1].id}' ({gate_key}), but transformers' "
            f"gate is its first half (gate, up = gate_up_proj(x).chunk(2, dim=-1)) — activate the first piece"
        )
    if gate_key is None or up_key is None or not (_says(gate_key, "up") and _says(up_key, "gate")):
        return None
    return (
        f"'{activated[3].id}' activates '{activated[1].id}', whose weight the checkpoint fills from {gate_key}, and "
        f"multiplies by '{plain[1].id}', filled from {up_key}: the gate goes through the activation, not up — swap the two"
    )


def _says(key: str, part: str) -> bool:
    """Whether a checkpoint key names the gate (``gate_proj``, ``w_gate``) or up (``up_proj``) projection."""
    words = key.replace(".", "_").split("_")
    return part in words and not ({"gate", "up"} - {part}) & set(words)
