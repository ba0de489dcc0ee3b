"""The pipeline file format as pydantic v2 models (unknown keys are errors)."""

from __future__ import annotations

import math
from typing import Annotated, Any, Literal

from pydantic import (
    ConfigDict,
    Field,
    GetCoreSchemaHandler,
    GetJsonSchemaHandler,
    PrivateAttr,
    StrictBool,
    StrictFloat,
    StrictInt,
    field_validator,
    model_validator,
)
from pydantic.json_schema import GenerateJsonSchema, JsonSchemaValue
from pydantic_core import PydanticCustomError, core_schema

from .. import steps  # noqa: F401  (registers every step kind)
from ..core import dimexpr
from ..core.dtypes import DTYPE_BYTES, FLOAT_DTYPES
from ..core.fields import DimText, ParamRef, RecordId, Strict, TensorId
from ..core.symbolic import dependency_order
from ..steps.contract import STEP_KINDS, StepBase
from .inits import INITS

DType = Literal[tuple(DTYPE_BYTES)]  # type: ignore[valid-type]
FloatDType = Literal[FLOAT_DTYPES]  # type: ignore[valid-type]
Init = Literal[tuple(INITS)]  # type: ignore[valid-type]  # every init of the registry, in its order
Scalar = StrictBool | StrictInt | StrictFloat
MAX_VALUES = 1_000_000
DIM_PATTERN = r"^[A-Za-z_][A-Za-z0-9_]*$"
MODULE_PATH = r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)+$"  # package.module.Class: `matches:`
SEED_MIN, SEED_MAX = -(2**63), 2**64 - 1  # what torch.manual_seed accepts


class Tokens(Strict):
    """Token ids of a sentence, built as tutorial 000 builds its dictionary."""

    text: str = Field(max_length=100_000, description="the sentence")
    remove: list[str] = Field(default_factory=list, description="characters deleted before splitting, e.g. [',']")

    def words(self) -> list[str]:
        text = self.text
        for chars in self.remove:
            text = text.replace(chars, "")
        return text.split()

    def ids(self) -> list[int]:
        words = self.words()
        vocab = {w: i for i, w in enumerate(sorted(words))}
        return [vocab[w] for w in words]


class TensorDecl(Strict):
    """An input or a parameter: a shape and exactly one source."""

    shape: list[DimText] = Field(max_length=16, description="list of dim names, expressions or ints, e.g. [B, T, d_model]")
    init: Init | None = Field(
        None, description="how to create it (torch.randn, torch.rand, ... ; 'linear'/'embedding' are nn.Linear's/nn.Embedding's own init)"
    )
    values: Any = Field(None, description="a literal nested list")
    tokens: Tokens | None = Field(None, description="{text, remove}: token ids of a sentence (tutorial 000)")
    seed: StrictInt | None = Field(None, ge=SEED_MIN, le=SEED_MAX, description="torch.manual_seed(seed) right before creating this tensor")
    dtype: DType | None = Field(
        None,
        description="float32, float64, float16, bfloat16, int64, int32 or bool (default: the pipeline's dtype; int64 for tokens, bool for all-boolean values)",
    )
    fan_in: DimText | None = Field(None, description="fan-in for init: linear (default: the last dim of a 2-D weight)")
    value: Scalar | None = Field(None, description="the fill value of init: full, e.g. 1.0 or -10000.0 (torch.full)")
    note: str | None = Field(None, max_length=500, description="free text shown in diagrams")
    buffer: bool = Field(
        False,
        description="params only: a module buffer, held but not trained (a causal mask, a rotary table): "
        "`tracer export` and `tracer.to_module` register it with register_buffer, and parameter counts leave it out",
    )
    allow: dict[Literal["unused-tensor"], Annotated[str, Field(min_length=1, max_length=300)]] | None = Field(
        None,
        description="declared on purpose and read by no step, with the reason: {unused-tensor: 'advances the RNG as the tutorial did'}",
    )

    @model_validator(mode="after")
    def _one_source(self) -> TensorDecl:
        given = [k for k in ("init", "values", "tokens") if getattr(self, k) is not None]
        if len(given) != 1:
            found = " and ".join(given) if given else "none"
            raise ValueError(f"needs exactly one of 'init', 'values' or 'tokens'; found {found}")
        if self.fan_in is not None and self.init != "linear":
            raise ValueError("'fan_in' only applies to init: linear")
        if (self.value is not None) != (self.init == "full"):
            raise ValueError("init: full needs 'value' (the number to fill with), and 'value' only applies to init: full")
        return self

    @field_validator("values")
    @classmethod
    def _nested_numbers(cls, value: Any) -> Any:
        if value is None:
            return value
        count = _count_scalars(value, 0)
        if count > MAX_VALUES:
            raise ValueError(f"holds {count} numbers; literal values are limited to {MAX_VALUES}")
        return value


