"""One exception type for everything a user can get wrong, with source positions.

Every diagnostic prints as ``FILE:LINE:COL: error[CODE]: step 'ID': message`` so editors and CI
logs can jump straight to the offending YAML.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

from .frozen import frozen


@frozen
class Position:
    """A 1-based line and column inside a pipeline file."""

    line: int
    col: int


# Text quoted from the user (file names, ids, messages) leaves tracer escaped: every line of output
# starts FILE:LINE:COL:, and no escape sequence, bidi override or line break reaches a terminal raw.
_UNPRINTABLE = [*range(0x00, 0x20), *range(0x7F, 0xA0), 0x200E, 0x200F, *range(0x202A, 0x202F), *range(0x2066, 0x206A), 0x2028, 0x2029]
_ESCAPES = {c: repr(chr(c))[1:-1] if c < 0x100 else f"\\u{c:04x}" for c in _UNPRINTABLE}


def printable(text: object) -> str:
    """``text`` with control characters, line breaks and bidi controls written as escapes (``\\x1b``)."""
    return str(text).translate(_ESCAPES)


def display(text: object) -> str:
    """``printable(text)`` that can be written as UTF-8: a file name's undecodable bytes (which
    Python keeps as lone surrogates) as the ``\\xff`` escapes of those bytes."""
    shown = printable(text)
    try:
        return shown.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
    except UnicodeEncodeError:  # a surrogate no file name decodes to: escape its code point
        return shown.encode("utf-8", "backslashreplace").decode("utf-8")


@dataclass(frozen=True)
class Diagnostic:
    """One located problem (an error or a lint warning)."""

    file: str
    position: Position | None
    code: str
    message: str
    step: str | None = None
    severity: str = "error"

    def as_dict(self) -> dict:
        """As JSON (``run --json``'s checks) and the HTML report show it."""
        where = None if self.position is None else {"line": self.position.line, "column": self.position.col}
        return {"code": self.code, "severity": self.severity, "step": self.step, "file": self.file, "where": where, "message": self.message}

    def __str__(self) -> str:
        file = printable(self.file)
        where = file if self.position is None else f"{file}:{self.position.line}:{self.position.col}"
        step = f"step '{printable(self.step)}': " if self.step else ""
        return f"{where}: {self.severity}[{self.code}]: {step}{printable(self.message)}"


_COPY_INDEX = re.compile(r"(?<=/)\d+(?=/)|(?<=copy )\d+")  # layers/3/Q, "copy 3 included at"


def merge_copies(diagnostics: list[Diagnostic]) -> list[Diagnostic]:
    """One diagnostic per problem: a problem inside a repeated block is found in every copy, at
    the same line of the block file, with only the copy's index changed; keep the first and count
    the rest. Exact repeats are dropped."""
    alike: dict[tuple, list[Diagnostic]] = {}
    for d in diagnostics:
        alike.setdefault((d.file, d.position, d.code, d.severity, _COPY_INDEX.sub("#", d.message)), []).append(d)
    merged = []
    for same in alike.values():
        more = len({d.message for d in same}) - 1
        merged.append(
            same[0]
            if not more
            else replace(same[0], message=f"{same[0].message}; the same in {more} more cop{'ies' if more > 1 else 'y'} of this block")
        )
    return merged


class TracerError(Exception):
    """The only exception tracer raises for bad input; its message starts ``FILE:LINE:COL:``."""

    def __init__(self, diagnostics: list[Diagnostic] | Diagnostic):
        self.diagnostics = [diagnostics] if isinstance(diagnostics, Diagnostic) else list(diagnostics)
        super().__init__("\n".join(str(d) for d in self.diagnostics))

    @property
    def code(self) -> str:
        return self.diagnostics[0].code


class ExpectationError(TracerError, AssertionError):
    """An ``expect:`` entry or a ``tracer.testing`` assertion that did not hold."""


class InternalError(RuntimeError):
    """A bug in tracer itself (for example a shape rule that disagrees with torch)."""
