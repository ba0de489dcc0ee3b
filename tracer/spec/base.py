"""The base of every step kind, and the registry that turns kinds into the ``op`` union.

A step kind is one class: its pydantic fields, its shape rule (``infer``) and its torch kernel
(``kernel``) side by side. ``@register`` adds it to the format; nothing else needs to change.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any, ClassVar

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, StrictInt, model_validator

from . import dims as dimexpr

STEP_KINDS: dict[str, type[StepBase]] = {}

ID_PATTERN = r"^[A-Za-z_][A-Za-z0-9_.\-]*$"
RECORD_PATTERN = r"^[A-Za-z_][A-Za-z0-9_.\-]*(/[A-Za-z0-9_.\-]+)*$"  # also a block's tensors: layers/3/scores


def _valid_dim(value: int | str) -> int | str:
    try:
        dimexpr.parse(value)
    except dimexpr.DimError as exc:
        raise ValueError(str(exc)) from None
    return value


DimText = Annotated[
    StrictInt | str, AfterValidator(_valid_dim), Field(description="a dim name, an int, or an expression such as 'd_model // H'")
]
TensorId = Annotated[str, Field(pattern=ID_PATTERN, max_length=64)]
RecordId = Annotated[str, Field(pattern=RECORD_PATTERN, max_length=200)]


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class StepBase(Strict):
    """Fields every step has."""

    # a step kind is only ever validated inside PipelineSpec: skip building a validator per kind
    model_config = ConfigDict(defer_build=True)

    id: TensorId = Field(description="unique name of the step's output tensor")
    input: TensorId | None = Field(None, description="the one input tensor (default: the previous step)")
    inputs: list[TensorId] | None = Field(None, description="several input tensors, in order")
    group: str | None = Field(None, max_length=80, description="label; diagrams draw a group as a cluster")
    note: str | None = Field(None, max_length=500, description="free text shown under the node in diagrams")

    arity: ClassVar[int | None] = 1  # number of data inputs; None means "one or more"
    param_fields: ClassVar[tuple[str, ...]] = ()  # fields that name extra tensors (weights, masks)
    example: ClassVar[str] = ""
    attention_weights: ClassVar[bool] = False  # output over its last dim is (…, T_q, T_kv) weights: reports draw heatmaps

    @model_validator(mode="after")
    def _one_input_form(self) -> StepBase:
        if self.input is not None and self.inputs is not None:
            raise ValueError("give either 'input' or 'inputs', not both")
        return self

    def data_inputs(self, previous: str | None) -> list[str]:
        if self.inputs is not None:
            return list(self.inputs)
        if self.input is not None:
            return [self.input]
        return [previous] if previous is not None else []

    def param_refs(self) -> list[str]:
        return [getattr(self, f) for f in self.param_fields if getattr(self, f) is not None]

    def args(self) -> list[str]:
        """Key arguments for diagrams and tables, e.g. ``['dim=-1']``."""
        return []

    def infer(self, ins: list, ctx: Any) -> Any:  # pragma: no cover - every kind overrides
        raise NotImplementedError

    def kernel(self, ctx: Any) -> Callable:  # pragma: no cover - every kind overrides
        raise NotImplementedError


def register(cls: type[StepBase]) -> type[StepBase]:
    op = cls.model_fields["op"].default
    STEP_KINDS[op] = cls
    return cls
