"""Strategies whose case is a folder, not one file: a ``save_pretrained`` checkpoint folder given to
``tracer run --weights``, and a module given to ``tracer import``. The generator writes a JSON
recipe (the case's bytes, shown by ``--show``); the runner builds the folder from it, runs the
command line, and holds it to three oracles: the exit status is 0, 1 or 2 (never 3); every error
line is located (``FILE[:LINE:COL]: error[CODE]: ...``); and no file changed or appeared that the
command did not list as written (a file of the weights folder or the module's source: never).
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import math
import re
import sys
import traceback
from pathlib import Path

from tests.fuzz.oracle import CASE_SECONDS, Hang, OracleFailure, Outcome, time_limit
from tests.fuzz.pools import PIPELINES

PREFIX = "attn.{layer}."
PARAMS = {"W_q": [4, 4], "W_k": [4, 4], "W_v": [4, 4], "W_o": [4, 4], "b_o": [4]}  # causal_mha at d_model=4
SECTION = (
    "checkpoint:\n  dims: {hidden_size: d_model, num_attention_heads: H}\n  prefix: attn.{layer}.\n"
    "  params: {W_q: W_q, W_k: W_k, W_v: W_v, W_o: W_o, b_o: b_o}\n"
)
# safetensors' dtype names and their bits per element: torch reads the first group, not the second
DTYPES = {"F32": 32, "F16": 16, "BF16": 16, "F64": 64, "I64": 64, "I8": 8, "BOOL": 8, "C64": 64, "F8_E4M3": 8, "U16": 16}
UNREADABLE = {"F4": 4, "F6_E2M3": 6, "F6_E3M2": 6, "F8_E8M0": 8, "X9": 8}
ODD_TEXT = ["", " ", "a\x1b[31mb", "x\u202ey", "\x00", "../../escape", "/etc/x", "ünï", "a" * 300, "..", "con", "a\nb"]
ODD_VALUES = [None, True, -1, 0, 2**62 + 1, 2**70, 1.5, "4", "a\x1b[2Jb", [4], {"x": 4}, "\u202e"]
LINE = re.compile(r"^.+?(:[1-9]\d*:[1-9]\d*)?: (error|warning)\[[a-z0-9-]+\]: ")


# ---------------------------------------------------------------- checkpoint folders


def gen_checkpoint(rng) -> bytes:
    """A checkpoint folder for causal_mha, with a few of its parts made hostile."""
    layers = rng.choice([1, 2, 3])
    config: dict = {"model_type": "toy", "hidden_size": 4, "num_attention_heads": 2, "num_hidden_layers": layers}
    tensors = [{"key": f"attn.{i}.{name}", "dtype": "F32", "shape": shape} for i in range(layers) for name, shape in PARAMS.items()]
    recipe = {"config": config, "tensors": tensors, "sharded": rng.random() < 0.5, "index": None, "truncate": None}
    hostile_folder = rng.random() < 0.6  # else a sound folder, and the output is where the danger is
    for _ in range(rng.choice([1, 1, 1, 2, 3]) if hostile_folder else 0):
        rng.choice(CHECKPOINT_MUTATIONS)(recipe, rng)
    recipe["layer"] = rng.choice([0, layers - 1, layers - 1, None, layers, 2**40] if hostile_folder else [0, layers - 1])
    outputs = ["weights/config.json", "weights/model.safetensors", "weights/model.safetensors.index.json", "notes.txt", "out.json"]
    recipe["output"] = rng.choice([None, None, *outputs] if hostile_folder else [*outputs, "weights"])
    recipe["force"] = rng.random() < 0.3
    recipe["max_memory"] = rng.choice([None, None, None, None, "100", "1KiB", "1GiB"] if hostile_folder else [None])
    return json.dumps(recipe, indent=1).encode()


def _config_key(recipe, rng) -> None:
    config = recipe["config"]
    key = rng.choice([*config, rng.choice(ODD_TEXT)])
    if rng.random() < 0.3:
        config.pop(key, None)
    else:
        config[key] = rng.choice(ODD_VALUES)


def _whole_config(recipe, rng) -> None:
    recipe["config"] = rng.choice([[], "x", None, {"model_type": "gpt2", "n_embd": 4}, {"model_type": "\x1b[31m"}])


def _dtype(recipe, rng) -> None:
    tensor = rng.choice(recipe["tensors"])
    tensor["dtype"] = rng.choice([*DTYPES, *UNREADABLE])


def _shape(recipe, rng) -> None:
    tensor = rng.choice(recipe["tensors"])
    tensor["shape"] = rng.choice([[], [0], [4, 5], [2**20, 2**12], [4, 4, 1], [-1]])


def _key(recipe, rng) -> None:
    tensors = recipe["tensors"]
    if rng.random() < 0.5:
        tensors.remove(rng.choice(tensors))
    else:
        tensors.append({"key": "attn.0." + rng.choice(ODD_TEXT), "dtype": "F32", "shape": [2]})


def _index(recipe, rng) -> None:
    recipe["sharded"] = True
    recipe["index"] = rng.choice(["not json", [], {"weight_map": []}, "swap", "outside", "missing", "hidden", "not a shard"])


def _truncate(recipe, rng) -> None:
    recipe["truncate"] = rng.choice([0, 7, 8, 40, -3])


CHECKPOINT_MUTATIONS = [_config_key, _config_key, _whole_config, _dtype, _dtype, _shape, _key, _index, _index, _truncate]


def run_checkpoint(data: bytes, folder: Path) -> Outcome:
    recipe = json.loads(data)
    case = _fresh(folder, "checkpoint")
    pipeline = case / "p.yaml"
    pipeline.write_text((PIPELINES / "causal_mha.yaml").read_text() + SECTION)
    weights = case / "weights"
    weights.mkdir()
    _write_checkpoint(recipe, weights)
    (case / "notes.txt").write_text("the user's own notes\n")
    argv = ["run", pipeline, "--weights", weights, "-q"]
    argv += [] if recipe["layer"] is None else ["--layer", recipe["layer"]]
    argv += [] if recipe["output"] is None else ["--json", "-o", case / recipe["output"]]
    argv += (["--force"] if recipe["force"] else []) + ([] if recipe["max_memory"] is None else ["--max-memory", recipe["max_memory"]])
    user = [] if recipe["force"] else [case / "notes.txt"]  # --force may replace the user's file, never an input
    return _judged(argv, case, protected=[*weights.iterdir(), pipeline], owned_by_user=user)


def _write_checkpoint(recipe: dict, weights: Path) -> None:
    config = recipe["config"]
    (weights / "config.json").write_text(json.dumps(config) if not isinstance(config, str) else config)
    tensors = recipe["tensors"]
    shards = [tensors[i::2] for i in range(2)] if recipe["sharded"] else [tensors]
    names = [f"model-{i:05d}-of-{len(shards):05d}.safetensors" for i in range(len(shards))] if recipe["sharded"] else ["model.safetensors"]
    for name, held in zip(names, shards, strict=True):
        _safetensors(weights / name, held, recipe["truncate"])
    if recipe["sharded"]:
        weight_map = {t["key"]: name for name, held in zip(names, shards, strict=True) for t in held}
        (weights / "model.safetensors.index.json").write_text(_index_text(recipe["index"], weight_map, names))


def _index_text(kind, weight_map: dict, names: list[str]) -> str:
    if kind in ("not json",):
        return "{not json"
    if not isinstance(kind, str) and kind is not None:
        return json.dumps(kind)
    if weight_map and kind is not None:
        key = next(iter(weight_map))
        other = next((n for n in names if n != weight_map[key]), names[0])
        weight_map[key] = {
            "swap": other,
            "outside": "../outside.safetensors",
            "missing": "absent.safetensors",
            "hidden": ".hidden.safetensors",
            "not a shard": "config.json",
        }[kind]
    return json.dumps({"metadata": {}, "weight_map": weight_map})


def _safetensors(path: Path, tensors: list[dict], truncate: int | None) -> None:
    """A .safetensors file written by hand, so that its header may say what safetensors' writer never would."""
    header, offset = {}, 0
    for tensor in tensors:
        bits = {**DTYPES, **UNREADABLE}[tensor["dtype"]]
        count = math.prod(tensor["shape"]) if all(isinstance(s, int) and s >= 0 for s in tensor["shape"]) else 0
        size = -(-count * bits // 8)
        header[tensor["key"]] = {"dtype": tensor["dtype"], "shape": tensor["shape"], "data_offsets": [offset, offset + size]}
        offset += size
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as file:
        file.write(len(text).to_bytes(8, "little") + text)
        file.truncate(8 + len(text) + offset)  # sparse: a header promising gigabytes costs no disk
        if truncate is not None:
            file.truncate(max(0, truncate if truncate >= 0 else 8 + len(text) + offset + truncate))


# ---------------------------------------------------------------- import outputs

MODULE = """
import torch


class Layer(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)

    def forward(self, x):
        return torch.relu(self.lin(x))


def make(name, container, layers):
    torch.manual_seed(0)

    def forward(self, x):
        for layer in getattr(self, container):
            x = layer(x)
        return x

    def init(self):
        torch.nn.Module.__init__(self)
        setattr(self, container, torch.nn.ModuleList(Layer() for _ in range(layers)))

    return type(name, (torch.nn.Module,), {"__init__": init, "forward": forward})()
"""


def gen_import(rng) -> bytes:
    """A module of repeated layers, a class name that may be any string, and an output that may be taken."""
    recipe = {
        "name": rng.choice(["Model", "Model", *ODD_TEXT]),
        "container": rng.choice(["layers", "h", "blocks"]),
        "layers": rng.choice([1, 2, 3]),
        "output": rng.choice(["out.yaml", "out.yaml", "fzmod.py", "notes.yaml", "out_layers.yaml", "sub/out.yaml", ".", "x y.yaml"]),
        "existing": rng.choice([None, "notes.yaml", "out.yaml", "out_layers.yaml", "Model_layers.yaml"]),
        "again": rng.random() < 0.3,  # the same import twice: the second replaces its own files
        "force": rng.random() < 0.3,
    }
    return json.dumps(recipe, indent=1).encode()


def run_import(data: bytes, folder: Path) -> Outcome:
    recipe = json.loads(data)
    case = _fresh(folder, "import")
    module_name = f"fzmod_{hashlib.sha1(data).hexdigest()[:12]}"
    source = case / f"{module_name}.py"
    source.write_text(MODULE)
    output = recipe["output"].replace("fzmod", module_name)
    user = []
    if recipe["existing"]:
        (case / recipe["existing"]).write_text("the user's own file\n")
        user.append(case / recipe["existing"])
    args = json.dumps([recipe["name"], recipe["container"], recipe["layers"]])
    argv = ["import", f"{module_name}:make", "--args", args, "--input", "x=2,3,4", "-o", output] + (["--force"] if recipe["force"] else [])
    sys.path.insert(0, str(case))
    try:
        outcome = _judged(argv, case, protected=[source], owned_by_user=[] if recipe["force"] else user)
        if recipe["again"] and outcome.kind == "ran":
            outcome = _judged([a for a in argv if a != "--force"], case, protected=[source], owned_by_user=[])
        return outcome
    finally:
        sys.path.remove(str(case))
        sys.modules.pop(module_name, None)


# ---------------------------------------------------------------- the oracles


def _fresh(folder: Path, name: str) -> Path:
    import shutil

    case = folder / f"{name}-case" / "inner"  # a parent of its own: a file written outside shows there
    shutil.rmtree(case.parent, ignore_errors=True)
    case.mkdir(parents=True)
    return case


def _judged(argv: list, case: Path, protected: list[Path], owned_by_user: list[Path]) -> Outcome:
    from tracer.cli import main

    before = _snapshot(case.parent)
    out, err = io.StringIO(), io.StringIO()
    try:
        with time_limit(CASE_SECONDS), contextlib.chdir(case), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = main([str(a) for a in argv])
            except SystemExit as exc:  # argparse: usage errors
                code = exc.code
        _check(code, err.getvalue(), before, _snapshot(case.parent), case, protected, owned_by_user)
    except Hang as exc:
        return Outcome("hang", f"{exc}\n{traceback.format_exc(limit=-8)}")
    except OracleFailure as exc:
        return Outcome("crash", f"`tracer {' '.join(map(str, argv))}`: {exc}\nstderr: {err.getvalue()[-2000:]}")
    except Exception as exc:
        return Outcome("crash", f"{type(exc).__name__}: {exc}\n{traceback.format_exc(limit=-12)}")
    return Outcome("ran" if code == 0 else "invalid")


def _check(code, stderr: str, before: dict, after: dict, case: Path, protected: list[Path], owned_by_user: list[Path]) -> None:
    if code not in (0, 1, 2):
        raise OracleFailure(f"exited {code}")
    if code == 1:
        for line in stderr.splitlines():
            if not LINE.match(line):
                raise OracleFailure(f"an unlocated error line: {line[:200]!r}")
    written = {(case / line[len("wrote ") :]).resolve() for line in stderr.splitlines() if line.startswith("wrote ")}
    for path in set(before) | set(after):
        if before.get(path) != after.get(path) and path not in written and "__pycache__" not in path.parts:
            raise OracleFailure(f"{path} changed or appeared, and the command did not list it as written")
    for path in [*protected, *owned_by_user]:
        if before.get(path.resolve()) != after.get(path.resolve()):
            raise OracleFailure(f"{path} was rewritten: an input or a file the command did not write")


def _snapshot(root: Path) -> dict[Path, str]:
    found = {}
    for path in root.rglob("*"):
        if path.is_file() and not path.is_symlink():
            found[path.resolve()] = hashlib.sha1(path.read_bytes()).hexdigest() if path.stat().st_size < 2**20 else str(path.stat())
    return found


RUNNERS = {"checkpoint": run_checkpoint, "import": run_import}
