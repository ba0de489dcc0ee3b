"""Block expansion: a spec -> spec pass that replaces every ``op: block`` by namespaced steps.

Blocks expand into ``BLOCK/ID`` steps (``BLOCK/COPY/ID`` with ``repeat``), so every shape rule,
kernel, record, lint and diagram works on them unchanged. Each block keeps its own dims: its base
dims are bound to expressions of the including file's dims (``dims:``; a dim with the same name is
bound automatically), its derived dims are recomputed. Every copy gets its own params
(``layers/3/W_q``), unless ``share_params``. The including pipeline's ``dtype`` applies.

Includes are resolved relative to the including file and must stay inside its folder; include
cycles, missing files and mismatched inputs are located errors in the file that caused them.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

from ..core import dimexpr
from ..core.errors import Diagnostic, TracerError
from ..core.symbolic import DimAlgebra, resolve
from ..steps.block import Block, BlockInput
from .load import load_spec
from .pipeline import tensor_dtype
from .source import SourceMap

MAX_EXPANDED_STEPS = 32_768  # ~1.2 s to check; a 96-layer GPT-3 is ~3,000 steps, 1,000 encoder layers 26,000
# Files including files: each level keeps a flattened copy of everything below it (the cache
# shares it between siblings and repeats), so memory grows with depth x steps; 16 levels is far
# beyond any model (a stack of layers of attention blocks is 3) and keeps that product small.
MAX_BLOCK_DEPTH = 16
# ... and the step copies made on the way, over all levels, are capped too: time and memory stay
# linear in the expanded steps (a 16-deep chain around a 19,000-step stack took 10 s and 475 MB).
MAX_STEP_COPIES = 3 * MAX_EXPANDED_STEPS
_COPIES = "copies"  # the cache's entry counting step copies (its other keys are tuples)


@dataclass
class BlockInfo:
    """One ``op: block`` step after expansion (for diagrams, traces and tests)."""

    id: str
    use: str
    path: str
    repeat: int | None
    copies: list[str]  # id prefixes of the copies: ['layers/0', 'layers/1', ...] or ['enc']
    output: str  # the record holding the last copy's output
    dims: dict[str, int]
    attention: str | None = None  # the block file's own `attention: {kind}`, for its steps' sites


@dataclass
class Expanded:
    pipeline: Any
    source: SourceMap
    alg: Any  # the file's dims, plus every block dim that has one value everywhere (see _shared_algebra)
    algs: dict = field(default_factory=dict)
    aliases: dict = field(default_factory=dict)
    blocks: dict = field(default_factory=dict)
    expect_algs: dict = field(default_factory=dict)  # a block file's expectations read its own dims
    copies: dict = field(default_factory=dict)  # step id -> the block copy it belongs to ('layers/3')


class ExpandedSource(SourceMap):
    """The including file's positions, with expanded steps and params routed to their own files."""

    def __init__(self, base: SourceMap, routes: dict[tuple, tuple[SourceMap, tuple, str | None]]):
        super().__init__(base.file)
        self.base, self.routes = base, routes

    @property
    def values(self):  # the including file's, found when first asked for
        return self.base.values

    @property
    def keys(self):
        return self.base.keys

    def locate(self, path: tuple, prefer_key: bool = False):
        route = self.routes.get(tuple(path)[:2])
        if route is None:
            return super().locate(path, prefer_key)
        source, prefix, _ = route
        return source.locate(prefix + tuple(path)[2:], prefer_key)

    def error(
        self, path: tuple, code: str, message: str, step: str | None = None, prefer_key: bool = False, severity: str = "error"
    ) -> Diagnostic:
        route = self.routes.get(tuple(path)[:2])
        if route is None:
            return super().error(path, code, message, step, prefer_key, severity)
        source, prefix, where = route
        found = source.error(prefix + tuple(path)[2:], code, message, step, prefer_key, severity)
        return Diagnostic(found.file, found.position, code, f"{message} ({where})" if where else message, step, severity)


@dataclass
class _Item:
    """One flattened step or param, with where it came from."""

    value: Any  # a step model or a TensorDecl
    source: SourceMap
    path: tuple  # its path in that source
    where: str | None  # "in block 'layers' copy 3 (file:line)", nested with ', '
    alg: Any  # the DimAlgebra its dims belong to
    copy: str | None = None  # the block copy it belongs to ('layers/3', local to the file being flattened)


