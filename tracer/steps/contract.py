"""The step contract: what a step kind is, what its shape rule and kernel receive and return.

A step kind is one pydantic class, registered with ``@register``:

- its **fields** are the YAML keys of the step (``op`` names the kind, as torch.fx's opcode names
  the handler);
- ``infer(ins, ctx: RuleContext)`` is its **shape rule**: the input ``Meta``s in, and out either
  one ``Meta``, a ``Composite`` (a step that is several torch ops, each recorded, e.g. ``merge``),
  or ``Outputs`` (several named tensors, e.g. ``split``);
- ``kernel(ctx: KernelContext)`` builds its **torch function** once per (dims, device): it takes
  the input tensors and returns one tensor, or a tuple in the order of the ``Composite``/``Outputs``;
- ``emit(ctx: EmitContext)`` writes the same computation as **PyTorch source** for ``tracer export``:
  one Python expression, or statements assigning the step's variables;
- **traits** (class attributes) tell every other layer what it needs to know about the kind, so
  diagrams, lints, memory estimates, the interpreter and ``tracer.verify`` never list op names.

Nothing here imports torch; shape rules run in ``tracer check`` without it.

No ``from __future__ import annotations`` here: pydantic evaluates every annotation of
``StepBase`` again for each of the ~90 kinds, and as text each is compiled first, which was a
quarter of the time ``import tracer.steps`` took.
"""

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import ModuleType
from typing import Annotated, Any, ClassVar, Protocol

from pydantic import ConfigDict, Field, model_validator

from ..core.fields import Strict, TensorId
from ..core.layout import Meta
from ..core.symbolic import Dim, DimAlgebra

STEP_KINDS: dict[str, type["StepBase"]] = {}


class RuleContext(Protocol):
    """What a shape rule may use (``tracer.analysis.shapes`` provides it)."""

    alg: DimAlgebra  # the dims in force for this step (a block's own, inside a block)
    input_ids: list[str]  # the ids of ``ins``, in order: data inputs, then param fields
    dtype: str  # the pipeline's floating-point dtype
    step_id: str

    def dim(self, text: int | str, field: str) -> Dim:
        """Evaluate a dim expression of field ``field``; a bad one is a located error there."""
        ...

    def warn_if_different(self, a: Dim, b: Dim, what: str, field: str) -> None:
        """Warn when two dims that must match are equal today but are not the same dim."""
        ...

    def record(self, suffix: str) -> str:
        """The id of a composite step's inner tensor, e.g. ``merged/contiguous``."""
        ...


class KernelContext(Protocol):
    """What a kernel builder may use (``tracer.runtime.interpreter`` provides it)."""

    torch: ModuleType
    F: ModuleType  # torch.nn.functional
    device: Any  # a torch.device
    ins: list[Meta]  # the static metadata of the inputs
    outs: list[Meta]  # of every tensor the step makes: a composite's inner ones, or each of several outputs
    out: Meta  # the last of ``outs``: the step's value

    def value(self, text: int | str) -> int:
        """The value of a dim expression at this run's dims."""
        ...

    def error(self, code: str, message: str, field: str | None = None) -> Exception:
        """A located error for what only a run can see (a token id outside its table)."""
        ...

    def shared_table(self, build: Callable) -> Callable:
        """``build`` (which makes the tables the kind's ``table_key`` describes) built once per
        run for every step of that run with an equal key: the first caller's tables, a copy of
        them for every later one (each step's records stay its own storage, as predicted)."""
        ...

    training: bool | None  # dropout on or off whatever the step says (tracer.to_module's train()/eval()); None: as written


class EmitContext(Protocol):
    """What ``emit`` may use to write a step as PyTorch source (``tracer.presentation.export`` provides it)."""

    args: list[str]  # Python expressions of the inputs, in the kernel's order: data inputs, then param fields
    ins: list[Meta]  # their static metadata
    outs: list[Meta]  # as for kernels: a composite's inner tensors, or each of several outputs
    out: Meta
    targets: list[str]  # the variable(s) the step assigns: one, or one per output of a several-output step
    training: str  # the expression that says whether dropout is on: "self.training"
    device: str  # the expression of the device the module runs on (a step that reads no tensor makes its own there)
    step_id: str  # the step's id in its file

    def dim(self, text: int | str) -> str:
        """A field's dim expression as Python source over the module's dims: ``'d_model // H'``."""
        ...

    def size(self, dim: Dim) -> str:
        """A symbolic dim of a ``Meta`` (``ins[0].shape[-1]``) as Python source."""
        ...

    def local(self, name: str) -> str:
        """A fresh variable name for a helper value of this step (``'q_rot_cos'``)."""
        ...

    def helper(self, name: str, source: str) -> str:
        """Define a module-level function once (``source`` is its ``def``); returns its name."""
        ...

    def submodule(self, name: str, made: str) -> str:
        """A module the step calls, made once in ``__init__`` by the expression ``made`` and held as
        an attribute named like ``name``; returns the expression that reads it (``self.experts``)."""
        ...

    def shared(self, name: str, expr: str) -> tuple[str, list[str]]:
        """A value several steps of one forward compute alike (RoPE's table for q and for k): the
        first step to ask assigns ``expr`` to a fresh local, the others read it. Returns the local
        and the lines to write (none after the first). ``expr`` names no input of the step."""
        ...


