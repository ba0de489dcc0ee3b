"""What each command of ``tracer`` does, but for the parsing (``tracer/cli.py``) and ``check``
(``tracer/checking.py``): running, drawing, exporting, importing, comparing, listing. Imported when
one of them runs, so that ``tracer --help`` and ``tracer check`` import none of it (start-up,
issue 32)."""

from __future__ import annotations

import argparse
import contextlib
import difflib
import math
import os
import shutil
import sys
from pathlib import Path

from . import checkpoints, weights
from .analysis.memory import check_budget, default_budget
from .analysis.shapes import MAX_TENSOR_BYTES
from .api import Pipeline, load
from .core.errors import Diagnostic, TracerError, printable
from .core.formatting import human_bytes
from .diff import diff, diff_json, diff_page, format_diff
from .distributed import run_parallel
from .presentation import outputs, ranks
from .presentation.export import export_source
from .presentation.files import Writes
from .presentation.folding import collapse_keys, depth_keys
from .presentation.graphviz import chosen_renderer, find_renderer
from .presentation.progress import Progress
from .runtime.interpreter import device_problem
from .runtime.tensors import match, takes
from .spec.bundled import models
from .spec.load import load_named

DRAWINGS = ("svg", "png", "pdf", "dot", "html")  # what `tracer render -o` writes, by suffix
DIFF_TROUBLE = 2  # `tracer diff`'s exit status for a problem, as diff(1) and `git diff --exit-code` use it


def device_argument(text: str) -> str:
    """``--device``: a torch device this machine has ('bogus', or 'cuda' without CUDA, is a usage error: exit 2)."""
    problem = device_problem(text)
    if problem is not None:
        raise argparse.ArgumentTypeError(problem)
    return text


def _models(args) -> int:
    """One line per bundled model: its name (what FILE takes), the classes it matches, whether
    ``--weights FOLDER`` fills it, and its description."""
    listed = models()
    width = max(len(m.name) for m in listed)
    for model in listed:
        classes = ", ".join(path.rpartition(".")[2] for path in model.matches) or "-"
        weights = "  (--weights FOLDER)" if model.takes_checkpoint else ""
        print(f"{model.name:<{width}}  {classes}{weights}\n{'':<{width}}  {model.description}")
    return 0


def _run(args) -> int:
    if args.world is not None:
        return _run_world(args)
    pipeline = _pipeline_to_run(args)
    analysis = pipeline.check(dict(args.dim))
    rank = _rank_to_show(analysis, args)
    keep_values = _kept_values(args)
    if args.values:
        _check_record_id(analysis, args.values, args.file)
    collapse_keys(_groups(analysis), tuple(args.collapse), args.file)  # an unknown group, before the run
    writes = _writes(args, analysis)
    if args.output:
        writes.check(args.output, "json" if args.json else "text")  # before the run: never the files it reads
    params = _weights(args, pipeline, analysis, keep_values) if args.weights or args.weights_map else None
    with _running(analysis, args.quiet) as progress:
        trace = pipeline.run(
            dims=dict(args.dim),
            seed=args.seed,
            keep_values=keep_values,
            device=args.device,
            max_memory=args.max_memory,
            observe=_with_progress(None, progress),
            params=params,
            check_values=True,
            meta_kernels=args.meta_kernels,
        )
    for warning in trace.analysis.warnings + list(trace.value_warnings):
        print(warning, file=sys.stderr)
    shown_rank = "" if rank is None else "\n" + ranks.rank_table(analysis, rank)
    if args.output:
        text = (
            trace.to_json(values=keep_values is True, rank=rank or 0)
            if args.json
            else _table(trace, args, args.width) + "\n" + trace.peak_line() + shown_rank
        )
        writes.write(args.output, text + chr(10), "json" if args.json else "text")
        _list_written(writes)
        return 0
    if args.json:
        print(trace.to_json(values=keep_values is True, rank=rank or 0))
        return 0
    print(_table(trace, args, args.width or _terminal_width()))
    print(trace.peak_line() + shown_rank)
    shown = [trace[args.values]] if args.values else trace.records if keep_values is True else []
    for record in shown:
        print(f"\n{record.id} {record.symbolic}:\n{record.tensor}")
    return 0


