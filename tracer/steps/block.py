"""``op: block``: another pipeline file as a sub-graph, once or ``repeat: N`` times in a chain.

Blocks are expanded before analysis by :mod:`tracer.spec.expand` (a spec -> spec pass) into
namespaced steps, so every shape rule, kernel, record, lint and diagram works on them unchanged.
``BlockInput`` is what the expansion puts where a block's declared input binds an outer tensor.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, StrictBool, StrictInt, model_validator

from ..core.fields import DimText
from ..core.layout import view
from .contract import StepBase, register
from .rules import StepError, show


@register
class Block(StepBase):
    """Another pipeline file as a sub-graph: its inputs take this step's inputs, in order.

    The block file's own ``expect:`` is checked on every copy, in the block's dims; the including
    file can pin any copy's tensor too (``expect: {layers/3/scores: [B, H, T, T]}``). With
    ``share_params: true`` the copies read one set of weights (``layers/W_Q``), as ALBERT does.
    Diagrams draw each copy as a group: ``tracer render --collapse 'layers/*'`` folds each into one box.
    """

    op: Literal["block"] = "block"
    use: str = Field(max_length=300, description="the pipeline file to include, relative to this file and inside its folder")
    dims: dict[str, DimText] = Field(
        default_factory=dict,
        description="the block's base dims as expressions of this file's dims "
        "(a block dim with the same name as one of this file's dims is bound to it automatically)",
    )
    repeat: StrictInt | None = Field(
        None,
        ge=1,
        le=10_000,
        description="chain N copies (ids BLOCK/0/..., BLOCK/1/...): each copy's first input is the previous copy's output",
    )
    share_params: StrictBool = Field(
        False,
        description="with repeat: every copy reads the same params (tied weights, as in "
        "ALBERT), created once as BLOCK/NAME instead of BLOCK/COPY/NAME",
    )
    arity = None
    includes_file = True
    example = """\
- id: layers
  op: block
  use: blocks/encoder_layer.yaml   # relative to this file
  input: x                         # the block's input(s), in its declaration order
  dims: {d_ff: 4 * d_model}        # same-named dims (B, T, d_model, H) bind automatically
  repeat: 48                       # layers/0/... to layers/47/...; 'layers' is the last output"""

    @model_validator(mode="after")
    def _sharing_needs_copies(self):
        if self.share_params and not self.repeat:
            raise ValueError("'share_params' shares weights between the copies of 'repeat'; add 'repeat: N' or remove it")
        return self

    def args(self):
        return [self.use] + ([f"×{self.repeat}"] if self.repeat else []) + (["shared params"] if self.share_params else [])

    def infer(self, ins, ctx):  # pragma: no cover - expanded before analysis
        raise StepError("block", "a block step is expanded before analysis; it has no shape rule of its own")

    def kernel(self, k):  # pragma: no cover
        raise NotImplementedError("block steps are expanded before planning")


class BlockInput(StepBase):
    """A block's declared input, bound to a tensor of the including pipeline (not a file op).

    Checks the bound tensor against the block's declaration and records it under the block's
    name (``layers/0/x``), sharing the outer tensor's storage.
    """

    op: Literal["block_input"] = "block_input"
    shape: list = Field(default_factory=list)
    dtype: str | None = None
    name: str = ""  # the block file's name for it; its id is BLOCK_COPY/name

    @property
    def block(self) -> str:
        """The block copy it is an input of: ``layers/3`` for ``layers/3/x``."""
        return self.id[: -len(self.name) - 1]

    def args(self):
        return [f"{self.block} input '{self.name}'"]

    def infer(self, ins, ctx):
        x = ins[0]
        want = tuple(ctx.dim(t, "shape") for t in self.shape)
        if tuple(d.value for d in want) != x.sizes:
            declared = "(" + ", ".join(map(str, want)) + ") [" + ", ".join(str(d.value) for d in want) + "]"
            raise StepError(
                "block-input",
                f"block '{self.block}' declares input '{self.name}' as {declared}, but '{ctx.input_ids[0]}' is {show(x)}",
                "shape",
            )
        if self.dtype is not None and x.dtype != self.dtype:
            raise StepError(
                "dtype", f"block '{self.block}' declares input '{self.name}' as {self.dtype}, '{ctx.input_ids[0]}' is {x.dtype}", "dtype"
            )
        return view(x, want, x.stride, x.offset)

    def kernel(self, k):
        return _identity


def _identity(x):
    return x
