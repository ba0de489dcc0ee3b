"""What each step costs, apart from what it means: FLOPs, and the bytes its kernel allocates and
frees again while it runs (its workspace), per step kind, from the metadata alone.

These formulas follow torch's CPU kernels (which copies ``torch.matmul`` makes, what the flash
attention kernel keeps per query), so they change when torch does; keeping them here keeps
kernel internals out of the shape rules. ``tests/analysis/test_costs.py`` holds every workspace
formula against the peak torch's allocator reports, as an upper bound within a stated tolerance,
and every FLOP count against ``torch.utils.flop_counter.FlopCounterMode``.

FLOPs are FlopCounterMode's: matrix products only (mm, bmm, addmm, baddbmm, attention kernels),
2 per multiply-add; a kind that is layout, elementwise, a normalisation or softmax costs 0.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable

from ..core.dtypes import DTYPE_BYTES, promote
from ..core.layout import Meta
from ..steps.attention import KEPT_PATTERN, Dropout, Mask, Softcap, Softmax
from ..steps.conv import Conv1d, Conv2d
from ..steps.einsum import Einsum, parse_equation
from ..steps.elementwise import LayerNorm
from ..steps.fused import Sdpa
from ..steps.norms import RMSNorm
from ..steps.numeric import MATH_KINDS, Clamp, Compare, Cumsum, Logical, Maximum, Minimum, Reduce, Where
from ..steps.positions import Alibi, RelativeBias, RelativePositionBias, Rope
from ..steps.products import Bmm, Matmul
from ..steps.projection import Linear
from ..steps.routing import Gather, Moe, Scatter, Topk
from .graph import Node, Out

#: a kind's cost function: (step, its inputs' metas in the kernel's order, its records' metas) -> number
Cost = Callable[[object, list[Meta], list[Meta]], int]
_FLOPS: dict[type, Cost] = {}
_WORKSPACE: dict[type, Cost] = {}
_KEPT: dict[type, Cost] = {}


def flops(step: object, ins: list[Meta], outs: tuple[Out, ...]) -> int:
    """The FLOPs of a step's kernel from its records (0 for a kind without a formula): the shape
    pass counts them as it makes the node."""
    cost = _FLOPS.get(type(step))
    return cost(step, ins, [out.meta for out in outs]) if cost else 0


def workspace(node: Node, ins: list[Meta]) -> int:
    """Bytes the node's kernel allocates besides its records and frees before it returns."""
    cost = _WORKSPACE.get(type(node.step))
    return cost(node.step, ins, [out.meta for out in node.outs]) if cost else 0


def kept(node: Node, ins: list[Meta]) -> int:
    """Bytes the node's kernel makes on its first run and keeps for later ones (a small mask
    pattern, as a model keeps its mask buffer): alive from the step to the end of the run."""
    cost = _KEPT.get(type(node.step))
    return cost(node.step, ins, [out.meta for out in node.outs]) if cost else 0


def _counts(table: dict[type, Cost], *kinds: type):
    def register(cost: Cost) -> Cost:
        for kind in kinds:
            table[kind] = cost
        return cost

    return register


# ---------------------------------------------------------------- matrix products


def merge_copy_bytes(meta: Meta, sizes: tuple[int, ...], merged: int, swap_last: bool = False) -> int:
    """Bytes torch allocates to reshape ``meta`` (its last two dims swapped with ``swap_last``),
    expanded to ``sizes``, with its first ``merged`` dims flattened into one: 0 when that is a
    view, a full copy when it is not (a broadcast dim has stride 0 and never merges with a real one)."""
    have, stride = list(meta.sizes), list(meta.stride)
    if swap_last:
        have[-2:], stride[-2:] = have[:-3:-1], stride[:-3:-1]
    pad = len(sizes) - len(have)
    strides = [0] * pad + [st if n == want else 0 for st, n, want in zip(stride, have, sizes[pad:])]
    kept = [(n, st) for n, st in zip(sizes[:merged], strides[:merged]) if n != 1]
    if all(outer == inner * n for (_, outer), (n, inner) in zip(kept, kept[1:])):
        return 0
    return math.prod(sizes) * DTYPE_BYTES[meta.dtype]


