"""Run hooks that watch tensors as a run produces them (``run(observe=...)``), keeping none alive:
what static checks cannot decide because it depends on the data (a mask known only at run time)."""

from __future__ import annotations

from ..analysis.attention import score_chain
from ..core.errors import Diagnostic, merge_copies


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
