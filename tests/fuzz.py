"""Fuzz the whole pipeline: hostile and mutated files must end in a success or a located TracerError.

``python -m tests.fuzz N [--seed S] [--start I]`` runs cases I .. I+N-1 (``make fuzz`` runs 10,000).
Every case is a file written to a scratch folder and taken through everything a user can reach:
``load_spec`` → ``analyze`` at the declared dims → (when valid) a run on ``device="meta"``, its
table, JSON and DOT, and for small pipelines a real CPU run with values; some cases also go
through the CLI (``tracer check`` and ``tracer run --json``), and some re-run at degenerate
``--dim`` overrides (0, 1, huge).

The oracle: nothing but ``TracerError`` may escape, every line of its message (and of every
diagnostic) starts ``FILE:LINE:COL:`` or ``FILE:``, the CLI never exits 3, and no case takes longer
than ``CASE_SECONDS`` (a hang). Case ``i`` of seed ``S`` is generated from ``random.Random(f"S:i")``,
so ``python -m tests.fuzz 1 --seed S --start i --show`` replays any reported case.

The generators take any ``random.Random``-like object, so ``tests/test_fuzz.py`` drives the very
same code from hypothesis (``st.randoms()``) for CI.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import random
import re
import shutil
import signal
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parent.parent
PIPELINES = ROOT / "pipelines"
CASE_SECONDS = 5.0
CPU_RUN_BYTES = 4 * 1024 * 1024  # run for real only when every tensor together fits in this
MEMORY_LIMIT = 8 * 1024**3  # address space of a campaign (torch itself reserves about 1 GiB)

# ---------------------------------------------------------------------------------------- pools

KNOWN_OPS: list[str] = []  # filled lazily from tracer.spec.base.STEP_KINDS
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
INITS = ["randn", "rand", "zeros", "ones", "arange", "linear", "embedding", "triu", "tril", "xavier", "!!python"]
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


def _ops() -> list[str]:
    if not KNOWN_OPS:
        from tracer.spec.base import STEP_KINDS

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
        return rng.choice(_ops() + INITS + DTYPES)
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


def _paths(node: Any, prefix: tuple = ()) -> list[tuple]:
    """Every path into a document (the root excluded)."""
    found = []
    if isinstance(node, dict):
        for key, value in node.items():
            found.append(prefix + (key,))
            found.extend(_paths(value, prefix + (key,)))
    elif isinstance(node, list):
        for i, value in enumerate(node):
            found.append(prefix + (i,))
            found.extend(_paths(value, prefix + (i,)))
    return found


def _get(doc: Any, path: tuple) -> Any:
    for part in path:
        doc = doc[part]
    return doc


def _containers(doc: Any, kind: type) -> list[tuple]:
    return [p for p in [()] + _paths(doc) if isinstance(_get(doc, p), kind)]


def _copy(node: Any) -> Any:
    if isinstance(node, dict):
        return {k: _copy(v) for k, v in node.items()}
    if isinstance(node, list):
        return [_copy(v) for v in node]
    return node


def _steps(doc: Any) -> list[dict]:
    steps = doc.get("steps") if isinstance(doc, dict) else None
    return [s for s in steps if isinstance(s, dict)] if isinstance(steps, list) else []


# ----------------------------------------------------------------------- structural mutations


def m_delete(doc, rng):
    paths = _paths(doc)
    if paths:
        path = rng.choice(paths)
        parent = _get(doc, path[:-1])
        del parent[path[-1]]


def m_duplicate(doc, rng):
    lists = [p for p in _containers(doc, list) if _get(doc, p)]
    if lists:
        items = _get(doc, rng.choice(lists))
        items.insert(rng.randrange(len(items) + 1), _copy(rng.choice(items)))


def m_reorder(doc, rng):
    if rng.random() < 0.5:
        lists = _containers(doc, list)
        if lists:
            rng.shuffle(_get(doc, rng.choice(lists)))
            return
    maps = [p for p in _containers(doc, dict) if p]
    if maps:
        path = rng.choice(maps)
        items = list(_get(doc, path).items())
        rng.shuffle(items)
        _get(doc, path[:-1])[path[-1]] = dict(items)


def m_change_type(doc, rng):
    paths = _paths(doc)
    if paths:
        path = rng.choice(paths)
        _get(doc, path[:-1])[path[-1]] = random_value(rng, 2)


def m_swap_ids(doc, rng):
    steps = [s for s in _steps(doc) if "id" in s]
    if len(steps) >= 2:
        a, b = rng.sample(steps, 2)
        a["id"], b["id"] = b["id"], a["id"]


def m_rename_id(doc, rng):
    steps = _steps(doc)
    if steps:
        names = [s.get("id") for s in steps] + list((doc.get("inputs") or {}) if isinstance(doc.get("inputs"), dict) else {})
        rng.choice(steps)["id"] = rng.choice(names + [random_scalar(rng), "x" * 65, "9bad", "a/b", "a b", ""])


def m_rename_ref(doc, rng):
    steps = _steps(doc)
    if steps:
        step = rng.choice(steps)
        names = [s.get("id") for s in steps]
        field = rng.choice(["input", "inputs", "weight", "bias", "mask"])
        step[field] = [rng.choice(names) for _ in range(rng.randint(0, 3))] if field == "inputs" else rng.choice(names + ["nope"])
        if rng.random() < 0.5:
            step.pop("inputs" if field == "input" else "input", None)


def m_dims(doc, rng):
    dims = doc.get("dims") if isinstance(doc, dict) else None
    if not isinstance(dims, dict) or not dims:
        if isinstance(doc, dict):
            doc["dims"] = {"T": rng.choice(DIM_VALUES)}
        return
    name = rng.choice(list(dims))
    names = list(dims)
    roll = rng.randrange(5)
    if roll == 0:
        dims[name] = rng.choice(DIM_VALUES)
    elif roll == 1:
        dims[name] = rng.choice(HOSTILE_EXPRS).replace("T", rng.choice(names))
    elif roll == 2:  # a random expression over the other dims (cycles included)
        ops = ["+", "-", "*", "//", "%"]
        dims[name] = (
            " ".join(str(rng.choice(names + [0, 1, 2, -1])) + f" {rng.choice(ops)}" for _ in range(rng.randint(1, 3)))
            + f" {rng.choice(names)}"
        )
    elif roll == 3:
        for key in names:  # every base dim degenerate at once
            if isinstance(dims[key], int):
                dims[key] = rng.choice([0, 1, 1, 2**20, 2**31])
    else:
        dims[name] = random_scalar(rng)


def m_unknown_op(doc, rng):
    steps = _steps(doc)
    if steps:
        step = rng.choice(steps)
        step["op"] = rng.choice(_ops() + ["attention", "Softmax", "soft_max", "eval", "exec", "block", "", None, 3, ["matmul"]])


def m_graft(doc, rng):
    """Move a field from one step to another (fields of the wrong kind, values of the wrong shape)."""
    steps = _steps(doc)
    if len(steps) >= 2:
        a, b = rng.sample(steps, 2)
        keys = [k for k in a if k != "id"]
        if keys:
            key = rng.choice(keys)
            b[key] = _copy(a[key])


def m_step_field(doc, rng):
    steps = _steps(doc)
    if steps:
        step = rng.choice(steps)
        key = rng.choice(STEP_KEYS)
        step[key] = field_value(
            key, rng, [s.get("id") for s in steps], list((doc.get("dims") or {}) if isinstance(doc.get("dims"), dict) else [])
        )


def m_decl(doc, rng):
    """Rewrite an input or param declaration: shapes, sources, oversized literals."""
    sections = [s for s in ("inputs", "params") if isinstance(doc.get(s), dict) and doc[s]]
    if not sections:
        return
    decls = doc[rng.choice(sections)]
    name = rng.choice(list(decls))
    decl = decls[name] if isinstance(decls[name], dict) else {}
    decls[name] = decl
    dims = list(doc["dims"]) if isinstance(doc.get("dims"), dict) else []
    roll = rng.randrange(6)
    if roll == 0:
        decl["shape"] = [rng.choice(dims + DIM_VALUES[:8] + [-1]) for _ in range(rng.randint(0, 5))]
    elif roll == 1:
        decl.pop("init", None), decl.pop("tokens", None)
        decl["values"] = nested_values(rng)
    elif roll == 2:
        decl["init"] = rng.choice(INITS)
    elif roll == 3:
        decl["dtype"] = rng.choice(DTYPES)
    elif roll == 4:
        decl.pop("init", None), decl.pop("values", None)
        decl["tokens"] = {
            "text": rng.choice(["a b c", "", "x " * 50, "é ü", "a,b, c"]),
            "remove": rng.choice([[], [","], [""], ["a", " "]]),
        }
    else:
        decl[rng.choice(DECL_KEYS)] = random_value(rng, 3)


def m_expect(doc, rng):
    names = [s.get("id") for s in _steps(doc)] + ["nope"]
    dims = list(doc["dims"]) if isinstance(doc.get("dims"), dict) else ["T"]
    shape = [rng.choice(dims + [0, 1, -1]) for _ in range(rng.randint(0, 4))]
    expect = doc.setdefault("expect", {}) if isinstance(doc.get("expect", {}), dict) else {}
    expect[str(rng.choice(names))] = shape if rng.random() < 0.5 else {"shape": shape, "contiguous": rng.choice([True, False, 1])}


def m_add_key(doc, rng):
    maps = _containers(doc, dict)
    if maps:
        target = _get(doc, rng.choice(maps))
        target[rng.choice(TOP_KEYS + STEP_KEYS + DECL_KEYS + ["<<", "?", "", "__class__"])] = random_value(rng, 3)


def m_block(doc, rng):
    """A step that includes another file (``op: block``), with paths trying to leave the folder."""
    steps = doc.get("steps") if isinstance(doc, dict) else None
    if isinstance(steps, list):
        use = rng.choice(
            [
                "../../etc/passwd",
                "/etc/passwd",
                "/dev/zero",
                "/dev/urandom",
                "/proc/self/environ",
                "~/.bashrc",
                "self.yaml",
                "case.yaml",
                "nope.yaml",
                "..",
                ".",
                "",
                "pipelines/../../x.yaml",
                "a\x00b.yaml",
                "file:///etc/passwd",
                "http://example.com/x.yaml",
                "causal_mha.yaml",
                "seeds/000_encoder_block.yaml",
            ]
        )
        steps.insert(
            rng.randint(0, len(steps)),
            {
                "id": f"blk{rng.randrange(9)}",
                "op": "block",
                "use": use,
                **({"with": {"T": rng.choice(DIM_VALUES)}} if rng.random() < 0.5 else {}),
            },
        )


def m_group(doc, rng):
    """Group names as paths and with glob characters: what --collapse patterns are matched against."""
    steps = _steps(doc)
    for step in rng.sample(steps, min(len(steps), rng.randint(1, 4))):
        step["group"] = rng.choice(["a", "a/b", "a/b/c", "x[1]", "*", "g?", "enc/dec", "enc", "", "a//b", "/lead", "trail/", "é/\n"])


def m_expect_path(doc, rng):
    """expect keys naming tensors inside blocks and composite steps, some twice over."""
    ids = [s.get("id") for s in _steps(doc) if isinstance(s.get("id"), str)] or ["x"]
    keys = ids + [
        f"{rng.choice(ids)}/{rng.choice(['0', '1', '47', 'x'])}/{rng.choice(['Q', 'out', 'scores', 'nope'])}",
        f"{rng.choice(ids)}/{rng.choice(['contiguous', 'transpose', 'view', 'out'])}",
        f"{rng.choice(ids)}/",
        "a//b",
    ]
    dims = list(doc["dims"]) if isinstance(doc.get("dims"), dict) else ["T"]
    expect = doc.setdefault("expect", {}) if isinstance(doc.get("expect", {}), dict) else {}
    for _ in range(rng.randint(1, 3)):
        expect[rng.choice(keys)] = [rng.choice(dims + [1, 2]) for _ in range(rng.randint(1, 4))]


GENTLE: list[Callable] = [m_group, m_group, m_expect_path]  # keep the pipeline valid, mostly

MUTATIONS: list[Callable] = [
    m_delete,
    m_duplicate,
    m_reorder,
    m_change_type,
    m_swap_ids,
    m_rename_id,
    m_rename_ref,
    m_dims,
    m_dims,
    m_unknown_op,
    m_graft,
    m_step_field,
    m_step_field,
    m_decl,
    m_decl,
    m_expect,
    m_add_key,
    m_block,
]


def nested_values(rng) -> Any:
    roll = rng.randrange(6)
    if roll == 0:
        return [rng.choice([1, 2.5, True, -1e308, 0]) for _ in range(rng.randint(0, 6))]
    if roll == 1:
        return [[rng.random() for _ in range(rng.randint(1, 3))] for _ in range(rng.randint(1, 3))]
    if roll == 2:
        return [[1, 2], [3]]  # ragged
    if roll == 3:
        return [1, "x", None]
    if roll == 4:
        value: Any = 1
        for _ in range(rng.randint(1, 20)):
            value = [value]
        return value
    return rng.choice([5, "1,2", {"a": 1}, [], [[]], [[], []]])


def field_value(key: str, rng, ids: list, dims: list) -> Any:
    """A plausible (often slightly wrong) value for a step field."""
    dims = dims or ["T"]
    small = [-3, -2, -1, 0, 1, 2, 3]
    if key in ("input", "weight", "bias", "mask"):
        return rng.choice(ids + ["nope", None])
    if key == "inputs":
        return [rng.choice(ids) for _ in range(rng.randint(0, 4))]
    if key == "dim":
        return rng.choice(small + [10, 2**63])
    if key == "dims":
        return [rng.choice(small) for _ in range(rng.randint(0, 5))]
    if key in ("shape", "repeats"):
        return [
            rng.choice(dims + [-1, 0, 1, 2, "T * T"] + ([rng.choice(HUGE)] if rng.random() < 0.1 else [])) for _ in range(rng.randint(0, 5))
        ]
    if key in ("index", "start", "stop", "step"):
        return rng.choice(small + dims + [f"{rng.choice(dims)} - 1", 2**62])
    if key in ("divide", "multiply"):
        return rng.choice([0, 0.0, 2, -1.5, float("nan"), {"sqrt": rng.choice(dims)}, {"sqrt": 0}, {"sqrt": -4}, {"sqrt": "x"}])
    if key == "p":
        return rng.choice([0.0, 0.2, 1.0, -0.1, 1.1, float("nan")])
    if key in ("causal", "training"):
        return rng.choice([True, False, "yes", 1])
    if key == "fill":
        return rng.choice([float("-inf"), -1e9, 0, "-inf", "nan", "x", float("nan")])
    if key == "polarity":
        return rng.choice(["keep", "block", "drop"])
    if key == "eps":
        return rng.choice([1e-5, 0, -1, float("inf")])
    if key == "approximate":
        return rng.choice(["none", "tanh", "erf"])
    if key == "layout":
        return rng.choice(["out_in", "in_out", "in"])
    return random_value(rng, 3)


# ----------------------------------------------------------------------------- text mutations


def t_truncate(text: str, rng) -> str:
    return text[: rng.randrange(len(text) + 1)]


def t_lines(text: str, rng) -> str:
    lines = text.split("\n")
    i, j = rng.randrange(len(lines)), rng.randrange(len(lines))
    roll = rng.randrange(4)
    if roll == 0:
        del lines[i]
    elif roll == 1:
        lines.insert(j, lines[i])  # duplicate keys and items at the text level
    elif roll == 2:
        lines[i], lines[j] = lines[j], lines[i]
    else:
        lines[i] = " " * rng.choice([1, 2, 3, 4, 8]) + lines[i] if rng.random() < 0.5 else lines[i].lstrip()
    return "\n".join(lines)


def t_insert(text: str, rng) -> str:
    at = rng.randrange(len(text) + 1)
    junk = rng.choice(
        [
            "&a ",
            "*a",
            "!!python/object:os.system ",
            "!!binary ",
            "!!set ",
            "!!omap ",
            "!!timestamp ",
            "<<: ",
            "? ",
            "- ",
            ": ",
            "{",
            "}",
            "[",
            "]",
            "'",
            '"',
            "|",
            ">",
            "%YAML 1.1\n",
            "---\n",
            "...\n",
            "\t",
            "#",
            "\x00",
            "\x07",
            "\ufeff",
            "\ud800",
            "é",
            "\r",
            "\r\n",
            "@",
            "`",
            "!local ",
            "!!float ",
            "!!int ",
            "!!str ",
            "!!null ",
            "!!bool ",
            "!!map ",
            "!!seq ",
            "!<tag:yaml.org,2002:python/name:os.system> ",
        ]
    )
    return text[:at] + junk + text[at:]


def t_bytes(data: bytes, rng) -> bytes:
    data = bytearray(data)
    for _ in range(rng.randint(1, 8)):
        if data:
            data[rng.randrange(len(data))] = rng.randrange(256)
    return bytes(data)


# ------------------------------------------------------------------------------------ strategies


def gen_mutated(rng) -> bytes:
    """A bundled pipeline after 1-4 structural mutations (and sometimes a text mutation)."""
    path = rng.choice(bundled())
    doc = _copy(bundled_doc(path))
    for _ in range(rng.choice([1, 1, 2, 2, 3, 4])):
        if isinstance(doc, dict):
            rng.choice(MUTATIONS)(doc, rng)
    text = dump(doc, rng)
    if rng.random() < 0.15:
        text = rng.choice([t_truncate, t_lines, t_insert])(text, rng)
    return text.encode("utf-8", "surrogatepass")


def gen_gentle(rng) -> bytes:
    """A bundled pipeline (blocks too) with new group names or expect keys: it still runs, so
    diagrams, collapse patterns and expectations on nested tensors get exercised."""
    doc = _copy(bundled_doc(rng.choice(bundled())))
    for _ in range(rng.randint(1, 2)):
        rng.choice(GENTLE)(doc, rng)
    return dump(doc, rng).encode("utf-8", "surrogatepass")


def gen_text_mutated(rng) -> bytes:
    """A bundled file, comments and all, edited as text: truncated, lines moved, junk inserted, bytes flipped."""
    text = bundled_text(rng.choice(bundled()))
    for _ in range(rng.randint(1, 3)):
        text = rng.choice([t_truncate, t_lines, t_lines, t_insert, t_insert])(text, rng)
    data = text.encode("utf-8", "surrogatepass")
    return t_bytes(data, rng) if rng.random() < 0.2 else data


def gen_random_bytes(rng) -> bytes:
    roll = rng.randrange(4)
    if roll == 0:
        return bytes(rng.randrange(256) for _ in range(rng.randint(0, 300)))
    if roll == 1:  # printable soup of YAML's special characters
        return "".join(rng.choice("ab:- \n\t[]{}&*!|>'\"%@`#,?0123.") for _ in range(rng.randint(0, 300))).encode()
    if roll == 2:
        return rng.choice(
            [
                b"",
                b"\xef\xbb\xbf",
                b"\xff\xfe",
                b"\x00" * 10,
                b"---\n---\n",
                b"...",
                b"~",
                b"[]",
                b"{}",
                b"- a\n- b",
                b"name: x",
                b"name: x\nsteps: []",
                b"name: x\nsteps:\n- {}",
                b"\xef\xbb\xbfname: x\nsteps: 1",
            ]
        )
    return (
        bytes(rng.randrange(256) for _ in range(rng.randint(0, 40))) + bundled_text(rng.choice(bundled())).encode()[: rng.randint(0, 400)]
    )


def gen_random_yaml(rng) -> bytes:
    """A random YAML document: any shape, pipeline-ish keys, hostile scalars."""
    doc = random_value(rng, 0) if rng.random() < 0.3 else {rng.choice(TOP_KEYS): random_value(rng, 1) for _ in range(rng.randint(0, 9))}
    return dump(doc, rng).encode("utf-8", "surrogatepass")


def coherent_fields(op: str, rng, ids: list, dims: list, rank: int) -> dict:
    """Fields a step of ``op`` accepts, mostly valid for an input of ``rank`` dims (the shape may still disagree)."""
    rank = max(rank, 0)
    if op == "scale":
        key = rng.choice(["divide", "multiply"])
        return {key: rng.choice([2, 0.5, -1.5, 0, {"sqrt": rng.choice(dims)}])}
    if op == "mask":
        if rng.random() < 0.6:
            return {"causal": True, "fill": rng.choice([float("-inf"), -1e9, 0.0])}
        return {"mask": rng.choice(ids), "polarity": rng.choice(["keep", "block"])}
    if op in ("softmax", "unsqueeze", "cat", "stack"):
        return {"dim": rng.randint(-rank - 1, rank)}
    if op == "dropout":
        return {"p": rng.choice([0.0, 0.2, 1.0]), "training": rng.random() < 0.3}
    if op == "layernorm":
        return {k: rng.choice(ids) for k in ("weight", "bias") if rng.random() < 0.3}
    if op == "gelu":
        return {"approximate": rng.choice(["none", "tanh"])}
    if op in ("view", "reshape"):
        return {"shape": [rng.choice(dims + [1, -1, 2]) for _ in range(rng.randint(0, 4))]}
    if op == "transpose":
        return {"dims": [rng.randint(-rank, max(rank - 1, 0)) for _ in range(2)]}
    if op == "permute":
        order = list(range(rank))
        rng.shuffle(order)
        return {"dims": order}
    if op == "repeat":
        return {"repeats": [rng.choice(dims + [1, 2, 0]) for _ in range(rank + rng.randint(0, 1))]}
    if op == "index":
        if rng.random() < 0.5:
            return {"dim": rng.randint(-rank, max(rank - 1, 0)), "index": rng.choice([0, 1, -1] + dims)}
        return {
            "dim": rng.randint(-rank, max(rank - 1, 0)),
            **{k: rng.choice([0, 1, 2] + dims) for k in ("start", "stop", "step") if rng.random() < 0.5},
        }
    if op in ("embed", "linear"):
        fields = {"weight": rng.choice(ids)}
        if op == "linear":
            if rng.random() < 0.4:
                fields["bias"] = rng.choice(ids)
            if rng.random() < 0.3:
                fields["layout"] = "in_out"
        return fields
    from tracer.spec.base import STEP_KINDS

    kind = STEP_KINDS[op]  # a step kind this generator does not know yet: fill its required fields
    return {
        k: field_value(k, rng, ids, dims)
        for k, info in kind.model_fields.items()
        if k not in ("id", "op", "group", "note", "input", "inputs") and (info.is_required() or rng.random() < 0.3)
    }


def gen_random_pipeline(rng) -> bytes:
    """A plausible pipeline from scratch: random dims (often degenerate), declarations and a chain of steps."""
    from tracer.spec.base import STEP_KINDS

    names = ["B", "T", "H", "D"][: rng.randint(1, 4)]
    dims: dict[str, Any] = {n: rng.choice([0, 1, 1, 2, 2, 3, 4]) for n in names}
    if rng.random() < 0.3:
        dims["Dh"] = f"{names[-1]} // {rng.choice(names)}"
    if rng.random() < 0.1:
        dims[rng.choice(names)] = rng.choice(HUGE)
    dim_names = list(dims)
    inputs: dict[str, Any] = {}
    ranks: dict[str, int] = {}
    for j in range(rng.randint(1, 3)):
        shape = [rng.choice(dim_names + [1, 2, 0]) for _ in range(rng.randint(0, 4))]
        decl: dict[str, Any] = {"shape": shape, "init": rng.choice(["randn", "rand", "zeros", "ones", "arange"])}
        if rng.random() < 0.1:
            decl["dtype"] = rng.choice(["float64", "float16", "bfloat16", "int64", "bool"])
        inputs[f"x{j}"] = decl
        ranks[f"x{j}"] = len(shape)
    params: dict[str, Any] = {}
    for j in range(rng.randint(0, 3)):
        shape = [rng.choice(dim_names + [1, 2]) for _ in range(rng.randint(1, 2))]
        init = rng.choice(["linear", "randn", "embedding", "triu", "tril", "ones"])
        params[f"w{j}"] = {
            "shape": shape,
            "init": init,
            **({"fan_in": rng.choice(dim_names)} if len(shape) == 1 and init == "linear" else {}),
        }
        ranks[f"w{j}"] = len(shape)
    if rng.random() < 0.2:
        n = rng.randint(0, 4)
        inputs["ids"] = {"shape": [n], "values": [rng.randint(0, 3) for _ in range(n)], "dtype": "int64"}
        ranks["ids"] = 1
    ids = list(inputs) + list(params)
    steps = []
    previous = None
    for j in range(rng.randint(1, 8)):
        op = rng.choice(_ops())
        kind = STEP_KINDS[op]
        step: dict[str, Any] = {"id": f"s{j}", "op": op}
        source = previous if previous is not None and rng.random() < 0.7 else rng.choice(ids)
        if kind.arity == 1 or (kind.arity is None and rng.random() < 0.3):
            if source != previous:
                step["input"] = source
        else:
            step["inputs"] = [source] + [rng.choice(ids) for _ in range((kind.arity or rng.randint(1, 3)) - 1)]
        step.update(
            coherent_fields(op, rng, ids, dim_names, ranks.get(source, 2))
            if rng.random() < 0.9
            else {k: field_value(k, rng, ids, dim_names) for k in rng.sample(STEP_KEYS[4:], 2)}
        )
        steps.append(step)
        ids.append(step["id"])
        ranks[step["id"]] = ranks.get(source, 2) + (1 if op in ("unsqueeze", "stack") else -1 if op == "index" and "index" in step else 0)
        previous = step["id"]
    doc: dict[str, Any] = {"name": "fuzz", "dims": dims, "seed": rng.choice([0, 1, None]), "inputs": inputs}
    if params:
        doc["params"] = params
    doc["steps"] = steps
    if rng.random() < 0.2:
        doc["dtype"] = rng.choice(["float64", "float16", "bfloat16"])
    if rng.random() < 0.2:
        doc["outputs"] = rng.sample(ids, k=min(len(ids), rng.randint(1, 3)))
    if rng.random() < 0.1:
        rng.choice(MUTATIONS)(doc, rng)
    return dump(doc, rng).encode()


def gen_dims(rng) -> bytes:
    """A bundled pipeline, unchanged but for its dims: 0, 1, a few, or huge, one at a time or all at once."""
    doc = _copy(bundled_doc(rng.choice(bundled())))
    dims = doc.get("dims") if isinstance(doc, dict) else None
    if isinstance(dims, dict) and dims:
        base = [k for k, v in dims.items() if isinstance(v, int)] or list(dims)
        chosen = base if rng.random() < 0.3 else rng.sample(base, rng.randint(1, len(base)))
        for name in chosen:
            dims[name] = rng.choice([0, 1, 1, 1, 2, 3, 5, 8, 2**20, 2**31, 2**40, 2**62, -1] if rng.random() < 0.9 else HOSTILE_EXPRS)
    return dump(doc, rng).encode()


def gen_hostile(rng) -> bytes:
    """Known attack shapes, parameterised: tags, alias bombs, deep nesting, long lines, huge literals."""
    roll = rng.randrange(8)
    n = rng.choice([10, 100, 1000, 10_000, 100_000])
    if roll == 0:
        tag = rng.choice(
            [
                "!!python/object/apply:os.system ['true']",
                "!!python/name:os.system",
                "!!python/module:os",
                "!!python/object/new:subprocess.Popen [['true']]",
                "!<tag:yaml.org,2002:python/object/apply:os.system> ['true']",
                "!!binary aGVsbG8=",
                "!!set {a, b}",
                "!!omap [{a: 1}]",
                "!!timestamp 2001-12-14",
                "!custom x",
            ]
        )
        at = rng.choice(
            ["name: {}\nsteps: []\n", "name: x\ndims: {{T: {}}}\nsteps: []\n", "{}\n", "name: x\nsteps:\n  - {{id: a, op: {}}}\n"]
        )
        return at.format(tag).encode()
    if roll == 1:  # billion laughs
        levels = rng.randint(2, 9)
        lines = ["a0: &a0 [lol, lol, lol, lol, lol, lol, lol, lol, lol]"]
        lines += [f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 9) + "]" for i in range(1, levels)]
        return ("name: x\nsteps: []\n" + "\n".join(lines) + "\n").encode()
    if roll == 2:
        opener, closer = rng.choice([("[", "]"), ("{a: ", "}"), ("- ", "")])
        return (("a: " if opener != "- " else "") + opener * n + "1" + closer * n).encode()
    if roll == 3:
        return ("name: x\ndims:\n" + "".join("  " + "  " * i + f"d{i}:\n" for i in range(min(n, 2000))) + "steps: []\n").encode()
    if roll == 4:
        return ("name: " + "x" * (n * 10) + "\nsteps: []\n").encode()
    if roll == 5:
        return (
            "name: x\ninputs:\n  a: {shape: [2], values: [" + ",".join(["1"] * n) + "]}\nsteps:\n  - {id: b, op: relu, input: a}\n"
        ).encode()
    if roll == 6:
        expr = rng.choice(HOSTILE_EXPRS + ["9" * rng.choice([30, 5000]), " * ".join(["T"] * 40), "-" * 150 + "T"])
        return (
            f"name: x\ndims:\n  T: 2\n  E: {json.dumps(expr)}\ninputs:\n  a: {{shape: [T, E], init: randn}}\nsteps:\n  - {{id: b, op: relu, input: a}}\n"
        ).encode()
    return ("name: x\nsteps: []\n" + "# comment\n" * n).encode()


STRATEGIES: dict[str, tuple[Callable, float]] = {
    "mutated": (gen_mutated, 0.22),
    "gentle": (gen_gentle, 0.13),
    "text": (gen_text_mutated, 0.1),
    "dims": (gen_dims, 0.12),
    "pipeline": (gen_random_pipeline, 0.22),
    "yaml": (gen_random_yaml, 0.08),
    "bytes": (gen_random_bytes, 0.07),
    "hostile": (gen_hostile, 0.06),
}


def pick_strategy(rng) -> str:
    roll, total = rng.random(), 0.0
    for name, (_, weight) in STRATEGIES.items():
        total += weight
        if roll < total:
            return name
    return "mutated"


# ------------------------------------------------------------------------------------- the oracle


class Hang(BaseException):
    """A case ran past ``CASE_SECONDS`` (BaseException, so no ``except Exception`` swallows it)."""


class OracleFailure(AssertionError):
    """An outcome that is neither a success nor a well-formed TracerError."""


@contextlib.contextmanager
def time_limit(seconds: float):
    if not hasattr(signal, "setitimer"):
        yield
        return

    def _alarm(signum, frame):
        raise Hang(f"case ran longer than {seconds} s")

    previous = signal.signal(signal.SIGALRM, _alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def check_lines(text: str, file: str) -> None:
    """Every line starts ``FILE:LINE:COL: `` or ``FILE: `` (the oracle for every message)."""
    if not text:
        raise OracleFailure("an empty error message")
    # a block's own errors point into its file, which sits under the case's folder
    blocks = re.escape(str(Path(file).parent / "blocks")) + r"/[^:\n]+\.yaml"
    located = re.compile(f"(?:{re.escape(file)}|{blocks})" + r"(:[1-9]\d*:[1-9]\d*)?: ")
    for line in text.splitlines() or [text]:
        if not located.match(line):
            raise OracleFailure(f"message line does not start '{file}:LINE:COL: ': {line[:200]!r}")


@dataclass
class Outcome:
    kind: str  # "ran", "invalid" (located errors), "crash", "hang"
    detail: str = ""


def run_case(data: bytes, folder: Path, rng, cpu: bool = True, cli: bool = False) -> Outcome:
    """Take one file through everything; ``crash``/``hang`` outcomes carry a traceback."""
    from tracer.errors import TracerError

    path = folder / "case.yaml"
    path.write_bytes(data)
    if not (folder / "blocks").exists():  # the bundled pipelines' includes resolve beside the case
        shutil.copytree(PIPELINES / "blocks", folder / "blocks")
    try:
        with time_limit(CASE_SECONDS):
            kind = _exercise(path, rng, cpu)
            if cli:
                _exercise_cli(path, rng)
        return Outcome(kind)
    except Hang as exc:
        return Outcome("hang", f"{exc}\n{traceback.format_exc(limit=-8)}")
    except TracerError as exc:  # escaped from somewhere the oracle did not expect it: still fine if located
        try:
            check_lines(str(exc), str(path))
        except OracleFailure as bad:
            return Outcome("crash", f"OracleFailure: {bad}")
        return Outcome("invalid")
    except Exception as exc:
        return Outcome("crash", f"{type(exc).__name__}: {exc}\n{traceback.format_exc(limit=-12)}")


def _exercise(path: Path, rng, cpu: bool) -> str:
    from tracer.api import Pipeline
    from tracer.errors import TracerError
    from tracer.spec.load import load_spec

    name = str(path)
    try:
        pipeline = Pipeline(*load_spec(path))
    except TracerError as exc:
        check_lines(str(exc), name)
        return "invalid"
    analysis = pipeline.check()
    for d in analysis.diagnostics:
        check_lines(str(d), name)
    if analysis.errors:
        try:
            pipeline.run(device="meta")
        except TracerError as exc:
            check_lines(str(exc), name)
            return "invalid"
        raise OracleFailure("a pipeline with static errors ran")
    kind = "ran"
    for attempt in _dims_to_try(analysis, rng):
        try:
            trace = pipeline.run(dims=attempt, device="meta")
        except TracerError as exc:
            check_lines(str(exc), name)
            kind = "invalid" if not attempt else kind
            continue
        str(trace)
        json.loads(trace.to_json())
        if rng.random() < 0.3:
            _render(trace, rng)
        if cpu and not attempt and _small(trace.analysis):
            try:
                real = pipeline.run(keep_values=True)
            except TracerError as exc:
                check_lines(str(exc), name)
                continue
            json.loads(real.to_json(values=True))
    return kind


def _dims_to_try(analysis, rng) -> list[dict]:
    """The declared dims, and sometimes one base dim forced to a degenerate or huge value."""
    attempts: list[dict] = [{}]
    base = [n for n, text in analysis.pipeline.dims.items() if isinstance(text, int) or str(text).strip().lstrip("-").isdigit()]
    if base and rng.random() < 0.3:
        attempts.append({rng.choice(base): rng.choice([0, 1, 1, 3, 2**31, 2**62, 2**62 + 1, -1])})
    return attempts


def _small(analysis) -> bool:
    total = 0
    for meta in analysis.metas.values():
        total += meta.nbytes
        if total > CPU_RUN_BYTES:
            return False
    return True


def _render(trace, rng) -> None:
    """The full diagram, and one collapsed by some of its groups, their path prefixes or globs."""
    from tracer.errors import TracerError
    from tracer.render import dot_source

    dot_source(trace)
    groups = sorted({s.group for s in trace.analysis.pipeline.steps if s.group})
    candidates = groups + [g.rsplit("/", 1)[0] for g in groups] + [g[:1] + "*" for g in groups] + ["*", "*/*", "[", "x/*"]
    try:
        dot_source(trace, rng.sample(candidates, min(len(candidates), rng.randint(1, 3))))
    except TracerError as exc:
        check_lines(str(exc), trace.analysis.source.file)


def _exercise_cli(path: Path, rng) -> None:
    from tracer.cli import main

    name = str(path)
    commands = [["check", name], ["run", name, "--device", "meta", "--json"]]
    if rng.random() < 0.3:
        commands.append(["run", name, "--device", "meta", "--dim", f"{rng.choice(['T', 'B', 'H', 'x'])}={rng.choice([0, 1, 2**62])}"])
    for argv in commands:
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = main(argv)
            except SystemExit as exc:  # argparse usage errors
                code = exc.code
        if code not in (0, 1, 2):
            raise OracleFailure(f"`tracer {' '.join(argv)}` exited {code}: {err.getvalue()[-2000:]}")
        if code == 1:
            try:
                check_lines(err.getvalue(), name)
            except OracleFailure as bad:
                raise OracleFailure(f"`tracer {' '.join(argv)}`: {bad}") from None


# ------------------------------------------------------------------------------------ the driver


def make_case(seed: int | str, index: int) -> tuple[str, bytes, random.Random]:
    rng = random.Random(f"{seed}:{index}")
    strategy = pick_strategy(rng)
    return strategy, STRATEGIES[strategy][0](rng), rng


def limit_memory(limit: int = MEMORY_LIMIT) -> None:
    """Cap the address space, so a case that allocates without bound fails with MemoryError (a crash
    the campaign reports) instead of waking the OOM killer on a shared machine."""
    try:
        import resource

        soft, hard = resource.getrlimit(resource.RLIMIT_AS)
        if soft == resource.RLIM_INFINITY or soft > limit:
            resource.setrlimit(resource.RLIMIT_AS, (limit if hard == resource.RLIM_INFINITY else min(limit, hard), hard))
    except (ImportError, ValueError, OSError):
        pass


def campaign(n: int, seed: int | str = 0, start: int = 0, show: bool = False, report: int = 3, out=None) -> int:
    out = out or sys.stdout
    _ops()
    import tracer  # noqa: F401  (import torch and friends before the clock starts)
    import tracer.interpreter  # noqa: F401

    tracer.interpreter.torch_module()
    counts: dict[str, int] = {}
    failures: list[tuple[int, str, bytes, Outcome]] = []
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="tracer-fuzz-") as tmp:
        folder = Path(tmp)
        for index in range(start, start + n):
            strategy, data, rng = make_case(seed, index)
            outcome = run_case(data, folder, rng, cpu=rng.random() < 0.3, cli=rng.random() < 0.08)
            counts[outcome.kind] = counts.get(outcome.kind, 0) + 1
            if show:
                print(
                    f"--- case {index} ({strategy}): {outcome.kind}\n{data.decode('utf-8', 'replace')[:4000]}\n{outcome.detail}", file=out
                )
            if outcome.kind in ("crash", "hang"):
                failures.append((index, strategy, data, outcome))
    crashes = sum(1 for f in failures if f[3].kind == "crash")
    hangs = len(failures) - crashes
    for index, strategy, data, outcome in failures[:report]:
        print(
            f"\n=== {outcome.kind}: case {index} of seed {seed} ({strategy}); replay: python -m tests.fuzz 1 --seed {seed} --start {index} --show",
            file=out,
        )
        print(data.decode("utf-8", "replace")[:3000], file=out)
        print(outcome.detail, file=out)
    elapsed = time.monotonic() - started
    detail = ", ".join(f"{k} {v}" for k, v in sorted(counts.items()))
    print(f"{n} cases, {crashes} crashes, {hangs} hangs ({detail}; {elapsed:.0f} s)", file=out)
    return 1 if failures else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.fuzz", description=__doc__.split("\n")[0])
    parser.add_argument("n", type=int, nargs="?", default=1000, help="number of cases (default 1000)")
    parser.add_argument("--seed", default="0", help="campaign seed (default 0)")
    parser.add_argument("--start", type=int, default=0, help="index of the first case (to replay one)")
    parser.add_argument("--show", action="store_true", help="print every case and its outcome")
    args = parser.parse_args(argv)
    limit_memory()
    return campaign(args.n, args.seed, args.start, args.show)


if __name__ == "__main__":
    sys.exit(main())
