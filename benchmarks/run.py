"""``make bench``: every performance target of tracer, measured side by side, as a table of ratios.

Each measurement runs in a fresh subprocess (``run.py --worker NAME``) so imports, allocator state
and torchlens' global wrapping of torch functions cannot leak from one into another. Every timing
goes through benchmarks/measure.py: the variants interleaved round by round (eager, traced,
traced, eager, ...) and the ratio taken per round, so drift and other processes' load hit both
sides alike; the table shows each ratio's median with its 95% bootstrap interval (a target is
judged on the median; the interval says whether this machine's noise could flip it), the CPU-time
ratio beside it, and the raw medians with their min–max. Results are printed and written to build/benchmarks.md
(``make bench``), or to docs/benchmarks.md with ``--output docs/benchmarks.md`` (``make bench-docs``).

    .venv/bin/python benchmarks/run.py                 # everything (a few minutes)
    .venv/bin/python benchmarks/run.py --quick         # fewer rounds
    .venv/bin/python benchmarks/run.py --profile       # pyinstrument of a toy-size traced run
"""

from __future__ import annotations

import argparse
import compileall
import functools
import glob
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

TOY = (2, 6, 4, 2)
GPT2 = (8, 512, 768, 12)
HUGE = (64, 131072, 8192, 64)
MHA = ROOT / "pipelines" / "causal_mha.yaml"
STACK = ROOT / "pipelines" / "encoder_stack.yaml"


def _dims(size) -> dict:
    B, T, d, H = size
    return {"B": B, "T": T, "d_model": d, "H": H}


# ---------------------------------------------------------------- workers (each in its own process)


def _contenders(size, tools: tuple[str, ...]):
    import torch
    from eager import eager_module

    import tracer

    module, x = eager_module(*size)
    pipeline = tracer.load(MHA)
    dims = _dims(size)
    state = module.state_dict()  # the eager module's own weights, as a user checks a trained model
    params = {"W_q": state["Wq.weight"], "W_k": state["Wk.weight"], "W_v": state["Wv.weight"]}
    params |= {"W_o": state["out_proj.weight"], "b_o": state["out_proj.bias"]}
    with torch.no_grad():
        same = torch.allclose(pipeline.run(dims, params=params, inputs={"x": x}).outputs["out"], module(x), atol=1e-5)
    if not same:
        raise SystemExit("the traced run with the eager module's weights computes something else")
    calls = {"eager": lambda: module(x), "tracer": lambda: pipeline.run(dims)}
    if not tools:  # the comparisons with other tools time the plain traced run only
        calls["tracer given"] = lambda: pipeline.run(dims, params=params, inputs={"x": x})
    if "torchview" in tools:
        from torchview import draw_graph

        calls["torchview"] = lambda: draw_graph(module, input_data=x, device="cpu", save_graph=False)
    if "torchlens" in tools:
        import torchlens

        calls["torchlens"] = lambda: torchlens.trace(module, x)
    return torch, calls


def worker_speed(size, rounds: int, per_round: int, tools: tuple[str, ...] = (), threads: int | None = None) -> dict:
    """Interleaved per-call times of the eager module and each contender, under no_grad."""
    from measure import interleaved, ratios, times

    torch, calls = _contenders(size, tools)
    if threads:
        torch.set_num_threads(threads)
    with torch.no_grad():
        for call in calls.values():  # warm-up: params created, kernels and allocator warm
            for _ in range(2 if size != TOY else 50):
                call()
        samples = interleaved(calls, rounds, per_round)
    return {
        "threads": torch.get_num_threads(),
        "times": {k: times(v).as_dict() for k, v in samples.items()},
        "ratios": {k: ratios(samples, k, "eager").as_dict() for k in calls if k != "eager"},
        "cpu_ratios": {k: ratios(samples, k, "eager", "cpu").as_dict() for k in calls if k != "eager"},
    }


def _rss_now() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def worker_rss(who: str, size) -> dict:
    """Peak RSS of a process that runs the eager module (or a traced run) twice at ``size``."""
    import resource

    import torch
    from eager import eager_module

    import tracer

    base = _rss_now()
    with torch.no_grad():
        if who == "eager":
            module, x = eager_module(*size)
            for _ in range(2):
                module(x)
        else:
            pipeline = tracer.load(MHA)
            for _ in range(2):
                trace = pipeline.run(_dims(size))
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    result = {"base": base, "peak": peak, "growth": peak - base}
    if who == "tracer":
        result["estimate"] = trace.peak_bytes
    return result


