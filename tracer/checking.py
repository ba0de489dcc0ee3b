"""``tracer check`` of one file, when the cache (``tracer/checkcache.py``) has no result for it:
its diagnostics, ``--rank``'s section, and the files it read. Apart from the other commands
(``tracer/commands.py``): checking needs the file format and the analysis, not the runtime, the
diagrams or the diff."""

from __future__ import annotations

from dataclasses import replace

from .analysis.shapes import analyze
from .checkcache import Checked
from .core.errors import Diagnostic, TracerError
from .core.gcpause import gc_paused
from .presentation import ranks
from .spec.load import load_named
from .spec.source import recording_reads


# Paused as a whole, not only while loading and analysing: a collection that starts between those
# (a file of warnings formats them) walks the file's whole spec and analysis, still alive then;
# once this returns they are freed by reference counts and the next collection finds little.
@gc_paused
def check_file(name: str, strict: bool, dims: dict[str, int], rank: int | None) -> Checked:
    """``tracer check`` of one file: its diagnostics (warnings as errors when ``strict``), then,
    with ``rank``, that rank's section or why there is none; with the files the check read."""
    analysis = None
    with recording_reads() as reads:
        try:
            spec, source = load_named(name)
            analysis = analyze(spec, source, dims)
            diagnostics = analysis.diagnostics
        except TracerError as exc:
            diagnostics = exc.diagnostics
    shown = [replace(d, severity="error") if strict and d.severity == "warning" else d for d in diagnostics]
    printed = [("err", str(d)) for d in shown]
    failed = any(d.severity == "error" for d in shown)
    if rank is not None and analysis is not None and not analysis.errors:
        problem = ranks.check_rank(analysis, rank)
        printed.append(
            ("out", ranks.rank_table(analysis, rank)) if problem is None else ("err", str(Diagnostic(name, None, "rank", problem)))
        )
        failed = failed or problem is not None
    return Checked(tuple(printed), failed, tuple(reads), frozenset(d.code for d in diagnostics))
