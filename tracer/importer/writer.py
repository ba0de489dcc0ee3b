"""An imported pipeline as YAML files: the main file and, for repeated layers, one block file.

N layers that compute the same steps (ids and params compared with their ``CONTAINER.i.``
prefix removed), each reading the previous one's output, become one ``op: block`` step with
``repeat: N``; the block file holds one layer, its params named as the state_dict names them
after the prefix, so ``layers/3/self_attn.q_proj.weight`` is ``layers.3.self_attn.q_proj.weight``.
Every value is written by PyYAML's safe dumper; source lines go into comments with their line
breaks removed, so nothing taken from the module changes what the file means.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, replace

import yaml

from ..steps.contract import STEP_KINDS
from .naming import Dim
from .rules import Step

REFERENCES = ("input", "inputs")  # besides each kind's param_fields and output_field


@dataclass
class Document:
    """What a file says, before it is text."""

    name: str
    header: list[str]
    dims: dict[str, tuple[int | str, str]]  # name -> (written, comment)
    inputs: dict[str, dict]
    params: dict[str, dict]
    steps: list[Step]
    outputs: list[str] | None = None
    seed: int | None = None  # the main file's: a run without the module's weights is reproducible

    def text(self) -> str:
        lines = [f"# {plain_line(line)}" for line in self.header] + [_entry("name", self.name)]
        lines += [] if self.seed is None else [_entry("seed", self.seed)]
        lines += ["dims:"] if self.dims else []  # a module whose sizes are all literals has none: `dims:` alone would be null
        lines += [f"  {_entry(name, written)}  # {plain_line(note)}" for name, (written, note) in self.dims.items()]
        for section in ("inputs", "params"):
            entries = getattr(self, section)
            lines += [f"{section}:"] + [f"  {_entry(name, value)}" for name, value in entries.items()] if entries else []
        lines.append("steps:")
        last = None
        for step in self.steps:
            if step.comment and step.comment != last:
                lines.append(f"  # {plain_line(step.comment)}")
            last = step.comment
            lines.append(f"  - {_flow(step.fields)}")
        if self.outputs:
            lines.append(_entry("outputs", self.outputs))
        return "\n".join(lines) + "\n"


def files(document: Document, stem: str | None = None) -> dict[str, str]:
    """{file name: text}, the main file ``STEM.yaml`` first (default: the document's name, made a
    file name), then one block file per folded container, ``STEM_CONTAINER.yaml``: named after the
    main file, so that two imports into one folder never share a block file. Repeated layers are
    folded in a copy: the document stays unfolded, to be written again under another name."""
    stem = file_stem(stem or document.name)
    document = replace(document, steps=list(document.steps), params=dict(document.params), outputs=list(document.outputs or []))
    blocks = {}
    for container in dict.fromkeys(s.layer[0] for s in document.steps if s.layer):
        block = _fold(document, container, stem)
        if block is not None:
            blocks[f"{file_stem(block.name)}.yaml"] = block.text()
    return {f"{stem}.yaml": document.text(), **blocks}


def file_stem(name: str) -> str:
    """A name as a file name in the output's folder: letters, digits, ``_``, ``-`` and inner dots
    only (a class named ``../x`` or ``/etc/y`` writes nowhere else), at most 100 characters."""
    stem = re.sub(r"[^A-Za-z0-9_.-]", "_", name)[:100].strip(".")
    return stem or "pipeline"


def _fold(document: Document, container: str, stem: str) -> Document | None:
    """Replace the layers of ``container`` by one block step if they are equal and chained."""
    layers = _layers(document.steps, container)
    if layers is None:
        return None
    shared = _shared_params(document, container, layers)
    forms = [_normalised(document, container, index, steps, shared) for index, steps in layers]
    bodies, externals = [f[0] for f in forms], [f[1] for f in forms]
    lasts = [steps[-1].fields["id"] for _, steps in layers]
    chained = all(externals[j][0] == lasts[j - 1] and externals[j][1:] == externals[0][1:] for j in range(1, len(layers)))
    if any(body != bodies[0] for body in bodies) or not chained or not _only_last_leaves(document, layers):
        return None
    block = _block_document(document, container, layers[0], bodies[0], externals[0], stem, shared)
    _replace_layers(document, container, layers, externals[0], f"{file_stem(block.name)}.yaml", shared)
    return block


def _shared_params(document: Document, container: str, layers) -> set[str]:
    """The params of one layer that a step of another layer reads (T5's relative bias table, held
    by its first block and added in every block): every layer then reads it from outside, as a
    block input, and it stays in the main file."""
    shared = set()
    for index, steps in layers:
        own = f"{container}.{index}."
        read = {name for step in steps for name in _names_read(step.fields) if name in document.params}
        shared |= {name for name in read if name.startswith(f"{container}.") and not name.startswith(own)}
    return shared


def _layers(steps: list[Step], container: str) -> list[tuple[int, list[Step]]] | None:
    """The layers of a container in order, each a run of consecutive steps; None unless 2 or more, from 0."""
    runs: list[tuple[int, list[Step]]] = []
    for previous, step in zip([None, *steps], steps):
        if step.layer and step.layer[0] == container:
            if runs and runs[-1][0] == step.layer[1] and runs[-1][1][-1] is previous:
                runs[-1][1].append(step)
            else:
                runs.append((step.layer[1], [step]))
    indexes = [index for index, _ in runs]
    return runs if len(runs) >= 2 and indexes == list(range(len(runs))) else None


def _reference_fields(fields: dict) -> list[str]:
    kind = STEP_KINDS[fields["op"]]
    return [*REFERENCES, *kind.param_fields, *([kind.output_field] if kind.output_field else [])]


def _rename(fields: dict, rename) -> dict:
    """The step with every tensor it names passed through ``rename`` (its id and outputs included)."""
    names = set(_reference_fields(fields))
    out = {}
    for key, value in fields.items():
        if key == "id" or key in names:
            value = [rename(v) for v in value] if isinstance(value, list) else rename(value)
        out[key] = value
    return out


def _defined(step: Step) -> list[str]:
    kind = STEP_KINDS[step.fields["op"]]
    return [step.fields["id"], *(step.fields.get(kind.output_field) or [] if kind.output_field else [])]


def _normalised(document: Document, container: str, index: int, steps: list[Step], shared: set[str]) -> tuple[list[dict], list[str]]:
    """The layer's steps with ``CONTAINER.i.`` removed and outside tensors (``shared`` params
    included) as $0, $1 ...; and those tensors."""
    prefix = f"{container}.{index}."
    own = {name for step in steps for name in _defined(step)}
    externals: list[str] = []

    def rename(name: str) -> str:
        if name in own or (name in document.params and name.startswith(prefix) and name not in shared):
            return name.removeprefix(prefix)
        if name not in externals:
            externals.append(name)
        return f"${externals.index(name)}"

    return [_rename(step.fields, rename) for step in steps], externals


def _only_last_leaves(document: Document, layers) -> bool:
    """No step after the layers reads a tensor of the last layer other than its output."""
    last_steps = layers[-1][1]
    inner = {name for step in last_steps for name in _defined(step)} - {last_steps[-1].fields["id"]}
    after = document.steps[document.steps.index(last_steps[-1]) + 1 :]
    used = {name for step in after for name in _names_read(step.fields)} | set(document.outputs or [])
    return not inner & used


def unread_names(document: Document) -> list[str]:
    """The inputs and params no step reads and no output names, as the file's analysis finds them
    (``unread_declarations``), known before the file is written."""
    read = {name for step in document.steps for name in _names_read(step.fields)} | set(document.outputs or [])
    return [name for name in (*document.inputs, *document.params) if name not in read]


def _names_read(fields: dict) -> list[str]:
    found = []
    _rename(fields, lambda name: found.append(name) or name)
    return found


def _block_document(
    document: Document, container: str, layer, body: list[dict], externals: list[str], stem: str, shared: set[str]
) -> Document:
    index, steps = layer
    prefix = f"{container}.{index}."
    own = {name for fields in body for name in _names_read(fields)}
    names = [_free("x", own), *(_free(e.replace(".", "_"), own) for e in externals[1:])]
    inputs = {name: {"shape": _shape_of(document, external), "init": "randn"} for name, external in zip(names, externals, strict=True)}
    params = {name.removeprefix(prefix): value for name, value in document.params.items() if name.startswith(prefix) and name not in shared}
    placed = [
        Step(_rename(fields, lambda n: names[int(n[1:])] if n.startswith("$") else n), step.node, step.comment, None, step.shape)
        for fields, step in zip(body, steps, strict=True)
    ]
    repeats = len(_layers(document.steps, container) or [])
    header = [f"Imported by tracer.from_module: one layer of {document.name}; '{container}' repeats it {repeats} times."]
    block = Document(f"{stem}_{container.replace('.', '_')}", header, document.dims, inputs, params, placed)
    drop_unused_dims(block)  # the encoder's layer names no decoder length (T5's T2), whatever the main file has
    return block


def _free(name: str, taken: set[str]) -> str:
    while name in taken:
        name += "_in"
    return name


def _shape_of(document: Document, name: str) -> list:
    for step in document.steps:
        if name in _defined(step):
            return step.shape
    return {**document.inputs, **document.params}[name]["shape"]


def _replace_layers(document: Document, container: str, layers, externals: list[str], use: str, shared: set[str]) -> None:
    first, last = layers[0][1][0], layers[-1][1][-1]
    start, stop = document.steps.index(first), document.steps.index(last) + 1
    output = last.fields["id"]
    comment = f"{len(layers)} equal layers: {container}.0 .. {container}.{len(layers) - 1}"
    block = Step(
        {"id": container, "op": "block", "use": use, "inputs": externals, "repeat": len(layers)}, first.node, comment, None, last.shape
    )
    after = [
        Step(_rename(s.fields, lambda n: container if n == output else n), s.node, s.comment, s.layer, s.shape)
        for s in document.steps[stop:]
    ]
    document.steps[start:] = [block, *after]
    document.outputs = [container if name == output else name for name in document.outputs or []]
    for index, _ in layers:
        for name in [n for n in document.params if n.startswith(f"{container}.{index}.") and n not in shared]:
            del document.params[name]


# libyaml's emitter when PyYAML has it: the same text, 3-4x faster than the pure-Python one
SAFE_DUMPER = getattr(yaml, "CSafeDumper", yaml.SafeDumper)


def _flow(value) -> str:
    return yaml.dump(value, Dumper=SAFE_DUMPER, default_flow_style=True, sort_keys=False, width=1 << 30, allow_unicode=False).strip()


def _entry(key: str, value) -> str:
    return _flow({key: value})[1:-1]


def plain_line(text: str) -> str:
    """One line of text that stays a comment: no line breaks or control characters, at most 120 characters."""
    text = text[:120]
    return text if text.isprintable() else "".join(ch if ch.isprintable() else " " for ch in text)


def drop_unused_dims(document: Document) -> None:
    """Keep the dims a shape or a step names, and those their expressions name: a config's vocab
    size is no dim of an imported attention layer. Input shapes are read, so every size a user
    needs to make the inputs stays."""
    kept: set[str] = set()
    todo = [name for name in _words([document.inputs, document.params, [s.fields for s in document.steps]]) if name in document.dims]
    while todo:
        name = todo.pop()
        if name not in kept:
            kept.add(name)
            todo += [word for word in _words(document.dims[name][0]) if word in document.dims]
    document.dims = {name: value for name, value in document.dims.items() if name in kept}


def _words(value) -> set[str]:
    return set(re.findall(r"[A-Za-z_]\w*", json.dumps(value, default=str)))


def dims_of(symbols: dict[str, int], model: dict[str, Dim]) -> dict[str, tuple[int | str, str]]:
    """The dims section: the capture's symbols with their example sizes, then the model's dims, derived ones last."""
    dims = {name: (size, "example size; followed from the inputs") for name, size in symbols.items()}
    base = {name: (d.written, d.note) for name, d in model.items() if isinstance(d.written, int)}
    derived = {name: (d.written, f"{d.note}, = {d.value}") for name, d in model.items() if not isinstance(d.written, int)}
    return {**dims, **base, **derived}
