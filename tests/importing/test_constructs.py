"""Constructs beyond the idioms of Llama and GPT-2, each in a small plain-torch module: bool masks
made by casting or inverting, ``repeat`` and ``stack``, sliding-window and band masks, Gemma's
powers and RMSNorm, and ``x @ W + b``. Each imports to the step a person would write, runs equal
to the module on its weights and checks clean under ``--strict``."""

import math

import pytest
import torch
import yaml
from torch import nn
from torch.nn import functional as F

import tracer
from tracer.importing import difference, from_module

B, T, D, W = 2, 7, 16, 3


def _steps(pipeline) -> list[dict]:
    return yaml.safe_load(pipeline.to_yaml())["steps"]


def _imported(module, *args) -> list[dict]:
    """The steps of the module's import, after checking it runs equal and is clean under --strict."""
    torch.manual_seed(1)
    pipeline = from_module(module, *args)
    assert difference(pipeline, module, *args) <= 1e-5
    assert [str(d) for d in pipeline.check().diagnostics if d.severity in ("error", "warning")] == []
    return _steps(pipeline)


class PaddingByCast(nn.Module):
    """A 0/1 padding mask made bool by ``.to(torch.bool)`` and inverted: ``masked_fill(~keep, ...)``."""

    def forward(self, x, attention_mask):
        keep = attention_mask[:, None, None, :].to(torch.bool)
        scores = x @ x.transpose(-1, -2)
        return F.softmax(scores.masked_fill(~keep, torch.finfo(scores.dtype).min), dim=-1)


def test_a_mask_made_bool_by_a_cast_and_inverted_is_a_keep_mask():
    mask = torch.ones(B, T, dtype=torch.long)
    mask[1, 4:] = 0
    steps = _imported(PaddingByCast(), torch.randn(B, 1, T, D), mask)
    (masked,) = [s for s in steps if s["op"] == "mask"]
    assert masked["polarity"] == "keep" and masked["fill"] == "min" and "causal" not in masked
    # the step reads an integer mask as .bool() itself (what `tracer export` writes back): no cast step
    assert not [s for s in steps if s["op"] == "cast"]
    assert masked["mask"] != "attention_mask" and any(s["id"] == masked["mask"] for s in steps)


class RepeatAndStack(nn.Module):
    def forward(self, x):
        both = torch.stack((x, x.sigmoid()), dim=1)  # (B, 2, T, D)
        return both.repeat(1, 1, 2, 1)  # (B, 2, 2T, D)


def test_repeat_and_stack_import_as_their_steps():
    steps = _imported(RepeatAndStack(), torch.randn(B, T, D))
    assert [s["op"] for s in steps] == ["sigmoid", "stack", "repeat"]
    assert steps[1]["dim"] == 1 and steps[2]["repeats"] == [1, 1, 2, 1]


class SlidingWindow(nn.Module):
    """Mistral's mask as triangles: keys after the query (``triu(1)``) or ``window`` or more behind (``tril(-W)``)."""

    sliding_window = W

    def forward(self, scores):
        t = scores.shape[-1]
        ones = torch.ones(t, t, dtype=torch.bool, device=scores.device)
        return scores.masked_fill(ones.triu(1) | ones.tril(-self.sliding_window), float("-inf"))


class Band(nn.Module):
    """ModernBERT's local attention as comparisons: keys ``window`` or more away on either side."""

    def forward(self, scores):
        positions = torch.arange(scores.shape[-1], device=scores.device)
        far = (positions[None, :] - positions[:, None]).abs() >= W
        return scores.masked_fill(far, torch.finfo(scores.dtype).min)


class Chunked(nn.Module):
    """Llama 4's chunked attention: causal within chunks of ``attention_chunk_size`` keys."""

    attention_chunk_size = W

    def forward(self, scores):
        positions = torch.arange(scores.shape[-1], device=scores.device)
        other_chunk = positions[None, :] // self.attention_chunk_size != positions[:, None] // self.attention_chunk_size
        return scores.masked_fill(torch.ones_like(other_chunk).triu(1) | other_chunk, float("-inf"))


