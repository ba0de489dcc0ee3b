"""Rows of benchmarks/import_sweep.py imported once per test process: tests that read the same
row (test_architectures' padded Llama, test_sizes' run at other sizes) share its capture, the
slow part of an import. Each test only reads the module and the pipeline."""

import functools

from benchmarks.import_sweep import build
from tracer.importing import from_module


@functools.cache
def imported_row(family: str, attention: str, layers: int = 1):
    """(module, args, kwargs, pipeline) of one sweep row."""
    module, args, kwargs = build(family, attention, layers)
    return module, args, kwargs, from_module(module, *args, name=family, **kwargs)
