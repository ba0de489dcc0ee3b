"""What keeps an import's own work small beside torch.export's (issue 31's 1.2x target, timed by
benchmarks/import_sweep.py): a small example's graph runs on one intra-op thread, and a node's
stack trace is parsed once however many times its id, comment and caller read it."""

import torch

from tracer.importer import idioms, lines
from tracer.importer.capture import capture, graph_inputs


class _Threads(torch.nn.Module):
    def forward(self, x):
        return torch.nn.functional.linear(x, torch.ones(x.shape[-1], x.shape[-1])).relu()


def _threads_while(tensors) -> int:
    with idioms.one_thread_if_small(tensors):
        return torch.get_num_threads()


def test_a_small_example_runs_on_one_thread_and_a_large_one_keeps_torchs_threads():
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        assert _threads_while([torch.ones(4, 4), 3, "text"]) == 1
        assert torch.get_num_threads() == 2  # restored afterwards
        assert _threads_while([torch.ones(4, 4), torch.empty(idioms.SMALL_TENSOR + 1)]) == 2
    finally:
        torch.set_num_threads(threads)


def test_the_graph_evaluates_on_one_thread_to_the_modules_values(monkeypatch):
    module, x = _Threads(), torch.randn(2, 3, 8)
    program = capture(module, (x,), {})
    seen = []
    running = torch.fx.Interpreter.run_node
    monkeypatch.setattr(torch.fx.Interpreter, "run_node", lambda self, node: seen.append(torch.get_num_threads()) or running(self, node))
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        values = idioms._evaluate(program.graph_module, graph_inputs(program, (x,), {}))
    finally:
        torch.set_num_threads(threads)
    assert seen and set(seen) == {1}
    (output,) = [n for n in program.graph_module.graph.nodes if n.op == "output"]
    assert torch.equal(values[output.args[0][0]], module(x))


def test_a_stack_trace_is_parsed_once_and_read_the_same_each_time():
    trace = 'File "/home/me/model.py", line 12, in forward\n    y = self.proj(x)\n'
    node = torch.fx.Graph().placeholder("x")
    node.meta["stack_trace"] = trace
    lines._frames.cache_clear()
    first = lines.frames(node)
    assert first == (("/home/me/model.py", 12, "forward", "y = self.proj(x)"),)
    assert lines.frames(node) is first and lines._frames.cache_info().misses == 1


class _Unread(torch.nn.Module):  # a param no op reads, as a tied or spare weight is
    def __init__(self):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(8, 8))
        self.spare = torch.nn.Parameter(torch.randn(8))

    def forward(self, x):
        return x @ self.weight


def _loads_counted(monkeypatch) -> list:
    import tracer.importing

    loaded, load = [], tracer.importing.load
    monkeypatch.setattr(tracer.importing, "load", lambda path: loaded.append(path) or load(path))
    return loaded


def test_an_unread_param_is_allowed_in_the_file_loaded_once(monkeypatch):
    from tracer.importing import difference, from_module

    loaded = _loads_counted(monkeypatch)
    module, x = _Unread(), torch.randn(2, 3, 8)
    pipeline = from_module(module, x)
    assert len(loaded) == 1  # the steps said which param is unread before the file was written
    assert pipeline.spec.params["spare"].allow == {"unused-tensor": "a state_dict entry of the module that no captured op reads"}
    assert [d for d in pipeline.check().diagnostics if d.severity in ("error", "warning")] == []
    assert difference(pipeline, module, x) == 0.0


def test_the_files_analysis_decides_when_the_steps_say_otherwise(monkeypatch):
    import tracer.importing
    from tracer.importing import from_module

    module, x = _Unread(), torch.randn(2, 3, 8)
    expected = from_module(module, x).files
    loaded = _loads_counted(monkeypatch)
    monkeypatch.setattr(tracer.importing, "unread_names", lambda document: ["weight"])  # a wrong guess: weight is read
    assert from_module(module, x).files == expected and len(loaded) == 2
