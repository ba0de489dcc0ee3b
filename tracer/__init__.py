"""tracer: declare attention pipelines in YAML, run them on torch, see and pin every shape.

>>> import tracer
>>> t = tracer.run("pipelines/causal_mha.yaml")           # doctest: +SKIP
>>> t["scores"].symbolic, t["scores"].shape                # doctest: +SKIP
('(B, H, T, T)', (2, 2, 6, 6))
"""

from typing import TYPE_CHECKING

from .core.errors import Diagnostic, ExpectationError, TracerError
from .runtime.records import TensorRecord

if TYPE_CHECKING:  # what the attributes below are, for type checkers and editors
    from .api import Pipeline, load, loads, run
    from .distributed import ParallelRun, run_parallel
    from .importing import from_module
    from .module import to_module
    from .presentation.trace import Trace

__all__ = [
    "Diagnostic",
    "ExpectationError",
    "ParallelRun",
    "Pipeline",
    "TensorRecord",
    "Trace",
    "TracerError",
    "from_module",
    "load",
    "loads",
    "run",
    "run_parallel",
    "to_module",
]
__version__ = "0.1.0"


def __getattr__(name: str):
    """The entry points are imported at their first use, not by ``import tracer``: the file format
    (pydantic and every step kind's model) costs ~0.3 s to import, more than twice what a start-up
    may take (benchmarks/startup.py), and ``tracer --version``, ``help``, ``models`` and the pytest
    plugin of a session that loads no pipeline need none of it. ``to_module`` and ``from_module``
    import torch, which ``tracer check`` never does."""
    if name in ("Pipeline", "load", "loads", "run"):
        from . import api

        return getattr(api, name)
    if name in ("ParallelRun", "run_parallel"):
        from . import distributed

        return getattr(distributed, name)
    if name == "Trace":
        from .presentation.trace import Trace

        return Trace
    if name == "to_module":
        from .module import to_module

        return to_module
    if name == "from_module":
        from .importing import from_module

        return from_module
    raise AttributeError(f"module 'tracer' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
