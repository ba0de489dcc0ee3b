"""Field types shared by the pipeline format and the step kinds: ids, dim expressions, strictness.

The step contract itself (``StepBase``, traits, ``@register``) is :mod:`tracer.steps.contract`.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, StrictInt

from . import dimexpr

ID_PATTERN = r"^[A-Za-z_][A-Za-z0-9_.\-]*$"
RECORD_PATTERN = r"^[A-Za-z_][A-Za-z0-9_.\-]*(/[A-Za-z0-9_.\-]+)*$"  # also a block's tensors: layers/3/scores
# a param a checkpoint key fills: a block copy's too (h.0.W_q or h/0/W_q), {layer} for every copy
PARAM_PATTERN = r"^([A-Za-z_]|\{layer\})([A-Za-z0-9_.\-]|\{layer\})*(/([A-Za-z0-9_.\-]|\{layer\})+)*$"


def _valid_dim(value: int | str) -> int | str:
    try:
        dimexpr.parse(value)
    except dimexpr.DimError as exc:
        raise ValueError(str(exc)) from None
    return value


DimText = Annotated[
    StrictInt | str, AfterValidator(_valid_dim), Field(description="a dim name, an int, or an expression such as 'd_model // H'")
]
TensorId = Annotated[str, Field(pattern=ID_PATTERN, max_length=128)]  # a state_dict key as it is: T5's reach 69 characters
RecordId = Annotated[str, Field(pattern=RECORD_PATTERN, max_length=200)]
ParamRef = Annotated[str, Field(pattern=PARAM_PATTERN, max_length=200)]


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
