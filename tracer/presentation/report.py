"""``tracer render FILE -o report.html``: one self-contained HTML file to explore a trace.

The page holds the diagram as inline SVG (drawn by Graphviz, every node and edge a link to
``#ID``), the records as JSON, and its own CSS and JS: nothing is fetched, and a Content
Security Policy forbids fetching anything, so it opens from disk anywhere. With values it adds
per-tensor statistics and per-head attention heatmaps, downsampled to stay small.

Everything user-written (ids, names, notes, groups) reaches the page either escaped by Graphviz
inside the SVG, or inside a ``<script type="application/json">`` block whose text cannot close
the element (``<``, ``>`` and ``&`` are written as JSON ``\\u`` escapes); the page's script
sets it with ``textContent`` only, never as markup.
"""

from __future__ import annotations

import base64
import hashlib
import html
import json
import math
import re
from collections.abc import Iterable
from importlib import resources
from typing import TYPE_CHECKING, Any

from ..analysis import parallel
from ..core.errors import Diagnostic, TracerError, display
from ..core.formatting import human_bytes
from ..runtime.interpreter import KernelContext
from ..runtime.records import TensorRecord
from .diagram import diagram
from .folding import repeat_folds
from .graphviz import render_bytes
from .heatmap import is_attention_weights, leading_maps
from .ranks import communication_line

if TYPE_CHECKING:
    from .trace import Trace

MAX_SIDE = 64  # a heatmap keeps at most 64 x 64 cells: longer sequences are mean-pooled into blocks
MAX_MAPS = 16  # ... and at most 16 (batch, head) maps per tensor, the first ones in row-major order
MAX_CELLS = 1 << 18  # ... and a page at most 262,144 cells in all (one byte each), in run order
RECOMPUTED = "recomputed from q, k, mask, scale: the fused kernel never stores its weights (the run is unchanged)"
DIGITS = 4  # significant digits of the statistics and of each map's largest weight
LEVELS = 254  # a cell is a byte: 0..254 of its map's largest weight, 255 for NaN
_ASSETS = resources.files("tracer.presentation") / "report_assets"
_SLOT = re.compile(r"\{\{(\w+)\}\}")
_SCRIPT_UNSAFE = {ord("<"): "\\u003c", ord(">"): "\\u003e", ord("&"): "\\u0026", 0x2028: "\\u2028", 0x2029: "\\u2029"}


def report_html(trace: Trace, collapse: Iterable[str] = (), tokens: Iterable[str] = ()) -> str:
    """The page; ``tokens`` (one word per position: ``"The cat sat".split()``) label the heatmaps'
    rows and columns, as a ``tokens:`` input's words do."""
    script = _asset("report.js")
    digest = base64.b64encode(hashlib.sha256(script.encode()).digest()).decode()
    slots = {
        "TITLE": html.escape(f"{trace.name} · tracer report"),
        "CSP": f"default-src 'none'; style-src 'unsafe-inline'; img-src data:; script-src 'sha256-{digest}'",
        "CSS": _asset("report.css"),
        "SVG": _svg(trace, collapse),
        "DATA": script_json(report_data(trace, tokens)),
        "SCRIPT": script,
    }
    return _SLOT.sub(lambda m: slots[m[1]], _asset("report.html"))


def script_json(data: Any) -> str:
    """JSON that can sit inside a ``<script>`` element: no ``</script>`` or ``<!--`` can form."""
    return json.dumps(data, separators=(",", ":"), ensure_ascii=False, allow_nan=False).translate(_SCRIPT_UNSAFE)


def _asset(name: str) -> str:
    return (_ASSETS / name).read_text(encoding="utf-8")


def _svg(trace: Trace, collapse: Iterable[str]) -> str:
    # repeated blocks folded as in every diagram: a 192-layer stack draws one layer, and the page's
    # copy selector shows the records of the others
    source = diagram(trace, collapse, links=True).source
    svg = render_bytes(source, "svg", trace.analysis.source.file).decode("utf-8")  # render's time limit and messages
    # inline SVG needs no XML prolog; Graphviz's comments only repeat node names
    return re.sub(r"<!--.*?-->", "", svg[svg.index("<svg") :], flags=re.S)


