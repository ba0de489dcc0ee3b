"""``tracer export``: a pipeline as standalone, readable PyTorch source (one ``nn.Module`` per file).

Each step kind writes its own source (``emit`` in the step contract); this module writes the rest:
the classes (the pipeline's, and one per block file: ``repeat: N`` is an ``nn.ModuleList``), the
constructor (dims as keyword arguments, derived dims computed and checked, params created in the
interpreter's order and way, so the same seed gives the same tensors), and ``forward`` (inputs in
declaration order, one line per step with its shape as a comment, nanoGPT's style).

Parameters are registered so that ``state_dict()`` keys are the param ids with ``/`` written as
``.``: ``layers/3/W_q`` is ``layers.3.W_q``. Names are never evaluated: ids become identifiers
by a fixed rule, and dim expressions are re-printed from tracer's own parse tree.
"""

from __future__ import annotations

import inspect
import keyword
import math
import re
from dataclasses import dataclass, field
from pathlib import Path

from ..analysis.graph import execution_order
from ..analysis.shapes import Analysis
from ..core import dimexpr
from ..core.dtypes import FLOAT_DTYPES
from ..core.errors import TracerError, printable
from ..core.layout import Meta
from ..core.pysource import atom, py_float
from ..core.symbolic import Dim, resolve
from ..spec.inits import INITS, Written, linear_bound
from ..spec.load import load_spec
from ..spec.pipeline import TensorDecl
from ..steps.block import Block

# names the generated code needs for itself; a tensor or dim with one of these names is renamed
RESERVED = {"self", "torch", "math", "F", "nn", "seed", "super", "range", "getattr", "setattr", "ValueError", "bound"}
_MODULE_ATTRIBUTES = None  # nn.Module's own attribute names, read once (a param cannot take one)


def export_source(pipeline, dims: dict[str, int] | None = None) -> str:
    """The pipeline (a ``tracer.Pipeline``) as the source of a Python module; deterministic."""
    analysis = pipeline.check(dims)
    analysis.raise_errors()
    writer = _Writer(analysis)
    for _ in range(2):  # a second pass when a helper function's name was taken by a variable
        text = writer.module(pipeline.spec, pipeline.source)
        clash = set(writer.helpers) & writer.used
        if not clash:
            return text
        writer = _Writer(analysis, reserved=clash)
    return text


def class_name(name: str) -> str:
    """``causal_mha`` -> ``CausalMha``: the words of a pipeline's name, capitalised."""
    words = [w for w in re.split(r"[^A-Za-z0-9]+", name) if w]
    text = "".join(w[:1].upper() + w[1:] for w in words) or "Pipeline"
    return text if text[0].isalpha() else f"Pipeline{text}"


@dataclass
class _Scope:
    """One pipeline file being written as a class: its steps' ids in the expanded analysis."""

    spec: object
    source: object
    prefix: str  # expanded ids of its tensors: '' at the top, 'layers/0/' in a block's first copy
    param_prefix: str  # of its params ('layers/' when the copies share them)
    dims: dict[str, int]  # its dims' values
    names: dict[str, str] = field(default_factory=dict)  # dim name -> Python name
    exprs: dict[str, str] = field(default_factory=dict)  # expanded tensor id -> Python expression
    used: set[str] = field(default_factory=set)