def _count_scalars(value: Any, depth: int) -> int:
    if isinstance(value, (bool, int, float)):
        return 1
    if isinstance(value, list) and depth < 16:
        total = 0
        for item in value:
            total += _count_scalars(item, depth + 1)
            if total > MAX_VALUES:
                break
        return total
    raise ValueError(f"'values' must be a nested list of numbers, found {type(value).__name__}")


# A config.json key: dotted into nested objects and lists (rope_parameters.rope_theta,
# layer_types.{layer}); {layer} stands for the layer picked with --layer.
ConfigKey = Annotated[str, Field(pattern=r"^[A-Za-z0-9_]+(\.([A-Za-z0-9_]+|\{layer\}))*$", max_length=200)]
FieldRef = Annotated[str, Field(pattern=r"^[A-Za-z_][A-Za-z0-9_.\-]*\.[a-z_]+$", max_length=120)]


class Split(Strict):
    """A packed checkpoint tensor cut into equal pieces."""

    into: list[ParamRef] = Field(min_length=1, description="the params, in order")
    dim: StrictInt = Field(0, description="the dim it is cut along")


class Checkpoint(Strict):
    """How a transformers ``save_pretrained`` folder fills this pipeline (``--weights DIR``)."""

    dims: dict[ConfigKey, Annotated[str, Field(pattern=DIM_PATTERN)]] = Field(
        default_factory=dict, description="config.json key -> the dim it sets, e.g. {hidden_size: d_model}"
    )
    fields: dict[ConfigKey, list[FieldRef]] = Field(
        default_factory=dict, description="config.json key -> the step fields it sets, as STEP.FIELD, e.g. {rms_norm_eps: [h.eps]}"
    )
    require: dict[ConfigKey, Scalar | str | None] = Field(
        default_factory=dict,
        description="config.json values this pipeline is written for, e.g. {hidden_act: silu}; a checkpoint with another value is refused",
    )
    prefix: str = Field(
        "",
        max_length=200,
        description="what the keys of `params` start with in the checkpoint; {layer} is the layer given by --layer, e.g. 'model.layers.{layer}.'",
    )
    params: dict[str, ParamRef | list[ParamRef] | Split | None] = Field(
        min_length=1,
        description="checkpoint key (after the prefix) -> param id, [P1, P2, ...] (a packed tensor cut along dim 0), {into, dim}, "
        "or null (a key the pipeline does not compute with); every key under the prefix must be named. Without {layer} in the "
        "prefix, a key and its params may hold {layer}: one entry per copy of a repeated block, e.g. "
        "'transformer.h.{layer}.ln_1.weight: h/{layer}/ln_1_w'",
    )

    @model_validator(mode="after")
    def _layer_needs_a_per_layer_prefix(self):
        keys = [*self.dims, *self.fields, *self.require]
        if "{layer}" not in self.prefix and any("{layer}" in key for key in keys):
            raise ValueError("a config key with {layer} needs a per-layer prefix, such as 'model.layers.{layer}.'")
        return self

    @field_validator("params")
    @classmethod
    def _layer_entries_name_every_copy(cls, params, info):
        per_layer_prefix = "{layer}" in info.data.get("prefix", "")
        for key, target in params.items():
            names = [] if target is None else [target] if isinstance(target, str) else target if isinstance(target, list) else target.into
            if "{layer}" in key and per_layer_prefix:
                raise ValueError(f"'{key}': {{layer}} is in the prefix already (one layer per --layer); a key names no other")
            if any(("{layer}" in name) != ("{layer}" in key) for name in names):
                raise ValueError(
                    f"'{key}': a key with {{layer}} maps to params with {{layer}} (one entry per copy), and only such a key does"
                )
        return params


