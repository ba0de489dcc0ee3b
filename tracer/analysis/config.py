"""What a pipeline declares about the model it stands for, read by the lints that hold a design
against its intent: the ``checkpoint:`` section's config keys (the dims and step fields a
``config.json`` sets, the values it must have) and the dims that are quantities rather than axes.

A dim that no tensor has as an axis and whose name says no axis role (``query_pre_attn_scalar``,
``scale_factor``) is a declared quantity: a scale written in it is the design, not a slip.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..core import dimexpr
from .roles import role_of_name

# config.json keys that set the attention scale, and how: the scale is the dim's value ** -0.5 …
SCALE_DIM_KEYS = ("query_pre_attn_scalar",)
# … or the value itself (Granite's attention_multiplier, MPT's attn_config.softmax_scale)
MULTIPLIER_KEYS = ("attention_multiplier", "softmax_scale")


@dataclass(frozen=True)
class Declared:
    """The checkpoint section, as lookups: dim -> config key, (step, field) -> config key, key -> value."""

    dims: dict[str, str] = field(default_factory=dict)
    fields: dict[tuple[str, str], str] = field(default_factory=dict)
    required: dict[str, object] = field(default_factory=dict)

    def dim_for(self, keys: tuple[str, ...]) -> tuple[str, str] | None:
        """(dim, key) for the first dim bound from a config key ending in one of ``keys``."""
        return next(((dim, key) for dim, key in self.dims.items() if _last(key) in keys), None)

    def field_key(self, step: str, name: str) -> str | None:
        return self.fields.get((step, name))

    def required_of(self, keys: tuple[str, ...]) -> tuple[str, object] | None:
        """(key, value) of the first required config value whose key ends in one of ``keys``."""
        return next(((key, value) for key, value in self.required.items() if _last(key) in keys), None)

    def layer_value(self, key: str) -> object | None:
        """What ``require:`` says ``key.{layer}`` (or ``key``) is for the layer this file computes."""
        for written, value in self.required.items():
            if written in (key, f"{key}.{{layer}}"):
                return value
        return None


def declared(analysis) -> Declared:
    """The pipeline's checkpoint section (empty without one)."""
    section = analysis.pipeline.checkpoint
    if section is None:
        return Declared()
    fields = {}
    for key, refs in section.fields.items():
        for ref in refs:
            step, _, name = ref.rpartition(".")
            fields[(step, name)] = key
    return Declared({dim: key for key, dim in section.dims.items()}, fields, dict(section.require))


def _last(key: str) -> str:
    return key.rsplit(".", 1)[-1]


def axis_names(analysis) -> frozenset[str]:
    """Every dim name some tensor has in an axis (its label, or a name its expression uses)."""
    names = set()
    for meta in analysis.metas.values():
        for dim in meta.shape:
            names |= {dim.label} if dim.label.isidentifier() else _names(dim.label)
    return frozenset(names)


def _names(label: str) -> set[str]:
    try:
        return set(dimexpr.names(dimexpr.parse(label)))
    except dimexpr.DimError:  # a label the algebra wrote that is no dim expression names nothing
        return set()


def is_quantity(name: str, axes: frozenset[str]) -> bool:
    """A dim that is a declared number, not an axis: no tensor has it, and its name says no role."""
    return name not in axes and role_of_name(name) is None
