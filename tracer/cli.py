"""The ``tracer`` command: check, run, render, export, schema."""

from __future__ import annotations

import argparse
import math
import os
import shutil
import signal
import sys
import threading
from pathlib import Path

from . import __version__, weights
from .analysis.memory import check_budget, default_budget, parse_bytes
from .analysis.shapes import analyze
from .api import Pipeline, load
from .core.errors import Diagnostic, InternalError, TracerError, printable
from .core.formatting import human_bytes
from .diff import diff, diff_json, format_diff
from .presentation import outputs
from .presentation.export import export_source
from .presentation.files import check_output, write_atomic
from .presentation.graphviz import chosen_renderer
from .presentation.progress import Progress
from .runtime.interpreter import device_problem
from .runtime.tensors import match, takes
from .runtime.watch import SoftmaxNaNs
from .spec.load import load_spec

DRAWINGS = ("svg", "png", "pdf", "dot", "html")  # what `tracer render -o` writes, by suffix
RENDER_TIMEOUT = 120.0  # seconds; the same default as tracer.presentation.diagram.DOT_TIMEOUT (kept here: the parser imports no renderer)


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    previous = _terminate_cleanly()
    try:
        return _handle(args)
    finally:  # a caller running main() in its own process keeps its own SIGTERM handling
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


def _handle(args) -> int:
    try:
        return args.handler(args)
    except TracerError as exc:
        print(exc, file=sys.stderr)
        return 1
    except InternalError as exc:
        if args.debug:
            raise
        print(f"tracer: internal error (please report it): {exc}", file=sys.stderr)
        return 3
    except BrokenPipeError:  # `tracer run ... | head` closed the pipe: not an error
        sys.stderr.close()
        return 0
    except KeyboardInterrupt:
        print("tracer: interrupted", file=sys.stderr)
        return 130
    except _Terminated:
        print("tracer: terminated", file=sys.stderr)
        return 143
    except Exception as exc:  # a bug in tracer, never the user's fault: say so without a traceback
        if args.debug:
            raise
        message = printable(f"{type(exc).__name__}: {exc}")
        print(f"tracer: internal error (please report it, rerun with --debug for details): {message}", file=sys.stderr)
        return 3


class _Terminated(BaseException):
    """SIGTERM, raised as an exception so that temporary files are removed on the way out."""