def _run_world(args) -> int:
    """``tracer run FILE --world N``: rank 0's records (``--rank R``'s), then its collectives and the checks."""
    unsupported = [
        flag for flag, given in (("--values", args.values is not None), ("--weights", args.weights), ("-o", args.output)) if given
    ]
    if unsupported or args.device == "meta":
        flag = unsupported[0] if unsupported else "--device meta"
        raise TracerError(Diagnostic(args.file, None, "usage", f"--world runs with the drawn tensors on cpu or cuda: leave out {flag}"))
    pipeline = load(args.file) if not args.dim else _load_unchecked(args.file)
    run = run_parallel(pipeline, args.world, dict(args.dim), args.seed, args.timeout, args.device)
    if args.json:
        print(run.to_json())
        return 0
    rank = args.rank or 0
    if rank >= run.world:
        raise TracerError(Diagnostic(args.file, None, "rank", f"--rank {rank}: the run had {run.world} ranks (0 to {run.world - 1})"))
    print(_table(run.ranks[rank], args, args.width or _terminal_width()))
    print(run.summary(rank))
    return 0


def _rank_to_show(analysis, args) -> int | None:
    """The rank whose view follows the table: ``--rank``, or 0 for a pipeline with ``parallel:``
    whose ranks could be analysed; None for any other (its output stays as it was)."""
    if args.rank is None and (analysis.rank is None or analysis.rank.analysis is None):
        return None
    rank = args.rank or 0
    problem = ranks.check_rank(analysis, rank)
    if problem is not None:
        raise TracerError(Diagnostic(args.file, None, "rank", problem))
    return rank


def _groups(analysis) -> list[str]:
    """Every group of the steps, in order: what --collapse names and --depth counts levels of."""
    return list(dict.fromkeys(node.step.group for node in analysis.nodes.values() if node.step.group))


def _kept_values(args) -> bool | list[str]:
    """What the run keeps: every tensor (``--values``, or ``--values ID --json``), one (``--values ID``), or none."""
    if args.values is None:
        return False
    return True if args.json or not args.values else [args.values]


def _check_record_id(analysis, record_id: str, file: str) -> None:
    """``--values ID`` names a tensor of the run: before anything runs, a name that is none says so."""
    if analysis.meta(record_id) is not None:
        return
    names = list(analysis.metas) + [name for name in analysis.nodes if name not in analysis.metas]
    close = difflib.get_close_matches(record_id, names, n=1)
    hint = f"; did you mean '{close[0]}'?" if close else " (`tracer run FILE` lists them)"
    raise TracerError(
        Diagnostic(file, None, "unknown-tensor", f"--values {printable(record_id)!r}: no tensor of this run has that id{hint}")
    )


def _reads(args, analysis) -> list[str]:
    """Every file this command reads: none of them may be its output (a weights folder: every file in it)."""
    given = [getattr(args, "weights", None), getattr(args, "weights_map", None)]
    return outputs.read_files(analysis) + [path for f in given if f for path in _files_of(f)]


def _files_of(path: str) -> list[str]:
    """``path``, or every entry of it when it is a folder (a save_pretrained folder's config, index and shards)."""
    if not _is_folder(path):
        return [path]
    try:
        return [path, *(entry.path for entry in os.scandir(path))]
    except OSError:  # unreadable: reading it fails with its own located error
        return [path]


def _writes(args, analysis) -> Writes:
    """What this command may write: never a file it reads, and an existing file only when tracer
    wrote it (or with --force)."""
    return Writes(_reads(args, analysis), force=args.force, error_file=args.file)


def _list_written(writes: Writes, stream=None) -> None:
    for path in writes.written:
        print(f"wrote {printable(path)}", file=stream or sys.stderr)


