"""``tracer.to_module(pipeline)``: the pipeline as an in-memory ``nn.Module`` that trains.

The module runs the interpreter's plan with autograd on: its params are ``nn.Parameter``s
(registered so that ``state_dict()`` keys are the param ids with ``/`` written as ``.``, as an
exported module's are), dropout follows ``train()``/``eval()`` whatever the steps say, and with
``keep_trace=True`` the records of the latest forward (values included) are ``module.last_trace``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from .api import Pipeline, load
from .core.dtypes import FLOAT_DTYPES
from .core.errors import TracerError
from .presentation.trace import Trace
from .runtime.interpreter import Plan
from .runtime.tensors import create_tensors, match


class PipelineModule(nn.Module):
    """A pipeline with its params as ``nn.Parameter``s; ``forward`` takes the inputs in declaration order."""

    def __init__(self, pipeline, dims: Mapping[str, int] | None = None, seed: int | None = None, keep_trace: bool = False):
        super().__init__()
        self.pipeline, self.keep_trace = pipeline, keep_trace
        self.analysis = pipeline.check(dims)
        self.analysis.raise_errors()
        self.seed = pipeline.spec.seed if seed is None else seed
        self.last_trace: Trace | None = None
        self._plans: dict[tuple, Plan] = {}
        self._places: dict[str, tuple[nn.Module, str]] = {}
        created = create_tensors(self.analysis, "cpu", self.seed)
        for name, decl in self.analysis.pipeline.params.items():
            self._register(name, created[name], buffer=decl.buffer)

    def _register(self, name: str, tensor, buffer: bool) -> None:
        """``layers/3/W_q`` as ``self.layers[3].W_q``: containers for each part, a param (or, not
        floating-point or declared ``buffer: true``, a buffer) at the end."""
        parts = re.split(r"[/.]", name)
        owner = self
        try:
            for part in parts[:-1]:
                if part not in owner._modules:
                    owner.add_module(part, nn.Module())
                owner = owner._modules[part]
            if not buffer and tensor.dtype in tuple(getattr(torch, d) for d in FLOAT_DTYPES):
                owner.register_parameter(parts[-1], nn.Parameter(tensor))
            else:
                owner.register_buffer(parts[-1], tensor)
        except (KeyError, TypeError) as exc:  # a name nn.Module has already (train, forward) or an empty part
            raise TracerError(
                self.analysis.source.error(
                    ("params", name), "module-name", f"param '{name}' cannot be a module attribute: {exc}", prefer_key=True
                )
            ) from None
        self._places[name] = (owner, parts[-1])

    def forward(self, *inputs):
        """The pipeline's outputs (a tuple when there are several) for these inputs."""
        names = list(self.analysis.pipeline.inputs)
        if len(inputs) != len(names):
            raise TypeError(f"{self.pipeline.name} takes {len(names)} inputs ({', '.join(names)}), got {len(inputs)}")
        tensors = dict(match(self.analysis, dict(zip(names, inputs)), "inputs", "forward"))
        tensors.update({name: getattr(owner, attr) for name, (owner, attr) in self._places.items()})
        device = next(iter(tensors.values())).device if tensors else torch.device("cpu")
        key = (self.training, str(device))
        if key not in self._plans:
            self._plans[key] = Plan(self.analysis, str(device), training=self.training)
        records, outputs, as_predicted = self._plans[key].run(tensors, keep_values=self.keep_trace, grad=True)
        if self.keep_trace:
            self.last_trace = Trace(self.pipeline, self.analysis, records, outputs, self.seed, True, as_predicted=as_predicted)
        results = tuple(outputs[name] for name in self.analysis.outputs)
        return results[0] if len(results) == 1 else results

    def extra_repr(self) -> str:
        return f"pipeline={self.pipeline.name!r}, dims={dict(self.analysis.dims)}"


def to_module(pipeline: Any, dims: Mapping[str, int] | None = None, seed: int | None = None, keep_trace: bool = False) -> PipelineModule:
    """``pipeline`` (a path or a ``tracer.Pipeline``) as a trainable ``nn.Module``; params created
    as a run creates them (same seed, same tensors)."""
    if not isinstance(pipeline, Pipeline):
        pipeline = load(pipeline)
    return PipelineModule(pipeline, dims, seed, keep_trace)