def _terminate_cleanly():
    """Install the SIGTERM handler; returns the one it replaced (None off the main thread, where none is set)."""

    def handler(signum, frame):
        raise _Terminated

    if threading.current_thread() is threading.main_thread():
        return signal.signal(signal.SIGTERM, handler)
    return None


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # argparse quotes the user's arguments: escape them like every diagnostic
        super().error(printable(message))


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="tracer", description="Declare attention pipelines in YAML, trace every tensor's shape, render and check them.")
    parser.add_argument("--debug", action="store_true", help="show Python tracebacks for internal errors")
    parser.add_argument("--version", action="version", version=f"tracer {_version()}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND", parser_class=_Parser)

    check = commands.add_parser("check", help="validate pipelines and infer every shape without running them")
    check.add_argument("files", nargs="+", metavar="FILE")
    check.add_argument("--strict", action="store_true", help="treat warnings (lints) as errors")
    _dims_option(check)
    check.set_defaults(handler=_check)

    run = commands.add_parser("run", help="run a pipeline on torch and print every tensor's record")
    run.add_argument("file", metavar="FILE")
    _dims_option(run)
    run.add_argument("--seed", type=int, help="override the pipeline's seed")
    run.add_argument("--values", action="store_true", help="keep and print tensor values")
    run.add_argument("--json", action="store_true", help="print the trace as JSON")
    run.add_argument(
        "-o",
        "--output",
        metavar="OUT",
        type=_output_name,
        help="write the table (or with --json the JSON) to OUT instead of stdout; written atomically: a failed run leaves OUT as it was",
    )
    run.add_argument(
        "--expand", action="store_true", help="list every copy of a repeated block (default: the first copy and one ×N row for the rest)"
    )
    _quiet_option(run)
    run.add_argument("--depth", type=_positive, metavar="N", help="show groups nested deeper than N levels as one row each")
    run.add_argument("--device", default="cpu", type=_device, help="torch device: cpu, cuda, meta (default: cpu)")
    run.add_argument(
        "--max-memory",
        type=_size,
        metavar="SIZE",
        help="refuse a real run whose estimated peak exceeds SIZE, e.g. 8GiB or 500MB "
        "(default: half of the available RAM; --device meta allocates nothing)",
    )
    run.add_argument(
        "--weights",
        metavar="W",
        help="the params from a .safetensors file or a torch.save'd state_dict (keys: param ids, with / or .); every param must be there",
    )
    run.add_argument(
        "--weights-map",
        metavar="MAP",
        help="a YAML file renaming a foreign checkpoint's keys: KEY: PARAM, KEY: [P1, P2, P3] (split a packed tensor), KEY: null (drop)",
    )
    run.set_defaults(handler=_run)

    render = commands.add_parser("render", help="draw the dataflow with shapes on every edge (svg, png, pdf or dot)")
    render.add_argument("file", metavar="FILE")
    render.add_argument(
        "-o",
        "--output",
        metavar="OUT",
        type=_output_name,
        help="output file; the format comes from its suffix: .svg .png .pdf .dot, or .html for the interactive report (default: NAME.svg)",
    )
    _dims_option(render)
    render.add_argument(
        "--collapse",
        action="append",
        default=[],
        metavar="GROUP",
        help="draw a group as one node: a group name, a group path ('layers' folds all copies of a block, 'layers/3' one) or a glob ('layers/*': one node per copy); repeatable",
    )
    _quiet_option(render)
    render.add_argument(
        "--expand", action="store_true", help="draw every copy of a repeated block (default: the first copy and one ×N node for the rest)"
    )
    render.add_argument("--device", default="cpu", type=_device, help="torch device for the run (meta: no memory)")
    render.add_argument(
        "--values",
        action="store_true",
        help="run on real data and show it: per-head attention heatmaps in softmax nodes; in an .html report also per-tensor statistics",
    )
    render.add_argument(
        "--timeout",
        type=float,
        default=RENDER_TIMEOUT,
        metavar="SECONDS",
        help=f"give up when Graphviz takes longer than this to draw (default: {RENDER_TIMEOUT:g})",
    )
    render.add_argument(
        "--dot",
        metavar="PATH",
        help="the program that draws DOT text (default: $TRACER_DOT, else Graphviz's `dot`, else `graphviz-pure`)",
    )
    render.set_defaults(handler=_render)

    export = commands.add_parser("export", help="write the pipeline as a standalone PyTorch module (nn.Module source)")
    export.add_argument("file", metavar="FILE")
    export.add_argument("-o", "--output", metavar="OUT", type=_output_name, help="the .py file to write, atomically (default: stdout)")
    _dims_option(export)
    export.set_defaults(handler=_export)

    imported = commands.add_parser(
        "import",
        help="write a PyTorch module as a pipeline file (runs MODULE:FACTORY: your own code)",
        epilog="example: tracer import mymodel:make_attention --args '[64, 4]' --input x=2,16,64 -o attention.yaml",
    )
    imported.add_argument("target", metavar="MODULE:FACTORY", help="a Python import path and a callable returning the nn.Module")
    imported.add_argument("--args", default="[]", metavar="JSON", help="the factory's arguments: a JSON list, or an object of keywords")
    imported.add_argument(
        "--input",
        action="append",
        default=[],
        metavar="NAME=SHAPE",
        type=_input_spec,
        help="an example input for forward's parameter NAME: x=2,16,64 (randn) or ids=2,16:int (token ids); repeatable",
    )
    _dims_option(imported)
    imported.add_argument(
        "-o", "--output", metavar="OUT", type=_output_name, required=True, help="the .yaml file to write (and its block files beside it)"
    )
    imported.set_defaults(handler=_import)

    compared = commands.add_parser(
        "diff",
        help="compare two pipelines: steps, shapes, params, FLOPs and peak memory",
        epilog="example: tracer diff a.yaml b.yaml --values",
    )
    compared.add_argument("files", nargs=2, metavar="FILE")
    compared.add_argument("--values", action="store_true", help="also run both (seed 0) and name the first tensor whose values differ")
    compared.add_argument("--json", action="store_true", help="print the differences as JSON")
    compared.set_defaults(handler=_diff)

    schema = commands.add_parser("schema", help="print the JSON Schema of the pipeline format (for editors: see docs/format.md)")
    schema.add_argument("--path", action="store_true", help="print where the installed schema file is instead, for a $schema line")
    schema.set_defaults(handler=_schema)
    return parser


