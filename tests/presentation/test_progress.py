"""The progress line: only on a terminal, erased when the work ends."""

import io
import time

from tracer.presentation import progress


class _Terminal(io.StringIO):
    def isatty(self):
        return True


def test_progress_shows_on_a_terminal_only_and_erases_itself(monkeypatch):
    monkeypatch.setattr(progress, "DELAY", 0.0)
    terminal = _Terminal()
    with progress.Progress("running", total=3, stream=terminal) as line:
        line.step("q")
    assert "tracer: running 1/3 · 0 s · q" in terminal.getvalue() and terminal.getvalue().endswith("\r\x1b[2K")
    for stream, quiet in ((_Terminal(), True), (io.StringIO(), False)):  # --quiet, or a pipe
        with progress.Progress("running", total=3, stream=stream, quiet=quiet) as line:
            line.step("q")
        assert stream.getvalue() == ""
    ticking = _Terminal()
    with progress.Progress("drawing x.svg", stream=ticking).ticking():
        time.sleep(0.05)
    assert "tracer: drawing x.svg · 0 s" in ticking.getvalue()
