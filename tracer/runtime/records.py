"""One immutable record per tensor of a run: its metadata, and the tensor only when values were kept."""

from __future__ import annotations

import html
import math
from dataclasses import dataclass, field
from typing import Any

from ..core.formatting import human_bytes, human_count

# one scoped style per notebook output: every cell of the tables is styled by class, not attribute by attribute
NOTEBOOK_STYLE = (
    "<style>.tracer { font-family: sans-serif; font-size: 12px }"
    " .tracer td, .tracer th { padding: 1px 8px; text-align: left; white-space: nowrap }"
    " .tracer .note { color: #666 }</style>"
)


@dataclass(frozen=True, slots=True)
class TensorRecord:
    """Metadata of one tensor of a run (the tensor itself only when values were kept)."""

    id: str
    op: str
    inputs: tuple[str, ...]
    shape: tuple[int, ...]
    symbolic_shape: tuple[str, ...]
    dtype: str
    device: str
    stride: tuple[int, ...]
    storage_offset: int
    contiguous: bool
    view_of: str | None
    nbytes: int
    flops: int = 0  # of the step that made it (FlopCounterMode's count; a step's last record carries it)
    tensor: Any = field(default=None, repr=False, compare=False)

    @property
    def symbolic(self) -> str:
        return "(" + ", ".join(self.symbolic_shape) + ")"

    def __repr__(self) -> str:
        layout = "" if self.contiguous else ", non-contiguous"
        storage = f"view of {self.view_of}" if self.view_of else human_bytes(self.nbytes)
        flops = f", {human_count(self.flops)} FLOPs" if self.flops else ""
        shape = "[" + ", ".join(map(str, self.shape)) + "]"
        return f"<TensorRecord {self.id!r}: {self.op} {self.symbolic} {shape} {self.dtype}, stride {tuple(self.stride)}{layout}, {storage}{flops}>"

    def _repr_html_(self) -> str:
        return record_html(self)

    def to_dict(self, values: bool = False) -> dict:
        data = {
            "id": self.id,
            "op": self.op,
            "inputs": list(self.inputs),
            "shape": list(self.shape),
            "symbolic_shape": list(self.symbolic_shape),
            "dtype": self.dtype,
            "device": self.device,
            "stride": list(self.stride),
            "storage_offset": self.storage_offset,
            "contiguous": self.contiguous,
            "view_of": self.view_of,
            "nbytes": self.nbytes,
            "flops": self.flops,
        }
        if values and self.tensor is not None and self.tensor.device.type != "meta":
            # an empty tensor is [] whatever its shape: tolist() of a (2**31, 3, 0) tensor builds 2**33 empty lists
            data["values"] = _finite(self.tensor.detach().cpu().tolist()) if self.tensor.numel() else []
        return data


# A plan builds one record per tensor of every layer (41,000 at 1,000 layers) and a run reuses them.
# A frozen dataclass's __init__ sets each field through object.__setattr__, twice the cost of the
# slots' own setters, called directly here; the record is the same in every other respect.
_new = object.__new__
_set_id, _set_op, _set_inputs, _set_shape = (TensorRecord.__dict__[f].__set__ for f in ("id", "op", "inputs", "shape"))
_set_symbolic_shape, _set_dtype, _set_device, _set_stride = (
    TensorRecord.__dict__[f].__set__ for f in ("symbolic_shape", "dtype", "device", "stride")
)
_set_storage_offset, _set_contiguous, _set_view_of, _set_nbytes, _set_flops, _set_tensor = (
    TensorRecord.__dict__[f].__set__ for f in ("storage_offset", "contiguous", "view_of", "nbytes", "flops", "tensor")
)


def new_record(
    id: str,
    op: str,
    inputs: tuple[str, ...],
    shape: tuple[int, ...],
    symbolic_shape: tuple[str, ...],
    dtype: str,
    device: str,
    stride: tuple[int, ...],
    storage_offset: int,
    contiguous: bool,
    view_of: str | None,
    nbytes: int,
    flops: int = 0,
) -> TensorRecord:
    """``TensorRecord(...)`` without a tensor, in half the time (a plan's templates)."""
    record = _new(TensorRecord)
    _set_id(record, id)
    _set_op(record, op)
    _set_inputs(record, inputs)
    _set_shape(record, shape)
    _set_symbolic_shape(record, symbolic_shape)
    _set_dtype(record, dtype)
    _set_device(record, device)
    _set_stride(record, stride)
    _set_storage_offset(record, storage_offset)
    _set_contiguous(record, contiguous)
    _set_view_of(record, view_of)
    _set_nbytes(record, nbytes)
    _set_flops(record, flops)
    _set_tensor(record, None)
    return record


def _finite(value: Any) -> Any:
    """JSON has no inf/nan: write them as strings so every parser accepts the file."""
    if isinstance(value, list):
        return [_finite(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")
    return value


def record_html(record: TensorRecord) -> str:
    """The record in Jupyter: one small table."""
    layout = "contiguous" if record.contiguous else "non-contiguous"
    rows = [
        ("op", record.op + (f" (from {', '.join(record.inputs)})" if record.inputs else "")),
        ("shape", f"{record.symbolic}  [{', '.join(map(str, record.shape))}]"),
        ("dtype · device", f"{record.dtype} · {record.device}"),
        ("stride · offset", f"{tuple(record.stride)} · {record.storage_offset} · {layout}"),
        ("storage", f"view of {record.view_of}" if record.view_of else f"own, {human_bytes(record.nbytes)}"),
        ("FLOPs", f"{record.flops:,}"),
    ]
    body = "".join(f"<tr><th>{_esc(k)}</th><td>{_esc(v)}</td></tr>" for k, v in rows)
    return f'<div class="tracer record">{NOTEBOOK_STYLE}<b>{_esc(record.id)}</b><table>{body}</table></div>'


def _esc(text: Any) -> str:
    return html.escape(str(text), quote=True)
