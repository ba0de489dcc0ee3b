"""Small text helpers shared by tables, diagrams and messages."""

from __future__ import annotations

import re


def human_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB", "PiB"):
        if n < 1024 or unit == "PiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} EiB"


def human_count(n: float) -> str:
    """A count in three significant figures: 960, 16.4K, 123M (FLOPs, parameters)."""
    for unit in ("", "K", "M", "G", "T", "P"):
        if abs(n) < 1000 or unit == "P":
            if not unit:
                return f"{n:.0f}"
            return f"{n:.3g}{unit}" if abs(n) < 100 else f"{n:.0f}{unit}"
        n /= 1000
    return f"{n:.0f}P"


_UNITS = {
    "": 1,
    "b": 1,
    "k": 1024,
    "m": 1024**2,
    "g": 1024**3,
    "t": 1024**4,
    "p": 1024**5,
    "kb": 1000,
    "mb": 1000**2,
    "gb": 1000**3,
    "tb": 1000**4,
    "pb": 1000**5,
    "kib": 1024,
    "mib": 1024**2,
    "gib": 1024**3,
    "tib": 1024**4,
    "pib": 1024**5,
}
_SIZE = re.compile(r"^\s*([0-9]+(?:\.[0-9]*)?|\.[0-9]+)\s*([A-Za-z]*)\s*$")


def parse_bytes(text: str | int | float) -> int:
    """``'8GiB'``, ``'500MB'``, ``'1.5G'`` (binary), ``'1048576'`` → bytes; ``ValueError`` otherwise."""
    if isinstance(text, bool):
        raise ValueError(f"expected a size such as 8GiB or 500MB, got {text!r}")
    if isinstance(text, (int, float)):
        if text < 0:
            raise ValueError(f"a memory size must not be negative, got {text}")
        return int(text)
    match = _SIZE.match(str(text))
    unit = match and match.group(2).lower()
    if not match or unit not in _UNITS:
        raise ValueError(f"expected a size such as 8GiB, 500MB or 1073741824, got '{text}'")
    return int(float(match.group(1)) * _UNITS[unit])
