"""Building an analysis without the cyclic garbage collector looking on.

Loading and checking a pipeline allocates hundreds of thousands of small objects (YAML nodes,
pydantic models, symbolic dims, records) that all stay alive. CPython's collector runs a full pass
over every tracked object in the process (torch's included, in a notebook) each time the number of
objects has grown by a quarter, so with it on, checking 384 layers cost more than twice checking
192. None of these objects is garbage while they are built, so the collector is paused for the
build and left as the caller had it afterwards. A run is paused too: its tensors and records are
freed by reference counts, and a full pass inside a 1,000-layer meta run cost more than the run.
"""

from __future__ import annotations

import functools
import gc
import importlib
from collections.abc import Callable
from types import ModuleType
from typing import ParamSpec, TypeVar

P = ParamSpec("P")
R = TypeVar("R")


def gc_paused(build: Callable[P, R]) -> Callable[P, R]:
    """``build`` with the collector off while it runs (on again after it, as before, also when it raises)."""

    @functools.wraps(build)
    def paused(*args: P.args, **kwargs: P.kwargs) -> R:
        if not gc.isenabled():  # the caller paused it, or an outer build did
            return build(*args, **kwargs)
        gc.disable()
        try:
            return build(*args, **kwargs)
        finally:
            gc.enable()

    return paused


def import_frozen(name: str) -> ModuleType:
    """Import module ``name`` with the collector paused, then freeze everything alive out of its
    passes (``gc.freeze``). For a program that imports the file format and the analysis (pydantic,
    ~90 step kinds' models: ~100,000 objects that live as long as the process) and then checks
    many files: the collector's passes would walk those objects again and again (~2% of a cold
    check of the bundle). Freezing exempts every object alive, so only a process of tracer's own
    may call it (``tracer check`` run as the program), never a caller's."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        return importlib.import_module(name)
    finally:
        gc.freeze()
        if was_enabled:
            gc.enable()