def _pipeline_to_run(args) -> Pipeline:
    """The file, with a save_pretrained folder's dims and fields bound when --weights is one."""
    if not _is_folder(args.weights):
        if args.layer is not None:
            raise TracerError(
                Diagnostic(args.file, None, "checkpoint", "--layer picks a layer of a save_pretrained folder: give one with --weights")
            )
        return load(args.file) if not args.dim else _load_unchecked(args.file)
    if args.weights_map:
        raise TracerError(
            Diagnostic(
                args.weights_map,
                None,
                "weights-map",
                "a save_pretrained folder is renamed by the pipeline's checkpoint: section, not --weights-map",
            )
        )
    return checkpoints.bind(_load_unchecked(args.file), args.weights, args.layer)


def _is_folder(path: str | None) -> bool:
    return path is not None and os.path.isdir(path)


def _weights(args, pipeline, analysis, keep_values: bool | list[str]) -> dict:
    """Every param from the checkpoint (renamed by the map): unknown, missing and mis-shaped keys together."""

    if args.weights_map and not args.weights:
        raise TracerError(Diagnostic(args.weights_map, None, "weights-map", "--weights-map renames the keys of --weights: give both"))
    check_budget(analysis, args.device, args.max_memory, keep_values)  # a run that would be refused reads no weights
    budget = args.max_memory if args.max_memory is not None else default_budget(args.device)[0]
    if _is_folder(args.weights):
        params = checkpoints.read_params(pipeline, args.weights, args.layer, budget, dict(args.dim))
    else:
        mapping = weights.read_map(args.weights_map) if args.weights_map else None
        declared = takes(analysis, "params")
        # read only what some param takes: a key the map drops, or that no param has, is never read
        state = weights.read(args.weights, max_bytes=budget, wanted=lambda key: any(map(declared, weights.targets(mapping, key))))
        if mapping is not None:
            state = weights.rename(state, mapping)
        params = match(analysis, state, "params", f"--weights {printable(args.weights)}", complete=True)
    layer = "" if args.layer is None else f", layer {args.layer}"
    size = human_bytes(sum(weights.nbytes(tensor) for tensor in params.values()))
    print(f"params: {len(params)} tensors ({size}) from {printable(args.weights)}{layer}", file=sys.stderr)
    return params


def _running(analysis, quiet: bool):

    made = sum(len(node.outs) for node in analysis.nodes.values())  # every tensor a step makes
    return Progress("running", total=made, quiet=quiet)


def _with_progress(observe, progress):
    """``observe``, plus a step of the progress line when one is shown (no cost when it is not)."""
    if not progress.enabled:
        return observe

    def both(record_id, tensor):
        if observe is not None:
            observe(record_id, tensor)
        progress.step(record_id)

    return both


def _table(trace, args, width: int | None) -> str:
    return trace.table(width=width, depth=args.depth, expand=args.expand, collapse=args.collapse)


def _terminal_width() -> int | None:
    """The terminal's columns; ``None`` (nothing elided) when the table goes to a pipe or a file,
    where a reader or a program wants every id whole."""
    return shutil.get_terminal_size((100, 24)).columns if sys.stdout.isatty() else None


def _load_unchecked(path: str):
    """Load without checking the declared dims: overridden dims are what will run."""

    return Pipeline(*load_named(path))


def _render(args) -> int:

    with chosen_renderer(args.dot):
        return _draw(args)


def _draw(args) -> int:

    output, fmt = outputs.by_suffix(args.output or f"{Path(args.file).stem}.svg", DRAWINGS, default="svg")
    if args.values and args.device == "meta":
        raise TracerError(Diagnostic(args.file, None, "values-on-meta", "--values needs real data: drop --device meta (or use cpu/cuda)"))

    if fmt.name != "dot":  # before the run: without a renderer, say how to get one at once
        find_renderer(args.file, "the html report" if fmt.name == "html" else fmt.name)
    pipeline = _load_unchecked(args.file)
    analysis = pipeline.check(dict(args.dim))
    writes = _writes(args, analysis)
    writes.check(output, fmt.name)  # before the run: never the files it reads
    if args.rank is not None:
        _rank_to_show(analysis, args)
    tokens = _tokens(args)  # a tokenizer folder that cannot be read, before the run
    with _running(analysis, args.quiet) as progress:
        observe = _with_progress(None, progress)
        trace = pipeline.run(
            dims=dict(args.dim),
            device=args.device,
            seed=args.seed,
            keep_values=args.values,
            max_memory=args.max_memory,
            observe=observe,
            check_values=True,
        )
    options = outputs.Options(
        collapse=tuple(args.collapse) + tuple(depth_keys(_groups(analysis), args.depth) if args.depth else ()),
        expand=args.expand,
        timeout=args.timeout,
        rankdir=args.rankdir,
        legend=args.legend,
        tokens=tokens,
        rank=args.rank,
    )
    with Progress(f"drawing {output.name}", quiet=args.quiet).ticking():
        outputs.write(trace, output, fmt, options, writes)  # with values: heatmaps in softmax nodes
    _list_written(writes, sys.stdout)
    return 0


