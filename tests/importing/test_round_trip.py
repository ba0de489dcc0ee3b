"""`tracer export` a pipeline, `tracer import` the module it wrote: the pipeline comes back.

The exported module names its variables after the steps and its params and dims after the file's,
so the import pairs every step by id; ``tracer diff`` then shows no step, shape or param change, and
the values agree on the same weights."""

import importlib.util

import torch

import tracer
from tests.conftest import PIPELINES
from tracer.diff import diff
from tracer.importing import difference, from_module
from tracer.presentation.export import export_source


def _exported_module(pipeline, folder, seed):
    """The module `tracer export` writes, imported from its file (import names steps from its source lines)."""
    path = folder / f"{pipeline.name}.py"
    path.write_text(export_source(pipeline))
    spec = importlib.util.spec_from_file_location(pipeline.name, path)
    module_file = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module_file)
    return getattr(module_file, module_file.__all__[0])(seed=seed)


def _round_trip(path, folder):
    pipeline = tracer.load(path)
    module = _exported_module(pipeline, folder, pipeline.spec.seed)
    trace = pipeline.run(keep_values=True)
    inputs = {name: trace[name].tensor for name in pipeline.spec.inputs}
    back = from_module(module, **inputs)
    assert difference(back, module, **inputs) <= 1e-6
    return pipeline, back


def test_the_llama_layer_comes_back_unchanged_names_and_dims_included(tmp_path):
    pipeline, back = _round_trip(PIPELINES / "models/llama_decoder_layer.yaml", tmp_path)
    found = diff(pipeline, back, values=True)
    assert found.same and not found.renamed and found.compared_values and found.diverges is None
    assert set(back.spec.dims) == set(pipeline.spec.dims) - {"seed"}
    assert [s.op for s in back.spec.steps] == [s.op for s in pipeline.spec.steps]


def test_causal_mha_comes_back_without_its_eval_mode_dropout(tmp_path):
    pipeline, back = _round_trip(PIPELINES / "causal_mha.yaml", tmp_path)
    found = diff(pipeline, back, values=True)
    # dropout is the identity in eval mode, where modules are captured: the one step import drops
    assert found.removed == ["weights_d: dropout"] and not found.added and not found.shapes and not found.params
    assert found.changed_op == ["context: reads weights_d, v_h -> weights, v_h"] and not found.renamed
    assert found.diverges is None


def test_an_imported_pipeline_exported_and_imported_again_differs_in_param_names_only(tmp_path):
    imported = tracer.load(PIPELINES / "imported/llama_decoder_layer.yaml")
    module = _exported_module(imported, tmp_path, seed=0)
    again = from_module(module, torch.randn(2, 6, 16))
    found = diff(imported, again, values=True)
    assert found.same and found.diverges is None
    # the exported module's variables are Python names: the one change is '.' written '_' in step ids
    steps = imported.check().nodes
    assert found.renamed == [f"step {i} -> {i.replace('.', '_')}: {node.op}" for i, node in steps.items()]