@dataclass
class _Flat:
    steps: list[_Item]
    params: dict[str, _Item]
    expect: dict[str, _Item]  # a block file's own expectations, checked on every copy
    aliases: dict[str, str]
    blocks: dict[str, BlockInfo]
    inputs: list[str]  # declared inputs (of a block file)
    output: str  # local id of its output record


def expand_blocks(pipeline, source: SourceMap, alg) -> Expanded:
    """The pipeline with every ``op: block`` replaced by its namespaced steps and params."""
    root = _folder_of(source.file)
    flat = _flatten(pipeline, source, alg, (_key(source.file),), root, {}, top=True)
    routes, algs, steps, params, copies = {}, {}, [], {}, {}
    for j, item in enumerate(flat.steps):
        steps.append(item.value)
        if item.copy is not None:
            copies[item.value.id] = item.copy
        routes[("steps", j)] = (item.source, item.path, item.where)
        if item.alg is not alg:
            algs[item.value.id] = item.alg
    for name, item in flat.params.items():
        params[name] = item.value
        if item.source is not source:
            routes[("params", name)] = (item.source, item.path, item.where)
        if item.alg is not alg:
            algs[name] = item.alg
    aliases = flat.aliases
    outputs = pipeline.outputs
    if outputs is None:
        outputs = [_resolve(pipeline.steps[-1].id, aliases)]
    else:
        outputs = [_resolve(name, aliases) for name in outputs]
    expect, expect_algs = {}, {}
    for name, item in flat.expect.items():  # the block files' own entries, on every copy
        expect[name], expect_algs[name] = item.value, item.alg
        routes[("expect", name)] = (item.source, item.path, item.where)
    for name, (written, value) in _own_expect(pipeline, source, aliases).items():  # the including file's entries win
        expect.pop(name, None)
        expect[name] = value
        expect_algs.pop(name, None)
        routes.pop(("expect", name), None)
        if written != name:  # 'layers' stands for 'layers/47/out': errors point at the key as written
            routes[("expect", name)] = (source, ("expect", written), None)
    expanded = pipeline.model_copy(update={"steps": steps, "params": params, "outputs": outputs, "expect": expect})
    shared = _shared_algebra(pipeline, alg, algs)
    return Expanded(expanded, ExpandedSource(source, routes), shared, algs, aliases, flat.blocks, expect_algs, copies)


def _shared_algebra(pipeline, alg, algs: dict):
    """The file's own dims plus each block dim whose name is free and whose value is the same in
    every block, so code that reads a block step's fields with ``analysis.alg`` still evaluates
    them (``analysis.alg_of(id)`` is exact); traces list those dims alongside the file's."""

    declared, values, clash = dict(pipeline.dim_exprs), dict(alg.values), set()
    for block_alg in {id(a): a for a in algs.values()}.values():
        for name, value in block_alg.values.items():
            if name in pipeline.dims or name in clash:
                continue
            if name in values and values[name] != value:
                clash.add(name)
            else:
                declared[name], values[name] = block_alg.exprs[name], value
    for name in clash:
        declared.pop(name, None)
        values.pop(name, None)
    try:
        return DimAlgebra(declared, values)
    except dimexpr.DimError:  # a block dim defined through a clashing one: keep the file's dims only
        return alg


def _resolve(name: str, aliases: dict[str, str]) -> str:
    return aliases.get(name, name)


def _key(file: str) -> str:
    try:
        return str(Path(file).resolve())
    except (OSError, RuntimeError):
        return file


def _folder_of(file: str) -> Path:
    path = Path(file)
    return (path.parent if path.suffix or path.exists() else Path.cwd()).resolve()


