"""Modules captured whole: a sparse mixture of experts is one call in the captured graph, which the
rules write as a ``moe`` step. Two kinds of module are:

- transformers' ``MixtralExperts`` (and the experts of the models that copy it), found by its
  structure: stacked ``gate_up_proj`` and ``down_proj``, no biases, a SiLU or GELU ``act_fn``;
- a module whose class says ``tracer_step = "moe"``: the ``MoeExperts`` a ``tracer export``ed
  module calls for each moe step (``tracer/steps/routing.py``), given the tokens, the routing
  weights, the chosen experts and the expert weights, its settings (``activation``, ``in_out``,
  ``interleave``, ``gated``, ``alpha``, ``limit``) the step's. The marker is the class's word that
  it is that step, not a guess from its name.

Their forward loops over the experts the tokens chose (``for expert_idx in expert_hit``), a branch
on the data that ``torch.export`` cannot capture, or, in transformers' grouped implementation,
sorts and bins the tokens (``sort``, ``histc``, indexing), which is ``moe`` spelled in ops tracer
has no step for. During the capture the experts' ``forward`` calls the operator
``tracer::experts`` instead, with the tokens, the routing weights, the chosen experts and the
expert weights: torch.export records that one call (its shape is the tokens'), and running the
graph on the example runs the module's own forward (so the values are the module's).
"""

from __future__ import annotations

import contextlib
import weakref
from typing import Optional

import torch

from ..steps.routing import ACTIVATIONS as MOE_ACTIVATIONS

# id of a captured experts module -> the module, while an import holds it (the operator's kernel runs it)
_CAPTURED: weakref.WeakValueDictionary[int, torch.nn.Module] = weakref.WeakValueDictionary()
# the activation of transformers' ACT2FN by class name -> the moe step's activation
ACTIVATIONS = {"SiLUActivation": "silu", "SiLU": "silu", "GELUActivation": "gelu", "GELU": "gelu"}
MARKER = "tracer_step"  # a module class whose attribute of this name is "moe" is a moe step's experts
# a marked module's settings: (attribute, the moe step's field, its default, how the field writes it)
MARKED_SETTINGS = (
    ("in_out", "layout", False, lambda on: "in_out" if on else "out_in"),
    ("interleave", "interleave", False, bool),
    ("gated", "gated", True, bool),
    ("alpha", "alpha", 1.702, float),
    ("limit", "limit", 7.0, float),
)


@torch.library.custom_op("tracer::experts", mutates_args=())
def experts(
    tokens: torch.Tensor,
    weights: torch.Tensor,
    chosen: torch.Tensor,
    gate_up: torch.Tensor,
    down: torch.Tensor,
    gate_up_bias: Optional[torch.Tensor],  # noqa: UP045 - torch.library reads the annotation; it knows Optional
    down_bias: Optional[torch.Tensor],  # noqa: UP045
    module: int,
) -> torch.Tensor:
    """The experts module ``module`` (an id in ``_CAPTURED``) run on the tokens, as its own forward runs them."""
    owner = _CAPTURED[module]
    if is_marked(owner):
        return type(owner).forward(owner, tokens, weights, chosen, gate_up, down, gate_up_bias, down_bias).clone()
    return type(owner).forward(owner, tokens, chosen, weights).clone()  # transformers': (hidden_states, top_k_index, top_k_weights)


@experts.register_fake
def _(tokens, weights, chosen, gate_up, down, gate_up_bias, down_bias, module):
    return torch.empty_like(tokens)


def is_marked(module: torch.nn.Module) -> bool:
    """A module whose class says it is a moe step's experts (``tracer export``'s ``MoeExperts``)."""
    return getattr(type(module), MARKER, None) == "moe"


def is_experts(module: torch.nn.Module) -> bool:
    """A marked module, or transformers' stacked experts: ``gate_up_proj`` (E, 2F, d), ``down_proj``
    (E, d, F), no biases, an ``act_fn``."""
    if is_marked(module):
        return True
    gate_up, down = getattr(module, "gate_up_proj", None), getattr(module, "down_proj", None)
    return (
        isinstance(gate_up, torch.nn.Parameter)
        and isinstance(down, torch.nn.Parameter)
        and gate_up.ndim == down.ndim == 3
        and gate_up.shape[0] == down.shape[0]
        and gate_up.shape[1] == 2 * down.shape[2]
        and gate_up.shape[2] == down.shape[1]
        and not any(name.endswith("bias") for name, _ in module.named_parameters(recurse=False))
        and type(getattr(module, "act_fn", None)).__name__ in ACTIVATIONS
    )


def settings(owner: torch.nn.Module) -> dict:
    """The moe step's fields besides its tensors: the activation, and a marked module's other
    settings where they are not the step's defaults. A ValueError says what a marked module holds
    that no moe step can be."""
    if not is_marked(owner):
        return {"activation": ACTIVATIONS[type(owner.act_fn).__name__]}
    activation = getattr(owner, "activation", None)
    if activation not in MOE_ACTIVATIONS:
        raise ValueError(f"its activation {activation!r} is none of the moe step's ({', '.join(MOE_ACTIVATIONS)})")
    fields = {"activation": activation}
    for attribute, name, default, written in MARKED_SETTINGS:
        value = getattr(owner, attribute, default)
        if isinstance(value, bool) != isinstance(default, bool) or not isinstance(value, int | float):
            raise ValueError(f"its {attribute} is {value!r}, not a {type(default).__name__}")
        if value != default:
            fields[name] = written(value)
    return fields


@contextlib.contextmanager
def experts_whole(module: torch.nn.Module):
    """Each experts module of ``module`` calls ``tracer::experts`` while the capture runs; as it was afterwards."""
    found = [m for m in module.modules() if is_experts(m)]
    for owner in found:
        _CAPTURED[id(owner)] = owner
        owner.forward = _calling_the_operator(owner)
    try:
        yield
    finally:
        for owner in found:
            del owner.forward


def _calling_the_operator(owner: torch.nn.Module):
    call = torch.ops.tracer.experts
    if is_marked(owner):

        def marked(x, weights, chosen, gate_up, down, gate_up_bias=None, down_bias=None):
            return call(x, weights, chosen, gate_up, down, gate_up_bias, down_bias, id(owner))

        return marked

    def forward(hidden_states, top_k_index, top_k_weights):
        return call(hidden_states, top_k_weights, top_k_index, owner.gate_up_proj, owner.down_proj, None, None, id(owner))

    return forward


def captured(module_id: int) -> torch.nn.Module | None:
    """The experts module a ``tracer::experts`` call of this import runs."""
    return _CAPTURED.get(module_id)