def worker_meta(rounds: int) -> dict:
    """causal_mha at (64, 131072, 8192, 64) on the meta device: a fresh pipeline's first run, and again."""
    import resource

    import torch
    from measure import interleaved, repeated, times

    import tracer

    tracer.load(MHA).run(device="meta")  # warm: torch imports torch._dynamo on its first meta triu (~1 s, once)
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    last = [tracer.load(MHA)]  # the pipeline the latest fresh run loaded, run again by "again"
    last[0].run(_dims(HUGE), device="meta")

    def fresh():
        last[0] = tracer.load(MHA)
        last[0].run(_dims(HUGE), device="meta")

    samples = interleaved({"first": fresh, "again": lambda: last[0].run(_dims(HUGE), device="meta")}, rounds)
    trace = last[0].run(_dims(HUGE), device="meta")
    grown = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss
    start = time.perf_counter()
    try:
        tracer.load(MHA).run(_dims(HUGE))
        refused = False
    except tracer.TracerError:
        refused = True
    guard = time.perf_counter() - start
    out = {
        "first": times(samples["first"]).as_dict(),
        "again": times(samples["again"]).as_dict(),
        "rss_growth_kib": grown,
        "scores": trace["scores"].nbytes,
        "peak": trace.peak_bytes,
        "guard_refused": refused,
        "guard_seconds": guard,
    }
    try:  # torchview on the meta device, for comparison (its own model at the same size)
        from eager import MultiHeadAttention
        from torchview import draw_graph

        B, T, d, H = GPT2
        with torch.device("meta"):
            module = MultiHeadAttention(d, d, T, H, 0.2).eval()
        out["torchview_meta_gpt2"] = repeated(
            lambda: draw_graph(module, input_size=(B, T, d), device="meta", save_graph=False), 3
        ).as_dict()
        start = time.perf_counter()
        tracer.load(MHA).run(_dims(GPT2), device="meta")
        out["tracer_meta_gpt2_first"] = time.perf_counter() - start
    except Exception as exc:  # optional
        out["torchview_meta_error"] = f"{type(exc).__name__}: {exc}"[:200]
    return out


