"""Value pools (hostile scalars, dims, keys), random YAML values, and the bundled pipelines the mutators start from."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
PIPELINES = ROOT / "pipelines"
KNOWN_OPS: list[str] = []  # filled lazily from tracer.steps.contract.STEP_KINDS
TOP_KEYS = ["name", "description", "dims", "seed", "dtype", "inputs", "params", "steps", "outputs", "expect"]
STEP_KEYS = [
    "id",
    "op",
    "input",
    "inputs",
    "group",
    "note",
    "dim",
    "dims",
    "shape",
    "weight",
    "bias",
    "mask",
    "polarity",
    "causal",
    "fill",
    "divide",
    "multiply",
    "p",
    "training",
    "eps",
    "approximate",
    "layout",
    "repeats",
    "index",
    "start",
    "stop",
    "step",
    "use",
    "with",
]
DECL_KEYS = ["shape", "init", "values", "tokens", "seed", "dtype", "fan_in", "note"]
INITS = ["randn", "rand", "zeros", "ones", "arange", "eye", "linear", "embedding", "triu", "tril", "xavier", "!!python"]
DTYPES = ["float32", "float64", "float16", "bfloat16", "int64", "int32", "bool", "complex64", "float8"]
HUGE = [2**31, 2**32, 2**40, 2**62, 2**62 + 1, 2**63, 2**64, 10**30, -(2**63), 99999999999999999999999]
DIM_VALUES = [0, 0, 1, 1, 1, 2, 3, -1, -2, 7, 64] + HUGE
HOSTILE_EXPRS = [
    "__import__('os').system('true')",
    "().__class__.__mro__",
    "open('/etc/passwd')",
    "T.real",
    "T[0]",
    "T ** 2",
    "2 ** 200",
    "9**9**9",
    "lambda: 1",
    "T / 2",
    "T // 0",
    "T % 0",
    "-T",
    "T - T",
    "T * T * T * T",
    "(T)",
    "T if T else 1",
    "[T]",
    "{T}",
    "T @ T",
    "T << 70",
    "~T",
    "not T",
    "T == T",
    "1e308",
    "0x10",
    "1_000",
    "9" * 60,
    "(" * 60 + "1" + ")" * 60,
    "T +",
    "",
    " ",
    "__T",
    "é",
    "T;T",
    "T\nT",
]
STRINGS = [
    "",
    " ",
    "x",
    "T",
    "-inf",
    "inf",
    "nan",
    "-1e9",
    "1e999",
    "null",
    "~",
    "yes",
    "no",
    "on",
    "0x1F",
    "0o17",
    ".inf",
    "é",
    "\u202e",
    "a" * 300,
    "../../etc/passwd",
    "/etc/passwd",
    "~/.ssh/id_rsa",
    "C:\\x",
    "\\\\server\\share",
    "file:///etc/passwd",
    "!!python/object:os.system",
    "${HOME}",
    "$(id)",
    "`id`",
    "%s%n",
    "{x}",
    "<script>",
    "a\tb",
]


def known_ops() -> list[str]:
    if not KNOWN_OPS:
        from tracer.steps.contract import STEP_KINDS

        KNOWN_OPS.extend(sorted(STEP_KINDS))
    return KNOWN_OPS


def bundled() -> list[Path]:
    return sorted(PIPELINES.rglob("*.yaml"))


_TEXTS: dict[Path, str] = {}
_DOCS: dict[Path, Any] = {}


def bundled_text(path: Path) -> str:
    if path not in _TEXTS:
        _TEXTS[path] = path.read_text(encoding="utf-8")
    return _TEXTS[path]


def bundled_doc(path: Path) -> Any:
    if path not in _DOCS:
        _DOCS[path] = yaml.safe_load(bundled_text(path))
    return _DOCS[path]


# -------------------------------------------------------------------- random values and documents


def random_scalar(rng) -> Any:
    kind = rng.randrange(9)
    if kind == 0:
        return rng.choice(DIM_VALUES)
    if kind == 1:
        return rng.randint(-5, 70)
    if kind == 2:
        return rng.choice([0.0, -0.0, 0.5, 1.5, -1e9, 1e308, float("inf"), float("-inf"), float("nan"), 2.0**70])
    if kind == 3:
        return rng.choice([True, False, None])
    if kind == 4:
        return rng.choice(STRINGS)
    if kind == 5:
        return rng.choice(HOSTILE_EXPRS)
    if kind == 6:
        return rng.choice(known_ops() + INITS + DTYPES)
    if kind == 7:
        return "".join(rng.choice("abcT_0123 .-:[]{}#&*!|>'\"%@`,?\\") for _ in range(rng.randint(0, 12)))
    return rng.choice(["B", "T", "H", "Dh", "d_model", "x", "q", "k", "v", "scores", "out", "W_q"])


def random_value(rng, depth: int = 0) -> Any:
    """Any YAML value: scalars, lists and mappings with pipeline-ish keys."""
    roll = rng.random()
    if depth > 4 or roll < 0.55:
        return random_scalar(rng)
    if roll < 0.8:
        return [random_value(rng, depth + 1) for _ in range(rng.randint(0, 4))]
    keys = rng.choice([TOP_KEYS, STEP_KEYS, DECL_KEYS])
    return {rng.choice(keys + [random_scalar(rng)]): random_value(rng, depth + 1) for _ in range(rng.randint(0, 5))}


def dump(data: Any, rng) -> str:
    """YAML text of ``data`` in a random style (block, flow or mixed; sorted or not)."""
    try:
        return yaml.safe_dump(
            data,
            default_flow_style=rng.choice([None, False, True]),
            sort_keys=rng.random() < 0.2,
            width=rng.choice([40, 80, 10_000]),
            allow_unicode=rng.random() < 0.5,
        )
    except yaml.YAMLError:  # e.g. a key yaml cannot represent: fall back to repr-ish text
        return json.dumps(data, default=str)


def doc_paths(node: Any, prefix: tuple = ()) -> list[tuple]:
    """Every path into a document (the root excluded)."""
    found = []
    if isinstance(node, dict):
        for key, value in node.items():
            found.append(prefix + (key,))
            found.extend(doc_paths(value, prefix + (key,)))
    elif isinstance(node, list):
        for i, value in enumerate(node):
            found.append(prefix + (i,))
            found.extend(doc_paths(value, prefix + (i,)))
    return found


def get_at(doc: Any, path: tuple) -> Any:
    for part in path:
        doc = doc[part]
    return doc


def containers(doc: Any, kind: type) -> list[tuple]:
    return [p for p in [()] + doc_paths(doc) if isinstance(get_at(doc, p), kind)]


def copy_doc(node: Any) -> Any:
    if isinstance(node, dict):
        return {k: copy_doc(v) for k, v in node.items()}
    if isinstance(node, list):
        return [copy_doc(v) for v in node]
    return node


def step_dicts(doc: Any) -> list[dict]:
    steps = doc.get("steps") if isinstance(doc, dict) else None
    return [s for s in steps if isinstance(s, dict)] if isinstance(steps, list) else []