PLACEMENT = r"^(Shard\(-?\d+\)|Replicate\(\)|Partial\(\))$"  # DTensor's placements, as torch prints them
Placement = Annotated[str, Field(pattern=PLACEMENT, description="Shard(dim), Replicate() or Partial(), as DTensor writes them")]
PlanStyle = Literal["colwise", "rowwise", "sequence", "replicate", "context"]
PLAN_TARGET = r"^[A-Za-z0-9_.*/{},\-]+$"  # a step id, or a glob over the expanded ids: layers/*/q_proj


class PlanEntry(Strict):
    """How one step is parallelised, in torch's ``parallelize_module`` vocabulary: ``colwise``
    (ColwiseParallel: the weight's output features sharded), ``rowwise`` (RowwiseParallel: the
    input features sharded, the partial sums reduced), ``sequence`` (SequenceParallel: a norm
    applied to a sequence shard), ``replicate`` (the whole step on every rank), ``context``
    (attention over a sequence sharded along ``mesh_dim``: the keys and values exchanged)."""

    style: PlanStyle = Field(description="colwise, rowwise, sequence, replicate or context")
    mesh_dim: Annotated[str, Field(pattern=DIM_PATTERN)] | None = Field(
        None, description="the mesh dim it is sharded over (default: tp, or cp for context)"
    )
    input: Placement | None = Field(None, description="the layout of its input as it arrives (input_layouts), e.g. Shard(1)")
    output: Placement | None = Field(None, description="the layout its output leaves in (output_layouts), e.g. Shard(1)")
    local_output: StrictBool = Field(
        True,
        description="use_local_output: the output as the rank's local tensor, as the next steps (each rank's program) read it; "
        "false (a DTensor) is refused",
    )


class Parallel(Strict):
    """How the pipeline is spread over devices: a device mesh whose sizes are dims (``H // tp``
    is an expression, ``--dim tp=8`` changes the degree), the inputs' placements on it, and a plan
    per step in torch's ``parallelize_module`` vocabulary (docs/parallel.md)."""

    mesh: dict[Annotated[str, Field(pattern=DIM_PATTERN)], DimText] = Field(
        min_length=1, max_length=4, description="mesh dim -> its size (a dim of the pipeline), outermost first, e.g. {dp: 2, tp: 4}"
    )
    inputs: dict[TensorId, list[Placement]] = Field(
        default_factory=dict,
        description="input -> one placement per mesh dim, e.g. {x: [Shard(0), Replicate()]} (default: replicated on every rank)",
    )
    plan: dict[Annotated[str, Field(pattern=PLAN_TARGET, max_length=200)], PlanStyle | PlanEntry] = Field(
        default_factory=dict,
        description="step id or glob -> its style, or {style, mesh_dim, input, output, local_output}, e.g. {q_proj: colwise}",
    )


class AttentionRole(Strict):
    """What the file's attention computes, so that its masks can be checked against it: a
    ``decoder`` attends only to earlier tokens (a causal mask), an ``encoder`` to every token of
    its sequence (no causal mask), ``cross`` attention from one sequence to another (no causal
    mask: the keys are not later tokens of the queries' sequence)."""

    kind: Literal["decoder", "encoder", "cross"] = Field(
        description="decoder: self-attention must be causal; encoder: must not be; cross: no causal mask"
    )


class Expect(Strict):
    shape: list[DimText] | None = None
    contiguous: StrictBool | None = None


