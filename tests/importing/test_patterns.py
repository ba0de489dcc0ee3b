"""The idiom patterns (RMSNorm, RoPE, repeat_kv, GPT-2's GELU) are traced with make_fx's
pre-dispatch mode, in half torch.export's time: the graphs must be the ones torch.export
records, or the idioms would stop matching the captured modules."""

import torch

from tracer.importer import idioms


def _form(graph: torch.fx.Graph) -> list[tuple]:
    """Each node's op, target and arguments, nodes by position (placeholder names differ)."""
    position = {node: i for i, node in enumerate(graph.nodes)}
    return [
        (node.op, "" if node.op == "placeholder" else str(node.target), str(torch.fx.node.map_arg(node.args, lambda n: position[n])))
        for node in graph.nodes
    ]


def test_idiom_patterns_traced_with_make_fx_are_the_graphs_torch_export_records(monkeypatch):
    traced = idioms._patterns.__wrapped__()
    monkeypatch.setattr(idioms, "_traced", lambda module, example: torch.export.export(module, example, strict=False).graph_module.graph)
    exported = idioms._patterns.__wrapped__()
    assert [(kind, _form(graph)) for kind, graph in traced] == [(kind, _form(graph)) for kind, graph in exported]
    assert traced and all(len(graph.nodes) > 3 for _, graph in traced)
