"""Where a node of the captured graph comes from: the frames of its stack trace outside torch, its
source line, and the tag that ends each line of forward in a module ``tracer export`` wrote (its
step id: export then import keeps the file's ids)."""

from __future__ import annotations

import functools
import linecache
import re

import torch

from ..presentation.export import HEADER as EXPORT_HEADER

FRAME = re.compile(r'File "([^"]+)", line (\d+), in (\S+)\n\s+(.*)')
# the tag `tracer export` ends each line of forward with: "  # (B, T, d_model) layer.q_proj" or "  # layer.q_proj"
EXPORT_TAG = re.compile(r"  # (?:\(.*\) )?([^\s#]+)$")
SHAPED_TAG = re.compile(r"  # \(.*\) [^\s#]+$")


def frames(node: torch.fx.Node) -> tuple[tuple[str, int, str, str], ...]:
    """(file, line, function, code) of the node's stack trace outside torch, outermost first."""
    return _frames(node.meta.get("stack_trace") or "")


@functools.lru_cache(maxsize=4096)
def _frames(stack_trace: str) -> tuple[tuple[str, int, str, str], ...]:
    """Parsed once per distinct trace: a node's is read for its id, its comment and its
    caller, and nodes of one line share it."""
    found = FRAME.findall(stack_trace)
    first = next((i for i, (_, _, function, _) in enumerate(found) if function == "forward"), len(found))  # the root module's forward
    return tuple((f, int(line), fn, code.strip()) for f, line, fn, code in found[first:] if not _internal(f))


def _internal(file: str) -> bool:
    """A frame of torch's machinery, not of a module's code (torch.nn's modules are modules' code)."""
    file = file.replace("\\", "/")
    return "/torch/" in file and "/torch/nn/modules/" not in file


def source_line(node: torch.fx.Node) -> tuple[str, int, str] | None:
    found = frames(node)
    return (found[-1][0], found[-1][1], found[-1][3]) if found else None


def exported_step(file: str, code: str) -> str | None:
    """The YAML step id a line of a module `tracer export` wrote ends with: its steps keep their ids
    (``layer.q_proj``, not the variable ``layer_q_proj``), so export then import gives the file back."""
    found = EXPORT_TAG.search(code)
    return found.group(1) if found and exported_file(file) else None


def exported_file(file: str) -> bool:
    """A module `tracer export` wrote: its first line is the export's header."""
    return linecache.getline(file, 1).rstrip("\n") == EXPORT_HEADER[0]


def whole_step(line: tuple[str, int, str]) -> str | None:
    """The step id of a line that is a whole step of a module `tracer export` wrote: tagged with its
    shape (a step's last line is) and not after a line of the same step (a step of several lines
    tags each of them)."""
    file, number, code = line
    tag = exported_step(file, code)
    if tag is None or not SHAPED_TAG.search(code):
        return None
    before = EXPORT_TAG.search(linecache.getline(file, number - 1).rstrip("\n"))
    return None if before is not None and before.group(1) == tag else tag
