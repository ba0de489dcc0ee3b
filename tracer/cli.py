"""The ``tracer`` command line: the parser, ``main``, and ``check`` answered from its cache
(``tracer/checkcache.py``). What the commands do is imported when one runs: a file's check from
``tracer/checking.py`` (the file format and the analysis), the others from ``tracer/commands.py``
(the runtime, diagrams, the diff too). ``tracer --help``, ``--version`` and a ``check`` of unchanged
files import none of it (start-up, issue 32)."""

from __future__ import annotations

import argparse
import functools
import math
import signal
import sys
import threading

from . import __version__, checkcache
from .core.errors import InternalError, TracerError, display, printable
from .core.formatting import parse_bytes
from .core.gcpause import import_frozen
from .presentation.files import OutputExists
from .spec.bundled import locate

WORLD_TIMEOUT = 60.0  # seconds: tracer run --world's default (tracer.distributed.run_parallel's too)
RENDER_TIMEOUT = 120.0  # seconds; the same default as tracer.presentation.diagram.DOT_TIMEOUT (kept here: the parser imports no renderer)


def main(argv: list[str] | None = None) -> int:
    """The command line: ``argv`` (default: the program's own arguments, as the ``tracer`` command runs)."""
    parser = _parser()
    args = parser.parse_args(argv)
    args.program = argv is None  # run as the program (not called from Python): the process is tracer's own
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
    check.add_argument(
        "--no-cache",
        action="store_true",
        help=f"check every file again, ignoring the results kept in {checkcache.DEFAULT_DIR}/ (also: {checkcache.OFF_ENV}=1)",
    )
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
    run.set_defaults(handler=_command("run"))

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
    render.set_defaults(handler=_command("render"))

    export = commands.add_parser(
        "export",
        help="write the pipeline as a standalone PyTorch module (nn.Module source)",
        epilog=_examples("tracer export causal_mha -o causal_mha.py"),
    )
    export.add_argument("file", metavar="FILE", type=_pipeline_file, help=FILE_HELP)
    export.add_argument("-o", "--output", metavar="OUT", type=_output_name, help="the .py file to write, atomically (default: stdout)")
    _dims_option(export)
    _force_option(export)
    export.set_defaults(handler=_command("export"))

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
    imported.set_defaults(handler=_command("import"))

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
    compared.set_defaults(handler=_command("diff"))

    schema = commands.add_parser(
        "schema",
        help="print the JSON Schema of the pipeline format, for editors",
        epilog=_examples(
            "tracer schema > pipeline.schema.json   # then, atop a pipeline: # yaml-language-server: $schema=pipeline.schema.json",
            "tracer schema --path",
        ),
    )
    schema.add_argument("--path", action="store_true", help="print where the installed schema file is instead, for a $schema line")
    schema.set_defaults(handler=_command("schema"))

    listed = commands.add_parser(
        "models",
        help="list the bundled models, the transformers modules each matches, and which read a save_pretrained folder",
        epilog=_examples("tracer models  # then: tracer run NAME, tracer run NAME --weights FOLDER --layer N"),
    )
    listed.set_defaults(handler=_command("models"))

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
    from . import commands  # the check asks torch: with the commands that run

    return commands.device_argument(text)


def _command(name: str):
    """The handler of a command: ``commands.HANDLERS[name]``, imported when the command runs."""

    def handler(args) -> int:
        from . import commands

        return commands.HANDLERS[name](args)

    return handler


def _check(args) -> int:
    """Every file's diagnostics (``checking.check_file``), or what they were when the file and the
    blocks it includes are unchanged (``checkcache``): the same lines, the same exit status."""
    cache = _check_cache(args)
    failed = False
    for name in args.files:
        checked = cache.get(name) if cache is not None else None
        if checked is None:
            checking = _checking(args.program)
            checked = checking.check_file(name, args.strict, dict(args.dim), args.rank)
            if cache is not None:
                cache.put(name, checked)
        checked.replay()
        failed = failed or checked.failed
    return 1 if failed else 0


def _checking(program: bool):
    """``tracer.checking``, imported at the first file the cache does not answer; run as the
    program, with what it imports frozen out of the collector's passes (``gcpause.import_frozen``)."""
    if program and "tracer.checking" not in sys.modules:
        return import_frozen("tracer.checking")
    from . import checking

    return checking


def _check_cache(args) -> checkcache.CheckCache | None:
    """The results kept for check's options that change what it prints; None when turned off, or
    when the current folder or tracer's own files cannot be read (the check runs uncached)."""
    if not checkcache.enabled(args.no_cache):
        return None
    try:
        return checkcache.CheckCache({"strict": args.strict, "dim": args.dim, "rank": args.rank})
    except OSError:
        return None


def _pipeline_file(text: str) -> str:
    """A FILE argument: the file, or the bundled pipeline of that name when no such file exists here."""
    return str(locate(text))


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not value > 0 or math.isinf(value):
        raise argparse.ArgumentTypeError(f"expected a number of seconds above 0, got '{text}'")
    return value


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


def _version() -> str:

    return __version__


if __name__ == "__main__":
    sys.exit(main())