@pytest.mark.parametrize(
    ("module", "pattern"),
    [
        (SlidingWindow(), {"causal": True, "window": "W", "fill": -math.inf}),
        (Band(), {"window": W, "fill": "min"}),
        (Chunked(), {"causal": True, "chunk": "C", "fill": -math.inf}),
    ],
)
def test_a_sliding_window_a_band_or_chunks_are_a_mask_with_that_pattern(module, pattern):
    (step,) = _imported(module, torch.randn(B, 2, T, T))
    assert step["op"] == "mask" and {k: step[k] for k in pattern} == pattern
    assert set(step) - set(pattern) == {"id", "op", "input"}


def test_a_constant_mask_of_no_pattern_is_a_located_report_not_a_guess():
    class Scattered(nn.Module):
        def forward(self, scores):
            return scores.masked_fill(torch.eye(scores.shape[-1], dtype=torch.bool).roll(2, 0), 0.0)

    with pytest.raises(tracer.TracerError) as caught:
        from_module(Scattered(), torch.randn(B, T, T))
    assert "test_constructs.py" in str(caught.value) and "not a causal, sliding-window or band pattern" in str(caught.value)


class InterleavedRope(nn.Module):
    """GPT-J's rotary embedding on (B, T, H, Dh): pairs (2i, 2i + 1), each frequency repeated in place."""

    def forward(self, x):
        inv_freq = 1.0 / 10000.0 ** (torch.arange(0, x.shape[-1], 2, dtype=torch.float32) / x.shape[-1])
        angles = (torch.arange(x.shape[1], dtype=torch.float32)[:, None] * inv_freq).repeat_interleave(2, dim=-1)
        cos, sin = angles.cos()[None, :, None, :], angles.sin()[None, :, None, :]
        return x * cos + torch.stack((-x[..., 1::2], x[..., ::2]), dim=-1).flatten(-2) * sin


def test_interleaved_rope_on_the_sequence_axis_of_b_t_h_dh_is_one_rope_step():
    (step,) = _imported(InterleavedRope(), torch.randn(B, T, 2, 8))
    assert step == {**step, "op": "rope", "theta": 10000.0, "style": "interleaved", "seq_dim": -3}


class GemmaPieces(nn.Module):
    """GemmaRMSNorm ((1 + weight) in float32), GELU-tanh written out with ``pow``, and powers."""

    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(D) * 0.1)

    def forward(self, x):
        h = x.float()
        h = (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6) * (1.0 + self.weight.float())).type_as(x)
        g = 0.5 * h * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (h + 0.044715 * torch.pow(h, 3.0))))
        return g.pow(2) + g.abs() ** 0.5 * g.exp() ** -0.5


def test_gemma_powers_import_as_square_sqrt_and_rsqrt_and_its_norm_with_a_unit_offset():
    steps = _imported(GemmaPieces(), torch.randn(B, T, D))
    assert steps[0]["op"] == "rmsnorm" and steps[0]["unit_offset"] is True
    assert steps[1] == {**steps[1], "op": "gelu", "approximate": "tanh"}
    ops = [s["op"] for s in steps]
    assert {"square", "sqrt", "rsqrt"} <= set(ops) and "pow" not in ops


class InOut(nn.Module):
    """Weights stored (in, out), as GPT-2's Conv1D and `tracer export` of ``layout: in_out`` write them."""

    def __init__(self):
        super().__init__()
        self.W, self.b, self.W_out = (nn.Parameter(torch.randn(*shape)) for shape in ((D, 2 * D), (2 * D,), (2 * D, D)))

    def forward(self, x):
        return F.relu(x @ self.W + self.b) @ self.W_out


def test_x_at_w_plus_b_is_a_linear_with_the_in_out_layout():
    steps = _imported(InOut(), torch.randn(B, T, D))
    assert [(s["op"], s.get("layout"), s.get("bias")) for s in steps] == [
        ("linear", "in_out", "b"),
        ("relu", None, None),
        ("linear", "in_out", None),
    ]


