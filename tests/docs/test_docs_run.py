"""Every shell and Python block in README.md and docs/*.md runs as written and succeeds, and a
text block marked ``<!-- output -->`` is what the shell block before it printed: its lines, in
order, among the real output's (``...`` stands for lines left out, a leading ``…`` for the start
of a line, such as the folder a path is in)."""

import re
import shlex
import shutil
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conftest import FORK_SERVER, ROOT, expected_exit, tracer_cli

DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


FENCE = re.compile(
    r"^(?P<mark>[ \t]*<!-- (?P<kind>not run|file|output)(?:: ?(?P<arg>[^>]*?))? ?-->\n)?(?P<indent>[ \t]*)```(?P<lang>\w*)\n(?P<body>.*?)^(?P=indent)```",
    re.M | re.S,
)


RUN = {"bash": "shell", "sh": "shell", "python": "python"}


NOT_RUN = {  # (document, the block's first word) of the blocks that only illustrate: keep this short
    ("README.md", "make"),  # make test, make demo: the test suite itself, and the gallery
    ("architecture.md", "@register"),  # adding a step kind or a lint would register it in this process
    ("architecture.md", '@writer("csv",'),  # adding an output format would register it
    ("quickstart.md", "make"),  # make install: sets up the environment these tests run in
    ("export.md", "class"),  # an exported module, abridged: the export tests check the real one
    ("import.md", "pipeline"),  # nanoGPT and Llama imports: tests/importing runs the same, with the classes
    ("import.md", "tracer"),  # tracer import of the reader's own module: tests/cli/test_import_and_diff.py runs one
    ("import.md", "$"),  # tracer diff's output, abridged: tests/importing/test_imported_pipelines.py checks those lines
    ("parallel.md", "from"),  # parallelize() on a 2-rank process group: tests/runtime/test_parallel_run.py runs it
}


@dataclass
class Block:
    doc: Path
    line: int
    lang: str
    body: str
    mark: str | None
    arg: str


def blocks(doc: Path) -> list[Block]:
    text = doc.read_text()
    return [
        Block(doc, text[: m.start("indent")].count("\n") + 1, m["lang"], textwrap.dedent(m["body"]), m["kind"], m["arg"])
        for m in FENCE.finditer(text)
    ]


def runnable(doc: Path) -> list[Block]:
    return [b for b in blocks(doc) if b.lang in RUN and b.mark != "not run"]


def _python(block: Block, where: str, request) -> None:
    namespace: dict = {}
    exec(compile(block.body, where, "exec"), namespace)  # the docs' own code, from this repository
    for name, test in list(namespace.items()):  # a test the docs show runs with the fixtures it asks for
        if name.startswith("test_") and callable(test):
            test(**{arg: request.getfixturevalue(arg) for arg in test.__code__.co_varnames[: test.__code__.co_argcount]})


def _commands(body: str) -> list[tuple[list[str], int]]:
    """Each line's words as the shell reads them, quotes kept (the shell globs unquoted words only),
    with the exit status it must end with: 0, or what a trailing comment says (``# exit 1``)."""
    return [(words, expected_exit(line)) for line in body.splitlines() if (words := _words(line))]


def _words(line: str) -> list[str]:
    lexer = shlex.shlex(line, posix=False)
    lexer.whitespace_split, lexer.commenters = True, "#"
    return list(lexer)


def _expand(words: list[str], scratch: Path) -> list[str]:
    """The shell's globbing and unquoting: an unquoted word that names files becomes their names,
    one that names none stays as written; a quoted one ('layers/*', '*') is never globbed."""
    out = []
    for word in words:
        plain = word[:1] not in "'\"" and "*" in word and not word.startswith("-")
        found = sorted(str(p.relative_to(scratch)) for p in scratch.glob(word)) if plain else []
        out.extend(found or shlex.split(word))
    return out


def _shell(words: list[str], scratch: Path, pytester, where: str, expected: int = 0) -> str:
    """Run one command line; what a tracer command printed (stdout, then stderr)."""
    words = _expand(words, scratch)
    command = " ".join(words)
    target = None
    if ">" in words:  # `tracer schema > pipeline.schema.json`
        words, target = words[: words.index(">")], words[words.index(">") + 1]
    if words[0] == "tracer":
        if words[1] == "import":  # in-process, as a fresh shell is not: a page's module, not another page's of that name
            sys.modules.pop(words[2].partition(":")[0], None)
        done = tracer_cli(*words[1:], cwd=scratch)
        assert done.returncode == expected, f"{where}: `{command}` exited {done.returncode}: {done.stderr[-1500:]}"
        if target:
            (scratch / target).write_text(done.stdout)
        return done.stdout + done.stderr
    if words[0] == "pytest":
        # hypothesis's plugin would re-import hypothesis in every in-process run (seconds each)
        result = pytester.runpytest("-p", "no:cacheprovider", "-p", "no:hypothesispytest", *words[1:])
        assert result.ret == 0, f"{where}: `{command}` exited {result.ret}:\n" + "\n".join(result.outlines[-30:])
        return ""
    pytest.fail(f"{where}: `{command}`: only tracer and pytest commands run here; mark the block <!-- not run: WHY -->")


def _shown(expected: str, printed: str, where: str) -> None:
    """The documented output's lines appear, in order, in what the command printed."""
    lines = iter(line.rstrip() for line in printed.splitlines())
    for line in expected.splitlines():
        if line.strip() in ("", "..."):
            continue
        suffix = line.rstrip().removeprefix("…")
        assert any(got == line.rstrip() or (suffix != line.rstrip() and got.endswith(suffix)) for got in lines), (
            f"{where}: the documented output's line\n{line}\nis not in what the command printed (in this order):\n{printed}"
        )


def test_an_output_block_is_held_to_what_was_printed():
    _shown("a\n...\n…/c.yaml: d", "a\nb\n/x/c.yaml: d\n", "here")
    for wrong in ("b\na", "a\n…/c.yaml: e", "z"):
        with pytest.raises(AssertionError):
            _shown(wrong, "a\nb\n/x/c.yaml: d\n", "here")


def test_only_the_listed_blocks_are_left_unrun():
    skipped = {(b.doc.name, b.body.strip().split()[0]) for doc in DOCS for b in blocks(doc) if b.mark == "not run"}
    assert skipped == NOT_RUN


def _marked(doc: Path):
    """A page that launches ranks (`tracer run --world`) runs beside the other launches (conftest's FORK_SERVER)."""
    return pytest.param(doc, marks=FORK_SERVER if "--world" in doc.read_text() else (), id=doc.name)


@pytest.mark.parametrize("doc", [_marked(d) for d in DOCS if runnable(d)])
def test_every_block_of_a_document_runs(doc: Path, pytester, request):
    scratch = pytester.path
    shutil.copytree(ROOT / "pipelines", scratch / "pipelines")
    for block in blocks(doc):
        if block.mark == "file":
            (scratch / block.arg).write_text(block.body)
    printed = None
    for block in blocks(doc):
        where = f"{doc.name}:{block.line}"
        if block.mark == "output":
            assert printed is not None, f"{where}: an output block follows no shell block"
            _shown(block.body, printed, where)
        elif block.mark == "not run" or block.lang not in RUN:
            continue
        elif RUN[block.lang] == "python":
            _python(block, where, request)
        else:
            printed = "".join(_shell(line, scratch, pytester, where, expected) for line, expected in _commands(block.body))
