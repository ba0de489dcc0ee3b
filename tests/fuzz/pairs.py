"""Diff pairs: two pipelines and what ``tracer diff A B --values --json`` must say of them.

A case is a JSON document (the bytes the campaign prints to replay it): A's text, B's text, the
block file each includes (the encoder stack's layer, when the pair is a stack), and the variant
that made B from A:

- ``renamed``: every id and dim of a well-typed pipeline renamed: the same pipeline, exit 0;
- ``mutated``: one field of one step given another value (often an invalid one): exit 2 with
  every line located in A's or B's files, or a verdict that agrees with an independent run;
- ``block``: the same, or an edit of :data:`BLOCK_EDITS`, inside the block file of a 2-layer
  stack: a change it finds is named by a step of a copy (``layers/{0,1}/scaled: ...``), and a
  spelling of the same computation is no change;
- ``depth``: the stack repeated another number of times: exit 1 and one ``repeat 2 -> N`` line.

The independent run: A from seed 0, B on A's inputs and params under the names the variant gave
them; outputs that differ by more than 1e-3 of their magnitude make a "same" verdict wrong.
"""

from __future__ import annotations

import json
from pathlib import Path

from tests.fuzz.mutations import field_value
from tests.fuzz.pools import PIPELINES, copy_doc, dump

STACK = PIPELINES / "encoder_stack.yaml"
LAYER = PIPELINES / "blocks" / "encoder_layer.yaml"
VARIANTS = ("renamed", "renamed", "mutated", "block", "depth")
MUTABLE = ("dim", "dims", "divide", "multiply", "p", "causal", "fill", "eps", "window", "shape", "index", "start", "stop")
SUFFIX = "_r"
BLOCK_EDITS = [  # (text of the layer, its replacement, the step the diff must name; "" for a spelling of the same)
    ("op: scale, divide: {sqrt: Dh}", "op: scale, divide: 3.0", "scaled"),
    ("op: scale, divide: {sqrt: Dh}", "op: scale, multiply: {sqrt: Dh}", "scaled"),
    ("op: relu", "op: gelu", "hidden_act"),
    ("op: softmax, dim: -1", "op: softmax, dim: -2", "attn_weights"),
    ("op: softmax, dim: -1", "op: softmax, dim: 3", ""),
    ("input: K_h, dims: [-1, -2]", "input: K_h, dims: [3, 2]", ""),
]


def gen_diff(rng) -> bytes:
    """One pair of pipelines, as the JSON document :func:`run_pair` reads."""
    from tests.fuzz.typed import build

    variant = rng.choice(VARIANTS)
    if variant in ("block", "depth"):
        main, layer = STACK.read_text().replace("repeat: 48", "repeat: 2"), LAYER.read_text()
        if variant == "depth":
            pair = {"a": main, "b": main.replace("repeat: 2", f"repeat: {rng.choice([1, 3])}"), "a_block": layer, "b_block": layer}
        elif rng.random() < 0.5:
            old, new, step = rng.choice(BLOCK_EDITS)
            assert old in layer, old
            pair = {"a": main, "b": main, "a_block": layer, "b_block": layer.replace(old, new), "names": step}
        else:
            pair = {"a": main, "b": main, "a_block": layer, "b_block": _mutated(_yaml(layer), rng)}
    else:
        doc = build(rng, small=True)
        b = _renamed_copy(doc) if variant == "renamed" else _mutated(doc, rng)
        pair = {"a": dump(doc, rng), "b": b if isinstance(b, str) else dump(b, rng), "a_block": None, "b_block": None}
    return json.dumps({"variant": variant, **pair}).encode()


def _yaml(text: str):
    import yaml

    return yaml.safe_load(text)


def _renamed_copy(doc: dict) -> dict:
    """Every input, param, step id and dim with a suffix, in every expression that names it; the
    kinds (``op``) as they were, whatever an id is called."""
    from tests.fuzz.generators import _renamed

    names = [*doc.get("dims", {}), *doc.get("inputs", {}), *doc.get("params", {}), *(s["id"] for s in doc["steps"])]
    copy = _renamed(copy_doc(doc), {name: name + SUFFIX for name in names})
    for mine, theirs in zip(copy["steps"], doc["steps"], strict=True):
        mine["op"] = theirs["op"]
    return copy


def _mutated(doc: dict, rng) -> str:
    """``doc`` with one field of one step (one it has, or a new one of :data:`MUTABLE`) given another value."""
    doc = copy_doc(doc)
    step = rng.choice(doc["steps"])
    keys = [k for k in step if k in MUTABLE] or list(MUTABLE)
    step[rng.choice(keys)] = field_value(rng.choice(keys), rng, [s["id"] for s in doc["steps"]], list(doc.get("dims", {})))
    return dump(doc, rng)


