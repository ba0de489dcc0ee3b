"""The ``tracer`` command: check, run, render, export, schema."""

from __future__ import annotations

import argparse
import contextlib
import difflib
import functools
import math
import os
import shutil
import signal
import sys
import threading
from pathlib import Path

from . import __version__, checkpoints, weights
from .analysis.memory import check_budget, default_budget, parse_bytes
from .analysis.shapes import MAX_TENSOR_BYTES, analyze
from .api import Pipeline, load
from .core.errors import Diagnostic, InternalError, TracerError, display, printable
from .core.formatting import human_bytes
from .diff import diff, diff_json, diff_page, format_diff
from .distributed import run_parallel
from .presentation import outputs, ranks
from .presentation.export import export_source
from .presentation.files import OutputExists, Writes
from .presentation.folding import collapse_keys, depth_keys
from .presentation.graphviz import chosen_renderer, find_renderer
from .presentation.progress import Progress
from .runtime.interpreter import device_problem
from .runtime.tensors import match, takes
from .spec.bundled import locate, models
from .spec.load import load_named

DRAWINGS = ("svg", "png", "pdf", "dot", "html")  # what `tracer render -o` writes, by suffix
DIFF_TROUBLE = 2  # `tracer diff`'s exit status for a problem, as diff(1) and `git diff --exit-code` use it
WORLD_TIMEOUT = 60.0  # seconds: tracer run --world's default (tracer.distributed.run_parallel's too)
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
    except OutputExists as exc:  # the command line must say that it may replace the file: a usage error
        print(exc, file=sys.stderr)
        return 2
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
    def __init__(self, *args, **kwargs):
        kwargs.setdefault("formatter_class", _Help)
        super().__init__(*args, **kwargs)

    def error(self, message: str):  # argparse quotes the user's arguments: escape them like every diagnostic
        super().error(printable(message))


class _Help(argparse.RawDescriptionHelpFormatter):
    """``-o, --output OUT`` (argparse's default spells the value twice: ``-o OUT, --output OUT``),
    and examples shown line by line as written."""

    def _format_action_invocation(self, action: argparse.Action) -> str:
        if not action.option_strings or action.nargs == 0:
            return super()._format_action_invocation(action)
        return f"{', '.join(action.option_strings)} {self._format_args(action, self._get_default_metavar_for_optional(action))}"


DEPTH_HELP = (
    "show each group N levels deep as one {shown}, what is nested in it included: 1, every top-level group "
    "(a block, a composite group); 2, the level below (a block's copies): as --collapse '*' and '*/*' do, "
    "but a file without groups that deep is no error"
)
FILE_HELP = "a pipeline file (YAML), or the name of a bundled one: causal_mha, llama_decoder_layer (`tracer models` lists the models)"


def _examples(*lines: str) -> str:
    return "examples:\n" + "\n".join(f"  {line}" for line in lines)