class _Writer:
    def __init__(self, analysis: Analysis, reserved: set[str] = frozenset()):
        self.analysis = analysis
        self.reserved = RESERVED | set(reserved)
        self.helpers: dict[str, str] = {}
        self.classes: dict[str, tuple[str, str, dict]] = {}  # block file path -> (class name, source, its dims' Python names)
        self.taken: set[str] = {"F"}  # class names: torch.nn.functional is F
        self.used: set[str] = set()

    # ------------------------------------------------------------------ the module

    def module(self, spec, source) -> str:
        top = self._scope(spec, source, "", "", dict(self.analysis.dims))
        main = self._class_name(spec.name)
        body = self._class(top, main, top=True)
        classes = [main] + [name for name, _, _ in self.classes.values()]
        text = "\n\n".join([*self.helpers.values(), *(src for _, src, _ in self.classes.values()), body])
        imports = ["import math\n"] if re.search(r"(?<![\w.])math\.", text) else []
        imports += ["import torch"]
        imports += ["import torch.nn.functional as F"] if re.search(r"(?<![\w.])F\.", text) else []
        imports += ["from torch import nn"]
        header = [f"# {printable(spec.name)}: written by `tracer export {printable(Path(source.file).name)}`."]
        header += [f"# {printable(line)}".rstrip() for line in spec.description.strip().splitlines()]
        header += ["# Shapes are symbolic, as in the trace: each line says which YAML step it is."]
        all_ = (
            "__all__ = ["
            + ", ".join(f'"{c}"' for c in classes)
            + "]"
            + ("  # noqa: RUF022 - the pipeline's class first" if classes != sorted(classes) else "")
        )
        return "\n".join(header) + "\n\n" + "\n".join(imports) + f"\n\n{all_}\n\n\n" + text

    def _class_name(self, name: str) -> str:
        base = class_name(name)
        chosen, n = base, 1
        while chosen in self.taken:
            n += 1
            chosen = f"{base}{n}"
        self.taken.add(chosen)
        return chosen

    def _scope(self, spec, source, prefix: str, param_prefix: str, values: dict[str, int]) -> _Scope:
        scope = _Scope(spec, source, prefix, param_prefix, {name: values[name] for name in spec.dims if name in values})
        for name in spec.dims:
            scope.names[name] = self._free(scope, name)
        return scope

    def _free(self, scope: _Scope, name: str) -> str:
        """``name`` as a Python identifier no other name of this scope has."""
        base = re.sub(r"\W", "_", name)
        if not base.isidentifier():
            base = f"t_{base}"
        chosen, n = base, 1
        while chosen in scope.used or chosen in self.reserved or keyword.iskeyword(chosen):
            n += 1
            chosen = f"{base}_{n}"
        scope.used.add(chosen)
        self.used.add(chosen)
        return chosen

    # ------------------------------------------------------------------ a class

    def _class(self, scope: _Scope, name: str, top: bool) -> str:
        init = self._init(scope, top)
        forward = self._forward(scope, top)
        about = f"The pipeline {printable(scope.spec.name)!r}" if top else f"The block file {printable(scope.spec.name)!r}"
        return f"class {name}(nn.Module):\n    # {about}, as PyTorch.\n\n" + init + "\n\n" + forward + "\n"

    def _init(self, scope: _Scope, top: bool) -> str:
        spec = scope.spec
        base = [n for n, text in spec.dims.items() if dimexpr.is_number(dimexpr.parse(text))]
        defaults = scope.dims if top else resolve({n: dimexpr.parse(t) for n, t in spec.dims.items()})  # a block file's own values
        args = [f"{scope.names[n]}={defaults[n]}" for n in base]
        if top:
            args.append(f"seed={spec.seed}")
        lines = ["super().__init__()"]
        for name in _dim_order(spec.dims):
            if name in base:
                continue
            expr = dimexpr.parse(spec.dims[name])
            lines += _dim_checks(name, expr, scope)
            lines.append(f"{scope.names[name]} = {_source(expr, scope.names)}")
        if spec.dims:
            lines.append(
                ", ".join(f"self.{self._attr(scope, n)}" for n in spec.dims) + " = " + ", ".join(scope.names[n] for n in spec.dims)
            )
        if top:
            lines += ["if seed is not None:", "    torch.manual_seed(seed)  # then every tensor in the order the file declares it"]
        lines += self._tensors(scope, top)
        signature = ", ".join(["self", "*", *args]) if args else "self"
        return f"    def __init__({signature}):\n" + "\n".join(f"        {line}" for line in lines)

    def _attr(self, scope: _Scope, dim: str) -> str:
        """The attribute holding a dim: its name, unless a param, a block or nn.Module already uses it."""
        taken = _module_attributes() | {p.split(".")[0] for p in scope.spec.params} | {s.id for s in scope.spec.steps if s.includes_file}
        return scope.names[dim] if dim not in taken else f"dim_{scope.names[dim]}"

    def _tensors(self, scope: _Scope, top: bool) -> list[str]:
        """Params and blocks' params in the interpreter's creation order; at the top, inputs declared
        before them are drawn too (and dropped), so that a seed gives the traced run's params."""
        spec, lines, pending = scope.spec, [], []
        sections = sorted(("inputs", "params"), key=lambda s: scope.source.keys[(s,)].line if (s,) in scope.source.keys else math.inf)
        containers: set[str] = set()
        for section in sections:
            if section == "inputs":
                pending = [line for name, decl in spec.inputs.items() for line in self._input_draw(scope, name, decl)] if top else []
                continue
            for name, decl in spec.params.items():
                lines, pending = lines + pending, []
                lines += self._param(scope, name, decl, containers)
            blocks = self._blocks(scope)
            lines += (pending if blocks else []) + blocks
        return lines

    def _input_draw(self, scope: _Scope, name: str, decl: TensorDecl) -> list[str]:
        why = f"  # input {printable(name)!r} is drawn here in the traced run: same seed, same params"
        lines = [f"torch.manual_seed({decl.seed}){why}"] if decl.seed is not None else []
        if decl.init in ("randn", "rand", "embedding"):
            setup, value = _init_source(decl, self.analysis.metas[scope.prefix + name], scope, self)
            lines += setup + [value + why]
        return lines

    def _param(self, scope: _Scope, name: str, decl: TensorDecl, containers: set[str]) -> list[str]:
        meta = self.analysis.metas[scope.param_prefix + name]
        parts = name.split(".")
        lines = []
        for j in range(1, len(parts)):
            if ".".join(parts[:j]) not in containers:
                containers.add(".".join(parts[:j]))
                lines.append(_assign(_access(parts[: j - 1]), parts[j - 1], "nn.Module()") + f"  # holds {printable(name)!r}")
        if decl.seed is not None:
            lines.append(f"torch.manual_seed({decl.seed})")
        setup, value = _init_source(decl, meta, scope, self)
        lines += setup
        owner, declared = _access(parts[:-1]), "(" + ", ".join(str(dimexpr.parse(t)) for t in decl.shape) + ")"
        if meta.dtype in FLOAT_DTYPES:
            lines.append(_assign(owner, parts[-1], f"nn.Parameter({value})") + f"  # {declared}")
        else:
            lines.append(f'{owner}.register_buffer("{parts[-1]}", {value})  # {declared}')
        scope.exprs[scope.param_prefix + name] = _access(parts)
        return lines

    def _blocks(self, scope: _Scope) -> list[str]:
        """Each ``op: block`` step as a submodule: its class, or an nn.ModuleList of copies."""
        lines = []
        for step in scope.spec.steps:
            if not step.includes_file:
                continue
            info = self.analysis.blocks[scope.prefix + step.id]
            call = f"{self._block_class(scope, info, step)}({self._block_dims(scope, step, info)})"
            if step.repeat and not step.share_params:
                call = f"nn.ModuleList([{call} for _ in range({step.repeat})])"
            lines.append(_assign("self", step.id, call))
        return lines

    def _block_dims(self, scope: _Scope, step: Block, info) -> str:
        """The block's base dims, bound as the expansion binds them: ``dims:``, or the same name here."""
        block_spec, _ = load_spec(info.path)
        names = self.classes[info.path][2]
        given = []
        for name, text in block_spec.dims.items():
            if not dimexpr.is_number(dimexpr.parse(text)):
                continue
            if name in step.dims:
                given.append(f"{names[name]}={_source(dimexpr.parse(step.dims[name]), scope.names)}")
            elif name in scope.names:
                given.append(f"{names[name]}={scope.names[name]}")
        return ", ".join(given)

    def _block_class(self, parent: _Scope, info, step: Block) -> str:
        """The block file's class, written from its first copy (its params' ids follow the parent's:
        a block inside a block that shares its params shares them too)."""
        if info.path not in self.classes:
            spec, source = load_spec(info.path)
            prefix = info.copies[0] + "/"
            own = f"{step.id}/" if step.share_params else info.copies[0][len(parent.prefix) :] + "/"
            scope = self._scope(spec, source, prefix, parent.param_prefix + own, info.dims)
            name = self._class_name(spec.name)
            self.classes[info.path] = (name, "", scope.names)  # reserved before writing: a nested block gets the next name
            source = self._class(scope, name, top=False)
            del self.classes[info.path]  # written after the blocks it includes, which are defined first
            self.classes[info.path] = (name, source, scope.names)
        return self.classes[info.path][0]

    # ------------------------------------------------------------------ forward

    def _forward(self, scope: _Scope, top: bool) -> str:
        spec = scope.spec
        args = []
        for name in spec.inputs:
            var = self._free(scope, name)
            args.append(var)
            scope.exprs[scope.prefix + name] = var
        body: list[str] = []
        for i in _order(spec):
            step = spec.steps[i]
            body += self._block_call(scope, step) if step.includes_file else self._step(scope, step)
        outputs = self._outputs(scope, top)
        body = _mark_unused(body, outputs)
        code = "\n".join(line.split("  # ")[0] for line in body + outputs)
        dims_used = [n for n in spec.dims if re.search(rf"(?<![\w.]){re.escape(scope.names[n])}\b", code)]
        head = []
        if dims_used:
            head.append(
                ", ".join(scope.names[n] for n in dims_used)
                + " = "
                + ", ".join(f"self.{self._attr(scope, n)}" for n in dims_used)
                + "  # dims"
            )
        lines = head + body + outputs
        return f"    def forward({', '.join(['self', *args])}):\n" + "\n".join(f"        {line}" for line in lines)

    def _outputs(self, scope: _Scope, top: bool) -> list[str]:
        spec = scope.spec
        if top:
            names = list(spec.outputs) if spec.outputs is not None else spec.steps[-1].output_ids()
        else:
            names = [spec.outputs[0] if spec.outputs else spec.steps[-1].id]
        exprs, shapes = [], []
        for j, name in enumerate(names):
            eid = self.analysis.aliases.get(scope.prefix + name, scope.prefix + name)
            expr = scope.exprs.get(eid) or scope.exprs.get(scope.prefix + name)
            if expr is None:
                raise TracerError(
                    scope.source.error(
                        ("outputs", j),
                        "export-output",
                        f"output '{name}' is inside a block or a composite step; an exported module returns tensors of its own file",
                        prefer_key=True,
                    )
                )
            exprs.append(expr)
            shapes.append(_shape(self.analysis.meta(eid), scope))
        return [f"return {', '.join(exprs)}  # {', '.join(shapes)}"]

    def _step(self, scope: _Scope, step) -> list[str]:
        analysis = self.analysis
        node = analysis.node(scope.prefix + step.id)
        expanded = node.step
        outs = [out.meta for out in node.outs]
        targets = [self._free(scope, name) for name in step.output_ids()]
        args, ins = [scope.exprs[r] for r in node.reads], [analysis.metas[r] for r in node.reads]
        context = _EmitContext(self, scope, step.id, args, ins, outs, targets)
        code = expanded.emit(context)
        for name, var in zip(expanded.output_ids(), targets):
            scope.exprs[name] = var
        if step.output_field is None:
            scope.exprs[node.value] = targets[0]
        shapes = (
            ", ".join(_shape(analysis.metas[o], scope) for o in expanded.output_ids()) if step.output_field else _shape(outs[-1], scope)
        )
        tag = f"# {shapes} {printable(step.id)}"
        if isinstance(code, str):
            assigned = f"({targets[0]},)" if step.output_field is not None and len(targets) == 1 else ", ".join(targets)
            return [f"{assigned} = {code}  {tag}"]
        return [line if "  # " in line else f"{line}  # {printable(step.id)}" for line in code[:-1]] + [f"{code[-1]}  {tag}"]

    def _block_call(self, scope: _Scope, step: Block) -> list[str]:
        analysis = self.analysis
        inputs = [scope.exprs[analysis.aliases.get(scope.prefix + r, scope.prefix + r)] for r in step.data_inputs()]
        var = self._free(scope, step.id)
        out_id = analysis.aliases[scope.prefix + step.id]
        scope.exprs[out_id] = scope.exprs[scope.prefix + step.id] = var
        shape = _shape(analysis.metas[out_id], scope)
        module = _access([step.id])
        rest = "".join(f", {x}" for x in inputs[1:])
        tag = f"# {shape} {printable(step.id)}"
        if not step.repeat:
            return [f"{var} = {module}({', '.join(inputs)})  {tag}"]
        if step.share_params:
            loop, call = f"for _ in range({step.repeat}):", module
        else:
            call = self._free(scope, "layer")
            loop = f"for {call} in {module}:"
        first = f"{var} = {inputs[0]}  # {printable(step.id)}: {step.repeat} copies in a chain, each reading the one before"
        return [first, f"{loop}  # {printable(step.id)}", f"    {var} = {call}({var}{rest})  {tag}"]


