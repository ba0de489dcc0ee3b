"""Small text helpers shared by tables, diagrams and messages."""

from __future__ import annotations


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
