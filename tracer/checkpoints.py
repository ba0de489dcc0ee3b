"""Real checkpoints in: a transformers ``save_pretrained`` folder (``config.json`` with
``model.safetensors``, or the shards ``model.safetensors.index.json`` lists) fills a pipeline as its
``checkpoint:`` section says: dims and step fields from the config, params from the tensors of
one layer (``--layer N``), keys renamed as ``--weights-map`` renames them.

The folder is untrusted input, read as :func:`tracer.weights.read` reads a file: only regular
files are opened, a shard the index names must be a ``.safetensors`` file beside it, only the
shards holding a needed tensor are opened, and the needed tensors' bytes (from the safetensors
headers) are held against the budget before any is copied.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from .api import Pipeline
from .core.dimexpr import MAX_VALUE
from .core.errors import Diagnostic, TracerError, printable
from .core.formatting import human_bytes
from .runtime.tensors import match
from .spec.load import load_named
from .spec.pipeline import Checkpoint, Split
from .spec.source import control_problem, one_line_field, open_regular
from .weights import described_tensor, nbytes, reason, rename

CONFIG, SINGLE, INDEX = "config.json", "model.safetensors", "model.safetensors.index.json"
LAYER_COUNT = "num_hidden_layers"  # transformers' name for it in every decoder config it maps
MAX_JSON = 16 * 2**20  # the shard index of a 400-shard model is about 2 MB
_MISSING = object()


def from_pretrained(
    pipeline: Pipeline | str | Path, folder: str | Path, layer: int | None = None, max_bytes: int | None = None
) -> tuple[Pipeline, dict[str, Any]]:
    """``pipeline`` with the dims and step fields of ``folder``'s ``config.json``, and its params
    from the checkpoint (layer ``layer`` when the keys are per layer): run it with
    ``bound.run(params=params, inputs=...)``."""
    bound = bind(pipeline, folder, layer)
    return bound, read_params(bound, folder, layer, max_bytes)


def bind(pipeline: Pipeline | str | Path, folder: str | Path, layer: int | None = None) -> Pipeline:
    """A new pipeline whose dims and step fields are the values ``config.json`` gives them; a
    config that differs from what the pipeline ``require:``s is refused, every problem at once."""
    if not isinstance(pipeline, Pipeline):
        pipeline = Pipeline(*load_named(pipeline))  # a file, or a bundled model's name
    section = _section(pipeline)
    _prefix(pipeline, section, layer)  # a missing or stray --layer before anything is read
    config_path = Path(folder) / CONFIG
    config = _read_json(_folder(folder) / CONFIG)
    if not isinstance(config, dict):
        raise TracerError(Diagnostic(str(config_path), None, "checkpoint", "expected a JSON object, as save_pretrained writes"))
    binder = _Binder(pipeline, config, str(config_path), layer)
    binder.check_layer()
    dims = binder.dims(section.dims)
    steps = binder.fields(section.fields)
    binder.require(section.require)
    if binder.problems:
        raise TracerError(binder.other_model(section) or binder.problems)
    return Pipeline(pipeline.spec.model_copy(update={"dims": dims, "steps": steps}), pipeline.source)


def read_params(
    pipeline: Pipeline, folder: str | Path, layer: int | None = None, max_bytes: int | None = None, dims: Mapping[str, int] | None = None
) -> dict[str, Any]:
    """Every param of ``pipeline`` (at ``dims``) from the checkpoint's tensors, checked against its declaration."""
    section = _section(pipeline)
    prefix = _prefix(pipeline, section, layer)
    analysis = pipeline.check(dims)
    analysis.raise_errors()
    entries = _per_copy(section.params, analysis)  # key after the prefix -> (the map's own key, its target)
    wanted = {prefix + key: written for key, (written, _) in entries.items()}
    state = _Shards(_folder(folder), pipeline, prefix, wanted).read(max_bytes)
    mapping = {key: _target(target) for key, (_, target) in entries.items()}
    params = rename({key[len(prefix) :]: tensor for key, tensor in state.items()}, mapping)
    return match(analysis, params, "params", f"--weights {folder}", complete=True)


