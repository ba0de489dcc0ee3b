"""Lints that hold an attention against the model config its `checkpoint:` section declares: the
rope it applies (theta, scaling, style, NoPE layers) and the window it masks."""

from __future__ import annotations

from ..attention import rotations
from ..config import declared
from .registry import Lint, register, warning

# config keys that say a layer uses rope (Llama 4's no_rope_layers: 1 = rope, 0 = NoPE)
ROPE_LAYER_KEYS = ("no_rope_layers",)
# config keys whose theta is the local (sliding-window) rope's: Gemma 3, ModernBERT; it has no scaling
LOCAL_THETA_KEYS = ("rope_local_base_freq", "local_rope_theta")
ROPE_TYPE_KEYS = ("rope_type", "type")
SLIDING, FULL = ("sliding_attention", "local"), ("full_attention", "global")


@register
class ConfigMismatch(Lint):
    """**What.** An attention that does something other than what the model config, as the file's
    `checkpoint:` section declares it, says this layer does:

    - rope on a layer the config marks NoPE (`require: {no_rope_layers.{layer}: 0}`, Llama 4);
    - a rope scaling the config rules out (`require: {rope_parameters.rope_type: default}` with a
      `rope_scaling:`, or another type than the one required), or a scaled rope whose theta is the
      local rope's (`rope_local_base_freq`, `local_rope_theta`: Gemma 3's and ModernBERT's sliding
      layers rotate unscaled);
    - a rope style other than the checkpoint's (`require: {rope_interleave: true}` is DeepSeek's
      interleaved pairs, `style: interleaved`);
    - a query and key rope of one attention whose thetas the config sets for one and not the other;
    - a window mask on a layer the config calls full attention, none on a sliding one
      (`require: {layer_types.{layer}: sliding_attention}`), or a window other than the dim the
      config's `sliding_window` sets.

    **Why it matters.** The file runs either way with its own numbers; loaded with the checkpoint's
    weights it computes another model than the one the config describes, with no error.

    **Fix.** Make the step say what the config says (the message names the key), or bind the
    field from the config in `checkpoint: fields:` so the two cannot drift.
    """

    code, example, origin = "config-mismatch", "config_mismatch", "transformers configs (Llama 4, Gemma 3, DeepSeek-V3)"

    def check(self, analysis):
        config = declared(analysis)
        if analysis.pipeline.checkpoint is None:
            return
        seen: set[str] = set()
        for site in analysis.attention:
            ropes = [n for n in rotations(analysis, site.query) + rotations(analysis, site.keys) if n.id not in seen]
            seen |= {n.id for n in ropes}
            yield from self._rope(analysis, config, ropes)
            yield from self._window(analysis, config, site)

    def _rope(self, analysis, config, ropes):
        uses_rope = next((config.layer_value(key) for key in ROPE_LAYER_KEYS if config.layer_value(key) is not None), None)
        wanted_type = next((v for k, v in config.required.items() if k.rsplit(".", 1)[-1] in ROPE_TYPE_KEYS and "rope" in k), None)
        interleave = next((v for k, v in config.required.items() if k.rsplit(".", 1)[-1] == "rope_interleave"), None)
        bound = {node.id: config.field_key(node.id, "theta") for node in ropes}
        if ropes and uses_rope is not None and not uses_rope:
            named = ", ".join(f"'{n.id}'" for n in ropes)
            message = f"the checkpoint requires {_key(config, ROPE_LAYER_KEYS)} = {uses_rope}: this layer is NoPE, but {named} rotate its queries and keys — drop the rope steps"
            yield self._at(analysis, ropes[0], message, None)
            return
        for node in ropes:
            rotation = node.step.rotation()
            if wanted_type == "default" and rotation.scaling is not None:
                yield self._at(
                    analysis,
                    node,
                    f"the checkpoint requires rope type default (no scaling), but '{node.id}' scales its rope ({rotation.scaling}) — drop rope_scaling",
                    "rope_scaling",
                )
            elif isinstance(wanted_type, str) and wanted_type != "default" and rotation.scaling not in (wanted_type, None):
                yield self._at(
                    analysis,
                    node,
                    f"the checkpoint requires rope type {wanted_type}, but '{node.id}' scales its rope as {rotation.scaling} — use rope_scaling type {wanted_type}",
                    "rope_scaling",
                )
            elif bound[node.id] is not None and bound[node.id].rsplit(".", 1)[-1] in LOCAL_THETA_KEYS and rotation.scaling is not None:
                yield self._at(
                    analysis,
                    node,
                    f"'{node.id}' takes its theta from config.{bound[node.id]}, the local (sliding-window) rope, which transformers never scales, but it has rope_scaling {rotation.scaling} — drop rope_scaling",
                    "rope_scaling",
                )
            if interleave is not None and (rotation.style == "interleaved") != bool(interleave):
                want = "interleaved" if interleave else "half"
                yield self._at(
                    analysis,
                    node,
                    f"the checkpoint requires rope_interleave = {interleave}, so its q and k rotate as style: {want}, but '{node.id}' uses style: {rotation.style} — use style: {want}",
                    "style",
                )
        keys = {key for key in bound.values() if key is not None}
        for node in ropes:
            if keys and bound[node.id] is None and len(keys) == 1:
                key = next(iter(keys))
                other = next(n for n in ropes if bound[n.id] == key)
                message = (
                    f"the checkpoint sets the theta of '{other.id}' from config.{key} but not that of '{node.id}' "
                    f"(θ={node.step.rotation().theta:g}): a checkpoint with another theta rotates q and k differently — "
                    f"add {node.id}.theta to fields: {key}"
                )
                yield self._at(analysis, node, message, "theta")

    def _window(self, analysis, config, site):
        layer = config.layer_value("layer_types")
        windows = [(step, m) for step, m in site.masks if m.window is not None]
        where = analysis.node(site.masks[0][0] if site.masks else site.product)
        if layer in FULL and windows:
            step, _ = windows[0]
            yield self._at(
                analysis,
                analysis.node(step),
                f"the checkpoint requires layer_types = {layer} for this layer, but '{step}' masks a sliding window — drop window:",
                "window",
            )
        elif layer in SLIDING and not windows:
            yield self._at(
                analysis,
                where,
                f"the checkpoint requires layer_types = {layer} for this layer, but the scores of '{site.product}' get no window — add window: (the dim config.sliding_window sets)",
                "window" if site.masks else None,
            )
        bound = config.dim_for(("sliding_window",))
        for step, masking in windows:
            node = analysis.node(step)
            if bound is not None and node.dims.dim(masking.window).value != node.dims.dim(bound[0]).value:
                yield self._at(
                    analysis,
                    node,
                    f"the checkpoint sets {bound[0]} from config.sliding_window, but '{step}' masks a window of {masking.window} — use window: {bound[0]}",
                    "window",
                )

    def _at(self, analysis, node, message: str, field: str | None):
        return warning(analysis, node, self.code, message, field)


def _key(config, keys: tuple[str, ...]) -> str:
    return next(k for k in config.required if k.split(".", 1)[0] in keys)
