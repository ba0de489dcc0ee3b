"""Field types shared by the pipeline format and the step kinds: ids, dim expressions, strictness.

The step contract itself (``StepBase``, traits, ``@register``) is :mod:`tracer.steps.contract`.
"""

from __future__ import annotations

import math
from typing import Annotated

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, StrictInt

from . import dimexpr as dimexpr

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


#: the one dtype table: every dtype the format knows, and its bytes per element
DTYPE_BYTES = {"float32": 4, "float64": 8, "float16": 2, "bfloat16": 2, "int64": 8, "int32": 4, "bool": 1}
FLOAT_DTYPES = ("float32", "float64", "float16", "bfloat16")
#: the largest finite value of each dtype but bool (torch.finfo / torch.iinfo)
DTYPE_MAX = {
    "float32": 3.4028234663852886e38,
    "float64": 1.7976931348623157e308,
    "float16": 65504.0,
    "bfloat16": 3.3895313892515355e38,
    "int64": 2**63 - 1,
    "int32": 2**31 - 1,
}


def fits(value: float | int, dtype: str) -> bool:
    """Whether torch writes ``value`` into a ``dtype`` tensor (masked_fill, full) rather than
    refusing it as an overflow; ±inf and nan are values of every floating dtype."""
    if dtype == "bool":
        return True
    top = DTYPE_MAX[dtype]
    if dtype in FLOAT_DTYPES:
        return not math.isfinite(value) or abs(value) <= top
    return math.isfinite(value) and -top - 1 <= value <= top


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