def _per_copy(params: Mapping[str, Any], analysis) -> dict[str, tuple[str, Any]]:
    """The map with each ``{layer}`` entry written out once per copy of its block that the
    pipeline declares (``h/0/ln_1_w``, ``h/1/ln_1_w``: copies 0 and 1)."""
    copies = sorted(_copies(params, analysis))
    entries = {}
    for key, target in params.items():
        for copy in copies if "{layer}" in key else [None]:
            entries[key if copy is None else key.replace("{layer}", str(copy))] = (key, _for_copy(target, copy))
    return entries


def _copies(params: Mapping[str, Any], analysis) -> set[int]:
    """The copies the declared params hold for the map's ``{layer}`` targets."""
    templates = {name for target in params.values() for name in _names(target) if "{layer}" in name}
    patterns = [re.compile(_copy_pattern(t.replace(".", "/"))) for t in templates]
    return {int(m["layer"]) for name in analysis.pipeline.params for p in patterns if (m := p.fullmatch(name))}


def _copy_pattern(template: str) -> str:
    """``template`` as a regex whose every ``{layer}`` is one and the same copy number (the first
    captures it, the others repeat it: no run of digit groups to backtrack through)."""
    parts = [re.escape(part) for part in template.split("{layer}")]
    return parts[0] + "(?P<layer>0|[1-9][0-9]*)" + parts[1] + "".join(f"(?P=layer){part}" for part in parts[2:])


def _names(target: Any) -> list[str]:
    return [] if target is None else [target] if isinstance(target, str) else list(target) if isinstance(target, list) else target.into


def _for_copy(target: Any, copy: int | None) -> Any:
    if copy is None or target is None:
        return target
    if isinstance(target, str):
        return target.replace("{layer}", str(copy))
    if isinstance(target, list):
        return [name.replace("{layer}", str(copy)) for name in target]
    return target.model_copy(update={"into": [name.replace("{layer}", str(copy)) for name in target.into]})


def _section(pipeline: Pipeline) -> Checkpoint:
    if pipeline.spec.checkpoint is None:
        raise TracerError(
            Diagnostic(
                pipeline.path,
                None,
                "checkpoint",
                "a save_pretrained folder fills a pipeline with a 'checkpoint:' section (which config.json keys set which dims, "
                "which keys are which params); add one, or give --weights a .safetensors file",
            )
        )
    return pipeline.spec.checkpoint


def _prefix(pipeline: Pipeline, section: Checkpoint, layer: int | None) -> str:
    per_layer = "{layer}" in section.prefix
    if per_layer == (layer is not None):
        return section.prefix.replace("{layer}", str(layer))
    message = (
        f"the checkpoint's keys are per layer ('{section.prefix}'): give the layer, --layer N"
        if per_layer
        else "the checkpoint's keys name no layer (its prefix has no {layer}): drop --layer"
    )
    raise TracerError(pipeline.source.error(("checkpoint", "prefix"), "checkpoint", message, prefer_key=True))


def _folder(folder: str | Path) -> Path:
    path = Path(folder)
    if not path.is_dir():
        raise TracerError(
            Diagnostic(
                str(folder),
                None,
                "weights-folder",
                "is not a folder; give the folder save_pretrained wrote (config.json, model.safetensors)",
            )
        )
    return path


def _read_json(path: Path) -> Any:
    fd, info = open_regular(path, str(path), "expected the JSON file save_pretrained writes", codes=("weights-folder", "weights-folder"))
    with os.fdopen(fd, "rb") as file:
        data = file.read(MAX_JSON + 1)
    if len(data) > MAX_JSON:
        raise TracerError(
            Diagnostic(str(path), None, "weights-folder", f"is over {human_bytes(MAX_JSON)}; save_pretrained writes far less")
        )
    try:
        return json.loads(data)
    except (ValueError, RecursionError) as exc:
        raise TracerError(Diagnostic(str(path), None, "weights-folder", f"is not JSON ({str(exc)[:200]})")) from None


def _control_problem(value: Any, one_line: bool) -> str | None:
    """The first text in a config value that breaks the control-character rule pipeline files follow."""
    if isinstance(value, str):
        return control_problem(value, one_line)
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    return next((p for key, item in items for p in [_control_problem(str(key), True), _control_problem(item, one_line)] if p), None)