def _flatten(spec, source: SourceMap, alg, stack: tuple, folder: Path, cache: dict, top: bool = False) -> _Flat:
    """Flatten one file's steps (recursively expanding its blocks), ids local to that file."""
    _refuse_block_id_clashes(spec, source)
    params = {name: _Item(decl, source, ("params", name), None, alg) for name, decl in spec.params.items()}
    out = _Flat([], params, {}, {}, {}, list(spec.inputs), "")
    steps, expect, aliases, blocks = out.steps, out.expect, out.aliases, out.blocks
    for i, step in enumerate(spec.steps):
        data = [_resolve(r, aliases) for r in step.data_inputs()]
        if not step.includes_file:
            update = _explicit_inputs(step, data)
            for f in step.param_fields:
                ref = getattr(step, f)
                if ref is not None and ref in aliases:
                    update[f] = aliases[ref]
            steps.append(_Item(step.model_copy(update=update) if update else step, source, ("steps", i), None, alg))
            continue
        block_spec, block_source, block_path = _load_block(step, i, source, folder, stack)
        block_alg, bound = _block_algebra(step, i, block_spec, block_source, source, alg)
        cache_key = (block_path, tuple(sorted(bound.items())))
        pos = source.locate(("steps", i), prefer_key=True)
        here = f"{source.file}:{pos.line}" if pos else source.file
        if cache_key not in cache:
            try:
                cache[cache_key] = _flatten(block_spec, block_source, block_alg, stack + (block_path,), Path(block_path).parent, cache)
            except TracerError as exc:  # a problem inside the block file: say which step included it
                raise TracerError([_included(d, f"in block '{step.id}' included at {here}") for d in exc.diagnostics]) from None
        inner = cache[cache_key]
        if len(data) != len(inner.inputs):
            names = ", ".join(inner.inputs) or "none"
            raise TracerError(
                source.error(
                    ("steps", i, "inputs" if step.inputs is not None else "input"),
                    "block-inputs",
                    f"block '{step.use}' takes {len(inner.inputs)} input{'s' if len(inner.inputs) != 1 else ''} ({names}), got {len(data)}",
                    step.id,
                    prefer_key=True,
                )
            )
        copies = [f"{step.id}/{c}" for c in range(step.repeat)] if step.repeat else [step.id]
        if len(steps) + len(copies) * (len(inner.steps) + len(inner.inputs)) > MAX_EXPANDED_STEPS:
            raise TracerError(
                source.error(
                    ("steps", i, "repeat"),
                    "block-too-large",
                    f"expanding this block gives more than {MAX_EXPANDED_STEPS} steps",
                    step.id,
                    prefer_key=True,
                )
            )
        _spend_copies(cache, len(copies) * (len(inner.steps) + len(inner.inputs)), source, i, step.id)
        first = data
        for c, prefix in enumerate(copies):
            where = f"in block '{step.id}'" + (f" copy {c}" if step.repeat else "") + f" included at {here}"
            shared = f"{step.id}/" if step.share_params else prefix + "/"
            _inline(out, inner, _Copy(prefix + "/", shared, first, where, step.group, block_spec, block_source, block_alg))
            made = f"{prefix}/{inner.output}"
            aliases[prefix] = made
            aliases.update({f"{prefix}/{name}": f"{prefix}/{target}" for name, target in inner.aliases.items()})  # nested blocks
            first = [made] + data[1:]
        aliases[step.id] = first[0]
        role = block_spec.attention.kind if block_spec.attention is not None else None
        blocks[step.id] = BlockInfo(step.id, step.use, block_path, step.repeat, copies, first[0], dict(block_alg.values), role)
    last = spec.outputs[0] if spec.outputs else spec.steps[-1].id
    if not top:  # the top file's expectations stay where they are
        for name, (written, value) in _own_expect(spec, source, aliases).items():
            expect[name] = _Item(value, source, ("expect", written), None, alg)
    out.output = _resolve(last, aliases)
    return out


def _spend_copies(cache: dict, n: int, source: SourceMap, i: int, step_id: str) -> None:
    cache[_COPIES] = cache.get(_COPIES, 0) + n
    if cache[_COPIES] > MAX_STEP_COPIES:
        raise TracerError(
            source.error(
                ("steps", i, "use"),
                "block-too-large",
                f"expanding nested blocks copies more than {MAX_STEP_COPIES} steps (each level of nesting copies the "
                "steps below it); include the large block from a file nearer the top, or repeat it fewer times",
                step_id,
                prefer_key=True,
            )
        )


def _own_expect(spec, source: SourceMap, aliases: dict[str, str]) -> dict[str, tuple[str, Any]]:
    """A file's ``expect:`` by the tensor each entry names: tensor -> (key as written, shape)."""
    own: dict[str, tuple[str, Any]] = {}
    for name, value in spec.expect.items():
        tensor = _resolve(name, aliases)
        if tensor in own:
            raise TracerError(
                source.error(
                    ("expect", name),
                    "duplicate-expect",
                    f"'{name}' and '{own[tensor][0]}' both name the tensor '{tensor}'; keep one",
                    prefer_key=True,
                )
            )
        own[tensor] = (name, value)
    return own


