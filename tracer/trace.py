"""What a run leaves behind: one immutable record per tensor, queries, a table and JSON."""

from __future__ import annotations

import json
import math
import textwrap
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from .folding import repeat_folds
from .formatting import human_bytes, human_count


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
        self.renderer: Any = None  # the tracer.render module, attached by the API

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

    def _repr_html_(self) -> str:  # notebooks show the diagram, drawn with the renderer's time limit
        return self._renderer().svg_text(self)

    def diagram(self, collapse: list[str] | tuple[str, ...] = ()):
        """The dataflow as a ``graphviz.Digraph`` (displays inline in Jupyter)."""
        return self._renderer().diagram(self, collapse=tuple(collapse))

    def _renderer(self):
        # drawing is tracer.render's job; a trace made by Pipeline.run carries that module as
        # ``renderer``, so this layer never imports the one above it
        if self.renderer is None:
            raise TypeError("this trace has no renderer attached; call tracer.render.diagram(trace)")
        return self.renderer


ACTIVATIONS = ("tensor", "op", "shape", "concrete", "stride", "contig", "view_of", "size", "FLOPs")
PARAMETERS = ("parameter", "shape", "concrete", "dtype", "count", "size")
# when a table is wider than the terminal, these columns give way first (their text elided in the middle)
_SHRINK = (("view_of", 7), ("tensor", 14), ("parameter", 14), ("shape", 24), ("op", 8), ("tensor", 12), ("shape", 18))


@dataclass
class _Folded:
    """Several records shown as one row: the copies of a repeated block, or a group below ``depth``."""

    label: str
    what: str
    records: list[TensorRecord]


def format_table(trace: Trace, width: int | None = None, depth: int | None = None, expand: bool = False) -> str:
    """The run as text: the tensors, the parameters in their own section, totals.

    Copies 1..N-1 of a repeated block are one "×N" row unless ``expand``; with ``depth``, a group
    nested deeper than that many levels is one row; ``width`` elides long ids to fit a terminal.
    """
    tensors, params = _grouped(trace, depth, expand)
    title = f"{trace.name}  dims: " + ", ".join(f"{k}={v}" for k, v in trace.dims.items())
    lines = textwrap.wrap(title, width, subsequent_indent="  ") if width else [title]
    lines += _columns([ACTIVATIONS] + [_tensor_row(item) for item in tensors], width)
    if params:
        lines += ["", "parameters"] + _columns([PARAMETERS] + [_param_row(item) for item in params], width)
    lines += ["", totals_line(trace)]
    return "\n".join(lines)


def totals_line(trace: Trace) -> str:
    count, size = trace.param_count, trace.param_bytes
    flops = trace.total_flops
    return (
        f"total: {count:,} parameter{'s' if count != 1 else ''} ({human_bytes(size)}) · "
        f"{human_count(flops)} FLOPs{f' ({flops:,})' if flops >= 1000 else ''} · {len(trace.records):,} tensors"
    )


def _grouped(trace: Trace, depth: int | None, expand: bool) -> tuple[list, list]:
    """Records in order, split into tensors and parameters, folds replacing what they hide."""
    analysis = trace.analysis
    folds = {} if expand else repeat_folds(analysis)
    group_of = _groups(analysis) if depth is not None else {}
    tensors, params, shown = [], [], {}
    for record in trace.records:
        fold = folds.get(record.id)
        group = group_of.get(record.id)
        key = label = None
        if group is not None and group.count("/") + 1 > depth:  # a group row holds every copy inside it
            key = label = "/".join(group.split("/")[:depth])
            what = "group"
        elif fold is not None:
            key, label, what = fold.key, fold.key, f"×{len(fold.hidden)}"
        target = params if record.op == "param" else tensors
        if key is None:
            target.append(record)
        elif (key, record.op == "param") in shown:
            shown[key, record.op == "param"].records.append(record)
        else:
            shown[key, record.op == "param"] = folded = _Folded(label, what, [record])
            target.append(folded)
    return tensors, params


