"""Rotary tables computed from constants: what ``rope`` step, with which ``rope_scaling``, makes them.

transformers computes RoPE's ``inv_freq`` at init with its ``ROPE_INIT_FUNCTIONS`` (Llama 3's
bands, YaRN's ramp, LongRoPE's factors, linear and dynamic NTK) and multiplies cos and sin by an
attention factor. The captured table is a constant: :func:`scaled_table` says whether it is a
rotation table at all (cos and sin of ``p · f`` for one frequency per pair of features, times one
factor), and :func:`scaling_of` finds the scaling among the module's configs whose frequencies,
computed by ``tracer/steps/rope_scaling.py`` as the ``rope`` step computes them, give the same
table at the example's positions. Nothing is fitted: a table no config reproduces is not a scaled rope.
"""

from __future__ import annotations

import ast
import contextlib
import inspect
import types
from dataclasses import dataclass

import torch
from pydantic import TypeAdapter, ValidationError

from ..steps.rope_scaling import FREQUENCIES, Dynamic, Linear, Llama3, Longrope, Scaling, Yarn, fields, needs_seq_len

SCALINGS = TypeAdapter(Scaling)
KINDS = {"linear": Linear, "dynamic": Dynamic, "llama3": Llama3, "yarn": Yarn, "longrope": Longrope}
EXPORTED = {FREQUENCIES[kind].__name__: kind for kind in KINDS}  # the functions `tracer export` writes: rope_llama3, …


def tolerance(dtype: torch.dtype, factor: float = 1.0) -> float:
    """How far a table of this dtype may be from float64's: float32's cos and sin, rounded to the dtype."""
    return (1e-5 if dtype in (torch.float32, torch.float64) else torch.finfo(dtype).eps) * max(1.0, abs(factor))


