"""Checkpoints in: ``read`` loads a ``.safetensors`` file or a ``torch.save``d state_dict
(``weights_only=True``: no code runs); ``read_map`` and ``rename`` adapt a foreign checkpoint's
keys (``--weights-map``). The tensors are then checked against the pipeline by
:func:`tracer.runtime.tensors.match`, as every tensor given by name is.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from .core.errors import Diagnostic, TracerError
from .spec.source import read_document


def read(path: str | Path) -> dict[str, Any]:
    """A checkpoint's tensors by key: ``.safetensors``, or a ``torch.save``d state_dict."""
    import torch

    path = Path(path)
    try:
        if path.suffix == ".safetensors":
            from safetensors.torch import load_file

            return dict(load_file(str(path)))
        state = torch.load(path, map_location="cpu", weights_only=True)
    except FileNotFoundError:
        raise TracerError(Diagnostic(str(path), None, "weights-file", "no such file")) from None
    except Exception as exc:  # a truncated file, a pickle that is not plain tensors, a bad header
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise TracerError(
            Diagnostic(
                str(path), None, "weights-file", f"cannot read weights ({first}); give a .safetensors file or a torch.save'd state_dict"
            )
        ) from None
    if isinstance(state, Mapping) and "state_dict" in state and isinstance(state["state_dict"], Mapping):
        state = state["state_dict"]  # a training checkpoint that wraps its state_dict
    if not isinstance(state, Mapping) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise TracerError(Diagnostic(str(path), None, "weights-file", "expected a state_dict: a mapping of names to tensors"))
    return dict(state)


def read_map(path: str | Path) -> dict[str, Any]:
    """A ``--weights-map`` file: ``FOREIGN_KEY: PARAM`` renames, ``FOREIGN_KEY: [P1, P2, P3]`` splits
    a packed tensor into equal pieces along dim 0 (``{into: [...], dim: 1}`` along another dim),
    ``FOREIGN_KEY: null`` drops a key the pipeline has no param for."""

    data, source = read_document(path)
    if not isinstance(data, dict):
        raise TracerError(source.error((), "weights-map", "a weights map is a mapping: FOREIGN_KEY: PARAM (or a list, or null)"))
    for key, target in data.items():
        ok = target is None or isinstance(target, str) or _is_names(target)
        ok = ok or (isinstance(target, dict) and set(target) <= {"into", "dim"} and _is_names(target.get("into")))
        ok = ok and (not isinstance(target, dict) or isinstance(target.get("dim", 0), int))
        if not ok:
            raise TracerError(
                source.error((key,), "weights-map", f"'{key}': give a param id, a list of param ids, {{into: [...], dim: N}} or null")
            )
    return data


def _is_names(value) -> bool:
    return isinstance(value, list) and bool(value) and all(isinstance(v, str) for v in value)


def rename(state: Mapping[str, Any], mapping: Mapping[str, Any]) -> dict[str, Any]:
    """``state`` with the map applied; keys the map does not name pass through unchanged."""
    renamed = {}
    for key, tensor in state.items():
        target = mapping.get(key, key)
        if target is None:
            continue
        if isinstance(target, str):
            renamed[target] = tensor
            continue
        names, dim = (target, 0) if isinstance(target, list) else (target["into"], target.get("dim", 0))
        if tensor.dim() == 0 or tensor.shape[dim] % len(names):
            raise TracerError(
                Diagnostic(
                    "<weights-map>",
                    None,
                    "weights-map",
                    f"'{key}' {list(tensor.shape)} does not split into {len(names)} equal pieces along dim {dim}",
                )
            )
        renamed.update(zip(names, (piece.contiguous() for piece in tensor.chunk(len(names), dim))))
    return renamed