@_counts(_FLOPS, Matmul)
def _matmul_flops(step, ins, outs):
    a, b = ins
    if len(b.shape) == 1:
        return 0  # torch runs aten.dot / aten.mv for a vector on the right: FlopCounterMode counts neither
    return 2 * outs[-1].numel * a.sizes[-1]


@_counts(_WORKSPACE, Matmul)
def _matmul_workspace(step, ins, outs):
    """torch.matmul folds a batched operand times a matrix or a vector into one mm when flattening
    its leading dims is a view; otherwise it expands both operands to the broadcast batch and
    reshapes them to 3-d for bmm, and each reshape that cannot be a view copies (a (B, 1, N, K) @
    (1, H, K, M) copies both at B x H; a vector, or a matrix spread over the batch, never copies)."""
    a, b = ins
    if len(a.shape) < 3 and len(b.shape) < 3 or _folds(a, b):
        return 0
    batch = _broadcast_sizes(a.sizes[:-2], b.sizes[:-2])
    return sum(merge_copy_bytes(m, batch + m.sizes[-2:], len(batch)) for m in (a, b) if len(m.shape) >= 2)


def _folds(a: Meta, b: Meta) -> bool:
    """torch's ``should_fold``: the operand with more dims (b transposed when it is b, and never
    under a matrix on the left) has at least 3, the other at most 2, and its leading dims
    flatten into rows without a copy (strictly: a size-1 dim's stride counts too)."""
    if len(a.shape) >= len(b.shape):
        sizes, stride, other = a.sizes, a.stride, len(b.shape)
    elif len(a.shape) == 2:
        return False
    else:
        sizes, stride, other = b.sizes[:-2] + b.sizes[:-3:-1], b.stride[:-2] + b.stride[:-3:-1], len(a.shape)
    if len(sizes) < 3 or other > 2:
        return False
    return 0 in sizes or all(stride[i] == stride[i + 1] * sizes[i + 1] for i in range(len(sizes) - 2))


def _broadcast_sizes(a: tuple[int, ...], b: tuple[int, ...]) -> tuple[int, ...]:
    width = max(len(a), len(b))
    a, b = (1,) * (width - len(a)) + a, (1,) * (width - len(b)) + b
    return tuple(y if x == 1 else x for x, y in zip(a, b))


@_counts(_FLOPS, Bmm)
def _bmm_flops(step, ins, outs):
    return 2 * outs[-1].numel * ins[0].sizes[2]


@_counts(_FLOPS, Linear)
def _linear_flops(step, ins, outs):
    return 2 * outs[-1].numel * ins[0].sizes[-1]  # the bias add is elementwise: not counted


@_counts(_WORKSPACE, Linear)
def _linear_workspace(step, ins, outs):
    """What torch.matmul copies (an input whose leading dims neither flatten into rows nor into one
    batch dim, a transposed batch), and the product the bias is added to: F.linear adds it inside
    the product (addmm) for a matrix or a contiguous input only, and ``x @ W + b`` never. (Other
    inputs get the bias in place, but out of place under a dispatch mode such as
    ``tests/measure.py``'s meter: counting the product keeps both measurements bounded.)"""
    x, w = ins[0], ins[1]
    product = _matmul_workspace(step, [x, w], outs)  # a 2-d weight never copies, transposed or not
    fused = step.layout == "out_in" and (len(x.shape) == 2 or x.contiguous)
    return product + (outs[-1].nbytes if step.bias and not fused else 0)


@_counts(_FLOPS, Conv1d, Conv2d)
def _conv_flops(step, ins, outs):
    """Every output element is a dot product over its group's input channels and the kernel taps
    (the bias add is not counted, as for linear)."""
    weight = ins[1]
    return 2 * outs[-1].numel * math.prod(weight.sizes[1:])