def _refuse_block_id_clashes(spec, source: SourceMap) -> None:
    """A block's id names its output and prefixes every tensor of its copies: a second tensor with
    that id would collide with all of them, so say it once, at the id."""
    first: dict[str, tuple] = {name: (section, name) for section in ("inputs", "params") for name in getattr(spec, section)}
    for i, step in enumerate(spec.steps):
        earlier = first.get(step.id)
        if earlier is not None and (step.includes_file or (earlier[0] == "steps" and spec.steps[earlier[1]].includes_file)):
            pos = source.locate(earlier, prefer_key=True)
            raise TracerError(
                source.error(
                    ("steps", i, "id"),
                    "duplicate-id",
                    f"id '{step.id}' is already used (line {pos.line if pos else '?'}); "
                    "a block's id names its output and prefixes its tensors, so it must be unique",
                    step.id,
                )
            )
        first.setdefault(step.id, ("steps", i))


def _explicit_inputs(step, data: list[str]) -> dict:
    """Make a step's data inputs explicit: after expansion, 'the previous step' is someone else."""
    if step.inputs is not None:
        return {"inputs": data} if data != step.inputs else {}
    if not data:
        return {}
    if len(data) == 1:
        return {"input": data[0]} if data[0] != step.input else {}
    return {"inputs": data}


class _Copy(NamedTuple):
    """One copy of a block, as ``_inline`` adds it."""

    prefix: str  # its tensors' ids start with this: 'layers/3/'
    param_prefix: str  # its params' ids: the same, or 'layers/' when the copies share params
    bound: list[str]  # the outer tensors its declared inputs read
    where: str  # "in block 'layers' copy 3 included at F:L", for its errors
    group: str | None  # the block step's own group
    spec: Any  # the block file: spec, source and dims
    source: SourceMap
    alg: DimAlgebra


def _inline(out: _Flat, inner: _Flat, copy: _Copy) -> None:
    """Add one copy of a flattened block to ``out``: its tensors under ``copy.prefix``, its params
    under ``copy.param_prefix`` (the same for every copy when they share params)."""
    prefix, where = copy.prefix, copy.where

    def ref(name: str) -> str:
        return (copy.param_prefix if name in inner.params else prefix) + name

    cluster = prefix[:-1] if copy.group is None else f"{copy.group}/{prefix[:-1]}"
    for name, outer in zip(inner.inputs, copy.bound):
        decl = copy.spec.inputs[name]
        step = BlockInput.model_construct(
            id=prefix + name,
            input=outer,
            shape=list(decl.shape),
            name=name,
            dtype=tensor_dtype(decl, None),
            group=cluster,
        )
        out.steps.append(_Item(step, copy.source, ("inputs", name), where, copy.alg, prefix[:-1]))
    for item in inner.steps:
        step = item.value
        # one cluster per block copy ('layers/3'); a nested block's copy nests under it ('layers/3/attn')
        update: dict[str, Any] = {"id": prefix + step.id, "group": f"{cluster}/{step.group}" if item.copy and step.group else cluster}
        if step.input is not None:
            update["input"] = ref(step.input)
        if step.inputs is not None:
            update["inputs"] = [ref(r) for r in step.inputs]
        for f in step.param_fields:
            if getattr(step, f) is not None:
                update[f] = ref(getattr(step, f))
        if step.output_field is not None:
            update[step.output_field] = [prefix + name for name in step.output_ids()]
        nested = _join(item.where, where)
        inside = prefix + item.copy if item.copy else prefix[:-1]
        out.steps.append(_Item(step.model_copy(update=update), item.source, item.path, nested, item.alg, inside))
    for name, item in inner.params.items():
        out.params.setdefault(
            copy.param_prefix + name, _Item(item.value, item.source, item.path, _join(item.where, where), item.alg, prefix[:-1])
        )
    for name, item in inner.expect.items():
        out.expect.setdefault(ref(name), _Item(item.value, item.source, item.path, _join(item.where, where), item.alg, prefix[:-1]))
    for block_id, info in inner.blocks.items():
        out.blocks[prefix + block_id] = BlockInfo(
            prefix + block_id,
            info.use,
            info.path,
            info.repeat,
            [prefix + c for c in info.copies],
            prefix + info.output,
            info.dims,
            info.attention,
        )