def _target(target: str | list[str] | Split | None) -> Any:
    """A map entry as :func:`tracer.weights.rename` takes it."""
    return target if target is None or isinstance(target, (str, list)) else target.model_dump()


class _Binder:
    """Reads config.json values into dims and step fields, collecting every problem."""

    def __init__(self, pipeline: Pipeline, config: dict, config_name: str, layer: int | None):
        self.pipeline, self.config, self.config_name, self.layer = pipeline, config, config_name, layer
        self.problems: list[Diagnostic] = []

    def value(self, key: str, path: tuple) -> Any:
        """The config's value at a dotted key (``_MISSING``, with a problem, when there is none)."""
        found = self.lookup(key)
        if found is _MISSING:
            self.problem(path, f"{self.config_name} has no '{key}'" + (f" (layer {self.layer})" if "{layer}" in key else ""))
        return found

    def lookup(self, key: str) -> Any:
        """The config's value at a dotted key, ``_MISSING`` when there is none."""
        node: Any = self.config
        for part in key.replace("{layer}", str(self.layer)).split("."):
            if isinstance(node, dict) and part in node:
                node = node[part]
            elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
                node = node[int(part)]
            else:
                return _MISSING
        return node

    def check_layer(self) -> None:
        """``--layer`` past the model's last, named with the model's layer count (not a config key
        that layer lacks, nor a prefix no tensor has)."""
        count = self.config.get(LAYER_COUNT)
        if self.layer is not None and type(count) is int and not 0 <= self.layer < count:
            layers = f"layers 0 to {count - 1}" if count > 1 else "only layer 0" if count == 1 else "no layers"
            message = (
                f"--layer {self.layer}: the model has {count} layers ({self.config_name} {LAYER_COUNT}: {count}); give one of {layers}"
            )
            raise TracerError(self.pipeline.source.error(("checkpoint", "prefix"), "checkpoint", message, prefer_key=True))

    def other_model(self, section: Checkpoint) -> list[Diagnostic]:
        """One problem instead of one per key when the config has none of the dims the section
        reads: it describes another architecture, named by its ``model_type``."""
        keys = list(section.dims)
        if not keys or any(self.lookup(key) is not _MISSING for key in keys):
            return []
        model_type = self.config.get("model_type")
        kind = f"a '{model_type}' model (model_type)" if isinstance(model_type, str) else "a model without a model_type"
        message = (
            f"{self.config_name} describes {kind}, with none of the keys this pipeline reads ({', '.join(keys)}): "
            "it is another architecture; give the folder of a model this pipeline is written for"
        )
        return [self.pipeline.source.error(("checkpoint", "dims"), "checkpoint", message, prefer_key=True)]

    def problem(self, path: tuple, message: str) -> None:
        self.problems.append(self.pipeline.source.error(("checkpoint", *path), "checkpoint", message, prefer_key=True))

    def dims(self, mapping: Mapping[str, str]) -> dict[str, Any]:
        dims = dict(self.pipeline.spec.dims)
        for key, dim in mapping.items():
            if dim not in dims:
                self.problem(("dims", key), f"'{dim}' is not a dim of this pipeline; its dims: {', '.join(dims)}")
                continue
            value = self.value(key, ("dims", key))
            if value is _MISSING:
                continue
            if type(value) is not int or not 1 <= value <= MAX_VALUE:  # null too: a model without a sliding window is another pipeline
                self.problem(
                    ("dims", key), f"{self.config_name} gives {key}: {json.dumps(value)}; dim '{dim}' needs a whole number from 1 to 2**62"
                )
                continue
            dims[dim] = value
        return dims

    def fields(self, mapping: Mapping[str, list[str]]) -> list:
        steps = list(self.pipeline.spec.steps)
        index = {step.id: i for i, step in enumerate(steps)}
        for key, refs in mapping.items():
            value = self.value(key, ("fields", key))
            if value is _MISSING:
                continue
            for n, ref in enumerate(refs):
                step_id, field = ref.rsplit(".", 1)
                where = ("fields", key, n)
                if step_id not in index:
                    self.problem(where, f"'{step_id}' is not a step of this pipeline")
                elif field in ("id", "op") or field not in type(steps[index[step_id]]).model_fields:
                    self.problem(where, f"step '{step_id}' ({steps[index[step_id]].op}) has no field '{field}'")
                else:
                    steps[index[step_id]] = self.field(steps[index[step_id]], field, key, value, where)
        return steps

    def field(self, step, field: str, key: str, value: Any, where: tuple):
        """``step`` with ``field`` set to ``value``, validated as the file's own value would be."""
        written = step.model_dump(exclude_unset=True)
        text = _control_problem(value, one_line_field(field))
        if text:
            self.problem(where, f"{self.config_name} gives {key} a text tracer does not show: {text}")
            return step
        try:
            return type(step).model_validate({**written, field: value})
        except ValidationError as exc:
            reason = exc.errors()[0]["msg"]
            self.problem(where, f"{self.config_name} gives {key}: {json.dumps(value)}, not a value for '{step.id}' {field} ({reason})")
            return step

    def require(self, mapping: Mapping[str, Any]) -> None:
        for key, expected in mapping.items():
            value = self.value(key, ("require", key))
            if value is not _MISSING and (value != expected or type(value) is not type(expected)):
                self.problem(
                    ("require", key),
                    f"{self.config_name} gives {key}: {json.dumps(value)}; this pipeline computes the model with {key}: {json.dumps(expected)}",
                )


