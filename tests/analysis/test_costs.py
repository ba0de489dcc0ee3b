"""FLOPs and kernel workspaces per step kind (tracer.analysis.costs): FLOPs as torch's FlopCounterMode
counts them, workspaces as upper bounds of what the kernels allocate."""

import pytest

from tests.conftest import assert_flops_as_counted, pipeline_text


def _inputs(shapes) -> tuple[str, str]:
    names = [f"t{i}" for i in range(len(shapes))]
    return ", ".join(names), "\n".join(f"{n}: {{shape: {list(s)}, init: randn}}" for n, s in zip(names, shapes))


@pytest.mark.parametrize(
    "equation, shapes",
    [
        ("bij,bjk->bk", ([2, 3, 4], [2, 4, 5])),  # i is summed away before the product
        ("bij,bjk->ijk", ([2, 3, 4], [2, 4, 5])),  # b contracted, j a batch dim
        ("bij,bik->bijk", ([2, 3, 4], [2, 3, 5])),  # nothing to contract: an elementwise product, 0
        ("bij,bij->", ([2, 3, 4], [2, 3, 4])),
        ("bij,bjk,kl->bil", ([2, 3, 4], [2, 4, 5], [5, 6])),  # left to right, pair by pair
        ("...ij,jk->...ik", ([2, 1, 3, 4], [4, 5])),
        ("bij,xjk->bik", ([2, 3, 4], [1, 4, 5])),
        ("ij->ji", ([3, 4],)),
    ],
)
def test_einsum_flops_are_what_flop_counter_mode_counts(equation, shapes):
    names, inputs = _inputs(shapes)
    assert_flops_as_counted(pipeline_text(f"- {{id: e, op: einsum, inputs: [{names}], equation: '{equation}'}}", inputs=inputs))


@pytest.mark.parametrize("a, b", [([4], [4]), ([3, 4], [4]), ([4], [2, 4, 5]), ([3, 4], [2, 4, 5]), ([2, 1, 3, 4], [5, 4, 6])])
def test_matmul_flops_follow_the_kernel_torch_picks(a, b):
    names, inputs = _inputs([a, b])
    assert_flops_as_counted(pipeline_text(f"- {{id: y, op: matmul, inputs: [{names}]}}", inputs=inputs))


def test_sdpa_flops_with_grouped_heads_and_narrower_values():
    _, inputs = _inputs([[1, 4, 3, 8], [1, 2, 5, 8], [1, 2, 5, 4]])
    assert_flops_as_counted(pipeline_text("- {id: o, op: sdpa, inputs: [t0, t1, t2], gqa: true, causal: true}", inputs=inputs))
