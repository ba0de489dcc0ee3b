"""Edits of a pipeline: structural mutations of its parsed document, plausible field values, and edits of its text."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tests.fuzz.pools import (
    DECL_KEYS,
    DIM_VALUES,
    DTYPES,
    HOSTILE_EXPRS,
    HUGE,
    INITS,
    STEP_KEYS,
    TOP_KEYS,
    containers,
    copy_doc,
    doc_paths,
    get_at,
    known_ops,
    random_scalar,
    random_value,
    step_dicts,
)

# ----------------------------------------------------------------------- structural mutations


def m_delete(doc, rng):
    paths = doc_paths(doc)
    if paths:
        path = rng.choice(paths)
        parent = get_at(doc, path[:-1])
        del parent[path[-1]]


def m_duplicate(doc, rng):
    lists = [p for p in containers(doc, list) if get_at(doc, p)]
    if lists:
        items = get_at(doc, rng.choice(lists))
        items.insert(rng.randrange(len(items) + 1), copy_doc(rng.choice(items)))


def m_reorder(doc, rng):
    if rng.random() < 0.5:
        lists = containers(doc, list)
        if lists:
            rng.shuffle(get_at(doc, rng.choice(lists)))
            return
    maps = [p for p in containers(doc, dict) if p]
    if maps:
        path = rng.choice(maps)
        items = list(get_at(doc, path).items())
        rng.shuffle(items)
        get_at(doc, path[:-1])[path[-1]] = dict(items)


def m_change_type(doc, rng):
    paths = doc_paths(doc)
    if paths:
        path = rng.choice(paths)
        get_at(doc, path[:-1])[path[-1]] = random_value(rng, 2)


def m_swap_ids(doc, rng):
    steps = [s for s in step_dicts(doc) if "id" in s]
    if len(steps) >= 2:
        a, b = rng.sample(steps, 2)
        a["id"], b["id"] = b["id"], a["id"]


def m_rename_id(doc, rng):
    steps = step_dicts(doc)
    if steps:
        names = [s.get("id") for s in steps] + list((doc.get("inputs") or {}) if isinstance(doc.get("inputs"), dict) else {})
        rng.choice(steps)["id"] = rng.choice(names + [random_scalar(rng), "x" * 65, "9bad", "a/b", "a b", ""])


def m_rename_ref(doc, rng):
    steps = step_dicts(doc)
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
    steps = step_dicts(doc)
    if steps:
        step = rng.choice(steps)
        step["op"] = rng.choice(known_ops() + ["attention", "Softmax", "soft_max", "eval", "exec", "block", "", None, 3, ["matmul"]])


def m_graft(doc, rng):
    """Move a field from one step to another (fields of the wrong kind, values of the wrong shape)."""
    steps = step_dicts(doc)
    if len(steps) >= 2:
        a, b = rng.sample(steps, 2)
        keys = [k for k in a if k != "id"]
        if keys:
            key = rng.choice(keys)
            b[key] = copy_doc(a[key])


def m_step_field(doc, rng):
    steps = step_dicts(doc)
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
    names = [s.get("id") for s in step_dicts(doc)] + ["nope"]
    dims = list(doc["dims"]) if isinstance(doc.get("dims"), dict) else ["T"]
    shape = [rng.choice(dims + [0, 1, -1]) for _ in range(rng.randint(0, 4))]
    expect = doc.setdefault("expect", {}) if isinstance(doc.get("expect", {}), dict) else {}
    expect[str(rng.choice(names))] = shape if rng.random() < 0.5 else {"shape": shape, "contiguous": rng.choice([True, False, 1])}


def m_add_key(doc, rng):
    maps = containers(doc, dict)
    if maps:
        target = get_at(doc, rng.choice(maps))
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
    steps = step_dicts(doc)
    for step in rng.sample(steps, min(len(steps), rng.randint(1, 4))):
        step["group"] = rng.choice(["a", "a/b", "a/b/c", "x[1]", "*", "g?", "enc/dec", "enc", "", "a//b", "/lead", "trail/", "é/\n"])


def m_expect_path(doc, rng):
    """expect keys naming tensors inside blocks and composite steps, some twice over."""
    ids = [s.get("id") for s in step_dicts(doc) if isinstance(s.get("id"), str)] or ["x"]
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