@_counts(_WORKSPACE, Conv1d, Conv2d)
def _conv_workspace(step, ins, outs):
    """oneDNN (float32, most shapes) reorders the input, the weight and the output into its blocked
    layouts, a copy of each; torch's own kernel (other dtypes without oneDNN support on this CPU,
    one small image) unfolds the whole batch into columns, one row of C_in x kernel taps per
    output position. ``padding: same`` with an even kernel pads a copy of the input first."""
    x, weight, out = ins[0], ins[1], outs[-1]
    total = x.nbytes + weight.nbytes + out.nbytes
    if step.padding == "same" and any(k % 2 == 0 for k in weight.sizes[2:]):
        total += x.nbytes
    if not _takes_onednn(step, x, weight):
        spatial = len(weight.sizes) - 2
        positions = math.prod(out.sizes[: -spatial - 1]) * math.prod(out.sizes[-spatial:])
        total += positions * x.sizes[-spatial - 1] * math.prod(weight.sizes[2:]) * DTYPE_BYTES[x.dtype]
    return total


def _takes_onednn(step, x: Meta, weight: Meta) -> bool:
    """torch's ``use_mkldnn`` for a CPU tensor, as far as it can be known without the CPU's ISA
    (half and bfloat16 count as not: an upper bound where the CPU supports them)."""
    if x.dtype != "float32":
        return False
    batch = x.sizes[0] if len(x.sizes) == len(weight.sizes) else 1
    large_kernel = all(k > 3 for k in weight.sizes[2:]) and len(weight.sizes) == 4
    return step.groups > 1 or large_kernel or batch > 1 or x.numel > 20480


@_counts(_FLOPS, Moe)
def _moe_flops(step, ins, outs):
    """Each token's K experts, two products each (gate and up together, then down): 2·(2F·d + d·F)
    per token and expert (2·(F·d + d·F) ungated), whatever the router chose (a token takes an
    expert at most once). Bias adds are elementwise: not counted."""
    d, f, pieces = step.widths(ins)
    return 2 * ins[1].numel * (pieces * f * d + d * f)


@_counts(_WORKSPACE, Moe)
def _moe_workspace(step, ins, outs):
    """At most every token goes to one expert: its tokens, the gate-and-up product, the activated
    gate and the gated product alive together (GPT-OSS's clamped SwiGLU and ``x @ W + b`` more), and the previous expert's weighted output (at most
    every token's too), beside the (rank, token) indices, their contiguous copies and the weights
    they pick; then the expert's output times the weights and its cast."""
    x, weights = ins[0], ins[1]
    tokens = math.prod(x.sizes[:-1])
    d, f, pieces = step.widths(ins)
    item, weight_item = DTYPE_BYTES[x.dtype], DTYPE_BYTES[weights.dtype]
    # GPT-OSS's clamps, sigmoid and products, and x @ W before its bias is added, are more of them
    extra = (4 * f if step.activation == "clamped_swiglu" else 0) + (pieces * f + d if step.layout == "in_out" else 0)
    inside = tokens * (2 * d + 4 * f + extra) * item
    after = tokens * d * (2 * item + max(item, weight_item))
    copies = sum(dense_copy(meta) for meta in ins[:3])  # reshaped to (N, …) rows: a copy unless contiguous
    # where's (rank, token), the index copies that indexing and index_add_ make, the picked weights
    indices = tokens * (48 + weights.sizes[-1] + weight_item) + 16 * ins[3].sizes[0] + 64
    return max(inside, after) + indices + copies


@_counts(_WORKSPACE, Topk)
def _topk_workspace(step, ins, outs):
    """Each thread sorts one slice at a time as (value, int64 index) pairs; ``normalize`` adds the
    raw values and their sums (one per slice: the k entries summed, 0 when k is 0)."""
    x, values = ins[0], outs[0]
    dim = step.dim % len(x.sizes)
    total = 2 * x.sizes[dim] * (DTYPE_BYTES[x.dtype] + 8) * usable_cpus()
    if step.normalize:
        total += values.nbytes + math.prod(values.sizes[:dim] + values.sizes[dim + 1 :]) * DTYPE_BYTES[x.dtype]
    return total


