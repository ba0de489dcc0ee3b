"""Axis roles: what each axis of a tensor means — batch, heads, positions, head dim or features.

A role belongs to a dim, not to an axis: as jaxtyping binds a dim name once, `T` means token
positions wherever it appears, so a role follows a tensor through every view, transpose and
cache concat for free (the shape pass already carries the dims). A named dim's role comes from
its name as people write it (nanoGPT's `B, T, C`, `nh`, `hs`; Llama's `H`, `H_kv`, `Dh`;
transformers' `num_heads`, `head_dim`, `seq_len`); a derived one from its expression
(`d_model // H` is a head dim, `H * Dh` features, `past + T` positions). The attention core adds
what it knows for sure: the dims the scores contract over (head dim) and run along (positions).

Lints hold each step's reading of its axes against these roles: sdpa reading (B, T, H, Dh) as
(B, H, T, Dh), rope turning along the heads, a head split laid out (Dh, H).
"""

from __future__ import annotations

import ast
import re

from ..core import dimexpr
from ..core.symbolic import Dim

BATCH, HEADS, POSITIONS, HEAD_DIM, FEATURES = "batch", "heads", "positions", "head dim", "features"

_NAMES = {
    BATCH: r"b|bs|bsz|batch|batch_?size|n_?batch",
    HEADS: r"h|nh|n_?heads?|num_?heads|num_?attention_?heads|heads|h_?kv|h_?q|n_?kv|n_?kv_?heads|num_?kv_?heads"
    r"|num_?key_?value_?heads|kv_?heads|n_?head|n_?rep|n_?groups?|groups",
    POSITIONS: r"t|s|l|seq|seq_?len|t_?(q|k|kv|new|ctx|src|tgt|enc|dec|max)|s_?(q|k|kv)|l_?(q|k)|past|past_?len|n_?ctx"
    r"|n_?tokens|n_?q|n_?k|tokens|context_?len|max_?len|max_?seq_?len|block_?size|n_?positions",
    HEAD_DIM: r"dh|d_?h|hs|hd|d_?k|d_?q|d_?v|d_?head|head_?dim|head_?size|dim_?head|d_?kv|d_?qk|qk_?dim|v_?dim"
    r"|d_?rope|d_?nope|rotary_?dim",
    FEATURES: r"c|d|e|d_?model|d_?emb|d_?embed|embed_?dim|n_?embd|hidden|hidden_?size|d_?hidden|d_?ff|d_?in|d_?out"
    r"|model_?dim|dim|d_?inner|intermediate|intermediate_?size|d_?c|kv_?lora_?rank|q_?lora_?rank",
}
_PATTERNS = {role: re.compile(f"(?:{names})", re.IGNORECASE) for role, names in _NAMES.items()}


def role_of_name(name: str) -> str | None:
    """The role people mean by a dim name, when the name says it."""
    return next((role for role, pattern in _PATTERNS.items() if pattern.fullmatch(name)), None)


def dim_role(dim: Dim, exprs: dict[str, ast.expr]) -> str | None:
    """The role of a dim of a tensor: its label's name, else what its expression combines."""
    return _role(dimexpr.parse(dim.label) if not dim.label.isidentifier() else ast.Name(dim.label), exprs, 0)


def _role(expr: ast.expr, exprs: dict[str, ast.expr], depth: int) -> str | None:
    if depth > 32:
        return None  # a deep chain of derived dims says nothing a name would not
    if isinstance(expr, ast.Name):
        named = role_of_name(expr.id)
        if named is not None or expr.id not in exprs:
            return named
        return _role(exprs[expr.id], exprs, depth + 1)
    if isinstance(expr, ast.BinOp):
        left, right = _role(expr.left, exprs, depth + 1), _role(expr.right, exprs, depth + 1)
        return _combined(type(expr.op), left, right, expr)
    return None


def _combined(op: type, left: str | None, right: str | None, expr: ast.BinOp) -> str | None:
    """``H * Dh`` features, ``d_model // H`` a head dim, ``past + T`` positions, ``2 * T`` positions."""
    if op is ast.Mult:
        if {left, right} == {HEADS, HEAD_DIM}:
            return FEATURES
        number = isinstance(expr.left, ast.Constant) or isinstance(expr.right, ast.Constant)
        return (left or right) if number or left == right else None
    if op is ast.FloorDiv:
        if left == FEATURES and right == HEADS:
            return HEAD_DIM
        return left if isinstance(expr.right, ast.Constant) or left == right == HEADS else None
    if op in (ast.Add, ast.Sub):
        return left if left == right or right is None and isinstance(expr.right, ast.Constant) else None
    return None
