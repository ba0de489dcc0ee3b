"""Modules captured whole: transformers' sparse mixture of experts (``MixtralExperts`` and the
experts of the models that copy it) is one call in the captured graph, which the rules write as a
``moe`` step.

Its forward loops over the experts the tokens chose (``for expert_idx in expert_hit``), a branch on
the data that ``torch.export`` cannot capture, or, in transformers' grouped implementation,
sorts and bins the tokens (``sort``, ``histc``, indexing), which is ``moe`` spelled in ops tracer
has no step for. During the capture the experts' ``forward`` calls the operator
``tracer::experts`` instead, with the tokens, the routing weights, the chosen experts and the two
stacked weights: torch.export records that one call (its shape is the tokens'), and running the
graph on the example runs the module's own forward (so the values are the module's).
"""

from __future__ import annotations

import contextlib
import weakref

import torch

# id of a captured experts module -> the module, while an import holds it (the operator's kernel runs it)
_CAPTURED: weakref.WeakValueDictionary[int, torch.nn.Module] = weakref.WeakValueDictionary()
# the activation of transformers' ACT2FN by class name -> the moe step's activation
ACTIVATIONS = {"SiLUActivation": "silu", "SiLU": "silu", "GELUActivation": "gelu", "GELU": "gelu"}


@torch.library.custom_op("tracer::experts", mutates_args=())
def experts(
    hidden_states: torch.Tensor,
    top_k_index: torch.Tensor,
    top_k_weights: torch.Tensor,
    gate_up: torch.Tensor,
    down: torch.Tensor,
    module: int,
) -> torch.Tensor:
    """The experts module ``module`` (an id in ``_CAPTURED``) run on the tokens, as its own forward runs them."""
    owner = _CAPTURED[module]
    return type(owner).forward(owner, hidden_states, top_k_index, top_k_weights).clone()


@experts.register_fake
def _(hidden_states, top_k_index, top_k_weights, gate_up, down, module):
    return torch.empty_like(hidden_states)


def is_experts(module: torch.nn.Module) -> bool:
    """transformers' stacked experts: ``gate_up_proj`` (E, 2F, d), ``down_proj`` (E, d, F), no biases, an ``act_fn``."""
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
    def forward(hidden_states, top_k_index, top_k_weights):
        return torch.ops.tracer.experts(hidden_states, top_k_index, top_k_weights, owner.gate_up_proj, owner.down_proj, id(owner))

    return forward


def captured(module_id: int) -> torch.nn.Module | None:
    """The experts module a ``tracer::experts`` call of this import runs."""
    return _CAPTURED.get(module_id)
