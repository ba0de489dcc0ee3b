"""Run hooks that watch tensors as a run produces them (``run(observe=...)``), keeping none alive:
what static checks cannot decide because it depends on the data (a mask known only at run time)."""

from __future__ import annotations

from dataclasses import dataclass

from ..analysis.attention import score_chain
from ..core.dtypes import FLOAT_DTYPES
from ..core.errors import Diagnostic, merge_copies
from ..steps.attention import FLOAT32_MIN
from .interpreter import torch_module


class SoftmaxNaNs:
    """Counts NaN rows in every softmax output as it is produced; ``warnings()`` then gives the
    ``nan-risk-mask`` warnings.

    A row is one softmax distribution (a slice along the softmax dim); one that holds a NaN is
    almost always a query whose every key was masked with -inf.

    >>> p = tracer.load("pipelines/lint_examples/nan_risk_mask.yaml")   # doctest: +SKIP
    >>> nans = SoftmaxNaNs(p.check()); p.run(observe=nans)              # doctest: +SKIP
    >>> [str(d) for d in nans.warnings()]                               # doctest: +SKIP
    ["...: warning[nan-risk-mask]: step 'attention_weights': softmax produced 2 NaN rows of 12 ..."]
    """

    def __init__(self, analysis):
        self.analysis = analysis
        self.softmax = {n.value: n for n in analysis.nodes.values() if n.step.normalises() is not None and n.outs}
        self.rows: dict[str, tuple[int, int]] = {}  # record id -> (NaN rows, rows)

    def __call__(self, record_id: str, tensor) -> None:
        node = self.softmax.get(record_id)
        if node is None or getattr(tensor, "device", None) is None or tensor.device.type == "meta" or tensor.dim() == 0:
            return
        # softmax values lie in [0, 1], so a row sums to NaN exactly when it holds one; summing first
        # keeps the hook ~10x cheaper than isnan() and allocates one number per row, not a bool tensor
        bad = tensor.sum(dim=node.step.normalises()).isnan()
        self.rows[record_id] = (int(bad.sum()), bad.numel())

    def warnings(self) -> list[Diagnostic]:
        found = []
        for record_id, (n_bad, n_rows) in self.rows.items():
            if not n_bad:
                continue
            node = self.softmax[record_id]
            chain, _ = score_chain(self.analysis, node)
            masks = [(n, m) for n in chain if (m := n.step.masking()) is not None]
            cause = ""
            if masks:
                step, masking = masks[0]
                fill = "-inf" if masking.fill == float("-inf") else f"{masking.fill:g}"
                cause = f"; mask step '{step.id}' fills {fill} — use fill: min (what transformers' eager masks add: such rows become uniform) or keep at least one key per query"
            message = (
                f"softmax produced {n_bad} NaN row{'s' if n_bad != 1 else ''} of {n_rows} (rows whose every score was -inf or NaN){cause}"
            )
            found.append(self.analysis.error(node, "nan-risk-mask", message, severity="warning"))
        return merge_copies(found)


def runtime_warnings(trace, tensors: dict | None = None) -> list[Diagnostic]:
    """The ``nan-risk-mask`` warnings of a finished run, from the softmax outputs it still has:
    in ``tensors`` (id -> tensor), in ``trace.outputs``, or in its records when it was run with
    ``keep_values=True``. To see every softmax of any run, pass ``SoftmaxNaNs`` as its hook."""
    nans = SoftmaxNaNs(trace.analysis)
    given = dict(tensors or {})
    for record_id in nans.softmax:
        tensor = given.get(record_id)
        if tensor is None:
            tensor = trace.outputs.get(record_id)
        if tensor is None and record_id in trace:
            tensor = trace[record_id].tensor
        if tensor is not None:
            nans(record_id, tensor)
    return nans.warnings()


@dataclass(frozen=True)
class Rows:
    """What a run found in one tensor's rows: its slices along the last dim (a softmax's own dim)."""

    rows: int
    nan: int = 0  # rows holding a NaN
    inf: int = 0  # rows holding ±inf, not counting the -inf a mask wrote into the scores
    masked: int = 0  # rows of a mask step's output whose every key is hidden

    def __bool__(self) -> bool:
        return bool(self.nan or self.inf or self.masked)

    def as_dict(self) -> dict:
        return {"rows": self.rows, "nan": self.nan, "inf": self.inf, "masked": self.masked}

    def __str__(self) -> str:
        found = [f"{n} {what}" for n, what in ((self.nan, "NaN"), (self.inf, "inf"), (self.masked, "all masked")) if n]
        return f"{', '.join(found)} of {self.rows} rows" if found else f"{self.rows} rows fine"


class ValueRows(SoftmaxNaNs):
    """:class:`SoftmaxNaNs`, and for every floating-point tensor the rows holding NaN or ±inf, and
    for every mask step the rows it hid entirely (a padded query: fine with ``fill: min``, NaN with
    -inf). Two reductions per tensor, one number per row allocated. ``tracer run`` uses it, and
    ``Pipeline.run(check_values=True)``; the trace then has ``value_rows`` and ``value_warnings``.
    """

    def __init__(self, analysis):
        super().__init__(analysis)
        self.masks, self.filled = {}, set()
        for site in analysis.attention:
            masked = [step for step, m in site.masks if m.fill == float("-inf")]
            if site.fused or not masked:
                continue
            first = site.chain.index(masked[0])
            self.filled.update(analysis.node(step).value for step in site.chain[first:])  # -inf there is the mask's
        for node in analysis.nodes.values():
            masking = node.step.masking()
            if masking is not None and node.outs and node.step.fused_attention() is None:
                self.masks[node.value] = masking.fill
                if masking.fill == float("-inf"):
                    self.filled.add(node.value)
        self.found: dict[str, Rows] = {}

    def __call__(self, record_id: str, tensor) -> None:
        super().__call__(record_id, tensor)
        meta = getattr(tensor, "device", None) is None or tensor.device.type == "meta"
        if meta or tensor.dim() == 0 or tensor.numel() == 0 or str(tensor.dtype).removeprefix("torch.") not in FLOAT_DTYPES:
            return
        node = self.softmax.get(record_id)
        dim = node.step.normalises() if node is not None else -1
        high, low = tensor.amax(dim), tensor.amin(dim)  # both propagate NaN
        nan = high.isnan()
        inf = (high == float("inf")) if record_id in self.filled else (high == float("inf")) | (low == float("-inf"))
        masked = 0
        if record_id in self.masks:
            fill = self.masks[record_id]
            fill = torch_module().finfo(tensor.dtype).min if fill == FLOAT32_MIN else fill  # fill: min is the scores' dtype's
            masked = int((high <= fill).sum())
        self.found[record_id] = Rows(nan.numel(), int(nan.sum()), int((inf & ~nan).sum()), masked)

    def warnings(self) -> list[Diagnostic]:
        """The softmax warnings, and where NaN or inf first appears when it is not a softmax's."""
        found = super().warnings()
        first = next(((rid, rows) for rid, rows in self.found.items() if rows.nan or rows.inf), None)
        if first is None or (first[0] in self.rows and self.rows[first[0]][0]):
            return found
        record_id, rows = first
        node = self.analysis.producer(record_id)
        what = "NaN" if rows.nan else "inf"
        message = (
            f"'{record_id}' is the first tensor of this run to hold {what} ({rows}); every step after it that reads it "
            f"carries it on — look at this step's inputs (a division by zero, an overflow in {self.analysis.metas[record_id].dtype}, "
            f"log or sqrt of a negative number)"
        )
        return found + [self.analysis.error(node, "non-finite", message, severity="warning")]