def run_pair(data: bytes, folder: Path, rng):
    """Write the pair, diff it through the CLI, and judge the verdict (an ``oracle.Outcome``)."""
    import traceback

    from tests.fuzz.oracle import CASE_SECONDS, Hang, OracleFailure, Outcome, time_limit, warm_up

    warm_up()
    pair = json.loads(data)
    files = _write(pair, folder)
    try:
        with time_limit(CASE_SECONDS):
            return Outcome(_judge(pair, files))
    except Hang as exc:
        return Outcome("hang", f"{exc}\n{traceback.format_exc(limit=-8)}")
    except OracleFailure as exc:
        return Outcome("crash", f"OracleFailure: {exc}")
    except Exception as exc:
        return Outcome("crash", f"{type(exc).__name__}: {exc}\n{traceback.format_exc(limit=-12)}")


def _write(pair: dict, folder: Path) -> list[str]:
    files = []
    for side in ("a", "b"):
        (folder / side / "blocks").mkdir(parents=True, exist_ok=True)
        (folder / side / "case.yaml").write_text(pair[side], encoding="utf-8", errors="surrogatepass")
        if pair[f"{side}_block"] is not None:
            (folder / side / "blocks" / "encoder_layer.yaml").write_text(pair[f"{side}_block"], encoding="utf-8", errors="surrogatepass")
        files.append(str(folder / side / "case.yaml"))
    return files


def _judge(pair: dict, files: list[str]) -> str:
    from tests.fuzz.oracle import OracleFailure, check_lines, cli

    code, out, err = cli(["diff", *files, "--values", "--json"])
    if code not in (0, 1, 2):
        raise OracleFailure(f"`tracer diff` exited {code}: {err[-2000:]}")
    if code == 2:
        for line in err.splitlines() or [err]:
            if not any(_located(line, f, check_lines) for f in files):
                raise OracleFailure(f"`tracer diff` exit 2, a line located in neither file: {line[:200]!r}")
        if pair["variant"] in ("renamed", "depth"):
            raise OracleFailure(f"`tracer diff` of a valid {pair['variant']} pair exited 2: {err[-1000:]}")
        return "invalid"
    found = json.loads(out)
    if found["same"] != (code == 0):
        raise OracleFailure(f"exit {code} but same={found['same']}")
    variant = pair["variant"]
    if variant == "renamed" and code != 0:
        raise OracleFailure(f"a renamed copy is not 'the same pipeline': {_changes(found)}")
    if variant == "depth" and (code != 1 or len(found["blocks"]) != 1 or not found["blocks"][0].startswith("layers: repeat 2 -> ")):
        raise OracleFailure(f"a deeper or shallower stack: exit {code}, blocks {found['blocks']}")
    if variant == "block" and code == 1 and not all(line.startswith("layers") for line in found["changed_op"] + found["blocks"]):
        raise OracleFailure(f"a change in the block file named outside the copies: {_changes(found)}")
    named = pair.get("names")
    if named == "" and code != 0:
        raise OracleFailure(f"a spelling of the same computation in the block is a change: {_changes(found)}")
    if named and not (code == 1 and any(line.startswith(f"layers/{{0,1}}/{named}: ") for line in found["changed_op"])):
        raise OracleFailure(f"an edit of step '{named}' in the block, not named: exit {code}, {_changes(found)}")
    if code == 0 and not found["unseeded"] and _outputs_differ(files, SUFFIX if variant == "renamed" else ""):
        raise OracleFailure("'the same pipeline', but the outputs of an independent run differ")
    return "ran"


def _located(line: str, file: str, check_lines) -> bool:
    try:
        check_lines(line, file)
    except AssertionError:
        return False
    return True


def _changes(found: dict) -> str:
    return json.dumps({k: found[k] for k in ("added", "removed", "changed_op", "blocks", "shapes", "params", "diverges")})[:1500]


def _outputs_differ(files: list[str], suffix: str) -> bool:
    """A from seed 0, B on A's inputs and params under the names B gives them; their outputs, in
    order, differ in shape or by more than 1e-3 of their magnitude."""
    import tracer

    a, b = tracer.load(files[0]), tracer.load(files[1])
    run_a = a.run(keep_values=True, seed=0)
    declared = b.check().declared
    given = {r.id + suffix: r.tensor for r in run_a.records if r.op in ("input", "param")}
    given = {n: t for n, t in given.items() if n in declared and tuple(t.shape) == declared[n].meta.sizes}
    sections = {n: declared[n].section for n in given}
    run_b = b.run(
        keep_values=True,
        seed=0,
        inputs={n: t for n, t in given.items() if sections[n] == "inputs"},
        params={n: t for n, t in given.items() if sections[n] == "params"},
    )
    outputs_a, outputs_b = list(run_a.outputs.values()), list(run_b.outputs.values())
    return len(outputs_a) != len(outputs_b) or any(_far(x, y) for x, y in zip(outputs_a, outputs_b, strict=True))


def _far(x, y) -> bool:
    import torch

    if x.shape != y.shape:
        return True
    x, y = x.double(), y.double()
    if not torch.equal(x.isnan(), y.isnan()):
        return True
    finite = x.isfinite() & y.isfinite()
    if not torch.equal(x[~finite].nan_to_num(), y[~finite].nan_to_num()):
        return True
    gap = (x[finite] - y[finite]).abs()
    magnitude = max(float(x[finite].abs().max()) if finite.any() else 0.0, 1.0)
    return bool(gap.numel()) and float(gap.max()) > 1e-3 * magnitude
