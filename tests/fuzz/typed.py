"""Well-typed pipelines from the step vocabulary: every step's fields are chosen to satisfy its
kind's shape rule, so most cases run, and kernels, layouts, memory estimates and diagrams get fuzzed.

The builder tracks each tensor's shape (dim text and value), dtype and whether it is surely
contiguous, independently of tracer's own rules (a disagreement is what the oracle looks for).
A step that needs a partner tensor (a weight, a mask, keys) declares a fresh input or param of
the right shape, or reuses the tensor itself.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

FLOATS = ("float32", "float64", "float16", "bfloat16")


@dataclass(frozen=True)
class Dim:
    text: int | str  # what the YAML says: a dim name, an expression or a number
    value: int


@dataclass(frozen=True)
class Tensor:
    shape: tuple[Dim, ...]
    dtype: str
    contiguous: bool  # surely contiguous (False: maybe not)
    vocab: int = 0  # int64 token ids: every id is below this

    @property
    def rank(self) -> int:
        return len(self.shape)

    @property
    def is_float(self) -> bool:
        return self.dtype in FLOATS


class Builder:
    """One pipeline under construction: dims, declarations, steps and the tensors they define."""

    def __init__(self, rng, small: bool = True):
        self.rng = rng
        self.dtype = rng.choice(["float32"] * 6 + ["float64", "bfloat16", "float16"])
        self.values: dict[str, int] = {}
        self.dims: dict[str, int | str] = {}
        self.inputs: dict[str, dict] = {}
        self.params: dict[str, dict] = {}
        self.steps: list[dict] = []
        self.tensors: dict[str, Tensor] = {}
        self.serial = 0
        self._choose_dims(small)

    # ------------------------------------------------------------------ dims and declarations

    def _choose_dims(self, small: bool) -> None:
        rng = self.rng
        low = 0 if rng.random() < 0.08 else 1  # sometimes an empty dim: strides of size-0 tensors
        self._base("B", rng.choice([low, 1, 2, 3]))
        self._base("T", rng.choice([low, 1, 2, 3, 5, 6]))
        self._base("H", rng.choice([1, 2, 2, 4]))
        self._base("Dh", rng.choice([2, 2, 4, 6]))
        self._base("S", rng.choice([1, 2, 3, 4]))
        self.dims["d_model"] = "H * Dh"
        self.values["d_model"] = self.values["H"] * self.values["Dh"]
        kv = [h for h in range(1, self.values["H"] + 1) if self.values["H"] % h == 0]
        self._base("H_kv", rng.choice(kv))
        self.dims["n_rep"] = "H // H_kv"
        self.values["n_rep"] = self.values["H"] // self.values["H_kv"]
        if not small:  # meta runs only: a huge batch exercises stride arithmetic past 2**31
            self.values["B"] = self.dims["B"] = rng.choice([2**20, 2**31 + 1, 3 * 2**33])

    def _base(self, name: str, value: int) -> None:
        self.dims[name] = self.values[name] = value

    def dim(self, name: str) -> Dim:
        return Dim(name, self.values[name])

    def fresh_name(self, stem: str) -> str:
        self.serial += 1
        return f"{stem}{self.serial}"

    def declare(self, section: str, shape: tuple[Dim, ...], dtype: str, stem: str = "p", **how: Any) -> str:
        """A new input or param of ``shape``; random floats unless ``how`` says otherwise."""
        name = self.fresh_name(stem)
        vocab = how.pop("vocab", 0)
        decl: dict[str, Any] = {"shape": [d.text for d in shape]}
        if not how:
            inits = ["randn", "rand", "ones", "arange"] + (["linear"] if section == "params" and len(shape) >= 2 else [])
            if dtype not in FLOATS:
                inits = ["zeros", "ones", "arange"]
            if dtype == "bool":
                inits = ["ones", "zeros"] + (["tril", "triu"] if len(shape) == 2 else [])
            how = {"init": self.rng.choice(inits)}
        decl.update(how)
        if dtype != self.dtype:
            decl["dtype"] = dtype
        (self.inputs if section == "inputs" else self.params)[name] = decl
        self.tensors[name] = Tensor(tuple(shape), dtype, True, vocab)
        return name

    def add(self, op: str, fields: dict, out: Tensor, source: str | None = None, inputs: list[str] | None = None) -> str:
        step_id = self.fresh_name(op.replace("_", "")[:6] + "_")
        step: dict[str, Any] = {"id": step_id, "op": op}
        if inputs is not None:
            step["inputs"] = inputs
        elif source is not None and (not self.steps or self.steps[-1]["id"] != source or self.rng.random() < 0.3):
            step["input"] = source  # the previous step's output is the default input
        step.update(fields)
        self.steps.append(step)
        self.tensors[step_id] = out
        return step_id

    # ------------------------------------------------------------------ the document

    def document(self) -> dict:
        rng = self.rng
        doc: dict[str, Any] = {"name": "typed", "dims": self.dims}
        if rng.random() < 0.5:
            doc["seed"] = rng.randint(0, 3)
        if self.dtype != "float32" or rng.random() < 0.1:
            doc["dtype"] = self.dtype
        doc["inputs"] = self.inputs
        if self.params:
            doc["params"] = self.params
        doc["steps"] = self.steps
        made = [s["id"] for s in self.steps if "outputs" not in s] + [o for s in self.steps for o in s.get("outputs", [])]
        if made and rng.random() < 0.3:
            doc["outputs"] = rng.sample(made, min(len(made), rng.randint(1, 3)))
        if made and rng.random() < 0.4:
            doc["expect"] = {name: [d.value for d in self.tensors[name].shape] for name in rng.sample(made, min(len(made), 2))}
        return doc


# ---------------------------------------------------------------------- the steps, one rule each


def _same(t: Tensor, shape=None, contiguous=None, dtype=None) -> Tensor:
    return Tensor(t.shape if shape is None else tuple(shape), dtype or t.dtype, t.contiguous if contiguous is None else contiguous, t.vocab)


def _fresh(shape, dtype: str) -> Tensor:
    return Tensor(tuple(shape), dtype, True)


def _product(a: Dim, b: Dim) -> Dim:
    return Dim(f"{_paren(a.text)} * {_paren(b.text)}", a.value * b.value)


def _paren(text: int | str) -> str:
    text = str(text)
    return text if text.isidentifier() or text.lstrip("-").isdigit() else f"({text})"


def unary(b: Builder, x: str) -> str | None:
    t = b.tensors[x]
    if not t.is_float:
        return None
    op = b.rng.choice(["relu", "gelu", "silu", "sigmoid", "tanh", "exp", "neg"])
    fields = {"approximate": "tanh"} if op == "gelu" and b.rng.random() < 0.5 else {}
    # pointwise ops keep a dense input's layout; add 'contiguous' knowledge only when the input had it
    return b.add(op, fields, _same(t), x)


KEEPS_INTEGERS = ("abs", "floor", "ceil", "trunc", "square")


def math_fn(b: Builder, x: str) -> str | None:
    """torch's math functions on any dtype: integer and bool results follow torch's rules."""
    t = b.tensors[x]
    op = b.rng.choice([*KEEPS_INTEGERS, "log", "log1p", "sqrt", "rsqrt", "sin", "cos", "reciprocal"])
    if t.dtype == "bool" and op in KEEPS_INTEGERS[:4]:
        return None  # torch refuses these on bool
    dtype = t.dtype if t.is_float else ("int64" if t.dtype == "bool" else t.dtype) if op in KEEPS_INTEGERS else "float32"
    return b.add(op, {}, _same(t, dtype=dtype), x)


def compare_select(b: Builder, x: str) -> str | None:
    """A comparison with a number, then sometimes a selection or a logical op on the bool result."""
    t = b.tensors[x]
    if t.dtype == "bool":
        return None
    mask = b.add(
        "compare",
        {"cmp": b.rng.choice(["eq", "ne", "lt", "le", "gt", "ge"]), "value": b.rng.choice([0, 1, 0.5])},
        _same(t, dtype="bool"),
        x,
    )
    roll = b.rng.random()
    if roll < 0.4:
        otherwise = b.rng.choice([0, -1.5])
        return b.add("where", {"otherwise": otherwise}, _same(t, dtype=_promoted(t.dtype, otherwise)), inputs=[mask, x])
    if roll < 0.6:
        return b.add("logical", {"fn": "not"}, _same(t, dtype="bool"), mask)
    if roll < 0.8:
        return b.add("clamp", {"min": -1, "max": 1}, _same(t), x)
    return mask


def _promoted(dtype: str, number: int | float) -> str:
    return dtype if dtype in FLOATS or isinstance(number, int) else "float32"


def along(b: Builder, x: str) -> str | None:
    """A running sum or a reduction along one dim of a tensor with dims."""
    t = b.tensors[x]
    if not t.rank:
        return None
    d = b.rng.randrange(t.rank)
    summed = t.dtype if t.is_float else "int64"
    if b.rng.random() < 0.4:
        return b.add("cumsum", {"dim": d - t.rank}, _fresh(t.shape, summed), x)
    fn = b.rng.choice(["sum", "amax", "any"] + (["mean"] if t.is_float else []))
    dtype = {"sum": summed, "any": "bool"}.get(fn, t.dtype)
    keepdim = b.rng.random() < 0.5
    shape = [Dim(1, 1) if i == d else s for i, s in enumerate(t.shape)] if keepdim else [s for i, s in enumerate(t.shape) if i != d]
    by_name = isinstance(t.shape[d].text, str) and t.shape[d].text.isidentifier() and sum(s.text == t.shape[d].text for s in t.shape) == 1
    return b.add("reduce", {"fn": fn, "dim": t.shape[d].text if by_name else d, "keepdim": keepdim}, _fresh(shape, dtype), x)


def arange(b: Builder, x: str) -> str | None:
    """Positions from dims, reading nothing: 0..L or S..S+L."""
    length = b.dim(b.rng.choice(["T", "H"]))
    start = b.rng.choice([0, "S"])
    stop = length.text if start == 0 else f"S + {length.text}"
    return b.add("arange", {"start": start, "stop": stop}, _fresh((length,), "int64"))


def scale(b: Builder, x: str) -> str | None:
    t = b.tensors[x]
    if not t.is_float:
        return None
    by: Any = b.rng.choice([2, 0.5, -1.5, 8.0, {"sqrt": b.rng.choice(["Dh", "d_model", "H"])}])
    return b.add("scale", {b.rng.choice(["divide", "multiply"]): by}, _same(t), x)


def dropout(b: Builder, x: str) -> str | None:
    t = b.tensors[x]
    if not t.is_float:
        return None
    training = b.rng.random() < 0.5
    return b.add("dropout", {"p": b.rng.choice([0.0, 0.1, 0.5, 1.0]), "training": training}, _same(t), x)


def softmax(b: Builder, x: str) -> str | None:
    t = b.tensors[x]
    if not t.is_float or not t.rank:
        return None
    return b.add("softmax", {"dim": b.rng.randint(-t.rank, t.rank - 1)}, _fresh(t.shape, t.dtype), x)


def cast(b: Builder, x: str) -> str | None:
    t = b.tensors[x]
    dtype = b.rng.choice(FLOATS + ("float32", "int64", "bool"))
    return b.add("cast", {"dtype": dtype}, _same(t, dtype=dtype, contiguous=t.contiguous), x)


def norm(b: Builder, x: str) -> str | None:
    t = b.tensors[x]
    if not t.is_float or not t.rank:
        return None
    last = t.shape[-b.rng.randint(1, min(t.rank, 2)) :]  # (D,), or (H, D): one weight per head
    if b.rng.random() < 0.5:
        fields = {k: b.declare("params", last, t.dtype, "ln") for k in ("weight", "bias") if b.rng.random() < 0.5}
        return b.add("layernorm", fields, _fresh(t.shape, t.dtype), x)
    fields: dict[str, Any] = {}
    if b.rng.random() < 0.6:
        fields["weight"] = b.declare("params", last, t.dtype, "g", init="ones")
        fields["unit_offset"] = b.rng.random() < 0.3
    return b.add("rmsnorm", fields, _same(t, contiguous=False), x)


def linear(b: Builder, x: str) -> str | None:
    t = b.tensors[x]
    if not t.is_float or not t.rank:
        return None
    out = b.dim(b.rng.choice(["d_model", "Dh", "S", "H"]))
    in_out = b.rng.random() < 0.3
    weight = b.declare("params", (t.shape[-1], out) if in_out else (out, t.shape[-1]), t.dtype, "W", init="linear")
    fields: dict[str, Any] = {"weight": weight}
    if in_out:
        fields["layout"] = "in_out"
    if b.rng.random() < 0.5:
        fields["bias"] = b.declare("params", (out,), t.dtype, "b", init="linear", fan_in=t.shape[-1].text)
    return b.add("linear", fields, _fresh(t.shape[:-1] + (out,), t.dtype), x)


def conv(b: Builder, x: str) -> str | None:
    """conv1d on (B, C, L) or conv2d on (B, C, H, W): a kernel that fits, same padding or a stride,
    sometimes grouped per channel."""
    t = b.tensors[x]
    if not t.is_float or t.rank not in (3, 4) or 0 in [d.value for d in t.shape[1:]]:
        return None
    rng, spatial = b.rng, t.rank - 2
    channels = t.shape[1]
    out = channels if rng.random() < 0.3 else b.dim(rng.choice(["d_model", "Dh", "S", "H"]))
    groups = channels.value if out == channels and rng.random() < 0.5 else 1
    kernel = [rng.randint(1, min(d.value, 3)) for d in t.shape[2:]]
    shape = (out, Dim(channels.value // groups, channels.value // groups)) + tuple(Dim(k, k) for k in kernel)
    fields: dict[str, Any] = {"weight": b.declare("params", shape, t.dtype, "K")}
    if groups > 1:
        fields["groups"] = groups
    if rng.random() < 0.5:
        fields["bias"] = b.declare("params", (out,), t.dtype, "c")
    lengths = [d for d in t.shape[2:]]
    if rng.random() < 0.4:
        fields["padding"] = "same"
    else:
        stride = rng.choice([1, 2])
        fields["stride"] = stride
        lengths = [Dim((d.value - k) // stride + 1, (d.value - k) // stride + 1) for d, k in zip(lengths, kernel)]
    op = "conv1d" if spatial == 1 else "conv2d"
    return b.add(op, fields, Tensor(t.shape[:1] + (out,) + tuple(lengths), t.dtype, t.contiguous or spatial == 1), x)


def binary(b: Builder, x: str) -> str | None:
    """add/mul/sub/div with the tensor itself, or with a new operand that broadcasts against it."""
    t = b.tensors[x]
    op = b.rng.choice(["add", "mul", "sub", "div"] if t.dtype != "bool" else ["add", "mul", "div"])
    if b.rng.random() < 0.3:
        other = x
        shape = t.shape
    else:
        keep = b.rng.randint(0, t.rank)  # trailing dims of the operand; some made 1
        shape = tuple(d if b.rng.random() < 0.6 else Dim(1, 1) for d in t.shape[t.rank - keep :])
        other = b.declare(b.rng.choice(["inputs", "params"]), shape, t.dtype, "o")
        if b.rng.random() < 0.5:
            x, other = other, x
    a, c = b.tensors[x], b.tensors[other]
    out_shape = tuple(_broadcast_pair(a.shape, c.shape))
    dtype = "float32" if op == "div" and not t.is_float else t.dtype
    contiguous = a.contiguous and c.contiguous and a.shape == c.shape
    return b.add(op, {}, Tensor(out_shape, dtype, contiguous), inputs=[x, other])


def _broadcast_pair(sa, sb):
    n = max(len(sa), len(sb))
    sa, sb = (None,) * (n - len(sa)) + tuple(sa), (None,) * (n - len(sb)) + tuple(sb)
    for da, db in zip(sa, sb):
        yield db if da is None or (db is not None and da.value == 1 and db.value != 1) else da


def transpose(b: Builder, x: str) -> str | None:
    t = b.tensors[x]
    if t.rank < 1:
        return None
    i, j = b.rng.randint(-t.rank, t.rank - 1), b.rng.randint(-t.rank, t.rank - 1)
    shape = list(t.shape)
    shape[i], shape[j] = shape[j], shape[i]
    return b.add("transpose", {"dims": [i, j]}, _same(t, shape, contiguous=t.contiguous and i % t.rank == j % t.rank), x)


def permute(b: Builder, x: str) -> str | None:
    t = b.tensors[x]
    order = list(range(t.rank))
    b.rng.shuffle(order)
    return b.add("permute", {"dims": order}, _same(t, [t.shape[d] for d in order], contiguous=t.contiguous and order == sorted(order)), x)


def contiguous(b: Builder, x: str) -> str | None:
    return b.add("contiguous", {}, _same(b.tensors[x], contiguous=True), x)


def unsqueeze(b: Builder, x: str) -> str | None:
    t = b.tensors[x]
    if t.rank >= 6:
        return None
    d = b.rng.randint(-t.rank - 1, t.rank)
    at = d % (t.rank + 1)
    return b.add("unsqueeze", {"dim": d}, _same(t, t.shape[:at] + (Dim(1, 1),) + t.shape[at:]), x)


def reshape(b: Builder, x: str) -> str | None:
    """Merge two neighbouring dims, split d_model into heads, or flatten: a view only of a surely contiguous tensor."""
    t = b.tensors[x]
    rng = b.rng
    roll = rng.random()
    shape: list[Dim]
    if t.rank >= 2 and roll < 0.4:
        i = rng.randrange(t.rank - 1)
        shape = list(t.shape[:i]) + [_product(t.shape[i], t.shape[i + 1])] + list(t.shape[i + 2 :])
    elif roll < 0.7 and any(d.text == "d_model" for d in t.shape):
        i = [d.text for d in t.shape].index("d_model")
        shape = list(t.shape[:i]) + [b.dim("H"), b.dim("Dh")] + list(t.shape[i + 1 :])
    elif roll < 0.85 and t.rank:
        i = rng.randrange(t.rank)
        shape = list(t.shape[:i]) + [Dim(1, 1), t.shape[i]] + list(t.shape[i + 1 :])
    else:
        total = math.prod(d.value for d in t.shape)
        shape = [Dim(total, total)]
    texts: list[Any] = [d.text for d in shape]
    if shape and math.prod(d.value for d in shape) and rng.random() < 0.3:
        texts[rng.randrange(len(texts))] = -1
    op = "view" if t.contiguous and rng.random() < 0.7 else "reshape"
    return b.add(op, {"shape": texts}, Tensor(tuple(shape), t.dtype, t.contiguous, t.vocab), x)


def index(b: Builder, x: str) -> str | None:
    t = b.tensors[x]
    if not t.rank:
        return None
    d = b.rng.randint(-t.rank, t.rank - 1)
    size = t.shape[d].value
    if size and b.rng.random() < 0.5:
        i = b.rng.randint(-size, size - 1)
        return b.add("index", {"dim": d, "index": i}, _same(t, t.shape[: d % t.rank] + t.shape[d % t.rank + 1 :], contiguous=False), x)
    start = b.rng.randint(0, size)
    stop = b.rng.randint(start, size)
    step = b.rng.choice([1, 1, 2, 3])
    length = -(-(stop - start) // step)
    fields = {"dim": d, "start": start, "stop": stop}
    if step != 1:
        fields["step"] = step
    shape = list(t.shape)
    shape[d] = t.shape[d] if (start, stop, step) == (0, size, 1) else Dim(length, length)
    return b.add("index", fields, _same(t, shape, contiguous=False), x)


def repeat(b: Builder, x: str) -> str | None:
    t = b.tensors[x]
    reps = [b.rng.choice([1, 1, 2]) for _ in range(t.rank + b.rng.randint(0, 1))]
    extra = len(reps) - t.rank
    shape = [Dim(r, r) for r in reps[:extra]]
    shape += [d if r == 1 else Dim(d.value * r, d.value * r) for r, d in zip(reps[extra:], t.shape)]
    return b.add("repeat", {"repeats": reps}, _fresh(shape, t.dtype), x)


def repeat_interleave(b: Builder, x: str) -> str | None:
    t = b.tensors[x]
    if not t.rank:
        return None
    d = b.rng.randint(-t.rank, t.rank - 1)
    reps = b.rng.choice([1, 2, 3, "n_rep"])
    value = b.values[reps] if isinstance(reps, str) else reps
    shape = list(t.shape)
    shape[d] = Dim(t.shape[d].value * value, t.shape[d].value * value)
    return b.add("repeat_interleave", {"repeats": reps, "dim": d}, _fresh(shape, t.dtype), x)


def expand(b: Builder, x: str) -> str | None:
    t = b.tensors[x]
    new = b.rng.randint(0, 2 if t.rank < 5 else 0)
    texts: list[Any] = []
    shape: list[Dim] = []
    for _ in range(new):
        d = b.dim(b.rng.choice(["B", "S", "n_rep"]))
        texts.append(d.text)
        shape.append(d)
    for d in t.shape:
        if d.value == 1 and b.rng.random() < 0.7:
            grown = b.dim(b.rng.choice(["S", "n_rep", "T"]))
            texts.append(grown.text)
            shape.append(grown)
        else:
            texts.append(-1 if b.rng.random() < 0.6 else d.text)
            shape.append(d)
    grew = new or any(a.value != c.value for a, c in zip(shape[new:], t.shape))
    return b.add("expand", {"shape": texts}, _same(t, shape, contiguous=t.contiguous and not grew), x)


def split(b: Builder, x: str) -> str | None:
    t = b.tensors[x]
    sized = [i for i, d in enumerate(t.shape) if d.value > 0]
    if not sized:
        return None
    d = b.rng.choice(sized)
    size = t.shape[d].value
    counts = [c for c in range(1, min(size, 4) + 1) if size % c == 0]
    count = b.rng.choice(counts)
    dim = d - t.rank if b.rng.random() < 0.5 else d
    names = [b.fresh_name("part") for _ in range(count)]
    if b.rng.random() < 0.4 and count > 1:  # uneven pieces listed one by one
        cuts = sorted(b.rng.sample(range(1, size), count - 1)) if size >= count else []
        if len(cuts) == count - 1:
            pieces = [hi - lo for lo, hi in zip([0] + cuts, cuts + [size])]
            fields: dict[str, Any] = {"dim": dim, "sizes": pieces, "outputs": names}
            return _split(b, x, t, d, fields, [Dim(p, p) for p in pieces])
    fields = {"dim": dim, "outputs": names}
    fields.update({"chunks": count} if b.rng.random() < 0.5 else {"sizes": size // count})
    return _split(b, x, t, d, fields, [Dim(size // count, size // count)] * count)


def _split(b: Builder, x: str, t: Tensor, d: int, fields: dict, pieces: list[Dim]) -> str:
    split_id = b.add("split", fields, t, x)
    for name, piece in zip(fields["outputs"], pieces):
        shape = list(t.shape)
        shape[d] = piece
        b.tensors[name] = _same(t, shape, contiguous=t.contiguous and (d == 0 or len(pieces) == 1))
    del b.tensors[split_id]  # the step's id names the split, not a tensor
    return fields["outputs"][-1]


def topk(b: Builder, x: str) -> str | None:
    t = b.tensors[x]
    if not t.rank or t.dtype == "bool":
        return None
    d = b.rng.randrange(t.rank)
    fields: dict[str, Any] = {"k": b.rng.randint(0, min(t.shape[d].value, 3)), "dim": d - t.rank if b.rng.random() < 0.5 else d}
    fields.update(largest=b.rng.random() < 0.7, sorted=b.rng.random() < 0.7)
    if t.is_float and b.rng.random() < 0.4:
        fields["normalize"] = True
    return _routed(b, x, t, d, fields)


def _routed(b: Builder, x: str, t: Tensor, d: int, fields: dict) -> str:
    """A topk step: values and indices, named by its outputs."""
    fields["outputs"] = [b.fresh_name("top"), b.fresh_name("idx")]
    step_id = b.add("topk", fields, t, x)
    shape = list(t.shape)
    shape[d] = Dim(fields["k"], fields["k"])
    b.tensors[fields["outputs"][0]] = _fresh(shape, t.dtype)
    b.tensors[fields["outputs"][1]] = _fresh(shape, "int64")
    del b.tensors[step_id]  # the step's id names the choice, not a tensor
    return fields["outputs"][0]


def gather_scatter(b: Builder, x: str) -> str | None:
    """gather from the tensor, or scatter into it, along one dim with an all-zero index (valid at any size)."""
    t = b.tensors[x]
    if not t.rank or 0 in [d.value for d in t.shape] or t.dtype == "bool":
        return None
    d = b.rng.randrange(t.rank)
    shape = tuple(dim if b.rng.random() < 0.7 else Dim(1, 1) for dim in t.shape)
    index = b.declare("inputs", shape, "int64", "ix", init="zeros")
    fields: dict[str, Any] = {"dim": d - t.rank if b.rng.random() < 0.5 else d}
    if b.rng.random() < 0.5:
        return b.add("gather", fields, _fresh(shape, t.dtype), inputs=[x, index])
    inputs = [x, index]
    if b.rng.random() < 0.5 and t.is_float:
        fields["value"] = b.rng.choice([0.0, -1.5, float("-inf")])
    else:
        inputs.append(b.declare("inputs", shape, t.dtype, "src"))
    if b.rng.random() < 0.3 and (t.is_float or "value" not in fields):
        fields["reduce"] = "add"
    return b.add("scatter", fields, _fresh(t.shape, t.dtype), inputs=inputs)


def moe(b: Builder, x: str) -> str | None:
    """Tokens routed by a topk of random router probabilities through E gated experts."""
    t = b.tensors[x]
    if not t.is_float or not t.rank:
        return None
    experts, hidden = b.dim(b.rng.choice(["H", "S"])), b.dim(b.rng.choice(["Dh", "S"]))
    probs = b.declare("inputs", t.shape[:-1] + (experts,), b.rng.choice([t.dtype, "float32"]), "router")
    fields = {"k": b.rng.randint(1, experts.value), "normalize": b.rng.random() < 0.5}
    weights = _routed(b, probs, b.tensors[probs], t.rank - 1, fields)
    two_hidden = Dim(f"2 * {hidden.text}", 2 * hidden.value)
    gate_up = b.declare("params", (experts, two_hidden, t.shape[-1]), t.dtype, "gu")
    down = b.declare("params", (experts, t.shape[-1], hidden), t.dtype, "dn")
    step = {"gate_up": gate_up, "down": down, "activation": b.rng.choice(["silu", "gelu"])}
    moe_id = b.add("moe", step, _fresh(t.shape, t.dtype), inputs=[x, weights, fields["outputs"][1]])
    return moe_id


def join(b: Builder, x: str) -> str | None:
    """cat along an existing dim or stack along a new one, of the tensor and a partner."""
    t = b.tensors[x]
    if b.rng.random() < 0.5 and t.rank:
        d = b.rng.randint(-t.rank, t.rank - 1)
        extra = b.dim(b.rng.choice(["S", "T", "H"]))
        shape = list(t.shape)
        shape[d] = extra
        partner = x if b.rng.random() < 0.3 else b.declare("inputs", tuple(shape), t.dtype, "c")
        length = t.shape[d].value + b.tensors[partner].shape[d].value
        shape[d] = Dim(length, length)
        return b.add("cat", {"dim": d}, _fresh(shape, t.dtype), inputs=[x, partner])
    d = b.rng.randint(-t.rank - 1, t.rank)
    n = b.rng.randint(1, 3)
    parts = [x if b.rng.random() < 0.5 else b.declare("inputs", t.shape, t.dtype, "c") for _ in range(n)]
    at = d % (t.rank + 1)
    return b.add("stack", {"dim": d}, _fresh(t.shape[:at] + (Dim(n, n),) + t.shape[at:], t.dtype), inputs=parts)


def merge(b: Builder, x: str) -> str | None:
    t = b.tensors[x]
    if t.rank < 3:
        return None
    shape = t.shape[:-3] + (t.shape[-2], _product(t.shape[-3], t.shape[-1]))
    return b.add("merge", {}, _fresh(shape, t.dtype), x)


def matmul(b: Builder, x: str) -> str | None:
    """x @ W, x @ xᵀ (attention scores), or a batched bmm."""
    t = b.tensors[x]
    if not t.is_float or not t.rank:
        return None
    roll = b.rng.random()
    if t.rank >= 2 and roll < 0.5:
        k_t = transpose_last(b, x)
        if t.rank == 3 and b.rng.random() < 0.4:
            return b.add("bmm", {}, _fresh(t.shape[:-1] + (t.shape[-2],), t.dtype), inputs=[x, k_t])
        return b.add("matmul", {}, _fresh(t.shape[:-1] + (t.shape[-2],), t.dtype), inputs=[x, k_t])
    cols = b.dim(b.rng.choice(["S", "Dh", "T"]))
    lead = tuple(Dim(1, 1) if b.rng.random() < 0.5 else d for d in t.shape[max(0, t.rank - 4) : -2]) if b.rng.random() < 0.3 else ()
    w = b.declare("params", lead + (t.shape[-1], cols), t.dtype, "M")
    batch = tuple(_broadcast_pair(t.shape[:-2], lead))
    rows = t.shape[-2:-1] if t.rank > 1 else ()
    return b.add("matmul", {}, _fresh(batch + rows + (cols,), t.dtype), inputs=[x, w])


def transpose_last(b: Builder, x: str) -> str:
    t = b.tensors[x]
    shape = t.shape[:-2] + (t.shape[-1], t.shape[-2])
    return b.add("transpose", {"dims": [-2, -1]}, _same(t, shape, contiguous=False), x)


def einsum(b: Builder, x: str) -> str | None:
    t = b.tensors[x]
    if not t.is_float or not 2 <= t.rank <= 6:
        return None
    letters = "abcdefg"[: t.rank]
    roll = b.rng.random()
    if roll < 0.4:  # scores: '...qd,...kd->...qk'
        lead = letters[:-2]
        equation = "...qd,...kd->...qk" if b.rng.random() < 0.5 else f"{lead}yz,{lead}xz->{lead}yx"
        shape = t.shape[:-1] + (t.shape[-2],)
        return b.add("einsum", {"equation": equation}, _fresh(shape, t.dtype), inputs=[x, x])
    order = list(letters)
    b.rng.shuffle(order)
    kept = [c for c in order if b.rng.random() < 0.8]
    implicit = b.rng.random() < 0.2
    equation = letters if implicit else f"{letters}->{''.join(kept)}"
    shape = t.shape if implicit else tuple(t.shape[letters.index(c)] for c in kept)
    return b.add("einsum", {"equation": equation}, _fresh(shape, t.dtype), inputs=[x])


def mask(b: Builder, x: str) -> str | None:
    t = b.tensors[x]
    if not t.is_float or t.rank < 2:
        return None
    rng = b.rng
    fields: dict[str, Any] = {}
    if rng.random() < 0.6:
        fields["causal"] = True
    if rng.random() < 0.3:
        fields["window"] = rng.choice([1, 2, "S"])  # without causal: a band
    if rng.random() < 0.2:
        fields["chunk"] = rng.choice([1, 2, "S"])
    if fields and rng.random() < 0.3:
        fields["align"] = "top-left"
    if t.shape[-1].value == t.shape[-2].value and rng.random() < 0.2:
        fields["segments"] = _segments(b, t)
    if not fields or rng.random() < 0.4:
        keep = rng.randint(2, t.rank)
        shape = tuple(d if rng.random() < 0.6 else Dim(1, 1) for d in t.shape[t.rank - keep :])
        fields["mask"] = b.declare("inputs", shape, rng.choice(["bool", "bool", "int64", t.dtype]), "m")
        fields["polarity"] = rng.choice(["keep", "block"])
    fields["fill"] = rng.choice([float("-inf"), -1e4 if t.dtype == "float16" else -1e9, 0.0, "min"])
    return b.add("mask", fields, _fresh(t.shape, t.dtype), x)


def _segments(b: Builder, t: Tensor) -> str:
    """Document ids for square scores (sorted: packed documents)."""
    length = t.shape[-1]
    return _per_token(b, t, length, t.rank >= 3, "seg", lambda: sorted(b.rng.randrange(3) for _ in range(length.value)))


def softcap(b: Builder, x: str) -> str | None:
    t = b.tensors[x]
    if not t.is_float:
        return None
    return b.add("softcap", {"cap": b.rng.choice([0.5, 2.0, 50.0])}, _same(t, contiguous=False), x)


def relative_bias(b: Builder, x: str) -> str | None:
    """T5's bias on (…, H, T_q, T_kv) scores, from a (num_buckets, H) table."""
    t = b.tensors[x]
    if not t.is_float or t.rank < 3:
        return None
    buckets = b.rng.choice([4, 8, 32])
    table = b.declare("params", (Dim(buckets, buckets), t.shape[-3]), t.dtype, "rel")
    fields = {"table": table, "bidirectional": b.rng.random() < 0.5, "max_distance": b.rng.choice([buckets, 128])}
    shape = (Dim(1, 1), *t.shape) if t.rank == 3 else t.shape  # scores + a (1, H, T_q, T_kv) bias
    return b.add("relative_bias", fields, _same(t, shape, contiguous=False), x)  # the bias is a permuted view: torch picks the layout