def _groups(analysis: Any) -> dict[str, str]:
    """Record id -> the group of the step that made it (inner records included)."""
    groups = {}
    for step_id in analysis.graph.order:
        group = analysis.step(step_id).group
        if group:
            for rid, _ in analysis.inner.get(step_id) or [(step_id, None)]:
                groups[rid] = group
    return groups


def _tensor_row(item: TensorRecord | _Folded) -> tuple[str, ...]:
    if isinstance(item, _Folded):
        last = item.records[-1]
        size, flops = sum(r.nbytes for r in item.records), sum(r.flops for r in item.records)
        return (item.label, item.what, last.symbolic, _concrete(last), "-", "-", "-", human_bytes(size), _flops_cell(flops))
    r = item
    stride = str(tuple(r.stride)) if len(r.stride) != 1 else f"({r.stride[0]},)"
    contiguous = "yes" if r.contiguous else "NO"
    return (r.id, r.op, r.symbolic, _concrete(r), stride, contiguous, r.view_of or "-", human_bytes(r.nbytes), _flops_cell(r.flops))


def _param_row(item: TensorRecord | _Folded) -> tuple[str, ...]:
    if isinstance(item, _Folded):
        count, size = sum(_numel(r) for r in item.records), sum(r.nbytes for r in item.records)
        return (item.label, item.what, f"{len(item.records)} tensors", "-", f"{count:,}", human_bytes(size))
    return (item.id, item.symbolic, _concrete(item), item.dtype, f"{_numel(item):,}", human_bytes(item.nbytes))


def _numel(record: TensorRecord) -> int:
    return math.prod(record.shape)


def _concrete(record: TensorRecord) -> str:
    return "[" + ", ".join(map(str, record.shape)) + "]"


def _flops_cell(flops: int) -> str:
    return human_count(flops) if flops else "-"


def _columns(rows: list[tuple[str, ...]], width: int | None) -> list[str]:
    header = rows[0]
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    gap = 2
    if width is not None and sum(widths) + gap * (len(widths) - 1) > width:
        gap = 1
        _fit(widths, header, width - (len(widths) - 1))
    lines = []
    for n, row in enumerate(rows):
        lines.append((" " * gap).join(_elide(cell, w, name).ljust(w) for cell, w, name in zip(row, widths, header)).rstrip())
        if n == 0:
            lines.append((" " * gap).join("-" * w for w in widths))
    return lines


def _fit(widths: list[int], header: tuple[str, ...], room: int) -> None:
    """Narrow the elidable columns, in order of what a reader can best spare, until they fit ``room``."""
    for name, least in _SHRINK:
        if name in header:
            i = header.index(name)
            widths[i] -= max(0, min(sum(widths) - room, widths[i] - max(least, len(name))))


def _elide(text: str, width: int, column: str) -> str:
    """``text`` in ``width`` characters. A shape shortens its longest dim names; an op keeps its
    start; an id drops leading path segments ('layers/0/attn_weights' -> '…/attn_weights'),
    then its middle ('masked_attention_scores' -> 'masked…_scores')."""
    if len(text) <= width:
        return text
    if column == "shape" and text.startswith("(") and text.endswith(")"):
        return _short_shape(text[1:-1].split(", "), width)
    if column == "op":
        return text[: width - 1] + "…"
    parts = text.split("/")
    while len(parts) > 1 and len("…/" + "/".join(parts)) > width:
        parts.pop(0)
    tail = "…/" + "/".join(parts) if len(parts) < len(text.split("/")) else text
    if len(tail) <= width:
        return tail
    head = width // 2
    return text[:head] + "…" + text[len(text) - (width - 1 - head) :]


def _short_shape(names: list[str], width: int) -> str:
    """A symbolic shape in ``width`` characters: the longest dim names lose their ends first,
    so every dim keeps its place ('(batch…, num_h…, seq_len, head_dim)')."""
    names = list(names)
    while len("(" + ", ".join(names) + ")") > width:
        i = max(range(len(names)), key=lambda j: len(names[j]))
        if len(names[i]) <= 2:
            break
        names[i] = names[i].rstrip("…")[:-1] + "…"
    return ("(" + ", ".join(names) + ")")[:width]