def _step_of_its_kind(value: Any) -> StepBase:
    """One step, validated by the model of the kind its ``op`` names, as a union discriminated by
    ``op`` would, with the same errors: each kind's validator is built at its first step (~1 ms),
    where the union's is built for every kind at the first file (~60 ms, most of checking one file)."""
    if isinstance(value, StepBase):
        return value
    if not isinstance(value, dict):
        raise PydanticCustomError("model_attributes_type", "Input should be a valid dictionary or object to extract fields from")
    if "op" not in value:
        raise PydanticCustomError(
            "union_tag_not_found", "Unable to extract tag using discriminator {discriminator}", {"discriminator": "'op'"}
        )
    op = value["op"]
    kind = STEP_KINDS.get(op) if isinstance(op, str) else None
    if kind is None:
        raise PydanticCustomError(
            "union_tag_invalid",
            "Input tag '{tag}' found using {discriminator} does not match any of the expected tags: {expected_tags}",
            {"discriminator": "'op'", "tag": str(op), "expected_tags": ", ".join(f"'{name}'" for name in STEP_KINDS)},
        )
    return kind.model_validate(value)


class _StepSchema:
    """The pydantic type of a step: validated by ``_step_of_its_kind``; described in the JSON
    schema as the union of every kind discriminated by ``op`` (built only when a schema is asked for)."""

    @classmethod
    def __get_pydantic_core_schema__(cls, source: Any, handler: GetCoreSchemaHandler) -> core_schema.CoreSchema:
        return core_schema.no_info_plain_validator_function(_step_of_its_kind)

    @classmethod
    def __get_pydantic_json_schema__(cls, schema: core_schema.CoreSchema, handler: GetJsonSchemaHandler) -> JsonSchemaValue:
        choices = {op: kind.__pydantic_core_schema__ for op, kind in STEP_KINDS.items()}
        return handler(core_schema.tagged_union_schema(choices, discriminator="op"))


Step = Annotated[StepBase, _StepSchema]


class PipelineSpec(Strict):
    """A declared attention pipeline (the file format)."""

    # the validator (every step kind's schema, ~100 ms) is built at the first validation, not at
    # import: `tracer --version`, `help`, `models`, `schema` and `import tracer` never build it
    model_config = ConfigDict(defer_build=True)

    name: str = Field(max_length=120, description="the pipeline's name")
    description: str = Field("", max_length=20_000, description="what it computes, for people")
    matches: list[Annotated[str, Field(pattern=MODULE_PATH, max_length=200)]] = Field(
        default_factory=list,
        max_length=20,
        description="the library modules this pipeline computes the same as, by import path, e.g. "
        "[transformers.models.llama.modeling_llama.LlamaDecoderLayer] (`tracer models` lists them)",
    )
    dims: dict[Annotated[str, Field(pattern=DIM_PATTERN)], DimText] = Field(
        default_factory=dict, description="name -> int or expression over other dims"
    )
    seed: StrictInt | None = Field(None, ge=SEED_MIN, le=SEED_MAX, description="torch.manual_seed before creating any tensor")
    dtype: FloatDType = Field("float32", description="floating dtype of created tensors")
    inputs: dict[TensorId, TensorDecl] = Field(default_factory=dict, description="named input tensors")
    params: dict[TensorId, TensorDecl] = Field(default_factory=dict, description="named parameters (weights)")
    steps: list[Step] = Field(min_length=1, max_length=10_000, description="the computation, one op per step")  # type: ignore[valid-type]
    outputs: list[RecordId] | None = Field(
        None, description="tensor ids returned by a run (default: the last step); a block's tensors as BLOCK/ID or BLOCK/COPY/ID"
    )
    expect: dict[RecordId, list[DimText] | Expect] = Field(
        default_factory=dict,
        description="id -> shape, or {shape, contiguous}; checked before and after running (a block's tensors as BLOCK/ID or BLOCK/COPY/ID)",
    )
    attention: AttentionRole | None = Field(
        None,
        description="{kind: decoder|encoder|cross}: what this file's attention is, checked against its masks "
        "(the file's own steps; a block file's covers its copies)",
    )
    checkpoint: Checkpoint | None = Field(
        None,
        description="how a transformers save_pretrained folder fills the dims, step fields and params (`tracer run FILE --weights DIR`)",
    )
    parallel: Parallel | None = Field(
        None,
        description="{mesh, inputs, plan}: tensor, sequence, context and data parallelism over a device mesh (docs/parallel.md)",
    )
    _parsed_dims: tuple | None = PrivateAttr(default=None)  # (the dims dict parsed, its expressions, their order)

    @model_validator(mode="after")
    def _parse_dims(self) -> PipelineSpec:
        """Keep the dims parsed: each text was just parsed by its validator, and within
        ``dimexpr.parsing_once`` (loading validates in it) that parse is the one kept."""
        exprs = {name: dimexpr.parse(text) for name, text in self.dims.items()}
        for name, size in self.parallel.mesh.items() if self.parallel is not None else ():
            exprs.setdefault(name, dimexpr.parse(size))  # a mesh dim is a dim (load reports one declared twice)
        self._parsed_dims = (self.dims, exprs, None)
        return self

    @property
    def dim_exprs(self) -> dict[str, dimexpr.Expr]:
        """Every dim's expression (the mesh's sizes too: ``tp`` is a dim), parsed once per spec: analysis, blocks and export read them
        many times, and a file of thousands of derived dims must not parse each again every time."""
        if self._parsed_dims[0] is not self.dims:  # a copy made with other dims parses its own
            self._parse_dims()
        return self._parsed_dims[1]

    @property
    def dim_order(self) -> list[str]:
        """The dims, each after the dims it is computed from (the file's order otherwise); raises
        ``DimError`` for a cycle or an unknown name, which the analysis reports first."""
        exprs = self.dim_exprs
        if self._parsed_dims[2] is None:
            self._parsed_dims = (self.dims, exprs, dependency_order(exprs))
        return self._parsed_dims[2]