@_counts(_WORKSPACE, Gather, Scatter)
def _indexing_workspace(step, ins, outs):
    """The index's smallest and largest entries (0-d int64), read to say which index is outside
    the dim before torch would fail, and a scattered value wrapped as a 0-d tensor."""
    return 16 + DTYPE_BYTES[ins[0].dtype]


@_counts(_FLOPS, Einsum)
def _einsum_flops(step, ins, outs):
    """torch.einsum contracts left to right, one pair at a time: a letter no later term or the
    output needs is summed away first (free), a pair with a shared letter to contract is one bmm
    (2 × the product of its letters' sizes), one without is an elementwise product (0)."""
    terms, output = parse_equation(step.equation, len(ins))
    sizes = _letter_sizes(terms, ins)
    later = [set(step.output_term(terms, output))]
    for term in reversed(terms[1:]):
        later.insert(0, later[0] | set(term))
    total, left = 0, set(terms[0])
    for term, needed in zip(terms[1:], later[1:]):
        right = set(term)
        left, right = {c for c in left if c in right or c in needed}, {c for c in right if c in left or c in needed}
        contracted = (left & right) - needed
        if contracted:
            total += 2 * math.prod(sizes[c] for c in left | right)
        left = (left | right) - contracted
    return total


@_counts(_WORKSPACE, Einsum)
def _einsum_workspace(step, ins, outs):
    """torch.einsum's own path (the kernel turns opt_einsum off, so it is always this one): a
    letter only one operand has and the output does not is summed out of that operand first; then
    the operands are contracted left to right, one pair at a time, each pair's operands copied into
    the layout of a batched product (at most their dense size) beside its result, which keeps every
    letter a later operand or the output needs (``ab,cd,ac->bd`` makes the n⁴ ``abcd`` first). The
    raw result then lives on while the step copies it into its output."""
    terms, output = parse_equation(step.equation, len(ins))
    sizes, item = _letter_sizes(terms, ins), DTYPE_BYTES[ins[0].dtype]
    out_letters = set(step.output_term(terms, output))

    def nbytes(letters) -> int:
        return item * math.prod(sizes[c] for c in letters)

    operands, alive = [], 0  # (letters, bytes it holds as a new tensor: 0 for an input's view)
    for term in terms:
        letters = set(term)
        lonely = {c for c in letters if c not in out_letters and sum(c in t for t in terms) == 1}
        held = nbytes(letters - lonely) if lonely else 0
        operands.append((letters - lonely, held))
        alive += held
    peak, (left, left_held) = alive, operands[0]
    for j, (right, right_held) in enumerate(operands[1:], start=1):
        needed = out_letters.union(*(letters for letters, _ in operands[j + 1 :]))
        result = (left | right) & needed
        peak = max(peak, alive + nbytes(left) + nbytes(right) + nbytes(result) - outs[-1].nbytes)
        alive += nbytes(result) - left_held - right_held
        left, left_held = result, nbytes(result)
    return max(peak, alive)


def _letter_sizes(terms: list[str], ins: list[Meta]) -> dict[str, int]:
    """Each letter's size after broadcasting; ``.`` stands for all the ``...`` dims together."""
    sizes: dict[str, int] = {}
    ellipsis: list[int] = []  # the broadcast '...' dims, right-aligned
    for term, meta in zip(terms, ins):
        lead = len(meta.sizes) - len(term) + 1
        at = 0
        for letter in term:
            if letter == ".":
                dims = list(meta.sizes[at : at + lead])
                width = max(len(dims), len(ellipsis))
                dims, ellipsis = [1] * (width - len(dims)) + dims, [1] * (width - len(ellipsis)) + ellipsis
                ellipsis = [max(a, b) for a, b in zip(ellipsis, dims)]
                at += lead
            else:
                sizes[letter] = max(sizes.get(letter, 1), meta.sizes[at])
                at += 1
    sizes["."] = math.prod(ellipsis)
    return sizes