def frequency_columns(rows: torch.Tensor, interleaved: bool) -> torch.Tensor:
    """The table's one column per frequency: the first half (rotate_half), the even ones (interleaved)."""
    return rows[..., ::2] if interleaved else rows[..., : rows.shape[-1] // 2]


@dataclass(frozen=True)
class Table:
    """A rotation table of positions 0…P-1: ``factor · cos(p · inv_freq)`` and its sine, in ``dtype``."""

    cos: torch.Tensor  # (P, R), float64
    sin: torch.Tensor
    dtype: torch.dtype
    interleaved: bool

    @property
    def factor(self) -> float:
        return float(self.cos[0, 0])

    @property
    def positions(self) -> int:
        return self.cos.shape[0]

    @property
    def rotary_dim(self) -> int:
        return self.cos.shape[-1]


def scaled_table(cos: torch.Tensor, sin: torch.Tensor, dtype: torch.dtype, interleaved: bool) -> Table | None:
    """The table if ``cos``/``sin`` (P, R) are ``a · cos(p f)``, ``a · sin(p f)`` for one frequency
    per pair of features (paired as the rotation pairs them) and one factor ``a > 0``; else None."""
    if cos.shape[0] < 2 or cos.shape[-1] % 2:
        return None
    table = Table(cos, sin, dtype, interleaved)
    atol = tolerance(dtype, table.factor)
    pair = 1 if interleaved else cos.shape[-1] // 2
    partner = torch.arange(cos.shape[-1]).reshape(-1, 2).flip(-1).flatten() if interleaved else torch.arange(cos.shape[-1]).roll(pair)
    if table.factor <= 0 or not torch.allclose(cos, cos[:, partner], atol=atol) or not torch.allclose(sin, sin[:, partner], atol=atol):
        return None
    inv_freq = torch.atan2(frequency_columns(sin[1], interleaved), frequency_columns(cos[1], interleaved))
    expected_cos, expected_sin = _table(inv_freq, table.factor, table.positions, interleaved)
    if not (torch.allclose(cos, expected_cos, atol=4 * atol) and torch.allclose(sin, expected_sin, atol=4 * atol)):
        return None
    return table


def _table(inv_freq: torch.Tensor, factor: float, positions: int, interleaved: bool) -> tuple[torch.Tensor, torch.Tensor]:
    freqs = torch.arange(positions, dtype=inv_freq.dtype)[:, None] * inv_freq
    emb = freqs.repeat_interleave(2, -1) if interleaved else torch.cat((freqs, freqs), -1)
    return emb.cos() * factor, emb.sin() * factor


def scaling_of(table: Table, configs: list, written: tuple[dict, ...] = ()) -> tuple[float, dict] | None:
    """``(theta, rope_scaling fields)`` of the first config's rope parameters (or of the ``written``
    ones, :func:`exported_parameters`) whose frequencies, as the ``rope`` step computes them (float32,
    then the table's dtype), make this table; None if none does."""
    candidates = [(config, parameters) for config in configs for parameters in _rope_parameters(config)]
    for config, parameters in [*candidates, *((None, parameters) for parameters in written)]:
        found = _matching(table, config, parameters)
        if found is not None:
            return found
    return None


def exported_parameters(code: str) -> dict | None:
    """The rope parameters a line of a module ``tracer export`` wrote passes to its frequencies
    function: ``frequencies = rope_llama3(torch, Dh, 500000.0, x.device, factor=8.0, …)`` is
    ``{rope_type: llama3, rope_theta: 500000.0, factor: 8.0, …}``, so the scaling comes back from
    the module that says it (it has no config). Read with ``ast``: only literals are taken (the
    table is then computed from them and compared: nothing is taken on trust); None for any other line."""
    call = assigned_call(code)
    kind = EXPORTED.get(call.func.id) if call is not None else None
    if kind is None or len(call.args) < 3:
        return None
    literals = {keyword.arg: literal(keyword.value) for keyword in call.keywords if keyword.arg is not None}
    theta = literal(call.args[2])
    if not isinstance(theta, int | float):
        return None
    return {"rope_type": kind, "rope_theta": theta, **{key: value for key, value in literals.items() if value is not NOT_LITERAL}}


NOT_LITERAL = object()


def assigned_call(code: str) -> ast.Call | None:
    """The call of a named function a one-line assignment makes (``x = f(a, b=1)``), parsed, never run."""
    try:
        (statement,) = ast.parse(code.strip()).body
    except (SyntaxError, ValueError):
        return None
    call = statement.value if isinstance(statement, ast.Assign) else None
    return call if isinstance(call, ast.Call) and isinstance(call.func, ast.Name) else None


def literal(node: ast.expr):
    """The value of a literal (``ast.literal_eval``), or ``NOT_LITERAL``."""
    try:
        return ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):  # seq_len=torch.tensor(…): not a scaling field
        return NOT_LITERAL


def _rope_parameters(config) -> list[dict]:
    """transformers 5's ``config.rope_parameters`` (one dict, or one per layer type), or 4's
    ``rope_scaling`` with ``rope_theta`` beside it."""
    given = getattr(config, "rope_parameters", None)
    if isinstance(given, dict) and all(isinstance(v, dict) for v in given.values()) and given:
        return list(given.values())
    if isinstance(given, dict):
        return [given]
    old = getattr(config, "rope_scaling", None)
    if isinstance(old, dict):
        return [{"rope_theta": getattr(config, "rope_theta", 10000.0), **old}]
    return []


def _matching(table: Table, config, parameters: dict) -> tuple[float, dict] | None:
    kind, theta = parameters.get("rope_type", parameters.get("type")), parameters.get("rope_theta")
    if kind not in KINDS or not isinstance(theta, int | float):
        return None
    try:
        scaling = SCALINGS.validate_python({"type": kind, **_fields(kind, config, parameters)})
    except ValidationError:
        return None
    computed = _computed(table, float(theta), scaling)
    if computed is None or not all(
        torch.allclose(a, b, atol=tolerance(table.dtype, table.factor)) for a, b in zip(computed, (table.cos, table.sin))
    ):
        return None
    return float(theta), {"type": kind, **_written(scaling)}