CHAINED = None  # an inner op that reads the one before it (the first one: all the step's tensors)


@dataclass(frozen=True)
class Inner:
    """One torch op inside a composite step, recorded as ``STEP/suffix``.

    ``reads`` says which tensors its kernel computes it from, as diagrams draw them and ``run
    --json`` records them: the step's own tensors by position in the kernel's arguments (``0``,
    the first input; params follow the inputs) and earlier inner records by suffix. rope's tables
    read only its positions (``(1,)``, or nothing), its ``rotated`` reads ``(0, "cos", "sin")``.
    """

    suffix: str
    op: str
    meta: Meta
    reads: tuple[int | str, ...] | None = CHAINED


class Composite(tuple):
    """A shape rule's result for a step that is several torch ops: ``Composite([Inner, ...])``.

    Each inner tensor is a record (``merged/contiguous``); the last one is the step's value.
    """


@dataclass(frozen=True)
class Outputs:
    """A shape rule's result for a step with several named outputs (``split`` into q, k, v).

    Each name is a tensor id of its own; the kernel returns a tuple in this order.
    """

    metas: Mapping[str, Meta]


Shape = Meta | Composite | Outputs


# ---------------------------------------------------------------- what a kind means, for the attention core and lints


@dataclass(frozen=True)
class Masking:
    """What a masking kind hides from attention: a causal pattern and/or a mask tensor."""

    causal: bool
    window: int | str | None  # a dim expression: each query sees only its last W keys (without causal: a band)
    align: str  # "bottom-right" (the last query is the last key) or "top-left"
    tensor: str | None  # the mask tensor's id
    polarity: str | None  # "keep" (True attends), "block" (True is hidden), None: added to the scores
    fill: float  # what a hidden score becomes
    chunk: int | str | None = None  # a dim expression: each query sees only keys of its own chunk
    segments: str | None = None  # the document ids' tensor: each query sees only keys of its document


@dataclass(frozen=True)
class Slicing:
    """A slice along one dim (``x[..., start:stop:step]``), each bound a dim expression or None."""

    dim: int
    start: int | str | None
    stop: int | str | None
    step: int | str | None


@dataclass(frozen=True)
class Projection:
    """A learned projection ``x @ W^T + b`` (``transposed``: ``x @ W``, the weight stored (in, out))."""

    weight: str
    bias: str | None
    transposed: bool


@dataclass(frozen=True)
class Rotation:
    """Token positions written into a tensor (rope): along ``seq_dim``, the first at ``offset``."""

    seq_dim: int
    offset: int | str  # a dim expression
    positions: str | None = None  # a tensor of each token's position, given instead of the offset
    style: str = "half"  # "half" (rotate_half: Llama, NeoX) or "interleaved" (rotate_every_two: GPT-J, RoFormer)
    theta: float | None = None  # the base of the frequencies
    scaling: str | None = None  # the frequency scaling's type (linear, yarn, …), None when unscaled
    score_scale: float = 1.0  # what it asks the attention scale to be multiplied by (DeepSeek's YaRN: mscale squared)


@dataclass(frozen=True)
class ScaledNorm:
    """A normalisation with a learned scale: ``weight`` (a param id), applied as 1 + w when ``unit_offset``."""

    weight: str
    unit_offset: bool


@dataclass(frozen=True)
class FusedAttention:
    """An attention kernel that takes q, k, v (its first three inputs) and never stores scores."""

    scale: float | None  # None: 1/sqrt(head dim), the kernel's default
    masking: Masking | None
    grouped: bool  # fewer kv heads than query heads, shared in groups