def worker_stack(rounds: int) -> dict:
    """encoder_stack: static check, collapsed render, and the expanded trace against plain torch."""
    import shutil

    import torch
    import torch.nn.functional as F
    from growth import layer_stacks, load_seconds
    from measure import ratios, repeated, times

    import tracer
    from tracer.analysis.shapes import analyze
    from tracer.spec.load import load_spec

    checks = repeated(lambda: analyze(*load_spec(STACK)), rounds)
    analysis = analyze(*load_spec(STACK))
    assert not analysis.errors
    pipeline = tracer.load(STACK)
    collapse = ["layers/*"]
    fmt = "svg" if shutil.which("dot") else "dot"
    with tempfile.TemporaryDirectory() as tmp:
        pipeline.run(device="meta").save(Path(tmp) / f"warm.{fmt}", collapse=collapse)
        renders = repeated(
            lambda: tracer.load(STACK).run(device="meta").save(Path(tmp) / f"stack.{fmt}", collapse=collapse), max(3, rounds // 3)
        )
    with tempfile.TemporaryDirectory() as tmp:
        layers = load_seconds(layer_stacks([192, 384], Path(tmp)), max(5, rounds))
    dims = {"B": 2, "T": 5, "d_model": 8, "H": 2}
    trace = pipeline.run(dims, keep_values=True)
    x = trace["x"].tensor
    for i in range(48):
        p = {
            n: trace[f"layers/{i}/{n}"].tensor
            for n in (
                "W_Q",
                "b_Q",
                "W_K",
                "b_K",
                "W_V",
                "b_V",
                "W_O",
                "b_O",
                "ln1_w",
                "ln1_b",
                "W_1",
                "b_1",
                "W_2",
                "b_2",
                "ln2_w",
                "ln2_b",
            )
        }
        B, T, d = x.shape
        H, Dh = dims["H"], d // dims["H"]
        q, k, v = (F.linear(x, p[f"W_{n}"], p[f"b_{n}"]).reshape(B, T, H, Dh).transpose(1, 2) for n in "QKV")
        ctx = (torch.softmax(q @ k.transpose(-1, -2) / Dh**0.5, -1) @ v).transpose(1, 2).reshape(B, T, d)
        n1 = F.layer_norm(x + F.linear(ctx, p["W_O"], p["b_O"]), (d,), p["ln1_w"], p["ln1_b"])
        x = F.layer_norm(n1 + F.linear(torch.relu(F.linear(n1, p["W_1"], p["b_1"])), p["W_2"], p["b_2"]), (d,), p["ln2_w"], p["ln2_b"])
    correct = bool(torch.allclose(trace["layers"].tensor, x, atol=1e-5))
    return {
        "check": checks.as_dict(),
        "render": renders.as_dict(),
        "render_format": fmt,
        "steps": len(analysis.nodes),
        "records": len(trace.records),
        "correct": correct,
        "load_192": times(layers[192]).median,
        "load_384": times(layers[384]).median,
        "load_ratio": ratios(layers, 384, 192).as_dict(),
    }


def worker_diff(rounds: int) -> dict:
    """``tracer diff`` at 600 steps that pair by position only and at 4,000 renamed chain steps."""
    from diff_growth import diff_seconds

    diff_seconds("renamed chain", 10, 1)  # warm up
    return {"unmatched_600": diff_seconds("unmatched", 600, rounds)[0], "renamed_4000": diff_seconds("renamed chain", 4000, rounds)[0]}


def _run_worker(name: str, *args, timeout: int = 900) -> dict:
    cmd = [sys.executable, __file__, "--worker", json.dumps([name, *args])]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=ROOT)
    if done.returncode != 0:
        raise RuntimeError(f"worker {name} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


TARGET_LINE = re.compile(
    r"^target: (?P<what>.+) (?P<value>[\d.]+(?:x| ms)?) \(target <= (?P<limit>[^)]+)\) (?P<met>met|NOT MET)(?P<note>.*)$"
)


def _script_targets(script: str, *args: str, timeout: int = 1800) -> list[dict]:
    """The ``target:`` lines a benchmark script prints (what, value, limit, met), run in a fresh process."""
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / script), *args], capture_output=True, text=True, timeout=timeout, cwd=ROOT
    )
    if done.returncode != 0:
        raise RuntimeError(f"{script} failed:\n{done.stderr[-3000:]}")
    found = [m.groupdict() for m in map(TARGET_LINE.match, done.stdout.splitlines()) if m]
    if not found:
        raise RuntimeError(f"{script} printed no target line:\n{done.stdout[-3000:]}")
    return found


def _check_all(rounds: int) -> dict:
    """``tracer check`` of every bundled pipeline, wall time of a fresh process with torch unimportable:
    cold (``--no-cache``: every file read, validated and analysed) and cached (every file
    unchanged since the check before, as on an editor's save; the cache in a folder of its own,
    filled once first).

    tracer's modules are byte-compiled first, as a wheel install does (an editable checkout under
    PYTHONDONTWRITEBYTECODE would otherwise compile them in every process, ~25 ms)."""
    compileall.compile_dir(str(ROOT / "tracer"), quiet=1)
    files = sorted(glob.glob(str(ROOT / "pipelines" / "**" / "*.yaml"), recursive=True))
    code = "import sys; sys.modules['torch'] = None; from tracer.cli import main; sys.exit(main(sys.argv[1:]))"
    from measure import repeated

    found = {"files": len(files)}
    with tempfile.TemporaryDirectory() as cache:
        env = {**os.environ, "TRACER_CACHE_DIR": cache}
        for name, options in (("cold", ["--no-cache"]), ("cached", [])):
            argv = [sys.executable, "-c", code, "check", *options, *files]
            done = [subprocess.run(argv, capture_output=True, text=True, cwd=ROOT, env=env)]  # fills the cache
            wall = repeated(functools.partial(_append_run, done, argv, env), rounds)
            found[name] = {"wall": wall.as_dict(), "rc": done[-1].returncode, "stderr": done[-1].stderr[-500:]}
    if found["cold"]["stderr"] != found["cached"]["stderr"]:
        raise RuntimeError(f"the cached check printed otherwise than the cold one:\n{found['cached']['stderr']}")
    return found