# ---------------------------------------------------------------- attention


@_counts(_FLOPS, Sdpa)
def _sdpa_flops(step, ins, outs):
    """torch's count for its attention kernels: q @ k^T and weights @ v (GQA shares kv heads, not work)."""
    q, key, v = ins[:3]
    pairs = math.prod(q.sizes[:-1]) * key.sizes[-2]  # (query, key) pairs over every batch and head
    return 2 * pairs * (q.sizes[-1] + v.sizes[-1])


@_counts(_WORKSPACE, Sdpa)
def _sdpa_workspace(step, ins, outs):
    """With torch's CPU flash kernel, small next to the (T_q, T_kv) scores it never stores: the
    float32 log-sum-exp per query, and an explicit mask (the causal pattern and its bool/float
    conversions). On the math path (``Sdpa.takes_math_path``) the scores and more."""
    q, key = ins[0], ins[1]
    if step.takes_math_path(ins):
        return _sdpa_math_workspace(ins, outs[-1])
    t_q, t_k = q.sizes[-2], key.sizes[-2]
    total = max(4, DTYPE_BYTES[q.dtype]) * q.numel // max(q.sizes[-1], 1)  # float64 q: a float64 log-sum-exp
    total += _flash_buffers(q, key, ins[2])
    mask = ins[3] if len(ins) > 3 else None
    pattern = step.causal and not step.is_causal_flag(t_q == t_k)
    if pattern:
        total += 24 * t_q + 16 * t_k + 5 * t_q * t_k  # int64 positions, the shifted queries too
    if mask is not None or pattern:
        elements = max(mask.numel if mask is not None else 0, t_q * t_k)
        total += 6 * elements  # bool conversions, and SDPA's additive float copy
    return total


def _flash_buffers(q: Meta, k: Meta, v: Meta) -> int:
    """The CPU flash kernel's buffers, one set per thread (FlashAttentionKernel.cpp): a block of
    scores (q_split x kv_split), the row maxima and sums, and an output block, in the accumulation
    dtype (float32 for narrower dtypes), plus their narrow copies. Threads: the CPUs this process
    may use, which bounds torch's default thread count."""
    t_q, t_k, head = q.sizes[-2], k.sizes[-2], max(q.sizes[-1], v.sizes[-1])
    q_split = min(256 if t_q >= 768 else 64 if t_q >= 192 else 32, t_q)
    kv_split = min(512, t_k)
    acc = max(4, DTYPE_BYTES[q.dtype])
    per_thread = acc * (q_split * kv_split + 2 * q_split + q_split * head)
    if DTYPE_BYTES[q.dtype] < 4:
        per_thread += DTYPE_BYTES[q.dtype] * q_split * kv_split
    return per_thread * usable_cpus()


def usable_cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def _sdpa_math_workspace(ins: list[Meta], out: Meta) -> int:
    """The math path: q, k, v in float32 (k and v spread over the query heads with gqa),
    scaled, the (…, T_q, T_kv) scores, the mask added, the weights, the causal pattern and the
    mask as numbers (with no keys or queries: zeros and a few 0-d sums)."""
    q, k, v = ins[:3]
    acc = max(4, DTYPE_BYTES[q.dtype])
    batch = out.numel // (out.sizes[-2] * out.sizes[-1]) if out.sizes[-2] * out.sizes[-1] else 0
    t_q, t_k = q.sizes[-2], k.sizes[-2]
    spread = batch * t_k * (k.sizes[-1] + v.sizes[-1])
    scores = batch * t_q * t_k
    operands = 2 * (q.numel + k.numel + v.numel + spread) + out.numel
    return acc * (operands + 4 * scores) + 9 * scores + 16 * (t_q + t_k) + 64


