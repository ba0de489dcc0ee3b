"""``python -m tracer.gallery PIPELINES OUT``: every pipeline's diagram as SVG and its exported PyTorch module (``tracer export``), plus a README.

Output is deterministic (sorted files, DOT that depends only on the pipeline), so re-running it
leaves committed files unchanged. A file that fails to load or run is reported and skipped.
"""

from __future__ import annotations

import glob
import sys
from pathlib import Path
from typing import NamedTuple

from .api import Pipeline
from .core.errors import TracerError
from .diff import diff, diff_page, format_diff
from .presentation import outputs
from .presentation.export import export_source
from .presentation.files import write_atomic
from .presentation.graphviz import find_renderer
from .spec.load import load_spec

# Pipelines that also get an interactive HTML report with values (heatmaps): the tutorials'
# sentence, a causal model and a sliding-window one. A path not in the folder is skipped.
REPORTS = ("seeds/000_encoder_block.yaml", "causal_mha.yaml", "models/mistral_sliding_window.yaml")
# Pipelines that fail on purpose (the lint examples' error): the gallery shows their error as what
# tracer reports, labelled so that nobody reading `make demo` takes it for a broken build.
DELIBERATE = ("lint_examples/view_non_contiguous.yaml",)


class Built(NamedTuple):
    """What one gallery build wrote, and what it skipped."""

    pictures: int
    modules: int
    reports: int
    deliberate: int  # errors on purpose (DELIBERATE), shown and skipped
    failed: int  # other pipelines that did not load or run

    def summary(self, index: Path) -> str:
        made = [_count(self.pictures, "diagram"), _count(self.modules, "PyTorch module"), _count(self.reports, "report")]
        shown = f", {_count(self.deliberate, 'deliberate error')} shown" if self.deliberate else ""
        skipped = f"; {self.failed} skipped with errors (above)" if self.failed else ""
        return f"gallery: {', '.join(made)}{shown}{skipped} — see {index}"


def _count(n: int, thing: str) -> str:
    return f"{n} {thing}{'' if n == 1 else 's'}"


# Imported pipelines (``tracer import``, pipelines/imported/modules.py) and the hand-written
# pipeline each stands beside: the README shows ``tracer diff`` between them.
IMPORTED = (
    ("models/llama_decoder_layer.yaml", "imported/llama_decoder_layer.yaml"),
    ("models/gpt2_attention.yaml", "imported/nanogpt_attention.yaml"),
)

HEADER = """# Gallery

Every pipeline in `pipelines/`, drawn by `tracer render` and written as a PyTorch module by
`tracer export` ([export and verify](../export.md)); regenerate with `make demo`.
How to read the marks: [reading a diagram](../reading-diagrams.md). Some have an interactive
HTML report with attention heatmaps ([the report](../report.md)): download it and open it from disk.

"""


def pipeline_files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.suffix in (".yaml", ".yml") and p.is_file())


def gallery_name(path: Path, root: Path) -> str:
    """Subfolders become name prefixes: ``seeds/000_x.yaml`` -> ``seeds__000_x``."""
    return "__".join(path.relative_to(root).with_suffix("").parts)


def render_one(path: Path, svg: Path) -> str:
    """Render one pipeline to ``svg``; returns its one-line description."""

    pipeline = Pipeline(*load_spec(path))
    pipeline.check().raise_errors()
    outputs.write(_run(pipeline), svg, outputs.WRITERS["svg"])  # a repeated block: its first copy and one ×N node
    return _markdown_text((pipeline.spec.description or pipeline.name).strip().splitlines()[0])


def _markdown_text(text: str) -> str:
    """A description as inert Markdown: no HTML tags, links or images from the pipeline's author."""
    return text.translate({ord("<"): "&lt;", ord(">"): "&gt;", **{ord(c): "\\" + c for c in "\\`[]"}})


def _export_one(path: Path, py: Path) -> str:
    """The pipeline as a PyTorch module (``tracer export``); the README's link to it, or nothing."""

    try:
        write_atomic(py, export_source(Pipeline(*load_spec(path))))
    except TracerError as exc:
        print(f"not exported {path}:\n{exc}", file=sys.stderr)
        return ""
    return f" · [PyTorch module]({py.name})"


def report_one(path: Path, html: Path) -> None:
    """The interactive report of one pipeline, run on the CPU with its values kept."""

    pipeline = Pipeline(*load_spec(path))
    options = outputs.Options(collapse=tuple(repeated_blocks(pipeline)))
    outputs.write(pipeline.run(keep_values=True), html, outputs.WRITERS["html"], options)


