"""Every ``init:`` a declared tensor can have, each in one place: what it accepts, how a run
creates it, how an exported module writes it, what it costs while it is made, and what is known
of its content before anything runs (the lints read masks declared as ``triu``/``tril``).

Creating takes torch as an argument, so this module (and ``tracer check``) never imports it.
The tutorials' numbers depend on drawing exactly as they draw: ``randn`` and ``embedding`` are
``normal_()`` on a fresh tensor (torch.randn's and nn.Embedding's numbers), ``linear`` is
``nn.Linear.reset_parameters`` bit for bit.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar

from ..core.dtypes import DTYPE_BYTES, FLOAT_DTYPES
from ..core.pysource import atom, py_float, py_tuple

INITS: dict[str, Init] = {}


def linear_bound(fan_in: int, ndim: int) -> float:
    """nn.Linear's reset_parameters, bit for bit: kaiming_uniform_(a=√5) for a weight, U(±1/√fan_in) for a bias."""
    if ndim >= 2:
        gain = math.sqrt(2.0 / (1 + 5))
        return math.sqrt(3.0) * gain / math.sqrt(fan_in) if fan_in else 0.0
    return 1 / math.sqrt(fan_in) if fan_in > 0 else 0.0


@dataclass(frozen=True)
class Made:
    """What creating a tensor needs: its sizes and dtype name, and ``fan_in`` evaluated (linear)."""

    sizes: tuple[int, ...]
    dtype: str
    fan_in: int | None = None


@dataclass(frozen=True)
class Written:
    """The same for an exported module: each as Python source over the module's dims."""

    dims: tuple[str, ...]  # the shape, one expression per dim
    dtype: str  # a dtype name
    fan_in: str | None = None
    generator: str = "None"  # the torch.Generator random inits draw from (None: torch's global one)
    scratch: str = "bound"  # a local an init may assign first (a linear init's bound)

    @property
    def shape(self) -> str:
        return ", ".join(self.dims) if self.dims else "()"

    @property
    def with_dtype(self) -> str:
        """``shape`` followed by ``dtype=`` when it is not the default float32."""
        return self.shape + ("" if self.dtype == "float32" else f", dtype=torch.{self.dtype}")


class Init:
    """One way to create a declared tensor (a subclass per ``init:`` name)."""

    name: ClassVar[str]
    floating: ClassVar[bool] = False  # draws floating-point numbers: refuses integer and bool dtypes
    param_only: ClassVar[bool] = False  # an init of weights (nn.Linear's, nn.Embedding's): params only

    def problem(self, decl: Any, sizes: tuple[int, ...], section: str) -> tuple[str, str] | None:
        """(field, message) when the declaration cannot be created this way."""
        if self.param_only and section != "params":
            return "init", f"init: {self.name} is a parameter init; declare the tensor under params"
        if self.floating and decl.dtype not in (None, *FLOAT_DTYPES):
            return (
                "dtype",
                f"init: {self.name} draws floating-point numbers, it cannot make {decl.dtype}; use values, tokens, arange, zeros or ones",
            )
        return None

    def create(self, torch: Any, made: Made, device: Any, decl: Any) -> Any:
        raise NotImplementedError

    def source(self, written: Written, decl: Any) -> tuple[list[str], str]:
        """(statements, expression) that create it in an exported module, as ``create`` does."""
        raise NotImplementedError

    def temporary_bytes(self, sizes: tuple[int, ...], dtype: str) -> int:
        """Bytes of a temporary tensor made on the way (freed once the tensor exists)."""
        return 0

    def known_rows(self, sizes: tuple[int, ...], decl: Any) -> list[list[bool]] | None:
        """Its content as rows of truth values (last dim; leading dims flattened) when the init fixes
        it: what the mask lints read. None for random content."""
        return None


def register(cls: type[Init]) -> type[Init]:
    INITS[cls.name] = cls()
    return cls


def _dtype(torch: Any, made: Made) -> Any:
    return getattr(torch, made.dtype)


@register
class Randn(Init):
    """torch.randn's numbers."""

    name, floating = "randn", True

    def create(self, torch, made, device, decl):
        return torch.empty(made.sizes, dtype=_dtype(torch, made), device=device).normal_()

    def source(self, written, decl):
        return [], f"torch.empty({written.with_dtype}).normal_(generator={written.generator})"


@register
class Rand(Init):
    name, floating = "rand", True

    def create(self, torch, made, device, decl):
        return torch.rand(made.sizes, dtype=_dtype(torch, made), device=device)

    def source(self, written, decl):
        return [], f"torch.rand({written.with_dtype}, generator={written.generator})"


