"""The pipelines that ship with tracer, addressable by name wherever it is installed.

They live in the repository's ``pipelines/`` folder, and the wheel carries that folder as
``tracer/pipelines/`` (setup.py maps it): one copy in git. ``tracer run llama_decoder_layer``
and ``tracer.load("causal_mha")`` find them when no file of that name exists where they run.
"""

from __future__ import annotations

import difflib
from pathlib import Path
from typing import NamedTuple

_PACKAGE = Path(__file__).resolve().parents[1]
SUFFIX = ".yaml"
MODELS = "models"


def folder() -> Path:
    """``tracer/pipelines`` in an installed package, else the checkout's ``pipelines/`` beside ``tracer/``."""
    installed = _PACKAGE / "pipelines"
    return installed if installed.is_dir() else _PACKAGE.parent / "pipelines"


def locate(name: str | Path) -> str | Path:
    """``name`` itself when it is a path that exists, else the bundled pipeline it names, else
    ``name`` (so that reading it says the file is missing). A name is looked up as written, with
    ``.yaml`` added, then among the models: ``causal_mha``, ``lint_examples/scale_mismatch``,
    ``llama_decoder_layer``; the docs' ``pipelines/causal_mha.yaml`` finds the bundled file too."""
    if Path(name).exists():
        return name
    found = find(str(name))
    return name if found is None else found


def find(name: str) -> Path | None:
    root = folder()
    relative = name.removeprefix("pipelines/")
    for candidate in (root / relative, root / (relative + SUFFIX), root / MODELS / (relative + SUFFIX)):
        if candidate.suffix == SUFFIX and candidate.is_file() and candidate.resolve().is_relative_to(root.resolve()):
            return candidate
    return None


def names() -> list[str]:
    """Every name ``locate`` finds: a model by its own name, any other pipeline by its path in the folder."""
    root = folder()
    return sorted(
        path.stem if path.parent == root / MODELS else path.relative_to(root).with_suffix("").as_posix()
        for path in root.rglob("*" + SUFFIX)
    )


def not_found(name: str | Path) -> str:
    """What to say of a FILE that is neither a file here nor a bundled pipeline: the closest
    bundled name, and the command that lists them."""
    written = str(name).removeprefix("pipelines/").removesuffix(SUFFIX)
    close = difflib.get_close_matches(written, names(), n=1)
    guess = f"; did you mean '{close[0]}'?" if close else ""
    return f"no such file, nor a bundled pipeline of that name{guess} (`tracer models` lists the bundled models)"


class Model(NamedTuple):
    name: str
    matches: list[str]
    takes_checkpoint: bool
    description: str


def models() -> list[Model]:
    """The bundled models, by name: the modules each computes the same as (its ``matches:``), and
    whether a ``save_pretrained`` folder fills it (a ``checkpoint:`` section). Read as plain YAML:
    listing them validates nothing."""
    import yaml  # here, not at the top: `tracer check` answered from its cache reads no YAML (issue 32)

    found = []
    for path in sorted((folder() / MODELS).glob("*" + SUFFIX)):
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
        found.append(Model(path.stem, list(data.get("matches") or []), "checkpoint" in data, data.get("description", "")))
    return found
