"""tracer: declare attention pipelines in YAML, run them on torch, see and pin every shape.

>>> import tracer
>>> t = tracer.run("pipelines/causal_mha.yaml")           # doctest: +SKIP
>>> t["scores"].symbolic, t["scores"].shape                # doctest: +SKIP
('(B, H, T, T)', (2, 2, 6, 6))
"""

from .api import Pipeline, load, loads, run
from .core.errors import Diagnostic, ExpectationError, TracerError
from .distributed import ParallelRun, run_parallel
from .presentation.trace import Trace
from .runtime.records import TensorRecord

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
    """``tracer.to_module`` and ``tracer.from_module`` import torch only when asked: ``tracer check`` stays fast."""
    if name == "to_module":
        from .module import to_module

        return to_module
    if name == "from_module":
        from .importing import from_module

        return from_module
    raise AttributeError(f"module 'tracer' has no attribute {name!r}")