class _EmitContext:
    """What a step kind's ``emit`` reads (the ``EmitContext`` protocol of the step contract)."""

    training = "self.training"

    def __init__(self, writer: _Writer, scope: _Scope, step_id: str, args, ins, outs, targets):
        self.writer, self.scope, self.step_id = writer, scope, step_id
        self.args, self.ins, self.outs, self.out, self.targets = args, ins, outs, outs[-1], targets

    def dim(self, text) -> str:
        return _source(dimexpr.parse(text), self.scope.names)

    def size(self, dim: Dim) -> str:
        return size_source(dim, self.scope)

    def local(self, name: str) -> str:
        return self.writer._free(self.scope, f"{self.step_id}_{name}")

    def helper(self, name: str, source: str) -> str:
        return _helper(self.writer, name, source)


def _mark_unused(body: list[str], outputs: list[str]) -> list[str]:
    """A step nothing reads (a dead step) is still written, as the trace runs it; ruff is told so."""
    code = [line.split("  # ")[0] for line in body + outputs]
    marked = []
    for j, line in enumerate(body):
        target = re.match(r"(\w+) = ", code[j])
        read = target and any(re.search(rf"(?<![\w.]){target.group(1)}\b", later) for later in code[j + 1 :])
        marked.append(line if not target or read else f"{line}  # noqa: F841")
    return marked


