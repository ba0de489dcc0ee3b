"""A status line on stderr for work that takes a while (long runs, big renders).

Shown only on a terminal, only once the work has lasted ``DELAY`` seconds (a quick command prints
nothing extra), rewritten in place at most ``RATE`` times a second, and erased when the work ends.
``--quiet`` turns it off; so does an output that is not a terminal (logs, pipes, CI).
"""

from __future__ import annotations

import shutil
import sys
import threading
import time
from typing import TextIO

from ..core.errors import printable

DELAY = 1.0  # seconds before the line appears
RATE = 10  # redraws per second at most


class Progress:
    """``with Progress("running", total=1200) as p: p.step("layers/3/Q")`` or, for one long call,
    ``with Progress("drawing with dot").ticking(): ...`` (a thread redraws the elapsed time)."""

    def __init__(self, label: str, total: int | None = None, quiet: bool = False, stream: TextIO | None = None):
        self.stream = sys.stderr if stream is None else stream
        self.enabled = not quiet and _is_terminal(self.stream)
        self.label, self.total, self.done = label, total, 0
        self.start = time.monotonic()
        self._next = self.start + DELAY
        self._shown = False
        self._stop = threading.Event()
        self._lock = threading.Lock()  # the ticking thread and the caller never write at once

    def step(self, what: str = "") -> None:
        """One unit of work done (``what``: the tensor just made); redraws when it is time."""
        self.done += 1
        if self.enabled and time.monotonic() >= self._next:
            self._draw(what)

    def ticking(self) -> Progress:
        """Redraw the elapsed time from a thread while the ``with`` block waits on one long call."""
        if self.enabled:
            threading.Thread(target=self._tick, daemon=True).start()
        return self

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc) -> None:
        with self._lock:
            self._stop.set()
            if self._shown:
                self.stream.write("\r\x1b[2K")  # erase the line: what follows starts clean
                self.stream.flush()

    def _tick(self) -> None:
        while not self._stop.wait(max(self._next - time.monotonic(), 0.5 if self._shown else 0.0)):  # the seconds, twice a second
            self._draw("")

    def _draw(self, what: str) -> None:
        with self._lock:
            if self._stop.is_set():
                return
            now = time.monotonic()
            self._next = now + 1 / RATE
            count = f" {self.done:,}/{self.total:,}" if self.total else ""
            line = printable(f"tracer: {self.label}{count} · {now - self.start:.0f} s" + (f" · {what}" if what else ""))
            self.stream.write("\r\x1b[2K" + line[: shutil.get_terminal_size((100, 24)).columns - 1])
            self.stream.flush()
            self._shown = True


def _is_terminal(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False