def _append_run(done: list, argv: list[str], env: dict) -> None:
    done.append(subprocess.run(argv, capture_output=True, text=True, cwd=ROOT, env=env))


def _available(module: str) -> bool:
    code = f"import {module}"
    return subprocess.run([sys.executable, "-c", code], capture_output=True, cwd=ROOT).returncode == 0


# ---------------------------------------------------------------- the report


def _fmt_time(seconds: float) -> str:
    if seconds < 1e-3:
        return f"{seconds * 1e6:.0f} µs"
    if seconds < 1:
        return f"{seconds * 1e3:.1f} ms" if seconds < 0.1 else f"{seconds * 1e3:.0f} ms"
    return f"{seconds:.2f} s"


def _span(s: dict, fmt=_fmt_time) -> str:
    return f"{fmt(s['median'])} ({fmt(s['min'])}–{fmt(s['max'])})"


def _ratio(s: dict) -> str:
    return f"{s['median']:.2f}× [{s['low']:.2f}–{s['high']:.2f}]"


def _mib(n: float) -> str:
    return f"{n / 2**20:.0f} MiB"


def _machine() -> str:
    cpu = platform.processor() or "unknown CPU"
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    mem = ""
    try:
        with open("/proc/meminfo") as f:
            mem = f"{int(f.readline().split()[1]) / 2**20:.0f} GiB RAM"
    except OSError:
        pass
    import torch

    return (
        f"{cpu}, {os.cpu_count()} cores, {mem}; Linux {platform.release()}; Python {platform.python_version()}; "
        f"torch {torch.__version__} (intra-op threads: {torch.get_num_threads()})"
    )


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--quick", action="store_true", help="fewer rounds (noisier)")
    parser.add_argument("--profile", action="store_true", help="profile a toy-size traced run with pyinstrument and exit")
    # the tracked docs/benchmarks.md changes only when asked (make bench-docs): a run on a machine
    # without torchview/torchlens, or a loaded one, must not rewrite the published numbers
    parser.add_argument(
        "--output", default=str(ROOT / "build" / "benchmarks.md"), help="markdown report (default: build/benchmarks.md; '-': do not write)"
    )
    parser.add_argument("--note", default="", help="a sentence for the report's first line: what else ran on the machine meanwhile")
    args = parser.parse_args(argv)
    if args.worker:
        name, *rest = json.loads(args.worker)
        fn = {"speed": worker_speed, "rss": worker_rss, "meta": worker_meta, "stack": worker_stack, "diff": worker_diff}[name]
        rest = [tuple(r) if isinstance(r, list) and name != "speed" else r for r in rest]
        if name == "speed":
            rest[0], rest[3] = tuple(rest[0]), tuple(rest[3])
        print(json.dumps(fn(*rest)))
        return 0
    if args.profile:
        return _profile()
    return _report(args)


def _profile() -> int:
    import torch
    from pyinstrument import Profiler

    import tracer

    torch.set_num_threads(1)  # as the toy-size benchmark: an idle OpenMP worker otherwise dominates the profile
    pipeline = tracer.load(MHA)
    pipeline.run()
    profiler = Profiler(interval=0.00005)
    with torch.no_grad():
        profiler.start()
        for _ in range(5000):
            pipeline.run()
        profiler.stop()
    print(profiler.output_text(unicode=True, color=False, show_all=False))
    return 0