class _Constant(Init):
    fill: ClassVar[bool]

    def create(self, torch, made, device, decl):
        return (torch.ones if self.fill else torch.zeros)(made.sizes, dtype=_dtype(torch, made), device=device)

    def source(self, written, decl):
        return [], f"torch.{self.name}({written.with_dtype})"

    def known_rows(self, sizes, decl):
        cols = sizes[-1] if sizes else 1
        rows = math.prod(sizes) // cols if cols else 0
        return [[self.fill] * cols for _ in range(rows)]


@register
class Zeros(_Constant):
    name, fill = "zeros", False


@register
class Ones(_Constant):
    name, fill = "ones", True


@register
class Full(Init):
    """torch.full with the declaration's ``value``."""

    name = "full"

    def create(self, torch, made, device, decl):
        return torch.full(made.sizes, decl.value, dtype=_dtype(torch, made), device=device)

    def source(self, written, decl):

        value = py_float(decl.value) if isinstance(decl.value, float) else repr(decl.value)
        dtype = "" if written.dtype == "float32" else f", dtype=torch.{written.dtype}"
        return [], f"torch.full({py_tuple(list(written.dims))}, {value}{dtype})"


@register
class Arange(Init):
    """0, 1, 2, … in row-major order: counted in int64, then cast."""

    name = "arange"

    def create(self, torch, made, device, decl):
        return torch.arange(math.prod(made.sizes), device=device).to(_dtype(torch, made)).reshape(made.sizes)

    def source(self, written, decl):

        count = " * ".join(atom(d) for d in written.dims) or "1"
        return [], f"torch.arange({count}).to(torch.{written.dtype}).reshape({py_tuple(list(written.dims))})"

    def temporary_bytes(self, sizes, dtype):
        return 0 if dtype == "int64" else 8 * math.prod(sizes)


@register
class Eye(Init):
    """torch.eye(n, m): ones on the main diagonal of a 2-d tensor (an identity projection, a
    mask of each token to itself)."""

    name = "eye"

    def problem(self, decl, sizes, section):
        if len(sizes) != 2:
            return "init", f"init: eye makes a 2-d (n, m) matrix, the shape has {len(sizes)} dims"
        return super().problem(decl, sizes, section)

    def create(self, torch, made, device, decl):
        return torch.eye(*made.sizes, dtype=_dtype(torch, made), device=device)

    def source(self, written, decl):
        return [], f"torch.eye({written.with_dtype})"

    def known_rows(self, sizes, decl):
        rows, cols = sizes
        return [[i == j for j in range(cols)] for i in range(rows)]


@register
class Linear(Init):
    """nn.Linear's reset_parameters: a weight's bound from its last dim, a bias's from ``fan_in``."""

    name, floating, param_only = "linear", True, True

    def problem(self, decl, sizes, section):
        if decl.fan_in is None and len(sizes) < 2 and section == "params":
            return "init", "a 1-d init: linear tensor (a bias) needs 'fan_in' (the in-features of its layer)"
        return super().problem(decl, sizes, section)

    def create(self, torch, made, device, decl):
        fan_in = made.fan_in if made.fan_in is not None else made.sizes[-1]
        bound = linear_bound(fan_in, len(made.sizes))
        return torch.empty(made.sizes, dtype=_dtype(torch, made), device=device).uniform_(-bound, bound)

    def source(self, written, decl):
        fan_in = written.fan_in if written.fan_in is not None else written.dims[-1]
        bound = written.scratch
        setup = [f"{bound} = linear_bound({fan_in}, {len(written.dims)})  # as nn.Linear initialises it"]
        return setup, f"torch.empty({written.with_dtype}).uniform_(-{bound}, {bound}, generator={written.generator})"


@register
class Embedding(Randn):
    """nn.Embedding's init: normal_(0, 1)."""

    name, param_only = "embedding", True


class _Triangle(Init):
    """Ones above the diagonal (``triu``: torch.triu(ones, 1), tutorial 002's "future") or on and
    below it (``tril``: what each query may see); a 2-d (T, T) pattern."""

    upper: ClassVar[bool]

    def problem(self, decl, sizes, section):
        if len(sizes) != 2:
            return "init", f"init: {self.name} builds a 2-d (T, T) pattern, the shape has {len(sizes)} dims"
        return super().problem(decl, sizes, section)

    def create(self, torch, made, device, decl):
        ones = torch.ones(made.sizes, dtype=_dtype(torch, made), device=device)
        return ones.triu(1) if self.upper else ones.tril()

    def source(self, written, decl):
        return [], f"torch.ones({written.with_dtype}).{self.name}({'1' if self.upper else ''})"

    def temporary_bytes(self, sizes, dtype):

        return math.prod(sizes) * DTYPE_BYTES[dtype]

    def known_rows(self, sizes, decl):
        rows, cols = sizes
        return [[(j > i) if self.upper else (j <= i) for j in range(cols)] for i in range(rows)]


@register
class Triu(_Triangle):
    name, upper = "triu", True


@register
class Tril(_Triangle):
    name, upper = "tril", False