def _fields(kind: str, config, parameters: dict) -> dict:
    """The scaling's fields from the rope parameters, the config's ``max_position_embeddings`` where
    transformers reads it (dynamic's context; YaRN's and LongRoPE's factor when not given)."""
    wanted = set(KINDS[kind].model_fields) - {"type"}
    found = {key: value for key, value in parameters.items() if key in wanted and value is not None}
    context = getattr(config, "max_position_embeddings", None)
    if "max_position_embeddings" in wanted and context is not None:
        found["max_position_embeddings"] = context
    original = found.get("original_max_position_embeddings")
    if kind in ("yarn", "longrope") and "factor" not in found and context and original:
        found["factor"] = context / original
    return found


def _computed(table: Table, theta: float, scaling) -> tuple[torch.Tensor, torch.Tensor] | None:
    """cos and sin as ``rope`` computes them with this scaling at positions 0…P-1, in the table's dtype."""
    kwargs = fields(scaling)
    if needs_seq_len(scaling):
        kwargs["seq_len"] = torch.tensor(table.positions)
    try:
        inv_freq, factor = FREQUENCIES[scaling.type](torch, table.rotary_dim, theta, "cpu", **kwargs)
    except (ArithmeticError, ValueError, RuntimeError):  # a config the formula cannot compute at this size
        return None
    if inv_freq.shape != (table.rotary_dim // 2,):
        return None
    freqs = torch.arange(table.positions).float()[:, None] * inv_freq
    emb = freqs.repeat_interleave(2, -1) if table.interleaved else torch.cat((freqs, freqs), -1)
    return tuple((f(emb) * factor).to(table.dtype).double() for f in (torch.cos, torch.sin))


def _written(scaling) -> dict:
    """The fields a file writes: those that differ from the defaults."""
    return {key: value for key, value in fields(scaling).items() if key in scaling.model_fields_set and value is not None}


@contextlib.contextmanager
def settled_rope_updates(module: torch.nn.Module, args: tuple, kwargs: dict):
    """transformers' rotary embeddings that update their frequencies in ``forward``
    (``dynamic_rope_update``), left as they were after a capture.

    Dynamic NTK recomputes ``inv_freq`` when ``max(position_ids) + 1`` passes the cached length, a
    branch on a tensor's value that torch.export cannot capture: the module is run once on the
    example, so the buffer holds the frequencies of the example's positions, and captured with
    the rotary embedding's undecorated ``forward`` (``inspect.unwrap``): the table is the module's
    at the example, and the ``rope`` step (``rope_scaling: dynamic``) recomputes it at any length.
    LongRoPE caches its long frequencies on the module as a plain attribute, made under the
    capture's fake tensors: a second capture (or a second import) would fail on it. Every such
    module's attributes and buffers are restored afterwards (its in-place ``inv_freq.copy_`` is
    kept off the module's buffer by ``capture.graph_inputs``)."""
    updating = [m for m in module.modules() if isinstance(getattr(m, "rope_type", None), str) and hasattr(type(m).forward, "__wrapped__")]
    updating = [m for m in updating if "dynamic" in m.rope_type or m.rope_type == "longrope"]
    if not updating:
        yield
        return
    saved = [(m, dict(m.__dict__), dict(m._buffers)) for m in updating]
    try:
        dynamic = [m for m in updating if "dynamic" in m.rope_type]
        if dynamic:
            module(*args, **kwargs)
        for m in dynamic:
            m.forward = types.MethodType(inspect.unwrap(type(m).forward), m)  # capture runs under no_grad already
        yield
    finally:
        for m, attributes, buffers in saved:
            m.__dict__.clear()
            m.__dict__.update(attributes)
            m._buffers.clear()
            m._buffers.update(buffers)
