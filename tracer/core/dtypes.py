"""The dtypes the format knows: bytes per element, the floating ones, the largest values, and
torch's type promotion (``torch.result_type``), as plain data."""

from __future__ import annotations

import math

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


_CATEGORY = {"bool": 0, "int32": 1, "int64": 1, "float16": 2, "bfloat16": 2, "float32": 2, "float64": 2}
_WIDTH = {"bool": 0, "int32": 1, "int64": 2, "float16": 1, "bfloat16": 1, "float32": 2, "float64": 3}


def _promote_pair(a: str, b: str) -> str:
    if a == b:
        return a
    if _CATEGORY[a] != _CATEGORY[b]:
        return a if _CATEGORY[a] > _CATEGORY[b] else b
    if {a, b} == {"float16", "bfloat16"}:
        return "float32"
    return a if _WIDTH[a] > _WIDTH[b] else b


def promote(metas: list) -> str:
    """``torch.result_type`` of tensors: dimensioned operands decide, unless a 0-d one is of a higher
    category (bool < integer < floating), as torch's type promotion says."""
    tiers = []
    for zero_dim in (False, True):
        dtypes = [m.dtype for m in metas if (len(m.shape) == 0) == zero_dim]
        if dtypes:
            result = dtypes[0]
            for d in dtypes[1:]:
                result = _promote_pair(result, d)
            tiers.append(result)
    if len(tiers) == 2 and _CATEGORY[tiers[1]] > _CATEGORY[tiers[0]]:
        return tiers[1]
    return tiers[0]


def promote_number(dtype: str, number: int | float) -> str:
    """``torch.result_type(tensor, number)``: a Python number only decides when it is of a higher
    category than the tensor (a float over an integer tensor: torch's default float32)."""
    if isinstance(number, float) and dtype not in FLOAT_DTYPES:
        return "float32"
    return "int64" if dtype == "bool" else dtype
