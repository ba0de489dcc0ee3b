"""Checkpoints in: ``read`` loads a ``.safetensors`` file or a ``torch.save``d state_dict
(``weights_only=True``: no code runs); ``read_map`` and ``rename`` adapt a foreign checkpoint's
keys (``--weights-map``). The tensors are then checked against the pipeline by
:func:`tracer.runtime.tensors.match`, as every tensor given by name is.

A checkpoint is untrusted input, read with bounded memory: only a regular file is opened (a FIFO
would block forever), a ``.pt`` is memory-mapped (never inflated: compressed zip members are
refused), and the bytes of its tensors are added up from their metadata and held against the
budget before any is copied, so neither a tensor that views a huge storage nor keys the pipeline
never uses can take more memory than the budget.
"""

from __future__ import annotations

import json
import os
import pickle
import zipfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from .core.errors import Diagnostic, TracerError
from .core.formatting import human_bytes
from .spec.source import SourceMap, open_regular, read_document

_EXPECTED = "give a .safetensors file or a torch.save'd state_dict"


def read(path: str | Path, max_bytes: int | None = None, wanted: Callable[[str], bool] | None = None) -> dict[str, Any]:
    """A checkpoint's tensors by key, each a copy of its own (never a view of a larger storage).

    Only the keys ``wanted`` accepts (every key without it) are read, and only after their bytes,
    taken from the file's metadata (a ``.safetensors`` header, a ``.pt``'s mapped tensors), are
    held against ``max_bytes``. The others come back as meta tensors of their shape and dtype:
    enough to check their names and split them by a map, without reading a byte of them."""
    path = Path(path)
    name = str(path)
    fd, _ = open_regular(path, name, _EXPECTED, codes=("weights-file", "weights-file"))
    try:
        opened = f"/proc/self/fd/{fd}" if os.path.isdir("/proc/self/fd") else name  # the file checked, not a swapped one
        if path.suffix == ".safetensors":
            return _load_safetensors(opened, name, max_bytes, wanted or _every_key)
        state = _load_pt(opened, name)
    finally:
        os.close(fd)
    return _take(name, state, max_bytes, wanted or _every_key, lambda key: state[key].clone())


def _every_key(key: str) -> bool:
    return True


def _take(name: str, described: Mapping[str, Any], max_bytes: int | None, wanted: Callable[[str], bool], load: Callable[[str], Any]):
    """The wanted keys loaded (once their bytes fit the budget), the others as placeholders."""
    taken = {key for key in described if wanted(key)}
    _check_size(name, sum(nbytes(described[key]) for key in taken), max_bytes)
    return {key: load(key) if key in taken else _placeholder(tensor) for key, tensor in described.items()}


def _placeholder(tensor):
    """A meta tensor standing for one that is not read; a tensor without plain sizes (nested,
    sparse) stands for itself: what is done with an unread key never reads it."""
    import torch

    if tensor.is_nested or tensor.layout != torch.strided:
        return tensor
    return torch.empty(tensor.shape, dtype=tensor.dtype, device="meta")


def _check_size(name: str, size: int, max_bytes: int | None) -> None:
    if max_bytes is not None and size > max_bytes:
        raise TracerError(
            Diagnostic(
                name,
                None,
                "weights-too-large",
                f"the checkpoint's tensors take {human_bytes(size)}, over the memory budget of {human_bytes(max_bytes)}; "
                "save only the tensors the pipeline uses, or raise the budget with --max-memory",
            )
        )


def _load_safetensors(opened: str, name: str, max_bytes: int | None, wanted: Callable[[str], bool]) -> dict[str, Any]:
    """The header first (safetensors checks that it agrees with the file), then each wanted
    tensor on its own: the rest of the file is never read."""
    from safetensors import safe_open

    try:
        with safe_open(opened, framework="pt") as file:
            described = {key: described_tensor(name, key, file) for key in file.keys()}
            return _take(name, described, max_bytes, wanted, file.get_tensor)
    except TracerError:
        raise
    except Exception as exc:  # a truncated file or a bad header: safetensors says which
        raise _unreadable(name, exc) from None