class _Shards:
    """The checkpoint's tensors for the wanted keys: from model.safetensors, or from the shards the
    index names for them."""

    def __init__(self, folder: Path, pipeline: Pipeline, prefix: str, wanted: Mapping[str, str]):
        self.folder, self.pipeline, self.prefix, self.wanted = folder, pipeline, prefix, wanted

    def read(self, max_bytes: int | None) -> dict[str, Any]:
        where = self._locations()
        self._check_keys(set(where))
        by_shard: dict[str, list[str]] = {}
        for key in self.wanted:
            by_shard.setdefault(where[key], []).append(key)
        opened = []
        try:
            for shard, keys in by_shard.items():
                opened.append((shard, keys, *self._open(shard)))
            total = sum(nbytes(self._described(shard, handle, key)) for shard, keys, _, handle in opened for key in keys)
            if max_bytes is not None and total > max_bytes:
                raise TracerError(
                    Diagnostic(
                        str(self.folder),
                        None,
                        "weights-too-large",
                        f"the tensors this pipeline takes from the checkpoint need {human_bytes(total)}, over the memory budget of "
                        f"{human_bytes(max_bytes)}; raise it with --max-memory",
                    )
                )
            return {key: self._tensor(shard, handle, key) for shard, keys, _, handle in opened for key in keys}
        finally:
            for _, _, fd, _ in opened:
                os.close(fd)

    def _locations(self) -> dict[str, str]:
        """Every key of the checkpoint, with the file holding it."""
        index, single = self.folder / INDEX, self.folder / SINGLE
        if index.exists():
            data = _read_json(index)
            weight_map = data.get("weight_map") if isinstance(data, dict) else None
            if not isinstance(weight_map, dict):
                raise TracerError(Diagnostic(str(index), None, "weights-folder", "has no 'weight_map' object (key -> shard file)"))
            for key, shard in weight_map.items():
                self._check_shard(key, shard, index)
            return weight_map
        if single.exists():
            fd, handle = self._open(SINGLE)
            try:
                return dict.fromkeys(handle.keys(), SINGLE)
            finally:
                os.close(fd)
        raise TracerError(
            Diagnostic(
                str(self.folder),
                None,
                "weights-folder",
                f"has neither {SINGLE} nor {INDEX}; save the model with save_pretrained (safetensors, the default)",
            )
        )

    def _check_shard(self, key: str, shard: Any, index: Path) -> None:
        """A shard is a .safetensors file beside the index: no path out of the folder."""
        if not (isinstance(shard, str) and shard.endswith(".safetensors") and Path(shard).name == shard and not shard.startswith(".")):
            raise TracerError(
                Diagnostic(
                    str(index),
                    None,
                    "weights-folder",
                    f"names {json.dumps(shard)[:100]} as the shard of '{key}'; a shard is a .safetensors file beside the index",
                )
            )

    def _check_keys(self, present: set[str]) -> None:
        """Every wanted key is there, and every key under the prefix is wanted: a tensor the
        pipeline does not map (a bias it lacks) would otherwise be dropped and the result wrong."""
        source, problems = self.pipeline.source, []
        if self.prefix and not any(key.startswith(self.prefix) for key in present):
            message = f"{self.folder} has no tensor whose key starts with '{self.prefix}' (a layer past the model's last?)"
            raise TracerError(source.error(("checkpoint", "prefix"), "checkpoint", message, prefer_key=True))
        for key, short in self.wanted.items():
            if key not in present:
                problems.append(
                    source.error(("checkpoint", "params", short), "checkpoint", f"{self.folder} has no tensor '{key}'", prefer_key=True)
                )
        for key in sorted(present):
            if key.startswith(self.prefix) and key not in self.wanted:
                problems.append(
                    source.error(
                        ("checkpoint", "params"),
                        "checkpoint",
                        f"{self.folder} has '{key}', which the checkpoint map does not name: the pipeline does not compute with it; "
                        f"map '{key[len(self.prefix) :]}' to a param, or to null if the model ignores it too",
                        prefer_key=True,
                    )
                )
        if problems:
            raise TracerError(problems)

    def _open(self, shard: str) -> tuple[int, Any]:
        """A descriptor of the shard (checked to be a regular file) and safetensors' reader on it."""
        from safetensors import safe_open

        path = self.folder / shard
        fd, _ = open_regular(path, str(path), "expected a .safetensors shard", codes=("weights-folder", "weights-file"))
        opened = f"/proc/self/fd/{fd}" if os.path.isdir("/proc/self/fd") else str(path)  # the file checked, not a swapped one
        try:
            return fd, safe_open(opened, framework="pt")
        except Exception as exc:  # a truncated file or a bad header: safetensors says which
            os.close(fd)
            raise TracerError(Diagnostic(str(path), None, "weights-file", f"cannot read weights ({reason(exc)})")) from None

    def _described(self, shard: str, handle: Any, key: str) -> Any:
        """``key``'s shape and dtype from the shard's header: the index may name a shard that lacks it."""
        path = str(self.folder / shard)
        if key not in handle.keys():
            message = f"does not hold the tensor '{key}', which {INDEX} says it holds"
            raise TracerError(Diagnostic(path, None, "weights-folder", message))
        return described_tensor(path, key, handle)

    def _tensor(self, shard: str, handle: Any, key: str) -> Any:
        try:
            return handle.get_tensor(key).clone()
        except Exception as exc:  # bytes the header promised and the file does not hold, or cannot convert
            raise TracerError(Diagnostic(str(self.folder / shard), None, "weights-file", f"cannot read '{key}' ({reason(exc)})")) from None


def tokenized(text: str, folder: str | Path) -> list[str]:
    """``text`` as the tokenizer of a ``save_pretrained`` folder splits it, special tokens included
    (what the model reads): one label per position for the report's heatmaps. transformers reads
    the folder offline, and runs no code from it (trust_remote_code stays off)."""
    where = f"--tokenizer {folder}"

    def fail(message: str):
        raise TracerError(Diagnostic(where, None, "tokenizer", message))

    if not os.path.isdir(folder):
        fail("not a folder: give the folder a tokenizer's save_pretrained wrote (tokenizer.json, tokenizer_config.json)")
    try:
        from transformers import AutoTokenizer
    except ImportError:
        fail("reading a tokenizer needs transformers: pip install transformers (or give the words with --tokens alone)")
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(folder), local_files_only=True, trust_remote_code=False)
    except Exception as exc:  # whatever the folder holds: its problem, said in transformers' words, never a traceback
        fail(
            f"transformers cannot read a tokenizer here: {printable(str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__)}"
        )
    return tokenizer.convert_ids_to_tokens(tokenizer(text)["input_ids"])