def _report(args) -> int:
    quick = args.quick
    tools = tuple(t for t in ("torchview", "torchlens") if _available(t))
    rows, notes = [], []
    t0, load_before = time.time(), os.getloadavg()[0]

    def row(target: str, limit: str, measured: str, ok: bool | None, raw: str = ""):
        rows.append((target, limit, measured, "yes" if ok else ("—" if ok is None else "NO"), raw))
        print(f"  {target}: {measured} [{'met' if ok else ('info' if ok is None else 'NOT MET')}] {raw}", flush=True)

    print("tracer benchmarks (each block in a fresh process) ...", flush=True)
    toy = _run_worker("speed", list(TOY), 7 if quick else 15, 200, [], 1)
    r, t = toy["ratios"]["tracer"], toy["times"]
    row(
        "traced causal_mha vs eager, (2, 6, 4, 2)",
        "≤ 1.5×",
        _ratio(r),
        r["median"] <= 1.5,
        f"eager {_span(t['eager'])}, tracer {_span(t['tracer'])}; CPU-time ratio {_ratio(toy['cpu_ratios']['tracer'])}",
    )
    r = toy["ratios"]["tracer given"]
    row(
        "run(params=, inputs=) of causal_mha vs eager, (2, 6, 4, 2)",
        "≤ 1.5×",
        _ratio(r),
        r["median"] <= 1.5,
        f"eager {_span(t['eager'])}, tracer with the eager module's weights and input {_span(t['tracer given'])}; "
        f"CPU-time ratio {_ratio(toy['cpu_ratios']['tracer given'])}",
    )
    gpt = _run_worker("speed", list(GPT2), 5 if quick else 9, 1, [], 0)
    r, t = gpt["ratios"]["tracer"], gpt["times"]
    row(
        "traced causal_mha vs eager, (8, 512, 768, 12)",
        "≤ 1.05×",
        _ratio(r),
        r["median"] <= 1.05,
        f"eager {_span(t['eager'])}, tracer {_span(t['tracer'])}; CPU-time ratio {_ratio(gpt['cpu_ratios']['tracer'])}",
    )
    r = gpt["ratios"]["tracer given"]
    row(
        "run(params=, inputs=) of causal_mha vs eager, (8, 512, 768, 12)",
        "≤ 1.05×",
        _ratio(r),
        r["median"] <= 1.05,
        f"eager {_span(t['eager'])}, tracer with the eager module's weights and input {_span(t['tracer given'])}; "
        f"CPU-time ratio {_ratio(gpt['cpu_ratios']['tracer given'])}",
    )
    peaks = {who: [_run_worker("rss", who, list(GPT2)) for _ in range(2 if quick else 3)] for who in ("eager", "tracer")}
    pe = statistics.median(p["peak"] for p in peaks["eager"])
    pt = statistics.median(p["peak"] for p in peaks["tracer"])
    ge = statistics.median(p["growth"] for p in peaks["eager"])
    gt = statistics.median(p["growth"] for p in peaks["tracer"])
    estimate = peaks["tracer"][0]["estimate"]
    row(
        "peak RSS, traced vs eager, (8, 512, 768, 12)",
        "≤ 1.1×",
        f"{pt / pe:.2f}×",
        pt / pe <= 1.1,
        f"process peak eager {_mib(pe)}, tracer {_mib(pt)}; growth over imports eager {_mib(ge)}, tracer {_mib(gt)} ({gt / ge:.2f}×)",
    )
    row(
        "estimated peak vs measured growth, (8, 512, 768, 12)",
        "info",
        f"{_mib(estimate)} estimated",
        None,
        f"tracer process grew {_mib(gt)} (tensors + allocator + kernels' workspaces)",
    )
    meta = _run_worker("meta", 3 if quick else 7)
    row(
        "meta run of causal_mha at (64, 131072, 8192, 64)",
        "≤ 0.1 s",
        _span(meta["first"]),
        meta["first"]["median"] <= 0.1,
        f"fresh load + analysis + plan + meta params + run; repeated run {_span(meta['again'])}; max RSS grew {meta['rss_growth_kib'] / 1024:.0f} MiB; "
        f"scores {meta['scores'] / 2**40:.1f} TiB, estimated peak {meta['peak'] / 2**40:.1f} TiB",
    )
    row(
        "memory guard at that size (cpu)",
        "refuses",
        "refused" if meta["guard_refused"] else "ran",
        meta["guard_refused"],
        f"TracerError after {_fmt_time(meta['guard_seconds'])}, nothing allocated",
    )
    if "torchview_meta_gpt2" in meta:
        row(
            "torchview on meta vs tracer on meta, (8, 512, 768, 12)",
            "info",
            _span(meta["torchview_meta_gpt2"]),
            None,
            f"tracer first meta run at that size {_fmt_time(meta['tracer_meta_gpt2_first'])}",
        )
    for script, options in (
        ("export_speed.py", ["--rounds", "9" if quick else "21"]),
        ("meta_growth.py", ["--layers", "125", "1000"] if quick else []),
    ):
        for found in _script_targets(script, *options):
            row(f"{found['what']} ({script})", f"≤ {found['limit']}", found["value"], found["met"] == "met", found["note"].lstrip("; "))
    check = _check_all(5 if quick else 9)
    for name, what, note in (
        ("cached", "unchanged since the last check (cached", "as cold; the issue's editor-on-save case, where the target is judged"),
        ("cold", "every file checked (--no-cache", ""),
    ):
        found = check[name]
        row(
            f"tracer check of all {check['files']} bundled pipelines, {what}; torch unimportable)",
            "≤ 0.3 s",
            _span(found["wall"]),
            found["wall"]["median"] <= 0.3,
            f"exit status {found['rc']}" + (f", {note}" if note else ""),
        )
    stack = _run_worker("stack", 5 if quick else 11)
    row(
        "check encoder_stack (48 layers, in process)",
        "≤ 0.1 s",
        _span(stack["check"]),
        stack["check"]["median"] <= 0.1,
        f"{stack['steps']} steps after expansion",
    )
    grown = stack["load_ratio"]
    row(
        "load + check of encoder_stack, 384 layers vs 192",
        "≤ 2.2×",
        _ratio(grown),
        grown["median"] <= 2.2,
        f"192 layers {_fmt_time(stack['load_192'])}, 384 layers {_fmt_time(stack['load_384'])} (medians, torch imported)",
    )
    row(
        f"render encoder_stack, layers collapsed ({stack['render_format']})",
        "≤ 2 s",
        _span(stack["render"]),
        stack["render"]["median"] <= 2,
    )
    row(
        "expanded encoder_stack trace equals plain torch",
        "correct",
        "correct" if stack["correct"] else "WRONG",
        stack["correct"],
        f"{stack['records']} records",
    )
    diffs = _run_worker("diff", 3 if quick else 5)
    row(
        "tracer diff, 600 steps pairing by position / 4,000 renamed chain steps",
        "≤ 2 s each",
        f"{_fmt_time(diffs['unmatched_600'])} / {_fmt_time(diffs['renamed_4000'])}",
        max(diffs.values()) <= 2,
        "pairing is linear (before: cubic, 132 s, and quadratic, 44 s); benchmarks/diff_growth.py shows each doubling",
    )
    for tool in tools:
        for size, label in ((TOY, "(2, 6, 4, 2)"), (GPT2, "(8, 512, 768, 12)")):
            res = _run_worker(
                "speed",
                list(size),
                (5 if size == TOY else 3) if quick else (9 if size == TOY else 7),
                50 if size == TOY else 1,
                [tool],
                1 if size == TOY else 0,
                timeout=1800,
            )
            rt, rtool = res["ratios"]["tracer"], res["ratios"][tool]
            # at GPT-2 size every contender is the kernels (~1.0×): a tie within 2% is all a 2-core box can tell apart
            slack, limit = (1.0, "tracer below it") if size == TOY else (1.02, "tracer ≤ it (±2%)")
            row(
                f"{tool} capture vs eager, {label}",
                limit,
                _ratio(rtool),
                rt["median"] <= rtool["median"] * slack,
                f"tracer {_ratio(rt)} in the same process; raw {tool} {_span(res['times'][tool])}, eager {_span(res['times']['eager'])}",
            )
    if len(tools) < 2:
        notes.append(
            "not installed, skipped: " + ", ".join(t for t in ("torchview", "torchlens") if t not in tools) + " (pip install -e '.[bench]')"
        )
    elapsed = time.time() - t0
    table = _table(rows)
    print("\n" + table)
    for note in notes:
        print(note)
    print(f"\n{sum(r[3] == 'yes' for r in rows)} of {sum(r[3] != '—' for r in rows)} targets met; {elapsed:.0f} s")
    if args.output != "-":
        load = (
            f"{load_before:.1f} when the run started and {os.getloadavg()[0]:.1f} when it ended (1-minute averages, {os.cpu_count()} cores)"
        )
        _write(Path(args.output), table, notes, elapsed, gpt, load, args.note)
    return 0 if all(r[3] != "NO" for r in rows) else 1