#: safetensors' dtype names, as torch names them (its F4, F6 and F8_E8M0 kinds have no torch dtype)
_SAFETENSORS_DTYPES = {
    "BOOL": "bool",
    "U8": "uint8",
    "I8": "int8",
    "U16": "uint16",
    "I16": "int16",
    "F16": "float16",
    "BF16": "bfloat16",
    "U32": "uint32",
    "I32": "int32",
    "F32": "float32",
    "U64": "uint64",
    "I64": "int64",
    "F64": "float64",
    "C64": "complex64",
    "F8_E4M3": "float8_e4m3fn",
    "F8_E4M3FNUZ": "float8_e4m3fnuz",
    "F8_E5M2": "float8_e5m2",
    "F8_E5M2FNUZ": "float8_e5m2fnuz",
}


def described_tensor(name: str, key: str, file) -> Any:
    """A meta tensor of the shape and dtype the safetensors header of ``file`` gives ``key``: its
    bytes are torch's own element size times its elements. A dtype torch does not read, or a key
    the file does not hold, is an error located at the file ``name``, never a guess."""
    import torch

    try:
        header = file.get_slice(key)
        dtype_name, shape = header.get_dtype(), header.get_shape()
    except Exception as exc:  # safetensors says which: a key the file lacks, a header it cannot read
        raise _unreadable(name, exc) from None
    dtype = _SAFETENSORS_DTYPES.get(dtype_name)
    if dtype is None:
        raise TracerError(
            Diagnostic(name, None, "weights-file", f"cannot read weights: '{key}' is {dtype_name}, a dtype torch does not read")
        )
    return torch.empty(shape, dtype=getattr(torch, dtype), device="meta")


def nbytes(tensor) -> int:
    """The bytes a (meta) tensor's elements take once read."""
    return tensor.numel() * tensor.element_size()


def _load_pt(opened: str, name: str) -> dict[str, Any]:
    """A ``torch.save``d state_dict, memory-mapped: its storages are read only where a tensor is."""
    import torch

    _check_zip(opened, name)
    try:
        state = torch.load(opened, map_location="cpu", weights_only=True, mmap=True)
    except pickle.UnpicklingError:  # torch's own message advises weights_only=False: never here
        raise TracerError(
            Diagnostic(name, None, "weights-file", f"cannot read weights: the file holds objects other than tensors; {_EXPECTED}")
        ) from None
    except Exception as exc:
        raise _unreadable(name, exc) from None
    if isinstance(state, Mapping) and "state_dict" in state and isinstance(state["state_dict"], Mapping):
        state = state["state_dict"]  # a training checkpoint that wraps its state_dict
    if not isinstance(state, Mapping) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise TracerError(Diagnostic(name, None, "weights-file", "expected a state_dict: a mapping of names to tensors"))
    return dict(state)


def _check_zip(opened: str, name: str) -> None:
    """torch.save writes an uncompressed zip; a compressed member would be inflated in full before
    any check (a 1 MB file holding 1 GiB of zeros), and the legacy format cannot be mapped."""
    try:
        with zipfile.ZipFile(opened) as archive:
            compressed = [m.filename for m in archive.infolist() if m.compress_type != zipfile.ZIP_STORED]
    except (zipfile.BadZipFile, OSError, ValueError):
        raise TracerError(
            Diagnostic(name, None, "weights-file", f"cannot read weights: not a zip archive as torch.save writes; {_EXPECTED}")
        ) from None
    if compressed:
        raise TracerError(
            Diagnostic(
                name,
                None,
                "weights-file",
                f"cannot read weights: member '{compressed[0]}' is compressed, which torch.save never does; "
                "save the state_dict again with torch.save",
            )
        )


def _unreadable(name: str, exc: Exception) -> TracerError:
    return TracerError(Diagnostic(name, None, "weights-file", f"cannot read weights ({reason(exc)}); {_EXPECTED}"))


def reason(exc: Exception) -> str:
    """The first line of what a reader (safetensors, torch) raised: it says what is wrong with the file."""
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return first[:200]


class WeightsMap(dict):
    """A ``--weights-map`` file's entries, with the positions ``rename`` reports its problems at."""

    def __init__(self, entries: Mapping[str, Any], source: SourceMap):
        super().__init__(entries)
        self.source = source


