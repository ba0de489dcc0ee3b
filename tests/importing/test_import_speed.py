"""What keeps an import's own work small beside torch.export's (issue 31's 1.2x target, timed by
benchmarks/import_sweep.py): a small example's graph runs on one intra-op thread, and a node's
stack trace is parsed once however many times its id, comment and caller read it."""

import contextlib

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


class _TwoLayers(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = torch.nn.ModuleList([torch.nn.Linear(8, 8) for _ in range(2)])

    def forward(self, x):
        for layer in self.layers:
            x = layer(x).relu()
        return x


def _capture_traces(module, x, monkeypatch) -> tuple[list, int]:
    """Each node's stack trace of a capture, the frames above this file's call of ``capture`` cut,
    and how many source lines the capture read."""
    import linecache

    read, getline = [], linecache.getline
    monkeypatch.setattr(linecache, "getline", lambda file, *args: read.append(file) or getline(file, *args))
    program = capture(module, (x,), {})
    monkeypatch.setattr(linecache, "getline", getline)
    return [(n.meta.get("stack_trace") or "").partition("in _capture_traces\n")[2] for n in program.graph.nodes], len(read)


def test_the_capture_reads_source_lines_only_of_the_frames_kept_and_keeps_the_same_traces(monkeypatch):
    from tracer.importer import capture as capture_module

    module, x = _TwoLayers(), torch.randn(2, 3, 8)
    traces, read = _capture_traces(module, x, monkeypatch)
    monkeypatch.setattr(capture_module, "_kept_frames_only", contextlib.nullcontext)  # torch's summary: a line read for every frame
    every_frame, read_by_torch = _capture_traces(module, x, monkeypatch)
    assert traces == every_frame and any("x = layer(x).relu()" in t for t in traces)
    assert read < read_by_torch * 2 // 3  # torch's machinery, some 40% of the frames here (more in a deep model), is not read


def test_a_nodes_module_stack_is_written_once_per_distinct_stack():
    node = torch.fx.Graph().placeholder("x")
    node.meta["nn_module_stack"] = {"L__self___proj": ("proj", torch.nn.Linear)}
    first = idioms.module_stack(node)
    assert first == (("proj", "torch.nn.modules.linear.Linear"),)
    assert idioms.module_stack(node) is first


def test_the_translator_asks_each_modules_children_once(monkeypatch):
    from tracer.importer.idioms import Graph
    from tracer.importer.naming import Namer
    from tracer.importer.rules import Translator

    module, x = _TwoLayers(), torch.randn(2, 3, 8)
    program = capture(module, (x,), {})
    translator = Translator(Graph(program, graph_inputs(program, (x,), {})), module, Namer({}, {}))
    asked = []
    monkeypatch.setattr(module, "get_submodule", lambda path: asked.append(path) or torch.nn.Module.get_submodule(module, path))
    leaves = [translator._leaf_module(n) for n in program.graph.nodes for _ in range(2)]
    assert {"layers.0", "layers.1"} <= set(leaves)
    assert sorted(asked) == sorted(set(asked))


def test_a_printable_comment_line_is_written_as_it_is():
    from tracer.importer.writer import plain_line

    line = "model.py:12: y = self.proj(x)"
    assert plain_line(line) is line
    assert plain_line("a\tb\nc" + "x" * 200) == "a b c" + "x" * 115