def _shape(meta: Meta, scope: _Scope) -> str:
    """A tensor's symbolic shape in the scope's own dims (a block's output, seen from the including
    file, is written in the including file's names, or numbers)."""
    return "(" + ", ".join(d.label if size_source(d, scope) == _relabel(d, scope) else size_source(d, scope) for d in meta.shape) + ")"


def _relabel(dim: Dim, scope: _Scope) -> str | None:
    """The dim's own label in the scope's names, when it is written in them (the trace's spelling)."""
    try:
        return _source(dimexpr.parse(dim.label), scope.names)
    except dimexpr.DimError:
        return None


def size_source(dim: Dim, scope: _Scope) -> str:
    """A symbolic dim as source over the scope's dims; its number when its name is not one of them
    (a block's dim seen from the including file) or would not evaluate to the same value."""
    try:
        expr = dimexpr.parse(dim.label)
        if dimexpr.names(expr) <= set(scope.dims) and dimexpr.evaluate(expr, scope.dims) == dim.value:
            return _source(expr, scope.names)
    except dimexpr.DimError:
        pass
    return str(dim.value)


class _PythonSource(dimexpr.Source):
    """A dim expression as Python source over the module's own names: an operand that is not a
    name or a number in parentheses (``-(d_model)`` stays readable as ``-d_model``)."""

    def operand(self, node, written: str) -> str:
        return atom(written)