def read_map(path: str | Path) -> WeightsMap:
    """A ``--weights-map`` file: ``FOREIGN_KEY: PARAM`` renames, ``FOREIGN_KEY: [P1, P2, P3]`` splits
    a packed tensor into equal pieces along dim 0 (``{into: [...], dim: 1}`` along another dim),
    ``FOREIGN_KEY: null`` drops a key the pipeline has no param for. Each param is named once."""

    data, source = read_document(path)
    if not isinstance(data, dict):
        raise TracerError(source.error((), "weights-map", "a weights map is a mapping: FOREIGN_KEY: PARAM (or a list, or null)"))
    problems, named_by = [], {}
    for key, target in data.items():
        problem = _entry_problem(key, target)
        if problem:
            problems.append(source.error((key, "dim") if "dim" in problem else (key,), "weights-map", problem))
            continue
        for param in _targets(target):
            if param in named_by:
                also = "twice" if named_by[param] == key else f"and so does '{named_by[param]}'"
                problems.append(source.error((key,), "weights-map", f"'{key}' gives '{param}' {also}; a param takes one tensor"))
            named_by.setdefault(param, key)
    if problems:
        raise TracerError(problems)
    return WeightsMap(data, source)


def _entry_problem(key: str, target) -> str | None:
    """What is wrong with one map entry (None: nothing)."""
    if target is None or isinstance(target, str) or _is_names(target):
        return None
    if not (isinstance(target, dict) and set(target) <= {"into", "dim"} and _is_names(target.get("into"))):
        return f"'{key}': give a param id, a list of param ids, {{into: [...], dim: N}} or null"
    dim = target.get("dim", 0)
    if type(dim) is not int:  # a bool is an int to isinstance, and `dim: true` is no dim
        return f"'{key}': dim must be a whole number such as 0 or -1, not {json.dumps(dim, default=str)}"
    return None


def _is_names(value) -> bool:
    return isinstance(value, list) and bool(value) and all(isinstance(v, str) for v in value)


def targets(mapping: Mapping[str, Any] | None, key: str) -> list[str]:
    """The params a checkpoint key gives tensors to under ``mapping`` (itself when it names none)."""
    return _targets(mapping.get(key, key) if mapping else key)


def _targets(target) -> list[str]:
    """The params one map entry gives tensors to."""
    if target is None:
        return []
    if isinstance(target, str):
        return [target]
    return target if isinstance(target, list) else target["into"]


def rename(state: Mapping[str, Any], mapping: Mapping[str, Any]) -> dict[str, Any]:
    """``state`` with the map applied; keys the map does not name pass through unchanged. Two
    tensors for one param (a renamed key onto a key that passes through) are refused, never
    resolved by order."""
    renamed, given_by, problems = {}, {}, []
    for key, tensor in state.items():
        target = mapping.get(key, key)
        pieces = {target: tensor} if isinstance(target, str) else _split(key, tensor, target, mapping) if target is not None else {}
        for param, piece in pieces.items():
            if param in given_by:
                problems.append(
                    _map_error(
                        mapping, (key,), f"'{key}' and '{given_by[param]}' both give '{param}'; map one of them to null (FOREIGN_KEY: null)"
                    )
                )
            given_by.setdefault(param, key)
            renamed[param] = piece
    if problems:
        raise TracerError(problems)
    return renamed


def _split(key: str, tensor, target, mapping: Mapping[str, Any]) -> dict[str, Any]:
    """A packed tensor's equal pieces along the map's ``dim``, by param."""
    names, dim = (target, 0) if isinstance(target, list) else (target["into"], target.get("dim", 0))
    if not -tensor.dim() <= dim < tensor.dim():
        raise TracerError(
            _map_error(
                mapping,
                (key, "dim"),
                f"'{key}' {list(tensor.shape)} has no dim {dim}; give a dim from {-tensor.dim()} to {tensor.dim() - 1}",
            )
        )
    if tensor.shape[dim] % len(names):
        raise TracerError(
            _map_error(mapping, (key,), f"'{key}' {list(tensor.shape)} does not split into {len(names)} equal pieces along dim {dim}")
        )
    return dict(zip(names, (piece.contiguous() for piece in tensor.chunk(len(names), dim))))


def _map_error(mapping: Mapping[str, Any], path: tuple, message: str) -> Diagnostic:
    """At ``path`` (a key, or its ``dim``) in the map file; a map given as a plain dict has no file."""
    if isinstance(mapping, WeightsMap):
        return mapping.source.error(path, "weights-map", message)
    return Diagnostic("<weights-map>", None, "weights-map", message)
