"""Issue 31's round trip over benchmarks/import_sweep.py's rows: import → export (Python API) →
load the model's state_dict (strict) → run equal → import the exported module → ``tracer diff``.

One line per row: ``family attention: <verdict>``, the first step that fails and why."""

import argparse
import importlib.util
import tempfile
from pathlib import Path

import torch

from benchmarks.import_sweep import ATTENTIONS, CONFIGS, build


def _first_tensor(output) -> torch.Tensor:
    """The first tensor of a module's output (a transformers ModelOutput, a tuple or a tensor)."""
    if isinstance(output, torch.Tensor):
        return output
    values = output.to_tuple() if hasattr(output, "to_tuple") else tuple(output)
    return next(v for v in values if isinstance(v, torch.Tensor))


def _inputs(pipeline, args, kwargs) -> dict:
    """The exported module's inputs by name: the model's own, then any the import made an input
    of its own (BERT's ``position_ids`` buffer, ``init: arange``) as the pipeline makes them."""
    given = {**dict(zip(pipeline.spec.inputs, args)), **{k: v for k, v in kwargs.items() if k in pipeline.spec.inputs}}
    missing = [name for name in pipeline.spec.inputs if name not in given]
    trace = pipeline.run(keep_values=True) if missing else {}
    return {name: given[name] if name in given else trace[name].tensor for name in pipeline.spec.inputs}


def _exported(pipeline, folder: Path) -> torch.nn.Module:
    from tracer.presentation.export import export_source

    path = folder / "exported.py"
    path.write_text(export_source(pipeline))
    spec = importlib.util.spec_from_file_location("exported", path)
    module_file = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module_file)
    return getattr(module_file, module_file.__all__[0])(seed=0).eval()


def row(family: str, attention: str, layers: int) -> str:
    from tracer.diff import diff
    from tracer.importing import from_module

    model, args, kwargs = build(family, attention, layers)
    stage = "import"
    try:
        pipeline = from_module(model, *args, name=family, **kwargs)
        folded = ",".join(f"{s.id}x{s.repeat}" for s in pipeline.spec.steps if s.op == "block") or "no block"
        stage = "export"
        with tempfile.TemporaryDirectory() as folder:
            exported = _exported(pipeline, Path(folder))
            stage = "load_state_dict"
            exported.load_state_dict(model.state_dict())
            stage = "run"
            inputs = _inputs(pipeline, args, kwargs)
            with torch.no_grad():
                found, expected = _first_tensor(exported(**inputs)), _first_tensor(model(*args, **kwargs))
            error = (found - expected).abs().max().item()
            if error > 1e-4:
                return f"{family} {attention}: run differs by {error:.1e} ({folded})"
            stage = "re-import"
            back = from_module(exported, name=family, **inputs)
        stage = "diff"
        changes = diff(pipeline, back)
        verdict = "same" if changes.same and not changes.renamed else f"differs: {str(changes).splitlines()[:3]}"
        return f"{family} {attention}: {verdict} (max diff {error:.1e}, {folded})"
    except Exception as exc:  # a benchmark: every row's failure is reported, the sweep goes on
        return f"{family} {attention}: {stage} failed: {type(exc).__name__}: {str(exc).splitlines()[0][:160]}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("families", nargs="*", default=[*CONFIGS, "bart", "t5", "decoder_layer"])
    options = parser.parse_args()
    for family in options.families:
        for attention in ATTENTIONS.get(family, ("eager", "sdpa")):
            print(row(family, attention, options.layers), flush=True)


if __name__ == "__main__":
    main()