def _source(expr, names: dict[str, str]) -> str:
    """A parsed dim expression as Python source, with the scope's names."""
    return dimexpr.fold(expr, _PythonSource(names))


def _dim_checks(name: str, expr, scope: _Scope) -> list[str]:
    """tracer's own errors for a derived dim: division by zero, and ``//`` that does not divide."""
    lines = []
    for node in dimexpr.fold(expr, dimexpr.Divisions()):
        left, right = _source(node.left, scope.names), _source(node.right, scope.names)
        where = f"dim {name} = {expr}"
        if not dimexpr.is_number(node.right):
            lines += [f"if {right} == 0:", f"    raise ValueError(f\"{where}: division by zero in '{node}' ({node.right}={{{right}}})\")"]
        if node.op == "//":
            described = [str(n.value) if dimexpr.is_number(n) else f"{n}={{{_source(n, scope.names)}}}" for n in (node.left, node.right)]
            lines += [
                f"if {atom(left)} % {atom(right)}:",
                f'    raise ValueError(f"{where}: {described[0]} is not divisible by {described[1]}")',
            ]
    return lines


def _dim_order(dims: dict) -> list[str]:
    """Dims in an order where each comes after the dims it is computed from (file order otherwise):
    the order ``resolve`` evaluates them in."""
    return list(resolve({name: dimexpr.parse(text) for name, text in dims.items()}))


