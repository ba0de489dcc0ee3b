"""The idiom patterns (RMSNorm, RoPE, repeat_kv, GPT-2's GELU) are traced with make_fx's
pre-dispatch mode, in half torch.export's time: the graphs must be the ones torch.export
records, or the idioms would stop matching the captured modules."""

import functools

import torch

from tracer.importer import idioms


def _form(graph: torch.fx.Graph) -> list[tuple]:
    """Each node's op, target and arguments, nodes by position (placeholder names differ)."""
    position = {node: i for i, node in enumerate(graph.nodes)}
    return [
        (node.op, "" if node.op == "placeholder" else str(node.target), str(torch.fx.node.map_arg(node.args, lambda n: position[n])))
        for node in graph.nodes
    ]


def _all_patterns() -> list[torch.fx.Graph]:
    return [idioms._pattern.__wrapped__(index) for index in range(len(idioms.PATTERNS))]


def test_idiom_patterns_traced_with_make_fx_are_the_graphs_torch_export_records(monkeypatch):
    traced = _all_patterns()
    monkeypatch.setattr(idioms, "_traced", lambda module, example: torch.export.export(module, example, strict=False).graph_module.graph)
    exported = _all_patterns()
    assert [_form(graph) for graph in traced] == [_form(graph) for graph in exported]
    assert traced and all(len(graph.nodes) > 3 for graph in traced)
    # the op each pattern is traced for is one it holds: a graph without it cannot match
    assert all(needed in idioms._targets(graph) for (*_, needed), graph in zip(idioms.PATTERNS, traced, strict=True))


class _Gated(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(4, 4)

    def forward(self, x):
        return torch.tanh(self.proj(x)) * x


def test_a_pattern_is_traced_only_for_a_graph_that_holds_its_op(monkeypatch):
    """Tracing the eight patterns costs 0.1-0.26 s of CPU: an import of a module without RMSNorm,
    RoPE or repeat_kv traces none of theirs."""
    from tracer.importing import from_module

    monkeypatch.setattr(idioms, "_pattern", functools.cache(idioms._pattern.__wrapped__))  # a fresh cache
    pipeline = from_module(_Gated(), torch.randn(2, 3, 4))
    assert [s.op for s in pipeline.spec.steps] == ["linear", "tanh", "mul"]
    traced = {idioms.PATTERNS[i][0] for i in range(len(idioms.PATTERNS)) if _cached(idioms._pattern, i)}
    assert traced == {"gelu_tanh"}  # tanh is there; its pattern's other ops are not, so it is not matched


def _cached(function, index: int) -> bool:
    hits = function.cache_info().hits
    function(index)
    return function.cache_info().hits > hits