def _tokens(args) -> tuple[str, ...]:
    if args.tokenizer is None:
        return tuple(args.tokens.split())
    if not args.tokens:
        raise TracerError(Diagnostic(f"--tokenizer {args.tokenizer}", None, "tokenizer", 'give the text to split with --tokens "..."'))
    return tuple(checkpoints.tokenized(args.tokens, args.tokenizer))


def _export(args) -> int:

    pipeline = _load_unchecked(args.file)
    writes = _writes(args, pipeline.check(dict(args.dim))) if args.output else None
    if writes is not None:
        writes.check(args.output, "python")
    source = export_source(pipeline, dict(args.dim))
    if writes is None:
        sys.stdout.write(source)
        return 0
    writes.write(args.output, source, "python")
    _list_written(writes)
    return 0


def _import(args) -> int:
    """Build the module with the user's own factory, import it, write the YAML, and say how far the
    pipeline is from the module on the module's own weights (the last line)."""
    import torch

    from .importing import difference, from_module

    module = _built_module(args.target, args.args, torch)
    writes = Writes(_sources(module, args.target), force=args.force, error_file=args.target)
    writes.check(args.output, "yaml")  # before the capture: never the module's own source
    _configure(module, _json_object(args.config, "--config", args.target), args.target)
    inputs = {name: _example(name, sizes, kind, torch) for name, sizes, kind in args.input}
    inputs.update(_json_object(args.forward, "--forward", args.target))
    pipeline = from_module(module, dims=dict(args.dim) or None, **inputs)
    texts = pipeline.files_named(Path(args.output).stem)  # block files named after the output: OUT_layers.yaml
    targets = {name: Path(args.output) if name == next(iter(texts)) else Path(args.output).parent / name for name in texts}
    for target in targets.values():  # every one checked before any is written
        writes.check(target, "yaml")
    for name, target in targets.items():
        writes.write(target, texts[name], "yaml")
    _list_written(writes)
    print(f"max |pipeline - module| on the module's weights: {difference(pipeline, module, **inputs):.3g}")
    return 0


def _sources(module, target: str) -> list[str]:
    """The Python files the imported module comes from (its class's module, the factory's): inputs, never outputs."""
    import inspect

    found = {getattr(sys.modules.get(target.partition(":")[0]), "__file__", None)}
    for cls in type(module).__mro__:
        if cls.__module__ != "builtins" and not cls.__module__.startswith("torch."):
            with contextlib.suppress(TypeError, OSError):  # a class made at run time has no file
                found.add(inspect.getsourcefile(cls))
    return sorted(path for path in found if path)


def _json_object(text: str, option: str, target: str) -> dict:
    """A JSON object given on the command line, or a located usage error."""
    import json

    try:
        given = json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise TracerError(Diagnostic(target, None, "import-target", f"{option} is not JSON ({exc})")) from None
    if not isinstance(given, dict) or not all(isinstance(key, str) and key.isidentifier() for key in given):
        raise TracerError(
            Diagnostic(target, None, "import-target", f"{option} must be a JSON object of names, not {json.dumps(given)[:40]}")
        )
    return given


def _configure(module, settings: dict, target: str) -> None:
    """``--config``: attributes of the module's ``config`` (a transformers model's), set before capture."""
    if not settings:
        return
    config = getattr(module, "config", None)
    if config is None:
        raise TracerError(Diagnostic(target, None, "import-target", f"--config: {type(module).__name__} has no config to set"))
    for key, value in settings.items():
        setattr(config, key, value)


