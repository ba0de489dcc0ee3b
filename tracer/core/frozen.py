"""Frozen dataclasses that are quick to build.

A frozen dataclass's generated ``__init__`` sets each field with ``object.__setattr__`` (its own
``__setattr__`` refuses), several times slower than storing it: a check of the bundle builds tens
of thousands of metas, dims, nodes and positions, and their ``__init__`` alone was a sixth of the
analysis. ``@frozen`` is ``@dataclass(frozen=True)`` with an ``__init__`` that writes the fields
into the new instance's ``__dict__``: the same signature, defaults and result, still immutable.
"""

from __future__ import annotations

import dataclasses
from typing import TypeVar

T = TypeVar("T")


def frozen(cls: type[T] | None = None, /, **options):
    """``@dataclass(frozen=True, **options)`` with a quick ``__init__`` (no ``slots``, no
    ``default_factory``, no ``__post_init__``: the generated one stays for those)."""

    def wrap(cls: type[T]) -> type[T]:
        cls = dataclasses.dataclass(frozen=True, **options)(cls)
        cls.__init__ = _quick_init(cls)
        return cls

    return wrap if cls is None else wrap(cls)


def _quick_init(cls: type):
    if "__slots__" in cls.__dict__:
        raise TypeError(f"{cls.__name__}: @frozen needs instances with a __dict__, not slots")
    if hasattr(cls, "__post_init__"):
        raise TypeError(f"{cls.__name__}: @frozen does not run __post_init__")
    params, stores, defaults = [], [], {}
    for f in dataclasses.fields(cls):
        if not f.init:
            raise TypeError(f"{cls.__name__}.{f.name}: @frozen sets every field in __init__")
        if f.default_factory is not dataclasses.MISSING:
            raise TypeError(f"{cls.__name__}.{f.name}: @frozen takes no default_factory")
        if f.default is dataclasses.MISSING:
            params.append(f.name)
        else:
            defaults[f"_default_{f.name}"] = f.default
            params.append(f"{f.name}=_default_{f.name}")
        stores.append(f"    fields[{f.name!r}] = {f.name}\n")
    source = f"def __init__(self, {', '.join(params)}):\n    fields = self.__dict__\n" + "".join(stores)
    namespace: dict = {}
    exec(source, defaults, namespace)  # noqa: S102 - the source is made from the class's own field names, as dataclasses does
    init = namespace["__init__"]
    init.__qualname__ = f"{cls.__qualname__}.__init__"
    return init