def _table(rows) -> str:
    header = ("target", "limit", "measured: median (min–max); ratios: median [95% CI]", "met", "raw numbers")
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(cell.replace("|", "\\|") for cell in r) + " |" for r in rows]
    return "\n".join(lines)


def _write(path: Path, table: str, notes: list[str], elapsed: float, gpt: dict, load: str, note: str = "") -> None:
    text = (
        f"""# Benchmarks

Generated by `make bench-docs` (`benchmarks/run.py --output docs/benchmarks.md`) on {time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}, in {elapsed:.0f} s.{" " + note if note else ""}

**Machine:** {_machine()}.
Toy-size timings use 1 intra-op thread (on 2 shared cores an idle OpenMP worker can stall a
tiny op for milliseconds); GPT-2-size timings use torch's default ({gpt["threads"]} threads).
Eager and traced runs alternate in one process under `torch.no_grad()`, many short rounds in a
rotated order (`benchmarks/measure.py`, the one timing loop of benchmarks/); each ratio is the
median of per-round ratios with its 95% bootstrap interval in brackets, and a target is judged on
that median (a row whose interval straddles the limit says so: this VM's noise could flip it);
growth exponents are fitted to the per-size medians over every size, their interval from
resampled rounds. CPU time (`time.process_time`) is given beside wall time. Each block runs in a
fresh process. The baseline is
tutorial 002's `MultiHeadAttention` (benchmarks/eager.py) in eval mode with the same weight sizes.
The rows marked `(export_speed.py)` and `(meta_growth.py)` are the target lines those scripts print,
each run in a fresh process: transformers' Llama decoder layer (d 2048, T 512, GQA) against the
exported module, `tracer.to_module` and the traced run, with the allocator settled first (see the
script's docstring); shapes-only runs and plan builds of 125 to 1,000 layers at toy and 70B dims.

{table}

"""
        + "".join(f"{n}\n\n" for n in notes)
        + f"""## What dominated (profiled before optimising)

Profiled with cProfile and pyinstrument (`benchmarks/run.py --profile`) on 3000 toy-size runs:

- **Before:** a traced run cost ~2.5× eager (172 µs vs 68 µs). Per run: `_enforce_expectations`
  re-parsed every `expect:` dim expression and `torch.set_rng_state` ran although nothing random
  was planned (together ~70 µs); each of the 26 `TensorRecord`s was built from ~8 torch metadata
  calls plus a frozen-dataclass `__init__` (~3 µs each, ~75 µs). The kernels themselves took
  ~58 µs, less than the eager module (~66 µs, which also pays `nn.Module.__call__` and `mask.bool()`).
- **After:** records are built once per plan from the static analysis; a run only checks that
  torch's tensor has the predicted shape, strides, offset, dtype and storage owner (one weakref per
  new storage) and reuses the record (any difference is recorded as observed); input and param
  records are reused while the cached tensors are the same; expectations are evaluated once per
  analysis and re-checked only when a record diverged; the RNG is restored only for plans with
  training dropout. What remains is the kernels themselves plus ~0.7 µs per record.
- `run(params=, inputs=)` (given tensors, the way a trained model is checked) cost ~2× the plain
  traced run: it drew the other tensors again on every call, and `torch.manual_seed` with them,
  which while CUDA is not initialised queues a lazy `torch.cuda.manual_seed_all` that formats the
  whole stack (`traceback.format_frame_summary` for every frame, and `linecache`'s `stat` of
  each frame's file). The drawn tensors depend only on which names are given, so they are drawn
  once and reused; a given tensor that fits its declaration is accepted with a few attribute reads,
  and what is wrong, and where, is worked out only for one that does not.
- Load and check of a 384-layer stack cost more than twice 192 layers: CPython's collector made
  full passes over every object in the process (torch's included) as the analysis grew, though
  nothing built is garbage. `load_spec` and `analyze` now run with the collector paused
  (`tracer/core/gcpause.py`); `benchmarks/growth.py` prints load + check at 96, 192 and 384 layers.
  The plan build and every run are paused too: full passes of ~0.6 s landed inside 1,000-layer meta
  runs that take 0.2-0.5 s.
- At GPT-2 size the run is the kernels (matmul, softmax, masked_fill on (8, 12, 512, 512)); the
  interpreter frees every tensor, inner ones too, right after its last reader.
- Meta runs: the first meta op of a process loads torch's meta registrations (~0.2 s), and the
  first comparison or `masked_fill` on the meta device makes torch import `torch._dynamo`
  (~0.6 s more); both are once per process, and the meta timing above is taken after them.
  Elementwise meta kernels run through torch's Python reference implementations (~0.3 ms each),
  which is what a 1200-step meta run pays. A repeated block's later copies skip them: they take
  the predicted layouts (`torch.empty_strided`, ~2-6 µs a tensor), and since most of those
  tensors are read by nothing but other predicted steps, only the ones a kernel, an output,
  `observe` or `keep_values` reads are made at all; the rest are recorded from their templates
  (CPU time of a repeated 500-layer run at 70B-class dims: 0.25 → 0.06-0.08 ms a layer).
- The traced Llama layer built RoPE's cos/sin table twice, for q and for k (~2 ms a table at
  T 512, Dh 128 here): a run now builds each table once and gives later steps of equal frequencies,
  positions, size and dtype a copy (their own storage, as the trace predicts), as the exported
  module and transformers share it.
- `tracer check` (a fresh process, 0.43 s before): imports took ~0.28 s of it (networkx ~60 ms,
  pydantic and tracer's models ~90 ms, yaml), YAML loading ~45 ms and the 48-layer stack's
  analysis ~50 ms. Now the networkx graph is built only when a graph algorithm is needed (cycles,
  out-of-order steps, diagrams); symbolic dims hash once and memoize their sums, products and
  texts; dim texts are parsed once; YAML scalar resolution is memoized; step kinds build no
  validator of their own (only PipelineSpec validates them). The row byte-compiles tracer first,
  as a wheel install does. The exit status is 1 because `pipelines/lint_examples/` holds one
  deliberate error example.
- `tracer check` of the whole bundle (~150 files): `benchmarks/startup.py` prints where its CPU
  goes, stage by stage. Reading YAML composed every file's nodes and walked them recording every
  position (~0.3 s CPU here); a file of plain data is now read in one pass over libyaml's events
  and its positions are found only when a diagnostic asks for one (~0.14 s). A view lint divided
  the same dims against each other thousands of times (a third of all lints' time); quotients
  are now kept per process like sums and products. What remains is the floor of one process: the
  imports alone (pydantic ~0.1 s, its ~90 step-kind models ~0.15-0.2 s, the rest ~0.1 s) exceed
  the 0.3 s target, before the ~50 validators the bundle's kinds need and the analysis of 150
  files with 49 lints. So `tracer check` now keeps each file's result, as ruff and mypy do
  (`.tracer_cache/`, [the command line](cli.md)): a file unchanged since its last check, with the
  same options, its blocks unchanged too, prints what it printed then without importing the file
  format, the analysis or PyYAML. That is what an editor's save or a pre-commit hook meets, and
  the target is judged on it (the cached row); the cold row (`--no-cache`) keeps its own verdict.
  A cold check no longer imports what only the other commands need (the runtime, diagrams, the
  diff: ~55 ms), and the 48-layer stack's analysis judges each of the block's view regroupings
  once rather than once per copy (the view-order lint was a quarter of its lints' time).
  A later round cut the cold bundled check by an eighth (4.05 → 3.53 G instructions under
  cachegrind, which a shared machine's load does not move; the same outputs, byte for byte, for
  every bundled file and ~1,400 fuzzed ones): a short scalar is read once per process (one
  dict lookup where a resolve, a construct and a pattern search were), a diagnostic's positions
  come from a walk over the events that records positions only (reading the bundle 0.127 →
  0.088 s, finding every file's positions 0.13 → 0.07 s), the dataclasses made for every step
  (`Meta`, `Dim`, `Node`, `Out`, `Position`) store their fields in `__init__` (`core/frozen.py`;
  a frozen dataclass's `object.__setattr__` per field was a sixth of the analysis' samples), and
  `tracer check` run as the command freezes the ~100,000 objects its imports made out of the
  collector's passes. What is left is flat. The imports (~0.3 s: pydantic and PyYAML ~0.1 s, the
  step kinds' ~90 models ~0.14 s, mostly pydantic's set-up of each model class) would not
  shrink by importing only the kinds a file uses: the bundle uses kinds of 14 of the 15 modules
  that define kinds. The ~50 validators it needs cost ~1.5 ms each (pydantic's schema generation, not
  its Rust validator), and the analysis is spread over the shape pass (~30%), the 49 lints
  (~30%), the graph, the declarations and the 48-layer stack's expansion, none of them more
  than ~10%.

Noise: load average {load}.
Ratios are paired per round, so load hits both sides of a ratio alike; raw times move by up to 2×
between runs on a busy machine.
"""
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    print(f"wrote {path}")


if __name__ == "__main__":
    sys.exit(main())