def _built_module(target: str, given_args: str, torch):
    """``MODULE:FACTORY`` called with ``--args``. Everything that goes wrong there is the target's
    or the arguments' (a factory is the user's own code: whatever it raises), never tracer's."""
    import importlib
    import json

    def refused(message: str) -> TracerError:
        return TracerError(Diagnostic(target, None, "import-target", message))

    where, _, attribute = target.partition(":")
    if not all(part.isidentifier() for part in where.split(".")) or not attribute.isidentifier():
        raise refused("expected MODULE:FACTORY, such as mymodel:make_attention (an absolute import path, a colon, a callable's name)")
    try:
        given = json.loads(given_args)
    except (ValueError, RecursionError) as exc:
        raise refused(f"--args is not JSON ({exc})") from None
    if not isinstance(given, (list, dict)):
        raise refused(f"--args must be a JSON list of arguments or an object of keywords, not {json.dumps(given)[:40]}")
    if "" not in sys.path and os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())  # MODULE is found in the current folder, as `python -m` finds it
    try:
        factory = getattr(importlib.import_module(where), attribute)
        module = factory(**given) if isinstance(given, dict) else factory(*given)
    except Exception as exc:  # importing the module runs its code too
        raise refused(f"cannot build the module: {type(exc).__name__}: {exc}") from None
    if not isinstance(module, torch.nn.Module):
        raise refused(f"{attribute} returned {type(module).__name__}, not a torch.nn.Module")
    return module.eval()


def _example(name: str, sizes: tuple[int, ...], kind: str, torch):
    """An example input for forward: random token ids (0 or 1) or randn, refused over the memory budget."""
    budget, what = default_budget("cpu")
    if math.prod(max(size, 1) for size in sizes) > MAX_TENSOR_BYTES // 8:  # torch's int64 strides overflow, even with a 0 size
        raise TracerError(
            Diagnostic(
                f"--input {name}", None, "import-input", f"{list(sizes)} overflows torch's sizes: their product must stay under 2**59"
            )
        )
    if math.prod(sizes) * 8 > budget:
        raise TracerError(
            Diagnostic(
                f"--input {name}", None, "import-input", f"{list(sizes)} is over the memory budget of {human_bytes(budget)} ({what})"
            )
        )
    return torch.randint(0, 2, sizes) if kind == "int" else torch.randn(sizes)


def _diff(args) -> int:
    """Exit as diff(1) does: 0 the same pipeline (names aside), 1 they differ, 2 trouble (a file
    that does not load or check, a run that fails, a page that cannot be written)."""
    try:
        a, b = load(args.files[0]), load(args.files[1])
        writes = Writes(outputs.read_files(a.check()) + outputs.read_files(b.check()), force=args.force, error_file=args.files[1])
        if args.html:
            writes.check(args.html, "diff")  # before the runs: never a file either pipeline reads (its blocks too)
        if args.values:  # both runs keep every tensor: each is held against the budget before either runs
            for pipeline in (a, b):
                check_budget(pipeline.check(), "cpu", args.max_memory, keep_values=True)
        found = diff(a, b, values=args.values, max_memory=args.max_memory)
        if args.html:
            writes.write(args.html, diff_page(a, b, found), "diff")
            _list_written(writes)
    except TracerError as exc:
        print(exc, file=sys.stderr)
        return DIFF_TROUBLE
    print(diff_json(found) if args.json else format_diff(found))
    return 0 if found.same else 1


def _schema(args) -> int:
    """The schema file shipped in the package (generated by tracer.docgen; a test keeps it current)."""
    path = Path(__file__).with_name("pipeline.schema.json")
    if args.path:
        print(path.resolve())
    else:
        sys.stdout.write(path.read_text(encoding="utf-8"))
    return 0


HANDLERS = {  # command -> what it does (cli.py's parser names them)
    "run": _run,
    "render": _render,
    "export": _export,
    "import": _import,
    "diff": _diff,
    "schema": _schema,
    "models": _models,
}