def repeated_blocks(pipeline) -> list[str]:
    """Collapse patterns that draw each copy of a ``repeat:`` block as one node: the report's
    diagram shows every copy (each is clickable), and a 48-layer stack still fits on a page."""
    return [
        glob.escape(f"{step.group}/{step.id}" if step.group else step.id) + "/*"
        for step in pipeline.spec.steps
        if step.includes_file and step.repeat
    ]


def _run(pipeline):
    # The meta device gives exact shapes, strides and views without memory; a step whose
    # kernel the meta device cannot run falls back to the CPU.
    try:
        return pipeline.run(device="meta")
    except TracerError:
        raise
    except Exception:
        return pipeline.run(device="cpu")


def build(root: Path, out: Path) -> Built:
    out.mkdir(parents=True, exist_ok=True)
    lines, counts = [], dict.fromkeys(Built._fields, 0)
    for path in pipeline_files(root):
        name, where = gallery_name(path, root), path.relative_to(root).as_posix()
        try:
            about = render_one(path, out / f"{name}.svg")
        except TracerError as exc:
            deliberate = where in DELIBERATE
            label = "— a deliberate error, what tracer reports for it (not a failure of the demo)" if deliberate else "(an error)"
            print(f"skipped {path} {label}:\n{exc}", file=sys.stderr)
            counts["deliberate" if deliberate else "failed"] += 1
            continue
        counts["pictures"] += 1
        report = _export_one(path, out / f"{name}.py")
        counts["modules"] += bool(report)
        if where in REPORTS:
            report_one(path, out / f"{name}.html")
            counts["reports"] += 1
            report += f" · [interactive report]({name}.html)"
        lines.append(f"- **{where}** — {about}{report}\n\n  ![{name}]({name}.svg)\n")
    write_atomic(out / "README.md", (HEADER + "\n".join(lines) + _imported_section(root, out)).encode())
    made = {f"{gallery_name(p, root)}.{kind}" for p in pipeline_files(root) for kind in ("svg", "html", "py")}
    made |= {_diff_page_name(imported, root) for _, imported in IMPORTED}
    for stale in [*out.glob("*.svg"), *out.glob("*.html"), *out.glob("*.py")]:  # files of pipelines that were removed or renamed
        if stale.name not in made:
            stale.unlink()
    return Built(**counts)


def _imported_section(root: Path, out: Path) -> str:
    """Each imported pipeline against its hand-written twin: ``tracer diff`` as text, and its
    side-by-side page (no runs: static)."""
    parts = []
    for written, imported in IMPORTED:
        if not (root / written).is_file() or not (root / imported).is_file():
            continue
        a, b = Pipeline(*load_spec(root / written)), Pipeline(*load_spec(root / imported))
        found = diff(a, b)
        found.a, found.b = written, imported  # paths as the reader finds them, whatever the working folder
        page = _diff_page_name(imported, root)
        write_atomic(out / page, diff_page(a, b, found))
        text = format_diff(found).replace("`", "'")  # inert inside the fence
        links = [f"[{p}]({gallery_name(root / p, root)}.svg)" for p in (written, imported)] + [f"[side by side]({page})"]
        parts.append(f"### {written} and {imported}\n\n{' · '.join(links)}\n\n```diff\n{text}\n```\n")
    if not parts:
        return ""
    intro = (
        "\n## Imported beside hand-written\n\nPipelines made by `tracer import` from PyTorch modules "
        "([importing](../import.md), `pipelines/imported/modules.py`), and `tracer diff` against the "
        "pipeline written by hand: `=` lines are renames, `~` changes, `-`/`+` steps only one side has.\n\n"
    )
    return intro + "\n".join(parts)


def _diff_page_name(imported: str, root: Path) -> str:
    return f"diff__{gallery_name(root / imported, root)}.html"


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2:
        print("usage: python -m tracer.gallery PIPELINES_DIR OUT_DIR", file=sys.stderr)
        return 2
    try:  # no renderer would skip every file and leave an empty index: say so once, change nothing
        find_renderer(args[0], "svg")
    except TracerError as exc:
        print(exc, file=sys.stderr)
        return 1
    out = Path(args[1])
    print(build(Path(args[0]), out).summary(out / "README.md"))
    return 0  # skipped files are reported, not fatal: others may be mid-edit


if __name__ == "__main__":
    sys.exit(main())