def _quiet_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("-q", "--quiet", action="store_true", help="no progress line (it only shows on a terminal, after a second)")


def _dims_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--dim", action=_DimsOnce, default=[], metavar="NAME=VALUE", type=_dim_pair, help="override a dim (repeatable)")


class _DimsOnce(argparse.Action):
    """``--dim`` may repeat, for different dims: one dim given two values is a usage error, never
    the last one silently winning."""

    def __call__(self, parser, namespace, pair, option_string=None):
        given = dict(getattr(namespace, self.dest))
        name, value = pair
        if given.get(name, value) != value:
            raise argparse.ArgumentError(self, f"{name} is given twice, as {given[name]} and as {value}: give it once")
        setattr(namespace, self.dest, [*getattr(namespace, self.dest), pair])


def _dim_pair(text: str) -> tuple[str, int]:
    name, sep, value = text.partition("=")
    if not sep or not name.strip():
        raise argparse.ArgumentTypeError(f"expected NAME=VALUE, got '{text}'")
    try:
        return name.strip(), int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"the value of {name.strip()} must be an integer, got '{value}'") from None


def _device(text: str) -> str:
    """A torch device this machine has: 'bogus' or 'cuda' without CUDA is a usage error (exit 2)."""

    problem = device_problem(text)
    if problem is not None:
        raise argparse.ArgumentTypeError(problem)
    return text


def _check(args) -> int:

    failed = False
    for name in args.files:
        try:
            spec, source = load_spec(name)
            diagnostics = analyze(spec, source, dict(args.dim)).diagnostics
        except TracerError as exc:
            diagnostics = exc.diagnostics
        for d in diagnostics:
            if args.strict and d.severity == "warning":
                d = Diagnostic(d.file, d.position, d.code, d.message, d.step, "error")
            print(d, file=sys.stderr)
            failed = failed or d.severity == "error"
    return 1 if failed else 0


def _run(args) -> int:

    pipeline = load(args.file) if not args.dim else _load_unchecked(args.file)

    analysis = pipeline.check(dict(args.dim))
    if args.output:
        check_output(args.output, _reads(args, analysis), args.file)  # before the run: never the files it reads
    nans = SoftmaxNaNs(analysis)
    params = _weights(args, analysis) if args.weights or args.weights_map else None
    with _running(analysis, args.quiet) as progress:
        trace = pipeline.run(
            dims=dict(args.dim),
            seed=args.seed,
            keep_values=args.values,
            device=args.device,
            max_memory=args.max_memory,
            observe=_with_progress(nans, progress),
            params=params,
        )
    for warning in trace.analysis.warnings + nans.warnings():
        print(warning, file=sys.stderr)
    if args.output:
        text = trace.to_json(values=args.values) if args.json else _table(trace, args) + "\n" + trace.peak_line()
        written = write_atomic(args.output, text + chr(10), error_file=args.file, reads=_reads(args, analysis))
        print(f"wrote {printable(written)}", file=sys.stderr)
        return 0
    if args.json:
        print(trace.to_json(values=args.values))
        return 0
    print(_table(trace, args))
    print(trace.peak_line())
    if args.values:
        for record in trace.records:
            print(f"\n{record.id} {record.symbolic}:\n{record.tensor}")
    return 0


def _reads(args, analysis) -> list[str]:
    """Every file this command reads: none of them may be its output."""
    given = [getattr(args, "weights", None), getattr(args, "weights_map", None)]
    return outputs.read_files(analysis) + [f for f in given if f]


def _weights(args, analysis) -> dict:
    """Every param from the checkpoint (renamed by the map): unknown, missing and mis-shaped keys together."""

    if args.weights_map and not args.weights:
        raise TracerError(Diagnostic(args.weights_map, None, "weights-map", "--weights-map renames the keys of --weights: give both"))
    check_budget(analysis, args.device, args.max_memory)  # a run that would be refused reads no weights
    budget = args.max_memory if args.max_memory is not None else default_budget(args.device)[0]
    mapping = weights.read_map(args.weights_map) if args.weights_map else None
    declared = takes(analysis, "params")
    # read only what some param takes: a key the map drops, or that no param has, is never read
    state = weights.read(args.weights, max_bytes=budget, wanted=lambda key: any(map(declared, weights.targets(mapping, key))))
    if mapping is not None:
        state = weights.rename(state, mapping)
    return match(analysis, state, "params", f"--weights {printable(args.weights)}", complete=True)


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


