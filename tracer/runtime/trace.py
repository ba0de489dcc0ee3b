"""What a run leaves behind: one immutable record per tensor, queries, a table and JSON."""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from ..core.formatting import human_bytes, human_count
from ..presentation.table import format_table


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
        from ..presentation.notebook import record_html

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


def _finite(value: Any) -> Any:
    """JSON has no inf/nan: write them as strings so every parser accepts the file."""
    if isinstance(value, list):
        return [_finite(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")
    return value


class Trace:
    """The records of one run, in execution order; ``trace["scores"]`` looks one up."""

    def __init__(
        self,
        pipeline: Any,
        analysis: Any,
        records: list[TensorRecord],
        outputs: dict,
        seed: int | None,
        keep_values: bool,
        as_predicted: bool = True,
    ):
        self.pipeline, self.analysis = pipeline, analysis
        self.as_predicted = as_predicted  # every record matched the static analysis exactly
        self.records = records
        self.outputs = outputs
        self.seed = seed
        self.keep_values = keep_values
        self._by_id = {r.id: r for r in records}
        self.renderer: Any = None  # the tracer.presentation.diagram module, attached by the API

    @property
    def name(self) -> str:
        return self.analysis.pipeline.name

    @property
    def peak_bytes(self) -> int:
        """Estimated peak memory of a real run at these dims (a meta run allocates none of it)."""
        return self.analysis.peak_bytes

    @property
    def dims(self) -> dict[str, int]:
        return dict(self.analysis.dims)

    @property
    def total_flops(self) -> int:
        """FLOPs of the whole run, as torch's FlopCounterMode counts them (matrix products)."""
        return sum(r.flops for r in self.records)

    @property
    def param_count(self) -> int:
        """Elements of the pipeline's params (torchinfo's "Total params")."""
        return sum(math.prod(r.shape) for r in self.records if r.op == "param")

    @property
    def param_bytes(self) -> int:
        return sum(r.nbytes for r in self.records if r.op == "param")

    def __getitem__(self, tensor_id: str) -> TensorRecord:
        record = self._by_id.get(tensor_id) or self._by_id.get(self.analysis.output_of(tensor_id))
        if record is None:
            raise KeyError(f"no tensor '{tensor_id}' in this trace (tensors: {', '.join(self._by_id)})")
        return record

    def __contains__(self, tensor_id: str) -> bool:
        return tensor_id in self._by_id or self.analysis.output_of(tensor_id) in self._by_id

    def __iter__(self) -> Iterator[TensorRecord]:
        return iter(self.records)

    def __len__(self) -> int:
        return len(self.records)

    def to_dict(self, values: bool = False) -> dict:
        return {
            "pipeline": self.name,
            "dims": self.dims,
            "seed": self.seed,
            "totals": {
                "params": self.param_count,
                "param_bytes": self.param_bytes,
                "flops": self.total_flops,
                "peak_bytes": self.peak_bytes,
            },
            "tensors": [r.to_dict(values) for r in self.records],
        }

    def to_json(self, values: bool = False, indent: int | None = 2) -> str:
        return json.dumps(self.to_dict(values), indent=indent, allow_nan=False)

    def __str__(self) -> str:
        return format_table(self)

    def table(self, width: int | None = None, depth: int | None = None, expand: bool = False) -> str:
        """The run as text; ``expand`` lists every copy of a repeated block, ``depth`` folds groups
        nested deeper than that, ``width`` fits a terminal of that many columns."""
        return format_table(self, width, depth, expand)

    def __repr__(self) -> str:
        return f"<Trace {self.name!r}: {len(self.records)} tensors, dims {self.dims}>"

    def _repr_html_(self) -> str:
        """Jupyter's view: a header with the totals, the table and the diagram (repeated blocks
        folded, under a size cap); without a renderer, one line says how to get diagrams."""
        from ..presentation.notebook import trace_html

        return trace_html(self)

    def diagram(self, collapse: list[str] | tuple[str, ...] = (), expand: bool = False):
        """The dataflow as a ``graphviz.Digraph`` (displays inline in Jupyter); ``expand`` draws
        every copy of a repeated block instead of the first and one "×N" node."""
        return self._renderer().diagram(self, collapse=tuple(collapse), expand=expand)

    def _renderer(self):
        # drawing is tracer.presentation.diagram's job; a trace made by Pipeline.run carries that module as
        # ``renderer``, so this layer never imports the one above it
        if self.renderer is None:
            raise TypeError("this trace has no renderer attached; call tracer.presentation.diagram.diagram(trace)")
        return self.renderer