class StepBase(Strict):
    """Fields every step has, and the contract every kind fulfils."""

    # a step kind is only ever validated inside PipelineSpec: skip building a validator per kind
    model_config = ConfigDict(defer_build=True)

    id: TensorId = Field(description="unique name of the step's output tensor")
    input: TensorId | None = Field(
        None, description="the one input tensor (default: the previous step; for the first step, the pipeline's only input)"
    )
    inputs: list[TensorId] | None = Field(None, description="several input tensors, in order")
    group: str | None = Field(None, max_length=80, description="label; diagrams draw a group as a cluster")
    note: str | None = Field(None, max_length=500, description="free text shown under the node in diagrams")
    allow: (
        dict[Annotated[str, Field(pattern=r"^[a-z][a-z0-9-]*$", max_length=40)], Annotated[str, Field(min_length=1, max_length=300)]] | None
    ) = Field(
        None,
        description="lints this step deliberately trips, each with the reason: {scale-mismatch: 'Gemma scales by query_pre_attn_scalar'}; "
        "`tracer check` still reports them, as allowed",
    )

    arity: ClassVar[int | None] = 1  # number of data inputs; None means "one or more"
    param_fields: ClassVar[tuple[str, ...]] = ()  # fields that name extra tensors (weights, masks)
    output_field: ClassVar[str | None] = None  # a field listing the names of several outputs (split's 'outputs')
    example: ClassVar[str] = ""  # a YAML snippet for the format reference; a test validates it

    # traits: what the other layers know about a kind without naming it
    copies_data: ClassVar[bool] = False  # a layout op whose new storage is a copy of its input's data
    passes_scores: ClassVar[bool] = False  # keeps attention scores (shape and meaning) between QK and softmax
    adds_bias: ClassVar[str | None] = None  # the inner record of a bias it adds to the scores it passes (T5, ALiBi)
    sums_inputs: ClassVar[bool] = False  # its output is the sum of its inputs (add)
    squashes: ClassVar[bool] = False  # maps its input into a bounded range (softcap's tanh): a mask's -inf comes out finite
    drops: ClassVar[bool] = False  # zeroes random elements when it trains (dropout), whether or not this file trains
    makes_scores: ClassVar[bool] = False  # may compute attention scores (a product of queries and keys)
    elementwise: ClassVar[bool] = False  # output element i reads input element i only (after broadcasting)
    includes_file: ClassVar[bool] = False  # another pipeline file, expanded into its steps before analysis (op: block)
    regroups: ClassVar[bool] = False  # splits or merges neighbouring dims in memory order (view, reshape)
    normalises_rows: ClassVar[bool] = False  # normalises each row over its last dim (layernorm, rmsnorm): SequenceParallel applies
    keeps_values: ClassVar[bool] = False  # every output element is an input element: layout ops, and cast (a 0/1 mask stays 0/1)
    multiplies: ClassVar[bool] = False  # the elementwise product of its two inputs (a 0/1 operand zeroes, it does not hide)
    looks_up: ClassVar[bool] = False  # picks rows of a table by integer ids (nn.Embedding): learned positions, when the ids count
    axis_fields: ClassVar[tuple[str, ...]] = ("dim",)  # fields that number axes, -1 the last (a kind without one has none)
    counts_output_axes: ClassVar[bool] = False  # its axes number the output's, one more than the input's (unsqueeze, stack)
    table_records: ClassVar[tuple[str, ...]] = ()  # inner records holding the tables ``table_key`` describes (rope: cos, sin)

    @model_validator(mode="after")
    def _one_input_form(self) -> "StepBase":
        if self.input is not None and self.inputs is not None:
            raise ValueError("give either 'input' or 'inputs', not both")
        return self

    def canonical(self, input_rank: int | None, output_rank: int | None) -> tuple[str, dict]:
        """(kind, fields) as every spelling of the same computation gives them: axes as positive
        numbers where the rank they count is known; tensor names, notes and groups left out.
        ``tracer diff`` compares these, so ``dim: -1`` and ``dim: 3`` of a 4-d input are no change."""
        skip = {"id", "op", "note", "group", "allow", "input", "inputs", *self.param_fields}
        fields = self.model_dump(exclude=skip | ({self.output_field} if self.output_field else set()))
        rank = output_rank if self.counts_output_axes else input_rank
        for key in self.axis_fields:
            if key in fields:
                fields[key] = positive_axes(fields[key], rank)
        return self.op, fields

    def data_inputs(self) -> list[str]:
        """The tensors it reads as data, in order (the loader wrote the implicit input in)."""
        if self.inputs is not None:
            return list(self.inputs)
        return [] if self.input is None else [self.input]

    def param_refs(self) -> list[str]:
        return [getattr(self, f) for f in self.param_fields if getattr(self, f) is not None]

    def output_ids(self) -> list[str]:
        """The tensor ids this step defines: its own id, or the names of its several outputs."""
        return [self.id] if self.output_field is None else list(getattr(self, self.output_field))

    # descriptions of meaning, read by the attention core and the lints (None: not this kind of step)

    def static(self, ins: list, sizes: tuple[int, ...], value: Callable[[int | str], int]):
        """Its result as a :class:`tracer.core.static.Static` from its inputs' (index arithmetic known
        before running: arange, compare, …), ``sizes`` the result's; None for kinds that do not say."""
        return None

    def splitting(self) -> int | None:
        """The dim it cuts into consecutive pieces, each an output of its own (split, chunk)."""
        return None

    def scaled_by(self) -> str | None:
        """The dim expression a scale is written in (``{sqrt: Dh}``: ``Dh``), None for a number."""
        return None

    def scaling(self, value: Callable[[int | str], int]) -> tuple[float, str] | None:
        """The number it multiplies by and how the file wrote it (``(0.577, '1/√d_k (d_k=3)')``);
        ``value`` evaluates a dim expression."""
        return None

    def masking(self) -> Masking | None:
        return None

    def normalises(self) -> int | None:
        """The dim a normalisation into weights (softmax) runs over."""
        return None

    def slicing(self) -> Slicing | None:
        return None

    def tiling(self) -> list[int | str] | None:
        """``repeat``'s repeats: the input tiled whole along each dim."""
        return None

    def projection(self) -> Projection | None:
        return None

    def fused_attention(self) -> FusedAttention | None:
        return None

    def fused_weights(self, k: KernelContext) -> Callable | None:
        """A fused attention kind's weights, ``softmax(q·kᵀ·scale + mask)`` before dropout, which
        its kernel computes and never stores: a function of the kernel's arguments, for the
        report to draw (labelled recomputed). None for every other kind."""
        return None

    def rotation(self) -> Rotation | None:
        """Positions it encodes into its input (rope)."""
        return None

    def joins(self) -> int | None:
        """The dim it concatenates its inputs along (cat: a KV cache grows this way)."""
        return None

    def counts(self) -> int | str | None:
        """The first value (a dim expression) of the integers it makes, ``start, start + 1, …``
        (arange: positions made inside the graph)."""
        return None

    def on_binary(self) -> str | None:
        """What it makes of a 0/1 tensor, element by element: ``"same"`` (``mask != 0``, ``mask > 0``)
        or ``"not"`` (``mask == 0``, ``logical_not``), so that lints follow a mask's polarity."""
        return None

    def scaled_norm(self) -> ScaledNorm | None:
        return None

    def score_axes(self, ndim: int) -> tuple[int | None, int | None]:
        """For a product of queries and keys (``makes_scores``): (query axis, key axis) of its result."""
        return ndim - 2, ndim - 1

    def is_identity(self) -> bool:
        """Whether it returns its input unchanged (dropout in eval mode)."""
        return False

    def is_random(self) -> bool:
        """Whether a run of this step draws from torch's RNG (training dropout)."""
        return False

    def table_key(self, value: Callable[[int | str], int], reads: tuple[str, ...], outs: list[Meta]) -> tuple | None:
        """What the tables its kernel builds from its settings alone depend on (rope's cos and sin:
        frequencies, positions, size, dtype), given ``value`` for dim expressions, the record ids
        it reads and its records' metadata; steps of one run with equal keys compute equal tables
        (``KernelContext.shared_table``). None: it builds no such table."""
        return None

    def args(self) -> list[str]:
        """Key arguments for diagrams and tables, e.g. ``['dim=-1']``."""
        return []

    def infer(self, ins: list[Meta], ctx: RuleContext) -> Shape:  # pragma: no cover - every kind overrides
        raise NotImplementedError

    def kernel(self, ctx: KernelContext) -> Callable:  # pragma: no cover - every kind overrides
        raise NotImplementedError

    def emit(self, ctx: EmitContext) -> str | list[str]:  # pragma: no cover - every kind overrides
        """The step as PyTorch source, computing exactly what ``kernel`` computes: one expression
        (for several outputs, a tuple in ``ctx.targets``' order; for a composite, its last tensor),
        or a list of statements that assign every name in ``ctx.targets``."""
        raise NotImplementedError


def register(cls: type[StepBase]) -> type[StepBase]:
    op = cls.model_fields["op"].default
    STEP_KINDS[op] = cls
    return cls


def positive_axes(value, rank: int | None):
    """An axis or a list of them counted from 0 (-1 is ``rank - 1``); as written where the rank is unknown."""
    if rank is None or isinstance(value, bool):
        return value
    if isinstance(value, int):
        return value % rank if -rank <= value < rank else value
    return [positive_axes(v, rank) for v in value] if isinstance(value, list) else value