@functools.cache  # built once per process: main() in a long-lived process (a notebook, the tests) pays 7 ms once
def _parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="tracer",
        description="Declare attention pipelines in YAML, trace every tensor's shape, render and check them.",
        epilog="`tracer help COMMAND` (or `tracer COMMAND -h`) explains a command, with examples.",
    )
    parser.add_argument("--debug", action="store_true", help="show Python tracebacks for internal errors")
    parser.add_argument("--version", action="version", version=f"tracer {_version()}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND", parser_class=_Parser)

    check = commands.add_parser(
        "check",
        help="validate pipelines and infer every shape without running them",
        epilog=_examples(
            "tracer check causal_mha llama_decoder_layer --strict  # lint warnings fail too",
            "tracer check causal_mha --dim T=4096               # at other sizes",
        ),
    )
    check.add_argument(
        "files",
        nargs="+",
        metavar="FILE",
        type=_pipeline_file,
        help="pipeline files (YAML) or bundled names; every error of each is reported",
    )
    check.add_argument("--strict", action="store_true", help="treat warnings (lints) as errors")
    _dims_option(check)
    _rank_option(check, "print that rank's local shapes, collectives and communication (a pipeline with parallel:)")
    check.set_defaults(handler=_check)

    run = commands.add_parser(
        "run",
        help="run a pipeline on torch and print every tensor's record",
        epilog=_examples(
            "tracer run causal_mha",
            "tracer run causal_mha --values scores           # one tensor's values",
            "tracer run causal_mha --device meta --dim T=65536  # shapes only, nothing allocated",
            "tracer run causal_mha --json -o trace.json",
            "tracer run causal_mha --collapse 'attention core'  # one row for the group",
            "tracer run llama_decoder_layer --dim T=32        # a bundled model (tracer models lists them)",
            "tracer run parallel/llama_tp --world 2            # as 2 processes on torch.distributed, sharded as its plan says",
        ),
    )
    run.add_argument("file", metavar="FILE", type=_pipeline_file, help=FILE_HELP)
    _dims_option(run)
    _rank_option(run, "with parallel:, the rank whose local shapes and collectives follow the table (and --json's rank; default 0)")
    run.add_argument("--seed", type=int, help="override the pipeline's seed")
    run.add_argument(
        "--values",
        nargs="?",
        const="",
        metavar="ID",
        help="keep and print tensor values; with ID (after FILE), only that tensor's (--json keeps every tensor's)",
    )
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
    run.add_argument("--depth", type=_positive, metavar="N", help=DEPTH_HELP.format(shown="row"))
    run.add_argument(
        "--width",
        type=_positive,
        metavar="N",
        help="fit the table in N columns: long ids and ops are elided, shapes never (default: the terminal's width; none in a file or a pipe)",
    )
    run.add_argument(
        "--collapse",
        action="append",
        default=[],
        metavar="GROUP",
        help="show a group as one row, as render --collapse draws it as one node: a group name, a group path or a glob; repeatable",
    )
    run.add_argument("--device", default="cpu", type=_device, help="torch device: cpu, cuda, meta (default: cpu)")
    run.add_argument(
        "--meta-kernels",
        action="store_true",
        help="with --device meta, run torch's meta kernel for every step (default: a repeated block's later copies "
        "take the layouts its first copy's kernels agreed with)",
    )
    _max_memory_option(run)
    _force_option(run)
    run.add_argument(
        "--weights",
        metavar="W",
        help="the params from a .safetensors file or a torch.save'd state_dict (keys: param ids, with / or .; every param must be there but those the file gives values:), "
        "or a transformers save_pretrained folder, read as the pipeline's checkpoint: section says (dims from config.json too)",
    )
    run.add_argument(
        "--layer",
        type=_whole,
        metavar="N",
        help="with --weights FOLDER: the layer whose tensors fill the params (model.layers.N. in a Llama checkpoint)",
    )
    run.add_argument(
        "--weights-map",
        metavar="MAP",
        help="a YAML file renaming a foreign checkpoint's keys: KEY: PARAM, KEY: [P1, P2, P3] (split a packed tensor), KEY: null (drop)",
    )
    run.add_argument(
        "--world",
        type=_positive,
        metavar="N",
        help="run as N processes on torch.distributed (gloo on cpu, nccl on cuda), sharded by torch's parallelize_module (a context step: torch's "
        "ring attention) as the file's parallel: section plans it; N is the mesh's size. Prints rank 0's records (--rank R's) and its collectives, and "
        "fails unless the outputs gathered from the ranks equal the single-device run's, every rank issued the predicted "
        "collectives and made the static per-rank shapes",
    )
    run.add_argument(
        "--timeout",
        type=_seconds,
        default=WORLD_TIMEOUT,
        metavar="SECONDS",
        help=f"with --world: stop every rank and fail when the run has not finished after this long (default: {WORLD_TIMEOUT:g})",
    )
    run.set_defaults(handler=_run)

    render = commands.add_parser(
        "render",
        help="draw the dataflow with shapes on every edge (svg, png, pdf, dot, or the html report)",
        epilog=_examples(
            "tracer render causal_mha -o mha.svg",
            "tracer render causal_mha --values -o report.html  # the interactive report",
            "tracer render encoder_stack --collapse 'layers/*' -o stack.svg",
            "tracer render llama_decoder_layer --collapse '*' --no-legend -o slide.svg  # every group one node: a layer on a slide",
        ),
    )
    render.add_argument("file", metavar="FILE", type=_pipeline_file, help=FILE_HELP)
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
        help="draw a group as one node: a group name, a group path ('layers' folds all copies of a block, 'layers/3' one) or a glob ('layers/*': one node per copy; '*': every top-level group, '*/*' the level below); repeatable",
    )
    render.add_argument("--depth", type=_positive, metavar="N", help=DEPTH_HELP.format(shown="node with its in and out shapes"))
    _quiet_option(render)
    render.add_argument(
        "--expand", action="store_true", help="draw every copy of a repeated block (default: the first copy and one ×N node for the rest)"
    )
    render.add_argument("--device", default="cpu", type=_device, help="torch device for the run (meta: no memory)")
    _max_memory_option(render)
    _force_option(render)
    render.add_argument("--seed", type=int, help="override the pipeline's seed (the values --values shows)")
    render.add_argument(
        "--rankdir", choices=("TB", "LR"), default="TB", help="the diagram's direction: TB top to bottom (default), LR left to right"
    )
    render.add_argument("--no-legend", dest="legend", action="store_false", help="leave the diagram's legend out (for slides)")
    _rank_option(render, "with parallel:, draw that rank's local shapes on the edges and the collectives as nodes with their bytes")
    render.add_argument(
        "--tokens",
        default="",
        type=_utf8_tokens,
        metavar="TEXT",
        help='label the .html report\'s attention heatmaps with these words, one per position: --tokens "The cat sat"',
    )
    render.add_argument(
        "--tokenizer",
        metavar="FOLDER",
        help="with --tokens: split TEXT as the tokenizer of this save_pretrained folder does, special tokens included "
        "(read offline with transformers; no code from the folder runs)",
    )
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

    export = commands.add_parser(
        "export",
        help="write the pipeline as a standalone PyTorch module (nn.Module source)",
        epilog=_examples("tracer export causal_mha -o causal_mha.py"),
    )
    export.add_argument("file", metavar="FILE", type=_pipeline_file, help=FILE_HELP)
    export.add_argument("-o", "--output", metavar="OUT", type=_output_name, help="the .py file to write, atomically (default: stdout)")
    _dims_option(export)
    _force_option(export)
    export.set_defaults(handler=_export)

    imported = commands.add_parser(
        "import",
        help="write a PyTorch module as a pipeline file (runs MODULE:FACTORY: your own code)",
        epilog=_examples(
            "tracer import tracer.pipelines.imported.modules:nanogpt_attention --input x=2,6,8 -o nanogpt.yaml  # nanoGPT's attention",
        ),
    )
    imported.add_argument(
        "target",
        metavar="MODULE:FACTORY",
        help="a Python import path and a callable returning the nn.Module, e.g. mymodel:make_attention with --args '[64, 4]'",
    )
    imported.add_argument("--args", default="[]", metavar="JSON", help="the factory's arguments: a JSON list, or an object of keywords")
    imported.add_argument(
        "--input",
        action="append",
        default=[],
        metavar="NAME=SHAPE",
        type=_input_spec,
        help="an example input for forward's parameter NAME: x=2,16,64 (randn) or ids=2,16:int (token ids); repeatable",
    )
    imported.add_argument(
        "--config",
        default="{}",
        metavar="JSON",
        help='settings for the module\'s config before capture: a JSON object, e.g. \'{"_attn_implementation": "eager"}\'',
    )
    imported.add_argument(
        "--forward",
        default="{}",
        metavar="JSON",
        help="forward's keyword arguments that are not tensors: a JSON object, e.g. '{\"output_attentions\": false}'",
    )
    _dims_option(imported)
    imported.add_argument(
        "-o",
        "--output",
        metavar="OUT",
        type=_output_name,
        required=True,
        help="the .yaml file to write (and its block files beside it, named after it: OUT_layers.yaml)",
    )
    _force_option(imported)
    imported.set_defaults(handler=_import)

    compared = commands.add_parser(
        "diff",
        help="compare two pipelines: steps (inside blocks too), shapes, params, dims, FLOPs and peak memory",
        description=(
            "Compare two pipelines, blocks expanded: a change inside a `use:` file is named by its step\n"
            "(layers/1/self_attn.scale; layers/{0..1}/... when every copy has it), a depth change reads\n"
            "'layers: repeat 2 -> 3'. Steps pair by id, else by structure, so renames are listed apart.\n"
            "--values gives each tensor that differs its max abs and relative difference; the tolerance\n"
            "is 1e-6 + 1e-5 x the values' magnitude.\n\n"
            "exit status: 0 the same pipeline (names aside), 1 they differ, 2 trouble (a file that does\n"
            "not load or check, a run that fails, a page that cannot be written, a bad option)."
        ),
        epilog=_examples(
            "tracer diff models/llama_decoder_layer imported/llama_decoder_layer --values  # names only: exit 0",
            "tracer diff lint_examples/scale_mismatch lint_examples/fixed/scale_mismatch --values  # exit 1",
        ),
    )
    compared.add_argument(
        "files",
        nargs=2,
        metavar="FILE",
        type=_pipeline_file,
        help="the two pipeline files (YAML) or bundled names, the first as the baseline",
    )
    compared.add_argument(
        "--values",
        action="store_true",
        help="also run both (seed 0): each tensor whose values differ, the first named, with its max abs and relative difference",
    )
    compared.add_argument("--json", action="store_true", help="print the differences as JSON")
    _max_memory_option(compared)
    _force_option(compared)
    compared.add_argument(
        "--html", metavar="PAGE", type=_output_name, help="also write the two side by side as one offline HTML page (PAGE.html)"
    )
    compared.set_defaults(handler=_diff)

    schema = commands.add_parser(
        "schema",
        help="print the JSON Schema of the pipeline format, for editors",
        epilog=_examples(
            "tracer schema > pipeline.schema.json   # then, atop a pipeline: # yaml-language-server: $schema=pipeline.schema.json",
            "tracer schema --path",
        ),
    )
    schema.add_argument("--path", action="store_true", help="print where the installed schema file is instead, for a $schema line")
    schema.set_defaults(handler=_schema)

    listed = commands.add_parser(
        "models",
        help="list the bundled models, the transformers modules each matches, and which read a save_pretrained folder",
        epilog=_examples("tracer models  # then: tracer run NAME, tracer run NAME --weights FOLDER --layer N"),
    )
    listed.set_defaults(handler=_models)

    helped = commands.add_parser("help", help="show this help, or a command's: tracer help run", epilog=_examples("tracer help render"))
    helped.add_argument("topic", nargs="?", metavar="COMMAND", choices=sorted(commands.choices), help="the command to explain")
    helped.set_defaults(handler=lambda args: _help(parser, commands, args.topic))
    return parser