# ---------------------------------------------------------------- the data the page shows


def report_data(trace: Trace, tokens: Iterable[str] = ()) -> dict:
    return _Data(trace, _checked_tokens(trace, list(tokens))).build()


def _checked_tokens(trace: Trace, tokens: list[str]) -> list[str]:
    """Words that can label the attention weights: as many as their queries or their keys."""
    if not tokens:
        return tokens
    analysis = trace.analysis
    sides = {analysis.meta(site.softmax).sizes[-1] for site in analysis.attention if site.softmax is not None}
    sides |= {analysis.meta(site.softmax).sizes[-2] for site in analysis.attention if site.softmax is not None}
    if sides and len(tokens) not in sides:
        lengths = " or ".join(map(str, sorted(sides)))
        words = f"{len(tokens)} word{'s' if len(tokens) != 1 else ''}"
        message = f"the tokens are {words}; the attention weights have {lengths} positions: give one word per position"
        raise TracerError(Diagnostic(analysis.source.file, None, "tokens", message))
    return tokens


class _Data:
    """What the page shows of each record, with the lookups it needs computed once."""

    def __init__(self, trace: Trace, tokens: list[str] | None = None):
        self.trace, self.analysis = trace, trace.analysis
        self.given_tokens = tokens or None
        self.by_id = {r.id: r for r in trace.records}
        self.users: dict[str, list[str]] = {}
        for record in trace.records:
            for ref in dict.fromkeys(record.inputs):
                self.users.setdefault(ref, []).append(record.id)
        inputs = self.analysis.pipeline.inputs
        self.tokens = {name: decl.tokens.words() for name, decl in inputs.items() if decl.tokens is not None}
        self.cells_left = MAX_CELLS
        self.folds = repeat_folds(self.analysis)
        blocks = {fold.key: fold for fold in self.folds.values()}.values()  # each repeated block once
        self.copy_prefixes = {copy: fold for fold in blocks for copy in fold.hidden}
        self._full: dict[str, dict] = {}
        self.sites = [_site(site) for site in self.analysis.attention]
        self.fused = {site.product for site in self.analysis.attention if site.fused}
        self.roles: dict[str, list[list]] = {}  # record id -> [[site index, its role there]]
        for n, site in enumerate(self.sites):
            for role in ROLES:
                if site[role] is not None:
                    self.roles.setdefault(site[role], []).append([n, role])

    def build(self) -> dict:
        trace = self.trace
        return {
            "name": trace.name,
            "file": display(self.analysis.source.file),  # a file name's undecodable bytes as \xff
            "dims": trace.dims,
            "seed": trace.seed,
            "peak": human_bytes(self.analysis.memory.peak_bytes),
            "values": bool(trace.keep_values),
            "tokens": self.given_tokens,
            "caps": {"side": MAX_SIDE, "maps": MAX_MAPS, "cells": MAX_CELLS},
            "count": len(trace.records),
            "tensors": [self.full(record.id) for record in trace.records if record.id not in self.folds],
            "copies": self.copies(),
            "attention": self.sites,
            "checks": [d.as_dict() for d in trace.checks],
            "groups": self.groups(),
            **self.mesh(),
        }

    def mesh(self) -> dict:
        """A parallel: pipeline's mesh, its ranks and the collectives of one forward (nothing for
        any other pipeline: its page is as it was)."""
        degrees = self.analysis.degrees
        if not degrees:
            return {}
        found = parallel.collectives(self.analysis)
        return {
            "mesh": {
                "degrees": dict(degrees),
                "ranks": parallel.world_size(degrees),
                "collectives": [f"{c.op} over {c.mesh_dim} at {c.step}: {human_bytes(c.bytes_per_rank)} per rank" for c in found],
                "communication": communication_line(self.analysis),
            }
        }

    def full(self, record_id: str) -> dict:
        """A record as the page shows it, made once (a folded copy is compared with copy 0's)."""
        if record_id not in self._full:
            self._full[record_id] = self.tensor(self.by_id[record_id])
        return self._full[record_id]

    def copy_of(self, record_id: str) -> str:
        """The folded copy a record belongs to, the outermost: 'layers/5' for 'layers/5/attn/q'."""
        end = record_id.find("/")
        while record_id[:end] not in self.copy_prefixes:
            end = record_id.find("/", end + 1)
        return record_id[:end]

    def copies(self) -> list[dict]:
        """Each repeated block: the copy drawn, the folded copies, and of each folded record only
        what copy 0's record, its ids moved to that copy, does not already say (the first step
        reads the copy before; with values, the statistics; under "-" the keys it lacks). The
        page rebuilds the rest."""
        found: dict[str, dict] = {}
        for record in self.trace.records:
            fold = self.folds.get(record.id)
            if fold is None:
                continue
            entry = found.setdefault(fold.key, {"shown": fold.shown, "hidden": list(fold.hidden), "changes": {}})
            copy = self.copy_of(record.id)
            # only what may differ is made for a folded record: a 192-layer stack costs about a 48-layer one
            template = moved(self.full(fold.shown + record.id[len(copy) :]), fold.shown, copy)
            actual = {**{k: v for k, v in template.items() if k not in PER_COPY}, **self.per_copy(record, self._node(record.id))}
            changes = {key: value for key, value in actual.items() if template.get(key) != value}
            removed = [key for key in template if key not in actual]
            if removed:
                changes["-"] = removed  # keys copy 0's record has and this one lacks
            if changes:
                entry["changes"][record.id] = changes
        return list(found.values())

    def tensor(self, record: TensorRecord) -> dict:
        node = self._node(record.id)
        return {**self.same_in_every_copy(record, node), **self.per_copy(record, node)}

    def per_copy(self, record: TensorRecord, node: Any) -> dict:
        """What may differ between the copies of a repeated block: the tensors a record reads and
        feeds (the first step reads the copy before), its attention site, its values."""
        data = {
            "id": record.id,
            "inputs": list(record.inputs),
            "users": self.users.get(record.id, []),
            "view_of": record.view_of,
            "group": node.step.group if node is not None else None,
        }
        if record.id in self.roles:
            data["attention"] = self.roles[record.id]
        rows = self.trace.value_rows.get(record.id)
        if rows:
            data["rows"] = str(rows)
        if record.tensor is not None and record.tensor.device.type != "meta":
            data["stats"] = _stats(record.tensor)
            if node is not None and is_attention_weights(node.step, record):
                data["heatmap"] = self.heatmap(record, leading_maps(record.tensor), record.symbolic_shape)
            elif node is not None and record.id == node.value and node.id in self.fused:
                weights = self.recomputed_weights(node)
                if weights is not None and weights.numel():
                    symbolic = self.by_id[node.reads[0]].symbolic_shape[:-1] + self.by_id[node.reads[1]].symbolic_shape[-2:-1]
                    data["heatmap"] = {**self.heatmap(record, leading_maps(weights), symbolic, weights.shape), "recomputed": RECOMPUTED}
        return data

    def recomputed_weights(self, node: Any) -> Any:
        """A fused kernel's weights, recomputed from the tensors it read (the run is not touched);
        None when one of them was not kept."""
        import torch

        args = [self.by_id[rid].tensor for rid in node.reads]
        if any(arg is None for arg in args):
            return None
        context = KernelContext(self.analysis, node, args[0].device, training=False)
        with torch.no_grad():
            return node.step.fused_weights(context)(*args)

    def same_in_every_copy(self, record: TensorRecord, node: Any) -> dict:
        """What every copy of a repeated block shares: the copies are one block file with one set of dims."""
        data = {
            "op": record.op,
            "symbolic": record.symbolic,
            "shape": list(record.shape),
            "dtype": record.dtype,
            "device": record.device,
            "stride": list(record.stride),
            "offset": record.storage_offset,
            "contiguous": record.contiguous,
            "bytes": record.nbytes,
            "size": human_bytes(record.nbytes),
            "where": self.where(record, node),
            "note": self.note(record, node),
            "axes": [role or "" for role in self.analysis.axis_roles(record.id)],
        }
        tokens = [str(p) for p in self.analysis.token_positions(record.id) if p is not None]
        if tokens:
            data["tokens"] = "; ".join(tokens)
        flops = getattr(record, "flops", None)  # when records carry a FLOP count, the panel shows it
        if flops is not None:
            data["flops"] = flops
        return data

    def heatmap(self, record: TensorRecord, maps: Any, symbolic: tuple[str, ...], shape: tuple[int, ...] | None = None) -> dict:
        """Every (batch, head) map of (…, T_q, T_kv) weights (``maps``, of ``record`` or of the
        fused step that made it), mean-pooled to at most MAX_SIDE a side, as long as the page's
        budget of cells lasts."""
        import torch

        shape = tuple(record.shape if shape is None else shape)
        total, (rows, cols) = maps.shape[0], maps.shape[-2:]
        side = (min(rows, MAX_SIDE), min(cols, MAX_SIDE))
        kept = min(total, MAX_MAPS, self.cells_left // (side[0] * side[1]))
        self.cells_left -= kept * side[0] * side[1]
        pooled = torch.nn.functional.adaptive_avg_pool2d(maps[:kept], side) if kept else []
        words = self.labels(record)
        return {
            "lead_dims": list(symbolic[:-2]),
            "lead": [list(_unravel(i, shape[:-2])) for i in range(kept)],
            "total": total,
            "rows": rows,
            "cols": cols,
            "side": list(side),
            "row_labels": words if words and len(words) == rows <= MAX_SIDE else None,
            "col_labels": words if words and len(words) == cols <= MAX_SIDE else None,
            "axes": list(symbolic[-2:]),
            "maps": [_encode_map(m) for m in pooled],
        }

    def _node(self, record_id: str):
        """The node that made a record (a composite's inner records belong to their step), or None."""
        return self.analysis.producer(record_id)

    def where(self, record: TensorRecord, node: Any) -> str:
        """``file:line`` of the YAML that made the tensor (a block's steps point into the block file)."""
        if node is not None:
            path = ("steps", node.index)
        else:
            path = ("inputs" if record.op == "input" else "params", record.id)
        found = self.analysis.source.error(path, "where", "", prefer_key=True)
        return display(found.file if found.position is None else f"{found.file}:{found.position.line}")

    def note(self, record: TensorRecord, node: Any) -> str | None:
        if node is not None:
            return node.step.note
        pipeline = self.analysis.pipeline
        decl = pipeline.inputs.get(record.id) or pipeline.params.get(record.id)
        return getattr(decl, "note", None)

    def groups(self) -> dict[str, list[str]]:
        """Group path -> the records of its steps, so a collapsed node's panel can list them (the
        folded copies of a repeated block draw no group)."""
        groups: dict[str, list[str]] = {}
        for record in self.trace.records:
            if record.id in self.folds:
                continue
            node = self._node(record.id)
            parts = node.step.group.split("/") if node is not None and node.step.group else []
            for n in range(1, len(parts) + 1):
                groups.setdefault("/".join(parts[:n]), []).append(record.id)
        return groups

    def labels(self, record: TensorRecord) -> list[str] | None:
        """The words given to the report, else those of the ``tokens:`` input (tutorial 000's
        sentence) the record derives from, if any."""
        if self.given_tokens:
            return self.given_tokens
        seen, todo = set(), [record.id]
        while todo and self.tokens:
            current = todo.pop()
            if current in self.tokens:
                return self.tokens[current]
            if current not in seen and current in self.by_id:
                seen.add(current)
                todo.extend(self.by_id[current].inputs)
        return None


PER_COPY = ("id", "inputs", "users", "view_of", "group", "attention", "stats", "heatmap")  # _Data.per_copy's keys
MOVED = ("id", "inputs", "users", "view_of", "group")  # the fields of a record that name tensors or groups


def moved(data: dict, old: str, new: str) -> dict:
    """A record's data with the ids under ``old`` ('layers/0') moved under ``new`` ('layers/5');
    report.js's ``moved`` does the same."""

    def move(text):
        if isinstance(text, str) and (text == old or text.startswith(old + "/")):
            return new + text[len(old) :]
        return text

    out = dict(data)
    for key in MOVED:
        if key in out:
            out[key] = [move(t) for t in out[key]] if isinstance(out[key], list) else move(out[key])
    return out


ROLES = ("query", "keys", "values", "scores", "weights", "context")  # a tensor's roles in an attention site


def _site(site) -> dict:
    """One attention computation as the page shows it (``tracer.analysis.attention.Site``)."""
    masks = []
    for step, masking in site.masks:
        pattern = (["causal"] if masking.causal else []) + ([f"window {masking.window}"] if masking.window is not None else [])
        pattern += [f"{masking.tensor} ({masking.polarity or 'added'})"] if masking.tensor else []
        masks.append({"step": step, "pattern": ", ".join(pattern)})
    scale = " · ".join(s.text for s in site.scales) or ("sdpa's default 1/√Dh" if site.fused and site.implicit_scale else "none")
    return {
        "product": site.product,
        "fused": site.fused,
        "query": site.query,
        "keys": site.keys,
        "values": site.values,
        "scores": site.scores,
        "weights": None if site.softmax is None else site.softmax,
        "recomputed": site.context if site.fused else None,  # its record carries the weights recomputed, with values
        "context": site.context,
        "scale": scale,
        "multiplier": _round(site.multiplier),
        "masks": masks,
    }


# ---------------------------------------------------------------- values


def _round(value: float) -> float | None:
    """A JSON number with ``DIGITS`` significant digits; NaN and infinities become null."""
    if not math.isfinite(value):
        return None
    return float(f"{value:.{DIGITS}g}")


def _stats(tensor: Any) -> dict:
    """Counts, and the finite values' min, max, mean and std to ``DIGITS`` digits (summed in
    float64, so the order of the sum does not matter). A mean below the tensor's own rounding
    noise is 0: a LayerNorm's output averages to 0 up to one unit in the last place of its
    values, and which tiny number that noise makes depends on the machine's SIMD width and
    thread count (-2.6e-08 on one, -3.7e-09 on another), not on the pipeline."""
    import torch

    values = tensor.detach().to("cpu", torch.float64).reshape(-1)
    finite = values[values.isfinite()]
    stats = {
        "count": values.numel(),
        "nan": int(values.isnan().sum()),
        "posinf": int((values == math.inf).sum()),
        "neginf": int((values == -math.inf).sum()),
    }
    if finite.numel():
        std = float(finite.std()) if finite.numel() > 1 else 0.0
        mean = float(finite.mean())
        noise = _resolution(tensor.dtype, torch) * float(finite.abs().max())
        mean = 0.0 if abs(mean) <= noise else mean
        stats.update(min=_round(float(finite.min())), max=_round(float(finite.max())), mean=_round(mean), std=_round(std))
    return stats


def _resolution(dtype: Any, torch) -> float:
    """The relative spacing of a dtype's values (its epsilon); 0 for integers, which are exact."""
    return torch.finfo(dtype).eps if dtype.is_floating_point else 0.0


def _encode_map(weights: Any) -> dict:
    """One map as its largest weight and a base64 string of one byte per cell (row-major)."""
    import torch

    finite = weights[weights.isfinite()]
    top = float(finite.max()) if finite.numel() else 0.0
    scaled = (weights / top * LEVELS).clamp(0, LEVELS) if top > 0 else torch.zeros_like(weights)
    levels = torch.where(weights.isnan(), LEVELS + 1, scaled.round()).to(torch.uint8)
    return {"max": _round(top), "cells": base64.b64encode(levels.numpy().tobytes()).decode()}


def _unravel(index: int, shape: tuple[int, ...]) -> tuple[int, ...]:
    out = []
    for size in reversed(shape):
        index, rest = divmod(index, size)
        out.append(rest)
    return tuple(reversed(out))
