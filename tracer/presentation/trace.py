"""What a run leaves behind, as users meet it: the records in run order, lookups, totals, JSON,
the table, the diagram and the notebook view."""

from __future__ import annotations

import functools
import json
import math
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from ..analysis.expect import Layout
from ..analysis.memory import memory_of
from ..core.formatting import human_bytes
from ..runtime.records import TensorRecord
from . import diagram as diagrams
from . import outputs
from .graphviz import DOT_TIMEOUT
from .notebook import trace_html
from .ranks import rank_dict
from .table import format_table


class Trace:
    """The records of one run, in execution order; ``trace["scores"]`` looks one up."""

    def __init__(
        self,
        pipeline: Any,
        analysis: Any,
        records: list[TensorRecord],
        outputs: dict,
        seed: int | None,
        keep_values: bool | frozenset[str],  # True: every tensor's values; a set: only those records
        as_predicted: bool = True,
    ):
        self.pipeline, self.analysis = pipeline, analysis
        self.as_predicted = as_predicted  # every record matched the static analysis exactly
        self.records = records
        self.outputs = outputs
        self.seed = seed
        self.keep_values = keep_values
        self.value_rows: dict = {}  # record id -> runtime.watch.Rows, when run with check_values
        self.value_warnings: tuple = ()  # what those rows say: NaN from a mask, where NaN or inf began

    @functools.cached_property
    def _by_id(self) -> dict[str, TensorRecord]:  # built on first lookup: a run whose records nobody asks for skips it
        return {r.id: r for r in self.records}

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
        """Elements of the pipeline's params, buffers aside (torchinfo's "Total params")."""
        return sum(math.prod(r.shape) for r in self._weights())

    @property
    def param_bytes(self) -> int:
        return sum(r.nbytes for r in self._weights())

    def _weights(self) -> list[TensorRecord]:
        """The param records but those declared ``buffer: true`` (a module's mask or table, not trained)."""
        declared = self.analysis.declared
        return [r for r in self.records if r.op == "param" and not (r.id in declared and declared[r.id].decl.buffer)]

    def __getitem__(self, tensor_id: str) -> TensorRecord:
        record = self._by_id.get(tensor_id) or self._by_id.get(self.analysis.record_of(tensor_id))
        if record is None:
            raise KeyError(f"no tensor '{tensor_id}' in this trace (tensors: {', '.join(self._by_id)})")
        return record

    def layout(self, tensor_id: str) -> Layout:
        """What ``expect:`` and ``tracer.testing`` hold a recorded tensor against."""
        record = self[tensor_id]
        return Layout(f"{record.symbolic} {list(record.shape)}", record.shape, record.stride)

    def __contains__(self, tensor_id: str) -> bool:
        return tensor_id in self._by_id or self.analysis.record_of(tensor_id) in self._by_id

    def __iter__(self) -> Iterator[TensorRecord]:
        return iter(self.records)

    def __len__(self) -> int:
        return len(self.records)

    def to_dict(self, values: bool = False, rank: int = 0) -> dict:
        """The run as JSON data; a ``parallel:`` pipeline's also holds ``rank``'s view (``rank``)."""
        found = {
            "pipeline": self.name,
            "dims": self.dims,
            "seed": self.seed,
            "totals": {
                "params": self.param_count,
                "param_bytes": self.param_bytes,
                "flops": self.total_flops,
                "peak_bytes": self.peak_bytes,
            },
            "tensors": [self._tensor_dict(r, values) for r in self.records],
            "checks": [d.as_dict() for d in self.checks],
        }
        shown = rank_dict(self.analysis, rank)
        if shown is not None:
            found["rank"] = shown
        return found

    @property
    def checks(self) -> tuple:
        """Every finding: the static ones, then what the run's values showed."""
        return tuple(self.analysis.diagnostics) + self.value_warnings

    def _tensor_dict(self, record, values: bool) -> dict:
        """A record, with what each axis means (tracer.analysis.roles; null where the dims do not say),
        which tokens each positions axis holds (tracer.analysis.positions) and, when the run checked values, its rows holding NaN or inf or hiding every key."""
        found = {**record.to_dict(values), "axis_roles": list(self.analysis.axis_roles(record.id))}
        found["positions"] = [None if p is None else str(p) for p in self.analysis.token_positions(record.id)]
        if record.id in self.value_rows:
            found["rows"] = self.value_rows[record.id].as_dict()
        return found

    def to_json(self, values: bool = False, indent: int | None = 2, rank: int = 0) -> str:
        return json.dumps(self.to_dict(values, rank), indent=indent, allow_nan=False)

    def __str__(self) -> str:
        return format_table(self)

    def table(self, width: int | None = None, depth: int | None = None, expand: bool = False, collapse: Iterable[str] = ()) -> str:
        """The run as text; ``expand`` lists every copy of a repeated block, ``depth`` shows each
        group that many levels deep as one row (1: every top-level group), ``collapse`` shows each group it names as one row (as
        ``render --collapse``), ``width`` fits a terminal of that many columns."""
        return format_table(self, width, depth, expand, tuple(collapse))

    def __repr__(self) -> str:
        return f"<Trace {self.name!r}: {len(self.records)} tensors, dims {self.dims}>"

    def _repr_html_(self) -> str:
        """Jupyter's view: a header with the totals, the table and the diagram (repeated blocks
        folded, under a size cap); without a renderer, one line says how to get diagrams."""
        return trace_html(self)

    def save(
        self,
        path: str | Path,
        *,
        collapse: Iterable[str] = (),
        expand: bool = False,
        values: bool = False,
        timeout: float = DOT_TIMEOUT,
        rankdir: str = "TB",
        legend: bool = True,
        tokens: str | Iterable[str] = (),
    ) -> Path:
        """Write the run to ``path`` in the format its suffix names (``tracer.presentation.outputs``:
        .svg .png .pdf .dot the diagram, .html the report, .json the records, .txt the table;
        no suffix: SVG), atomically; returns the path. A diagram flows ``rankdir`` ('LR': left
        to right) and has a legend unless ``legend=False``. A report labels its attention heatmaps
        with ``tokens``, one word per position ("The cat sat" or a list)."""
        words = tuple(tokens.split() if isinstance(tokens, str) else tokens)
        path, fmt = outputs.by_suffix(path, tuple(outputs.WRITERS), default="svg")
        options = outputs.Options(
            collapse=tuple(collapse),
            expand=expand,
            timeout=timeout,
            values=values,
            peak=self.peak_line(),
            rankdir=rankdir,
            legend=legend,
            tokens=words,
        )
        return outputs.write(self, path, fmt, options)

    def peak_line(self) -> str:
        """``estimated peak: 2.0 KiB (while 'scores' runs)``: the table's last line."""
        memory = memory_of(self.analysis, self.keep_values)  # a kept tensor is never freed
        where = f" (while '{memory.peak_step}' runs)" if memory.peak_step else ""
        note = "; this meta run allocated none of it" if self.records and self.records[0].device == "meta" else ""
        return f"estimated peak: {human_bytes(memory.peak_bytes)}{where}{note}"

    def diagram(
        self,
        collapse: list[str] | tuple[str, ...] = (),
        expand: bool = False,
        rankdir: str = "TB",
        legend: bool = True,
        rank: int | None = None,
    ):
        """The dataflow as a ``graphviz.Digraph`` (displays inline in Jupyter); ``expand`` draws
        every copy of a repeated block instead of the first and one "×N" node; ``rankdir="LR"``
        flows left to right, ``legend=False`` leaves the legend out (for slides)."""
        return diagrams.diagram(self, collapse=tuple(collapse), expand=expand, rankdir=rankdir, legend=legend, rank=rank)
