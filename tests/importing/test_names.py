"""Step names and comments a person would write: a Linear keeps its module path even where the
line assigns a variable of that name (``down_proj = self.down_proj(a * b)``: the product is not
the Linear), GQA's repeated keys and values are named after them, and a leaf module's step is
commented with the line that called it, not with torch's ``linear.py`` line."""

import inspect

import pytest
import torch
import yaml
from torch import nn
from torch.nn import functional as F

import tracer
from tracer.importing import difference, from_module

B, T, D, H, H_KV = 2, 5, 16, 4, 2


class Mlp(nn.Module):
    """Llama's MLP as modeling_llama.py writes it."""

    def __init__(self):
        super().__init__()
        self.gate_proj, self.up_proj, self.down_proj = (
            nn.Linear(D, 24, bias=False),
            nn.Linear(D, 24, bias=False),
            nn.Linear(24, D, bias=False),
        )

    def forward(self, x):
        down_proj = self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))
        return down_proj


def repeat_kv(hidden_states, n_rep):
    batch, num_key_value_heads, slen, head_dim = hidden_states.shape
    hidden_states = hidden_states[:, :, None, :, :].expand(batch, num_key_value_heads, n_rep, slen, head_dim)
    return hidden_states.reshape(batch, num_key_value_heads * n_rep, slen, head_dim)


class Attention(nn.Module):
    """Grouped-query attention with transformers' repeat_kv, then the MLP."""

    def __init__(self):
        super().__init__()
        self.q_proj, self.k_proj, self.v_proj = nn.Linear(D, D), nn.Linear(D, D // H * H_KV), nn.Linear(D, D // H * H_KV)
        self.o_proj, self.mlp = nn.Linear(D, D), Mlp()

    def forward(self, x):
        b, t, _ = x.shape
        q = self.q_proj(x).view(b, t, H, -1).transpose(1, 2)
        key_states = self.k_proj(x).view(b, t, H_KV, -1).transpose(1, 2)
        value_states = self.v_proj(x).view(b, t, H_KV, -1).transpose(1, 2)
        key_states = repeat_kv(key_states, H // H_KV)
        value_states = repeat_kv(value_states, H // H_KV)
        context = F.scaled_dot_product_attention(q, key_states, value_states, is_causal=True)
        attn_output = self.o_proj(context.transpose(1, 2).reshape(b, t, D))
        return self.mlp(x + attn_output)


def _commented_steps(text: str) -> dict[str, str]:
    """step id -> the comment line above it (the one above the step's group)."""
    found, comment = {}, None
    for line in text.split("steps:")[1].splitlines():
        if line.lstrip().startswith("#"):
            comment = line.strip()
        elif line.lstrip().startswith("- {"):
            found[yaml.safe_load(line.strip()[2:])["id"]] = comment
    return found


def _line_of(function, start: str) -> int:
    lines, first = inspect.getsourcelines(function)
    return first + next(i for i, line in enumerate(lines) if line.strip().startswith(start))


def test_linears_keep_their_path_repeats_name_their_source_and_comments_are_the_calling_line():
    torch.manual_seed(0)
    module, x = Attention().eval(), torch.randn(B, T, D)
    pipeline = from_module(module, x)
    assert difference(pipeline, module, x) <= 1e-5
    text = pipeline.to_yaml()
    steps = {s["id"]: s for s in yaml.safe_load(text)["steps"]}
    assert steps["mlp.down_proj"]["op"] == "linear" and steps["mlp.down_proj_mul"]["op"] == "mul"
    repeated = {s["input"]: s["id"] for s in steps.values() if s["op"] == "repeat_interleave"}
    assert repeated == {"key_states": "key_states_repeated", "value_states": "value_states_repeated"}
    comments = _commented_steps(text)
    q_line, down_line = _line_of(Attention.forward, "q = "), _line_of(Mlp.forward, "down_proj = ")
    assert comments["q_proj"] == f"# test_names.py:{q_line}: q = self.q_proj(x).view(b, t, H, -1).transpose(1, 2)"
    assert (
        comments["mlp.down_proj_mul"]
        == f"# test_names.py:{down_line}: down_proj = self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))"
    )
    assert not any("linear.py" in (c or "") for c in comments.values())


def test_a_module_whose_sizes_are_all_literals_imports_without_dims_and_a_reshape_is_no_merge():
    class Fixed(nn.Module):
        def forward(self, x):
            return x.view(1, 5, 4, 4).transpose(1, 2).reshape(1, 5, 16)  # sizes written as numbers

    x = torch.randn(1, 1, 80)  # axes of 1 are no batch or sequence: no size to follow, no dims at all
    pipeline = from_module(Fixed(), x)
    assert difference(pipeline, Fixed(), x) <= 1e-6
    assert "\ndims:" not in pipeline.to_yaml() and "merge" not in pipeline.to_yaml()


def test_an_unmapped_op_in_a_leaf_module_is_reported_at_the_line_that_called_it():
    class Activated(nn.Module):
        def __init__(self):
            super().__init__()
            self.act = nn.PReLU()

        def forward(self, x):
            return self.act(x) + 1

    with pytest.raises(tracer.TracerError) as caught:
        from_module(Activated(), torch.randn(B, T, D))
    (problem,) = caught.value.diagnostics
    assert problem.file.endswith("test_names.py") and problem.position.line == _line_of(Activated.forward, "return self.act")
    assert "prelu" in problem.message and "return self.act(x) + 1" in problem.message
