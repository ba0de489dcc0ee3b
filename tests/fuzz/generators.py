"""The strategies: each turns a ``random.Random``-like object into the bytes of one case file."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from tests.fuzz.folders import gen_checkpoint, gen_import
from tests.fuzz.mutations import GENTLE, MUTATIONS, field_value, t_bytes, t_insert, t_lines, t_truncate
from tests.fuzz.pairs import gen_diff
from tests.fuzz.pools import (
    HOSTILE_EXPRS,
    HUGE,
    STEP_KEYS,
    TOP_KEYS,
    bundled,
    bundled_doc,
    bundled_text,
    copy_doc,
    dump,
    known_ops,
    random_value,
)


def gen_mutated(rng) -> bytes:
    """A bundled pipeline after 1-4 structural mutations (and sometimes a text mutation)."""
    path = rng.choice(bundled())
    doc = copy_doc(bundled_doc(path))
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
    doc = copy_doc(bundled_doc(rng.choice(bundled())))
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
    from tracer.steps.contract import STEP_KINDS

    kind = STEP_KINDS[op]  # a step kind this generator does not know yet: fill its required fields
    return {
        k: field_value(k, rng, ids, dims)
        for k, info in kind.model_fields.items()
        if k not in ("id", "op", "group", "note", "input", "inputs") and (info.is_required() or rng.random() < 0.3)
    }


def gen_random_pipeline(rng) -> bytes:
    """A plausible pipeline from scratch: random dims (often degenerate), declarations and a chain of steps."""
    from tracer.steps.contract import STEP_KINDS

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
        op = rng.choice(known_ops())
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


def gen_typed(rng) -> bytes:
    """A well-typed pipeline built from the step vocabulary (``typed``): it should run, so kernels,
    layouts, memory estimates and diagrams get fuzzed; sometimes at a huge batch (meta runs only),
    sometimes nudged by one mutation into a near miss."""
    from tests.fuzz.typed import build

    doc = build(rng, small=rng.random() < 0.9)
    if rng.random() < 0.08:
        rng.choice(MUTATIONS)(doc, rng)
    return dump(doc, rng).encode("utf-8", "surrogatepass")


def gen_dims(rng) -> bytes:
    """A bundled pipeline, unchanged but for its dims: 0, 1, a few, or huge, one at a time or all at once."""
    doc = copy_doc(bundled_doc(rng.choice(bundled())))
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


# Names an exported module must not let collide: nn.Module's own attributes and methods, the names
# the generated code uses (imports, helpers, `seed`, `generator`, `bound`, loop variables), Python's
# keywords and builtins, dunders (mangled), prefixes the writer could derive (`dim_x`), dotted holders.
RISKY_DIMS = ["_", "training", "forward", "bound", "bound_2", "dim_head", "head", "seed", "generator", "self", "torch", "F",
              "nn", "math", "linear_bound", "Attn", "layer", "copy", "_modules", "_parameters", "sum", "range", "super",
              "x", "dims", "T_2", "B"]  # fmt: skip
RISKY_IDS = ["_", "training", "forward", "eval", "state_dict", "__w", "a", "a.b", "a.c", "x", "self", "torch", "F", "math",
             "nn", "True", "None", "class", "super", "print", "generator", "seed", "bound", "layer", "head", "dim_head",
             "linear_bound", "_parameters", "register_buffer", "w-1", "T", "Attn", "out", "l", "a-b", "y.z.w"]  # fmt: skip


def gen_named(rng) -> bytes:
    """A well-typed pipeline whose dims, inputs, params and step ids are renamed to risky names
    (``RISKY_DIMS``, ``RISKY_IDS``): the oracle exports it and holds the module equal to the run."""
    from tests.fuzz.typed import build

    doc = build(rng, small=True)
    dims = list(doc.get("dims", {}))
    ids = [*doc.get("inputs", {}), *doc.get("params", {}), *(s["id"] for s in doc["steps"])]
    dim_names = rng.sample(RISKY_DIMS, min(len(dims), len(RISKY_DIMS)))
    id_names = rng.sample(RISKY_IDS, min(len(ids), len(RISKY_IDS)))
    renamed = {**dict(zip(ids, id_names)), **dict(zip(dims, dim_names))}  # the rest keep their names
    return dump(_renamed(doc, renamed), rng).encode()


def _renamed(node: Any, names: dict[str, str]) -> Any:
    """``node`` with every id (a whole string) and every dim (a word in an expression) renamed."""
    import re

    if isinstance(node, dict):
        return {names.get(k, k) if isinstance(k, str) else k: _renamed(v, names) for k, v in node.items()}
    if isinstance(node, list):
        return [_renamed(v, names) for v in node]
    if isinstance(node, str):
        if node in names:
            return names[node]
        return re.sub(r"[A-Za-z_][A-Za-z0-9_]*", lambda m: names.get(m.group(), m.group()), node)
    return node


STRATEGIES: dict[str, tuple[Callable, float]] = {
    "typed": (gen_typed, 0.26),  # well-typed: most of the campaign's runnable cases
    "mutated": (gen_mutated, 0.12),
    "gentle": (gen_gentle, 0.1),
    "text": (gen_text_mutated, 0.07),
    "dims": (gen_dims, 0.08),
    "pipeline": (gen_random_pipeline, 0.1),
    "yaml": (gen_random_yaml, 0.05),
    "bytes": (gen_random_bytes, 0.05),
    "hostile": (gen_hostile, 0.04),
    "named": (gen_named, 0.05),  # risky names, exported and compared with the run
    "diff": (gen_diff, 0.04),  # two pipelines and `tracer diff`'s verdict on them (judged by tests.fuzz.pairs)
    "checkpoint": (gen_checkpoint, 0.03),  # a hostile save_pretrained folder through run --weights (tests/fuzz/folders.py)
    "import": (gen_import, 0.01),  # tracer import onto taken names, with class names that are paths
}


def pick_strategy(rng) -> str:
    roll, total = rng.random(), 0.0
    for name, (_, weight) in STRATEGIES.items():
        total += weight
        if roll < total:
            return name
    return "mutated"