@_counts(_WORKSPACE, Mask)
def _mask_workspace(step, ins, outs):
    """The bool masks the kernel builds and drops within the step: the position pattern (from two
    int64 ranges: causal, a window's or band's shifted ranges and comparisons, a chunk's divided
    ranges), the documents' (B, T, T) comparison, the mask tensor as bool and inverted, and the
    pattern ORed with each."""
    t_q, t_k = ins[0].sizes[-2:]
    scores, total = t_q * t_k, 0
    if step.positional():
        # the query range and its shifted copy, then the shifted one, the key range and the pattern
        total += max(16 * t_q, 8 * (t_q + t_k) + scores)
        total += 0 if step.window is None else (8 * t_q + 2 * scores) * (1 if step.causal else 2)
        total += 0 if step.chunk is None else 8 * (t_q + t_k) + 2 * scores
    if step.segments is not None:
        total += math.prod(ins[-1].sizes[:-1]) * scores
    if step.mask is not None:
        mask = ins[1]
        total += mask.numel * ((mask.dtype != "bool") + (step.polarity == "keep"))
    parts = step.positional() + (step.segments is not None) + (step.mask is not None)
    return total + (parts - 1) * outs[-1].numel - _mask_kept(step, ins, outs)  # each OR of two patterns


@_counts(_KEPT, Mask)
def _mask_kept(step, ins, outs):
    """The position pattern of a small mask: kept, not freed (it is counted from the step on)."""
    scores = ins[0].sizes[-2] * ins[0].sizes[-1]
    return scores if step.positional() and scores <= KEPT_PATTERN else 0


@_counts(_WORKSPACE, Softcap)
def _softcap_workspace(step, ins, outs):
    """x / cap and its tanh, alive together while tanh runs."""
    return 2 * ins[0].nbytes


@_counts(_WORKSPACE, Dropout)
def _dropout_workspace(step, ins, outs):
    """The noise tensor (or the 0-d zero for p = 1) that training dropout multiplies by."""
    x = ins[0]
    if not step.training or step.p == 0 or x.numel == 0:
        return 0
    return DTYPE_BYTES[x.dtype] * (1 if step.p == 1 else x.numel)


@_counts(_WORKSPACE, Rope)
def _rope_workspace(step, ins, outs):
    """The kernel's temporaries: the float32 frequency tables, and x_rot * cos, the rotation
    and rotation * sin alive together with their sum; a partial rotary's cat then makes the
    output while the rotation and the rotated part are still alive. Scaled frequencies add the
    cos and sin multiplied by the attention factor and the scaling's own (R/2,) temporaries."""
    x, rot = ins[0], outs[0].sizes[-1]
    rows = math.prod(outs[0].sizes[:-1])  # positions: T, or B * T for (B, T) positions
    head = x.sizes[-1]
    part = x.nbytes // head * rot if head else 0
    tables = 14 * rows * rot + 8 * rot + 16 * rows  # int64 ranges, float32 freqs, emb, cos, sin
    tables += 0 if step.rope_scaling is None else 8 * rows * rot + 64 * rot + 256
    return tables + (3 * part if rot == head else max(4 * part - x.nbytes, 2 * part))


@_counts(_WORKSPACE, Alibi)
def _alibi_workspace(step, ins, outs):
    """Slopes (a 0-d base, int32 exponents and their powers, joined when the head count is not a
    power of two) and key positions (int64), the relative distances, and a float32 bias before
    its cast to a narrower dtype."""
    heads, t_q, t_k = ins[0].sizes[-3:]
    total = 8 * t_k + 16 * heads + 8
    if step.relative:
        total += 8 * t_q * t_k + 8 * t_q
    bias = outs[0]
    return total + (4 * bias.numel if bias.dtype != "float32" else 0)


# ---------------------------------------------------------------- promotion: an input in another dtype is copied first


def _cast_copies(ins: list[Meta], dtype: str) -> int:
    """torch's CPU kernels convert an operand of another dtype than the one they compute in to a
    whole temporary copy before they run (a bool summed in int64, an int64 tensor in a float op)."""
    return sum(m.numel * DTYPE_BYTES[dtype] for m in ins if m.dtype != dtype)


