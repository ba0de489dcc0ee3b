"""Dim names for an imported module: sizes become the names a person would write.

The batch and sequence sizes are followed from the inputs through the graph (``sizes.py``), so
they are ``B`` and ``T`` wherever they occur (``B * T``, ``T - 1``). The model's sizes come from its
config or attributes (``hidden_size`` or ``n_embd`` is ``d_model``, ``num_attention_heads`` is
``H`` ...), and the sizes that follow from them are expressions (``Dh: d_model // H``,
``n_rep: H // H_kv``), so that tracer sees ``d_model = H * Dh``. Other sizes stay numbers.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from .sizes import Poly, Shape

# (attribute, dim) in order of preference; the first found names the dim
ATTRIBUTES = (
    ("hidden_size", "d_model"),
    ("n_embd", "d_model"),
    ("embed_dim", "d_model"),
    ("d_model", "d_model"),
    ("num_attention_heads", "H"),
    ("n_head", "H"),
    ("num_heads", "H"),
    ("n_heads", "H"),
    ("nhead", "H"),
    ("num_key_value_heads", "H_kv"),
    ("n_kv_heads", "H_kv"),
    ("head_dim", "Dh"),
    ("intermediate_size", "d_ff"),
    ("n_inner", "d_ff"),
    ("dim_feedforward", "d_ff"),
    ("vocab_size", "V"),
    ("n_positions", "P"),  # named only where a table of positions has that many rows: a vocab of the same size stays V
    ("max_position_embeddings", "P"),
    ("sliding_window", "W"),
    ("num_local_experts", "E"),  # named only where a step prefers it (a topk's k is K): never by value
    ("num_experts_per_tok", "K"),
    ("attention_chunk_size", "C"),
    ("relative_attention_num_buckets", "NB"),  # named only where a table of T5's buckets has that many rows
    *(
        (name, name) for name in ("H", "H_kv", "Dh", "d_ff", "V", "W", "C", "E", "K", "NB")
    ),  # a module tracer export wrote keeps its dims by name
)
ORDER = ("d_model", "H", "Dh", "H_kv", "n_rep", "d_ff", "V")
# sizes written as products only in these forms: "H * H" or "4 * H" would be true of the numbers and wrong in meaning
PRODUCTS = (("H_kv", "Dh"), ("H", "Dh"), (2, "d_model"), (3, "d_model"), (4, "d_model"), (2, "d_ff"))  # 2 * d_ff: a fused gate and up
HEAD_PRODUCTS = ((3, "Dh"),)  # the last axis of a tensor with heads: GPT-NeoX's q, k and v per head


@dataclass
class Dim:
    value: int
    written: int | str  # the number, or an expression over other dims
    note: str  # where it came from


def model_dims(module: torch.nn.Module, given: dict[str, int] | None) -> dict[str, Dim]:
    """The model's dims: ``given`` first, then its config's and its modules' attributes, derived ones as expressions."""
    found = {name: Dim(value, value, "given") for name, value in (given or {}).items()}
    for where, holder in _holders(module):
        for attribute, name in ATTRIBUTES:
            value = getattr(holder, attribute, None)
            if name not in found and isinstance(value, int) and not isinstance(value, bool) and value > 0:
                found[name] = Dim(value, value, f"{where}.{attribute}")
    _derive(found)
    return found


def _holders(module: torch.nn.Module):
    """Configs first (the root's, then a submodule's: a wrapped transformers layer), then modules."""
    subs = list(module.named_modules())
    for path, sub in subs:
        config = getattr(sub, "config", None)
        if config is not None and not isinstance(config, torch.nn.Module):
            yield f"{path}.config" if path else "config", config
    for path, sub in subs:
        yield path or type(module).__name__, sub


def _derive(found: dict[str, Dim]) -> None:
    model, heads, head = found.get("d_model"), found.get("H"), found.get("Dh")
    if model and heads and model.value % heads.value == 0 and (head is None or head.value * heads.value == model.value):
        found["Dh"] = Dim(model.value // heads.value, "d_model // H", "head width")
    kv = found.get("H_kv")
    if heads and kv and kv.value == heads.value:
        del found["H_kv"]
    elif heads and kv and heads.value % kv.value == 0:
        found["n_rep"] = Dim(heads.value // kv.value, "H // H_kv", "query heads per kv head")


class Namer:
    """Writes sizes in dim names: a batch or sequence size as its expression (``B``, ``T - 1``), a
    number by the model's dims."""

    def __init__(self, dims: dict[str, Dim], shapes: dict[int, Shape], roles: dict[int, dict[int, str]] | None = None):
        self.dims, self.shapes = dims, shapes  # shapes: id(example tensor) -> its sizes (Sizes.of_value)
        self.roles = roles or {}  # id(example tensor) -> {axis: the only dim it may be} (Sizes.roles: a positions table's rows are P)

    def size(self, size, prefer: tuple[str, ...] = (), products: tuple = PRODUCTS) -> int | str:
        if isinstance(size, Poly):  # an expression over the batch and sequence sizes
            return str(size)
        value = int(size)
        if value == 1:  # a broadcast axis far more often than a dim of size 1 (a head width of 1)
            return 1
        for name in (*prefer, *ORDER):
            if name in self.dims and self.dims[name].value == value:
                return name
        for product in products:
            factors = [f if isinstance(f, int) else getattr(self.dims.get(f), "value", None) for f in product]
            if None not in factors and math.prod(factors) == value:
                return " * ".join(map(str, product))
        return value

    def axis(self, tensor, axis: int):
        """The size of one axis of an example tensor: its expression, or its number."""
        sizes = self.shapes.get(id(tensor))
        size = sizes[axis] if sizes is not None else tensor.shape[axis]
        return size if isinstance(size, Poly) else int(size)

    def shape(self, tensor) -> list[int | str]:
        """The sizes in dim names; the last axis of a tensor with heads is the head width first (H = Dh = 4),
        or a multiple of it right after the heads axis (GPT-NeoX's fused q, k, v: ``[B, T, H, 3 * Dh]``)."""
        names: list[int | str] = []
        for axis in range(len(tensor.shape)):
            last = axis == len(tensor.shape) - 1 >= 3
            after_heads = last and names[-1] in ("H", "H_kv")
            size, role = self.axis(tensor, axis), self.roles.get(id(tensor), {}).get(axis)
            if role == "V" and "V" not in self.dims and isinstance(size, int) and size > 1:  # no config names the vocab
                self.dims["V"] = Dim(size, size, "rows of a table looked up by the token ids the module is given")
            if role is not None:  # where the size comes from says which dim it is: that one, or the number
                names.append(role if role in self.dims and self.dims[role].value == int(size) else int(size))
                continue
            prefer = ("Dh",) if last else ()
            names.append(self.size(size, prefer, (*HEAD_PRODUCTS, *PRODUCTS) if after_heads else PRODUCTS))
        return names