def _included(d: Diagnostic, where: str) -> Diagnostic:
    """``d`` with the include that led to it, in the "(in block 'x' included at F:L, ...)" form of step errors."""
    joined = f"{d.message[:-1]}, {where})" if d.message.endswith(")") and "included at" in d.message else f"{d.message} ({where})"
    return Diagnostic(d.file, d.position, d.code, joined, d.step, d.severity)


def _join(inner: str | None, outer: str) -> str:
    return outer if inner is None else f"{inner}, {outer}"


def _load_block(step: Block, i: int, source: SourceMap, folder: Path, stack: tuple):
    def fail(code: str, message: str):
        raise TracerError(source.error(("steps", i, "use"), code, message, step.id))

    use = step.use.strip()
    if not use:
        fail("block-use", "'use' names no file")
    if Path(use).is_absolute() or use.startswith(("/", "\\", "~")) or (len(use) > 1 and use[1] == ":"):
        fail("block-use", f"'use: {use}' is an absolute path; give a path relative to this file, inside its folder")
    if "\x00" in use:
        fail("block-use", "'use' holds a NUL character; give a plain relative path")
    try:
        target = (folder / use).resolve()
    except (OSError, RuntimeError, ValueError) as exc:  # a symlink loop, a name too long
        fail("block-use", f"'use: {use}' cannot be resolved: {exc}")
    if target != folder and folder not in target.parents:
        fail("block-use", f"'use: {use}' leaves this file's folder ({folder}); blocks must live inside it (e.g. blocks/NAME.yaml)")
    key = str(target)
    if key in stack:
        chain = " -> ".join(Path(p).name for p in stack[stack.index(key) :] + (key,))
        fail("block-cycle", f"blocks include each other in a cycle: {chain}")
    if len(stack) > MAX_BLOCK_DEPTH:
        chain = " -> ".join(Path(p).name for p in stack + (key,))
        fail("block-too-deep", f"blocks nest more than {MAX_BLOCK_DEPTH} files deep: {chain}; include the inner files from fewer levels")
    try:
        is_folder = target.is_dir()  # a FIFO or device is refused by the loader, which checks before reading
    except OSError as exc:  # a name over 255 bytes, a loop, no permission
        fail("block-use", f"'use: {use}' cannot be opened: {exc.strerror or exc}")
    if is_folder:
        fail("block-use", f"'use: {use}' is a folder; name a block file in it (e.g. blocks/NAME.yaml)")
    if not target.exists():
        fail("block-missing", f"'use: {use}': no such file ({target})")
    shown = os.path.relpath(target)
    try:
        spec, block_source = load_spec(target if shown.startswith("..") else shown)
    except TracerError as exc:  # the block's own errors, located in the block file
        raise TracerError(
            exc.diagnostics + [source.error(("steps", i, "use"), "block-invalid", f"block '{use}' is invalid (see above)", step.id)]
        ) from None
    return spec, block_source, key


def _block_algebra(step: Block, i: int, block_spec, block_source: SourceMap, source: SourceMap, alg):
    exprs = block_spec.dim_exprs
    bound: dict[str, int] = {}
    for name, text in step.dims.items():
        path = ("steps", i, "dims", name)
        if name not in exprs:
            raise TracerError(
                source.error(
                    path,
                    "unknown-dim",
                    f"block '{step.use}' has no dim '{name}' (dims: {', '.join(exprs) or 'none'})",
                    step.id,
                    prefer_key=True,
                )
            )
        if not dimexpr.is_number(exprs[name]):
            raise TracerError(
                source.error(
                    path,
                    "derived-dim",
                    f"'{name}' is derived in block '{step.use}' ({exprs[name]}); bind the dims it is computed from",
                    step.id,
                    prefer_key=True,
                )
            )
        try:
            bound[name] = alg.dim(text).value
        except dimexpr.DimError as exc:
            raise TracerError(source.error(path, exc.code, f"dims.{name}: {exc}", step.id)) from None
    for name, expr in exprs.items():
        if name not in bound and dimexpr.is_number(expr) and name in alg.values:
            bound[name] = alg.values[name]
    try:
        values = resolve(exprs, bound)
    except dimexpr.DimError as exc:
        raise TracerError(source.error(("steps", i, "dims"), exc.code, f"block '{step.use}': {exc}", step.id, prefer_key=True)) from None
    for name, value in values.items():
        if value < 0:
            raise TracerError(
                source.error(("steps", i, "dims"), "dim-negative", f"block '{step.use}': dim {name} is {value}", step.id, prefer_key=True)
            )
    return DimAlgebra(exprs, values), bound