@_counts(_WORKSPACE, *MATH_KINDS, Clamp, Minimum, Maximum, Cumsum)
def _computed_in_result_dtype(step, ins, outs):
    return _cast_copies(ins, outs[-1].dtype)


@_counts(_WORKSPACE, Where)
def _where_workspace(step, ins, outs):
    """The branches are converted to the result's dtype (a number to a 0-d tensor); the bool
    condition is read as it is."""
    numbers = (step.then is not None) + (step.otherwise is not None)
    return _cast_copies(ins[1:], outs[-1].dtype) + numbers * DTYPE_BYTES[outs[-1].dtype]


@_counts(_WORKSPACE, Compare, Logical)
def _computed_in_common_dtype(step, ins, outs):
    """Two operands are compared in their promoted dtype; a bool out is no copy."""
    return _cast_copies(ins, promote(ins)) if len(ins) == 2 else 0


@_counts(_WORKSPACE, Reduce)
def _reduce_workspace(step, ins, outs):
    """Integers and bools are summed and multiplied in int64; any and all read a non-bool input as bool."""
    x = ins[0]
    if step.fn in ("any", "all"):
        return x.numel if x.dtype != "bool" else 0
    return _cast_copies(ins, outs[-1].dtype) if step.fn in ("sum", "prod") else 0


@_counts(_WORKSPACE, RelativeBias, RelativePositionBias)
def _relative_bias_workspace(step, ins, outs):
    """T5's bucket arithmetic over (T_q, T_kv) pairs: at its widest, the int64 distances, the
    buckets so far, the bool masks and a float32 and an int64 intermediate of the logarithm are
    alive together (measured: 24 to 35 bytes a pair besides the records), after the positions
    (an arange and its shift for the queries, one for the keys)."""
    t_q, t_k = outs[0].sizes  # the buckets' (T_q, T_kv)
    return 36 * t_q * t_k + 16 * (t_q + t_k)


# ---------------------------------------------------------------- normalisation


def dense_copy(meta: Meta) -> int:
    """Bytes of the dense copy a kernel makes of an input that is not contiguous (a transposed or
    an expanded tensor): CPU softmax and layer_norm call ``contiguous()`` on their input first."""
    return 0 if meta.contiguous else meta.nbytes


@_counts(_WORKSPACE, Softmax)
def _softmax_workspace(step, ins, outs):
    """The dense copy of a non-contiguous input (host_softmax reads contiguous rows)."""
    return dense_copy(ins[0])


@_counts(_WORKSPACE, LayerNorm)
def _layernorm_workspace(step, ins, outs):
    """native_layer_norm also returns each row's mean and 1/std (in float32 at least), and reads a
    dense copy of a non-contiguous input; per-head params apply after it, to a normalised copy
    (and, with both, to the scaled one). Nemotron's unit offset also makes weight + 1."""
    x = ins[0]
    after = len(ins) - 1 if step.per_head(ins) else 0
    offset = ins[1].nbytes if step.unit_offset else 0
    return 2 * math.prod(x.sizes[:-1]) * max(4, DTYPE_BYTES[x.dtype]) + dense_copy(x) + after * x.nbytes + offset


@_counts(_WORKSPACE, RMSNorm)
def _rmsnorm_workspace(step, ins, outs):
    """h.pow(2) and the normalised h beside the output, in float32; for another dtype also the
    float32 copy of x, which lives while the squares or the normalised h are made, or the cast of
    h back beside it (as wide as x) that the weight multiplies; and the (…, 1) mean-square columns.
    Gemma's unit offset also makes 1 + weight in float32 (after a float32 copy of another dtype)."""
    x = ins[0]
    n, rows = x.numel, math.prod(x.sizes[:-1])  # rows: the (…, 1) columns exist for an empty last dim too
    converted = max(4 * n, x.nbytes) if x.dtype != "float32" else 0
    offset = 4 * ins[1].numel * (1 + (ins[1].dtype != "float32")) if step.unit_offset else 0
    return 4 * n + converted + 12 * rows + offset