def _help(parser: argparse.ArgumentParser, commands, topic: str | None) -> int:
    (commands.choices[topic] if topic else parser).print_help()
    return 0


def _max_memory_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--max-memory",
        type=_size,
        metavar="SIZE",
        help="refuse a real run whose estimated peak, the values it keeps included, exceeds SIZE, e.g. 8GiB or 500MB "
        "(default: half of the available RAM; --device meta allocates nothing)",
    )


def _force_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--force",
        action="store_true",
        help="replace an existing output that tracer did not write (never a file the command reads: the pipeline, its blocks, weights)",
    )


def _quiet_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("-q", "--quiet", action="store_true", help="no progress line (it only shows on a terminal, after a second)")


def _rank_option(parser: argparse.ArgumentParser, about: str) -> None:
    parser.add_argument("--rank", type=_whole, metavar="R", help=about)


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


def _pipeline_file(text: str) -> str:
    """A FILE argument: the file, or the bundled pipeline of that name when no such file exists here."""
    return str(locate(text))


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


def _check(args) -> int:

    failed = False
    for name in args.files:
        analysis = None
        try:
            spec, source = load_named(name)
            analysis = analyze(spec, source, dict(args.dim))
            diagnostics = analysis.diagnostics
        except TracerError as exc:
            diagnostics = exc.diagnostics
        for d in diagnostics:
            if args.strict and d.severity == "warning":
                d = Diagnostic(d.file, d.position, d.code, d.message, d.step, "error")
            print(d, file=sys.stderr)
            failed = failed or d.severity == "error"
        if args.rank is not None and analysis is not None and not analysis.errors:
            failed = not _print_rank(analysis, args.rank, name) or failed
    return 1 if failed else 0