def _table(trace, args) -> str:
    return trace.table(width=shutil.get_terminal_size((100, 24)).columns, depth=args.depth, expand=args.expand)


def _positive(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number of at least 1, got '{text}'")
    return int(text)


def _output_name(text: str) -> str:
    if not text:
        raise argparse.ArgumentTypeError("the output name is empty: name the file to write (or leave -o out)")
    return text


def _size(text: str) -> int:

    try:
        return parse_bytes(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _load_unchecked(path: str):
    """Load without checking the declared dims: overridden dims are what will run."""

    return Pipeline(*load_spec(path))


def _render(args) -> int:

    with chosen_renderer(args.dot):
        return _draw(args)


def _draw(args) -> int:

    output, fmt = outputs.by_suffix(args.output or f"{Path(args.file).stem}.svg", DRAWINGS, default="svg")
    if args.values and args.device == "meta":
        raise TracerError(Diagnostic(args.file, None, "values-on-meta", "--values needs real data: drop --device meta (or use cpu/cuda)"))

    pipeline = _load_unchecked(args.file)
    analysis = pipeline.check(dict(args.dim))
    check_output(output, _reads(args, analysis), args.file)  # before the run: never the files it reads
    with _running(analysis, args.quiet) as progress:
        observe = _with_progress(None, progress)
        trace = pipeline.run(dims=dict(args.dim), device=args.device, keep_values=args.values, observe=observe)
    options = outputs.Options(collapse=tuple(args.collapse), expand=args.expand, timeout=args.timeout)
    with Progress(f"drawing {output.name}", quiet=args.quiet).ticking():
        written = outputs.write(trace, output, fmt, options)  # with values: heatmaps in softmax nodes
    print(f"wrote {printable(written)}")
    return 0


def _export(args) -> int:

    pipeline = _load_unchecked(args.file)
    reads = _reads(args, pipeline.check(dict(args.dim))) if args.output else []
    if args.output:
        check_output(args.output, reads, args.file)
    source = export_source(pipeline, dict(args.dim))
    if not args.output:
        sys.stdout.write(source)
        return 0
    print(f"wrote {printable(write_atomic(args.output, source, error_file=args.file, reads=reads))}", file=sys.stderr)
    return 0


def _input_spec(text: str) -> tuple[str, tuple[int, ...], str]:
    name, sep, rest = text.partition("=")
    shape, _, kind = rest.partition(":")
    try:
        sizes = tuple(int(size) for size in shape.split(","))
    except ValueError:
        sizes = ()
    if not sep or not name.isidentifier() or not sizes or min(sizes) < 0 or kind not in ("", "int", "float"):
        raise argparse.ArgumentTypeError(f"expected NAME=SIZE,SIZE,... with an optional :int or :float, got '{text}'")
    return name, sizes, kind or "float"


def _import(args) -> int:
    """Build the module with the user's own factory, import it, write the YAML, and say how far the
    pipeline is from the module on the module's own weights (the last line)."""
    import torch

    from .importing import difference, from_module

    module = _built_module(args.target, args.args, torch)
    inputs = {name: _example(name, sizes, kind, torch) for name, sizes, kind in args.input}
    pipeline = from_module(module, dims=dict(args.dim) or None, **inputs)
    pipeline.to_yaml(args.output)
    print(f"wrote {printable(args.output)}", file=sys.stderr)
    print(f"max |pipeline - module| on the module's weights: {difference(pipeline, module, **inputs):.3g}")
    return 0


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
    if math.prod(sizes) * 8 > budget:
        raise TracerError(
            Diagnostic(
                f"--input {name}", None, "import-input", f"{list(sizes)} is over the memory budget of {human_bytes(budget)} ({what})"
            )
        )
    return torch.randint(0, 2, sizes) if kind == "int" else torch.randn(sizes)


def _diff(args) -> int:
    found = diff(load(args.files[0]), load(args.files[1]), values=args.values)
    print(diff_json(found) if args.json else format_diff(found))
    return 0


def _version() -> str:

    return __version__


def _schema(args) -> int:
    """The schema file shipped in the package (generated by tracer.docgen; a test keeps it current)."""
    path = Path(__file__).with_name("pipeline.schema.json")
    if args.path:
        print(path.resolve())
    else:
        sys.stdout.write(path.read_text(encoding="utf-8"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