def relative_position_bias(b: Builder, x: str) -> str | None:
    """T5's bias alone, (1, H, T, T_kv), from a (num_buckets, H) table: reads no tensor."""
    buckets = b.rng.choice([4, 8, 32])
    table = b.declare("params", (Dim(buckets, buckets), b.dim("H")), b.dtype, "rel")
    keys = b.dim("T") if b.rng.random() < 0.5 else Dim("S + T", b.values["S"] + b.values["T"])  # queries after a cache
    fields = {"table": table, "queries": "T", "keys": keys.text, "bidirectional": b.rng.random() < 0.5}
    fields["max_distance"] = b.rng.choice([buckets, 128])
    return b.add("relative_position_bias", fields, Tensor((Dim(1, 1), b.dim("H"), b.dim("T"), keys), b.dtype, False))


def alibi(b: Builder, x: str) -> str | None:
    t = b.tensors[x]
    if not t.is_float or t.rank < 3 or t.shape[-3].value < 1:
        return None
    return b.add("alibi", {"relative": b.rng.random() < 0.5}, Tensor(t.shape, t.dtype, False), x)


def rope(b: Builder, x: str) -> str | None:
    t = b.tensors[x]
    head = t.shape[-1].value if t.rank else 0
    if not t.is_float or t.rank < 2 or head < 2 or head % 2:
        return None
    fields: dict[str, Any] = {"style": b.rng.choice(["half", "interleaved"])}
    if b.rng.random() < 0.3:
        fields["rotary_dim"] = 2 * b.rng.randint(1, head // 2)  # head may be 2**33 (meta runs)
    if b.rng.random() < 0.3:
        fields["offset"] = b.rng.choice([1, "T", "S"])
    if t.rank >= 3 and b.rng.random() < 0.3:
        fields["seq_dim"] = b.rng.choice([-3, 0])
    if b.rng.random() < 0.2:
        fields["theta"] = 500000.0
    listable = t.shape[fields.get("seq_dim", -2) % t.rank].value <= MAX_LISTED  # positions are written out, one per token
    if b.rng.random() < 0.3 and "offset" not in fields and listable:
        fields["positions"] = _positions(b, t, fields.get("seq_dim", -2))
    if b.rng.random() < 0.3:
        fields["rope_scaling"] = _rope_scaling(b, fields.get("rotary_dim", head), dynamic="positions" not in fields)
    return b.add("rope", fields, Tensor(t.shape, t.dtype, False), x)


MAX_LISTED = 4096  # the longest axis a case writes values for (a hostile dim of 2**40 would not fit in memory)


def _positions(b: Builder, t: Tensor, seq_dim: int) -> str:
    """Token positions for a rope on axis ``seq_dim``."""
    seq = seq_dim % t.rank
    return _per_token(b, t, t.shape[seq], seq > 0, "pos", lambda: [b.rng.randrange(40) for _ in range(t.shape[seq].value)])


def _per_token(b: Builder, t: Tensor, length: Dim, batched: bool, stem: str, row: Callable[[], list[int]]) -> str:
    """An integer tensor of one value per token: (T,), or (B, T) / (1, T) pairing B with ``t``'s dim 0."""
    batch = t.shape[0]
    if not batched or b.rng.random() < 0.4 or batch.value > 4:
        return b.declare("inputs", (length,), "int64", stem, values=row())
    lead = batch if b.rng.random() < 0.7 else Dim(1, 1)
    return b.declare("inputs", (lead, length), b.rng.choice(["int64", "int32"]), stem, values=[row() for _ in range(lead.value)])


def _rope_scaling(b: Builder, rot: int, dynamic: bool) -> dict:
    """A frequency scaling valid for a rotary dim of ``rot``; ``dynamic``: the kinds that read the
    largest position (not with a positions tensor: meta runs have no values)."""
    kinds = ["linear", "llama3", "yarn"] + (["dynamic"] if dynamic and rot > 2 else []) + (["longrope"] if dynamic and rot <= 64 else [])
    kind = b.rng.choice(kinds)
    factor = b.rng.choice([1.0, 2.0, 8.0])
    context = b.rng.choice([2, 4, 16])
    if kind == "linear":
        return {"type": kind, "factor": factor}
    if kind == "dynamic":
        return {"type": kind, "factor": factor, "max_position_embeddings": context}
    if kind == "llama3":
        return {"type": kind, "factor": factor, "original_max_position_embeddings": context}
    if kind == "yarn":
        return {"type": kind, "factor": factor, "original_max_position_embeddings": context, "mscale": 1.0, "mscale_all_dim": 0.5}
    short = [b.rng.choice([1.0, 1.5]) for _ in range(rot // 2)]
    return {
        "type": kind,
        "short_factor": short,
        "long_factor": [2 * f for f in short],
        "original_max_position_embeddings": context,
        "factor": factor,
    }


def sdpa(b: Builder, x: str) -> str | None:
    """q = the tensor; keys and values: the tensor itself, or new ones (fewer heads with gqa)."""
    t = b.tensors[x]
    rng = b.rng
    if not t.is_float or t.rank < 2:
        return None
    fields: dict[str, Any] = {}
    if rng.random() < 0.3:
        k = v = x
        t_kv = t.shape[-2]
    else:
        t_kv = b.dim(rng.choice(["T", "S"]))
        lead = t.shape[:-2]
        if t.rank >= 3 and rng.random() < 0.4 and t.shape[-3].value % b.values["H_kv"] == 0 and t.shape[-3].value:
            lead = lead[:-1] + (b.dim("H_kv"),)
            fields["gqa"] = lead[-1].value != t.shape[-3].value or rng.random() < 0.5
        k = b.declare("inputs", lead + (t_kv, t.shape[-1]), t.dtype, "k")
        v = b.declare("inputs", lead + (t_kv, b.dim(rng.choice(["Dh", "S"]))), t.dtype, "v")
    if rng.random() < 0.5:
        fields["causal"] = True
        if rng.random() < 0.3:
            fields["window"] = rng.choice([1, 2, "S"])
        if rng.random() < 0.3:
            fields["align"] = "top-left"
    if rng.random() < 0.3:
        scores = t.shape[:-1] + (t_kv,)
        keep = rng.randint(2, len(scores))
        shape = tuple(d if rng.random() < 0.6 else Dim(1, 1) for d in scores[len(scores) - keep :])
        dtype = rng.choice(["bool", t.dtype])
        fields["mask"] = b.declare("inputs", shape, dtype, "m")
        if dtype == "bool":
            fields["polarity"] = rng.choice(["keep", "block"])
    if rng.random() < 0.2:
        fields["scale"] = rng.choice([0.5, 1, 0.125])
    if rng.random() < 0.2:
        fields.update(dropout=0.5, training=True)
    out_shape = t.shape[:-1] + b.tensors[v].shape[-1:]
    return b.add("sdpa", fields, Tensor(out_shape, t.dtype, False), inputs=[x, k, v])


def embed(b: Builder, x: str) -> str | None:
    t = b.tensors[x]
    if t.dtype != "int64" or not t.vocab:
        return None
    table = b.declare("params", (Dim(t.vocab, t.vocab), b.dim("d_model")), b.dtype, "E", init="embedding")
    return b.add("embed", {"weight": table}, _fresh(t.shape + (b.dim("d_model"),), b.dtype), x)


RULES: list[tuple[Callable, int]] = [
    (unary, 3),
    (scale, 2),
    (dropout, 1),
    (softmax, 2),
    (cast, 1),
    (norm, 2),
    (linear, 3),
    (conv, 1),
    (binary, 3),
    (transpose, 2),
    (permute, 1),
    (contiguous, 1),
    (unsqueeze, 1),
    (reshape, 3),
    (index, 1),
    (repeat, 1),
    (repeat_interleave, 1),
    (expand, 1),
    (split, 2),
    (topk, 1),
    (moe, 1),
    (gather_scatter, 1),
    (join, 1),
    (merge, 1),
    (matmul, 3),
    (einsum, 2),
    (mask, 2),
    (alibi, 1),
    (relative_bias, 1),
    (relative_position_bias, 1),
    (softcap, 1),
    (rope, 2),
    (sdpa, 2),
    (embed, 2),
    (math_fn, 1),
    (compare_select, 1),
    (along, 1),
    (arange, 1),
]


def _start(b: Builder) -> str:
    """The first tensor: hidden states, heads already split, or token ids."""
    rng = b.rng
    roll = rng.random()
    if roll < 0.2:
        vocab = rng.randint(1, 7)
        count = b.values["T"]
        ids = [rng.randrange(vocab) for _ in range(count)]
        return b.declare("inputs", (b.dim("T"),), "int64", "ids", values=ids, vocab=vocab)
    if roll < 0.5:
        return b.declare("inputs", (b.dim("B"), b.dim("H"), b.dim("T"), b.dim("Dh")), b.dtype, "x", init="randn")
    shape = (b.dim("B"), b.dim("T"), b.dim("d_model"))
    return b.declare("inputs", shape[rng.randrange(2) :] if rng.random() < 0.2 else shape, b.dtype, "x", init="randn")


def build(rng, small: bool = True) -> dict:
    """A well-typed pipeline document of 1 to 14 steps."""
    b = Builder(rng, small)
    current = _start(b)
    rules, weights = zip(*RULES)
    for _ in range(rng.randint(1, 14)):
        if rng.random() < 0.2:
            current = rng.choice(list(b.tensors))
        for _ in range(8):  # a rule may not apply to this tensor: try another
            made = rng.choices(rules, weights)[0](b, current)
            if made is not None:
                current = made
                break
        if small and max(math.prod(d.value for d in t.shape) for t in b.tensors.values()) > 1 << 22:
            break  # keep real runs small: repeats and products grow fast
    if not b.steps:
        contiguous(b, current)
    return b.document()