class EverydayOps(nn.Module):
    """Ops people run that map to steps: numbers as operands, unbind, flatten, cumsum position ids
    (RoBERTa's), roll, einsum, conv1d and conv2d, sign, diff, a cubic power and baddbmm."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv1d(D, D, 3, padding=1)
        self.patches = nn.Conv2d(1, 4, 2, stride=2)

    def forward(self, x, ids):
        q, k = torch.stack((x, x - 1), dim=0).unbind(0)
        scores = torch.einsum("btd,bsd->bts", q, k) * 0.25
        rolled = torch.roll(1.0 - scores.softmax(-1), 1, 2)
        framed = self.conv(x.transpose(1, 2)).transpose(1, 2) ** 3
        images = self.patches(x[:, None, :6, :]).flatten(2)
        positions = torch.cumsum(ids.ne(0).int(), dim=1) * ids.ne(0).int() + 1  # RoBERTa: padding_idx + 1 onwards
        steps = torch.diff(x.sign(), dim=1)
        biased = scores.baddbmm(q, k.transpose(1, 2), beta=1.0, alpha=0.5)  # Bloom's ALiBi scores
        return rolled @ framed, images, positions, steps, biased, x[:, [-1]], x[:, :, [2, 3]]


def test_numbers_unbind_flatten_cumsum_roll_einsum_conv_sign_diff_and_baddbmm_import_as_steps():
    ids = torch.randint(0, 5, (B, T))
    steps = _imported(EverydayOps(), torch.randn(B, T, D), ids)
    ops = {s["op"] for s in steps}
    assert {"unbind", "einsum", "roll", "conv1d", "conv2d", "cumsum", "sign", "diff", "pow", "reshape", "bmm"} <= ops, ops
    assert any(s["op"] == "scale" and s.get("multiply") == 0.5 for s in steps)  # baddbmm's alpha
    slices = [(s["dim"], s.get("start"), s["stop"]) for s in steps if s["op"] == "index" and s["input"] == "x"]
    assert (1, "T - 1", "T") in slices and (2, 2, 4) in slices, slices  # x[:, [-1]] and x[:, :, [2, 3]]: lists of positions
    numbers = {(s["op"], s.get("value"), s.get("value_first", False)) for s in steps if "value" in s and s["op"] != "compare"}
    assert {("sub", 1, False), ("sub", 1.0, True), ("add", 1, False)} <= numbers, numbers
    assert any(s["op"] == "scale" and s.get("multiply") == 0.25 for s in steps)


class TransposedWeight(nn.Module):
    """Falcon's ``FalconLinear``: ``x @ self.weight.T + self.bias``."""

    def __init__(self):
        super().__init__()
        self.weight, self.bias = nn.Parameter(torch.randn(8, D)), nn.Parameter(torch.randn(8))

    def forward(self, x):
        return x @ self.weight.T + self.bias


def test_x_at_a_transposed_param_is_a_plain_linear():
    (step,) = _imported(TransposedWeight(), torch.randn(B, T, D))
    assert step == {"id": step["id"], "op": "linear", "input": "x", "weight": "weight", "bias": "bias"}


class SmallestTwo(nn.Module):
    def forward(self, x):
        values, indices = torch.topk(x.softmax(-1), 2, dim=-1, largest=False)
        return values * 2.0, indices


def test_topk_imports_as_its_step_with_its_outputs_named_by_the_assignment():
    steps = _imported(SmallestTwo(), torch.randn(B, T, D))
    (route,) = [s for s in steps if s["op"] == "topk"]
    assert route["k"] == 2 and route["largest"] is False and route["outputs"] == ["values", "indices"]
    assert "normalize" not in route  # the values are doubled, not divided by their sum


class AdditiveMaskAttention(nn.Module):
    """Attention given an additive float mask (0 where a key is seen, a large negative number
    where it is hidden), passed to SDPA as its ``attn_mask``, as transformers' older masks are."""

    def forward(self, q, k, v, additive_mask):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=additive_mask)


@pytest.mark.parametrize("mask_shape", [(B, 1, 1, T), (B, 1, T, T)], ids=["padding", "per query"])
def test_a_float_mask_the_module_is_given_is_added_to_the_scores_by_the_sdpa(mask_shape):
    q, k, v = (torch.randn(B, 2, T, D) for _ in range(3))
    additive = torch.zeros(mask_shape)
    additive[1, ..., 4:] = torch.finfo(torch.float32).min  # the second sequence's last keys hidden
    (sdpa,) = [s for s in _imported(AdditiveMaskAttention(), q, k, v, additive) if s["op"] == "sdpa"]
    assert sdpa["mask"] == "additive_mask" and "polarity" not in sdpa