def _print_rank(analysis, rank: int, file: str) -> bool:
    """``rank``'s section (``check --rank``), or why there is none; whether it was printed."""
    problem = ranks.check_rank(analysis, rank)
    if problem is not None:
        print(Diagnostic(file, None, "rank", problem), file=sys.stderr)
        return False
    print(ranks.rank_table(analysis, rank))
    return True


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


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not value > 0 or math.isinf(value):
        raise argparse.ArgumentTypeError(f"expected a number of seconds above 0, got '{text}'")
    return value


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


def _whole(text: str) -> int:
    if not text.isdigit():
        raise argparse.ArgumentTypeError(f"expected a whole number such as 0, got '{text}'")
    return int(text)


def _positive(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number of at least 1, got '{text}'")
    return int(text)


def _output_name(text: str) -> str:
    if not text:
        raise argparse.ArgumentTypeError("the output name is empty: name the file to write (or leave -o out)")
    return text


def _utf8_tokens(text: str) -> str:
    """The words, which the report writes as UTF-8: a byte the terminal passed that is not UTF-8
    (Python keeps it as a lone surrogate) is refused here, not when the page is written."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise argparse.ArgumentTypeError(
            f"the tokens must be UTF-8 text; {display(text[exc.start : exc.end])} (character {exc.start}) is not UTF-8"
        ) from None
    return text


def _size(text: str) -> int:

    try:
        return parse_bytes(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


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