# How a number is written when YAML 1.1 (tracer's reader, PyYAML) reads it as text but a lax float
# field converts it: `1e-5` and `-inf` are strings to PyYAML and numbers to YAML 1.2 editors.
NUMBER_TEXT = r"^\s*[-+]?((\d[\d_]*(\.[\d_]*)?|\.\d[\d_]*)([eE][-+]?\d[\d_]*)?|inf|Inf|INF|infinity|Infinity|INFINITY)\s*$"


class _SchemaGenerator(GenerateJsonSchema):
    """Pydantic's generator, made to describe what tracer accepts in strict JSON: a lax float field
    also takes its number as text (the YAML reading above), and a non-finite default is written as
    that text ("-inf"), since JSON has no Infinity."""

    def float_schema(self, schema):
        number = super().float_schema(schema)
        if schema.get("strict"):
            return number
        return {"anyOf": [number, {"type": "string", "pattern": NUMBER_TEXT}]}

    def encode_default(self, dft):
        if isinstance(dft, float) and math.isinf(dft):
            return "-inf" if dft < 0 else "inf"
        return super().encode_default(dft)


def _dispatch_on_op(union: dict) -> dict:
    """A step's schema chosen by its ``op``, in draft-07's terms: ``if op is X then X's schema``.
    Pydantic's ``oneOf`` + OpenAPI ``discriminator`` makes a draft-07 validator try all kinds on
    every step and report a mismatch against each; this reports the chosen kind's problems only."""
    mapping = union["discriminator"]["mapping"]
    return {
        "type": "object",
        "required": ["op"],
        "properties": {"op": {"enum": sorted(mapping)}},
        "allOf": [{"if": {"properties": {"op": {"const": op}}}, "then": {"$ref": ref}} for op, ref in sorted(mapping.items())],
    }


def json_schema() -> dict:
    schema = PipelineSpec.model_json_schema(schema_generator=_SchemaGenerator)
    schema["properties"]["steps"]["items"] = _dispatch_on_op(schema["properties"]["steps"]["items"])
    schema["$schema"] = "http://json-schema.org/draft-07/schema#"
    schema["title"] = "tracer pipeline"
    return schema


def tensor_dtype(decl: TensorDecl, default: str) -> str:
    if decl.dtype:
        return decl.dtype
    if decl.tokens is not None:
        return "int64"
    if decl.values is not None and _all_bool(decl.values):
        return "bool"
    return default


def _all_bool(values) -> bool:
    return isinstance(values, bool) or (isinstance(values, list) and bool(values) and all(_all_bool(v) for v in values))