def _order(spec) -> list[int]:
    """The file's steps in an order that computes every input first (the file's own, when it does)."""
    producer: dict[str, str] = {}
    for step in spec.steps:
        for name in [step.id, *step.output_ids()]:
            producer.setdefault(name, step.id)
    edges = [(producer[r], step.id) for step in spec.steps for r in step.data_inputs() + step.param_refs() if r in producer]
    position = {step.id: i for i, step in enumerate(spec.steps)}
    return [position[step_id] for step_id in execution_order(list(position), edges)]


def _init_source(decl: TensorDecl, meta: Meta, scope: _Scope, writer: _Writer) -> tuple[list[str], str]:
    """(statements, expression) creating a declared tensor exactly as a run does (its init's own
    ``source``, ``tracer.spec.inits``); the shape as the file writes it."""
    dims = tuple(_source(dimexpr.parse(t), scope.names) for t in decl.shape)
    if decl.values is not None or decl.tokens is not None:
        values = decl.tokens.ids() if decl.tokens is not None else decl.values
        return [], f"torch.tensor({_literal(values)}, dtype=torch.{meta.dtype})"
    fan_in = _source(dimexpr.parse(decl.fan_in), scope.names) if decl.fan_in is not None else None
    setup, value = INITS[decl.init].source(Written(dims, meta.dtype, fan_in), decl)
    if any("linear_bound(" in line for line in setup):
        _helper(writer, "linear_bound", inspect.getsource(linear_bound))
    return setup, value


def _helper(writer: _Writer, name: str, source: str) -> str:
    """A module-level function of the generated file, written once (tracer's own, from its source)."""
    writer.helpers.setdefault(name, source.rstrip() + "\n")
    return name


def _literal(value) -> str:
    if isinstance(value, list):
        return "[" + ", ".join(_literal(v) for v in value) + "]"
    if isinstance(value, float):
        return py_float(value)
    return repr(value)


def _access(parts: list[str]) -> str:
    """``self.Wq.weight``; ``getattr(self, "W-q")`` for a name that is not an identifier."""
    expr = "self"
    for part in parts:
        expr = f"{expr}.{part}" if part.isidentifier() and not keyword.iskeyword(part) else f'getattr({expr}, "{part}")'
    return expr


def _assign(owner: str, part: str, value: str) -> str:
    if part.isidentifier() and not keyword.iskeyword(part):
        return f"{owner}.{part} = {value}"
    return f'setattr({owner}, "{part}", {value})'


def _module_attributes() -> set[str]:
    global _MODULE_ATTRIBUTES
    if _MODULE_ATTRIBUTES is None:
        from torch import nn

        _MODULE_ATTRIBUTES = set(dir(nn.Module))
    return _MODULE_ATTRIBUTES
