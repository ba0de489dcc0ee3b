"""Generated code is built, not pasted: no pipeline text can change how Python reads an exported
module (PEP 263 coding declarations, identifiers, nn.Module's own names), and two YAML names never
land on one Python name. Every case either exports to a module equal to its run, or is refused with
a located `export-name` error."""

from __future__ import annotations

import io
import json
import subprocess
import sys
import textwrap
import tokenize

import pytest
import torch

import tracer
from tests.exporting import assert_module_equals_trace, load_module
from tracer.presentation.export import export_source

SMALL = """\
name: {name}
description: {description}
dims: {{B: 1, T: 2}}
inputs:
  x: {{shape: [B, T], init: randn}}
steps:
  - {{id: y, op: softmax, input: x, dim: -1}}
"""

# (file name, name, description): Python reads `coding[:=]` from lines 1-2 and decodes the whole file
# with it; unicode_escape and raw_unicode_escape turn a written `\n` into a newline, utf-7 turns `+AAo-`
# into one with no backslash at all.
COOKIES = {
    "unicode_escape in the name": ("p.yaml", "'coding:unicode_escape'", r'''"\\nopen('PWNED','w')"'''),
    "utf-7 in the name, no backslash": ("p.yaml", "'x coding=utf-7 '", '''"+AAo-open('PWNED','w')+AAo-#"'''),
    "vim modeline in the description": ("p.yaml", "ok", '''"vim: set fileencoding=utf-7 : +AAo-open('PWNED','w')+AAo-#"'''),
    "the file name declares it": ("coding=raw_unicode_escape .yaml", "ok", r'''"\\u000aopen('PWNED','w')"'''),
    "emacs spelling": ("p.yaml", "'-*- coding: utf-7 -*-'", '''"+AAo-open('PWNED','w')+AAo-#"'''),
    "both lines": ("p.yaml", "'# coding=utf-7'", '''"# -*- coding: unicode_escape -*-\\n+AAo-open('PWNED','w')"'''),
}


def _exported(folder, case: str) -> str:
    file, name, description = COOKIES[case]
    (folder / file).write_text(SMALL.format(name=name, description=description))
    return export_source(tracer.load(folder / file))


@pytest.mark.parametrize("case", COOKIES, ids=list(COOKIES))
def test_no_pipeline_text_declares_the_modules_encoding(tmp_path, case):
    encoding, first_lines = tokenize.detect_encoding(io.BytesIO(_exported(tmp_path, case).encode()).readline)
    assert encoding == "utf-8" and not any(tokenize.cookie_re.match(line.decode()) for line in first_lines)


@pytest.mark.long
def test_python_imports_every_such_module_as_utf8_and_runs_no_text(tmp_path):
    """What the cookie would change is how Python reads the file: each case's module is imported by
    a fresh Python (one for all the cases: each start imports torch)."""
    names = []
    for i, case in enumerate(COOKIES):
        (tmp_path / f"case{i}").mkdir()
        (tmp_path / f"m{i}.py").write_text(_exported(tmp_path / f"case{i}", case))
        names.append(f"m{i}")
    script = f"import {', '.join(names)}; print([len(m.__all__) for m in ({', '.join(names)},)])"
    done = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == str([1] * len(COOKIES))
    assert not list(tmp_path.rglob("PWNED*"))


def test_user_text_reaches_the_source_only_in_comments_and_string_literals(tmp_path):
    """Every token that carries the pipeline's name or description is a comment, a string, or the
    class name (letters and digits only)."""
    marker = "ZZmarkZZ"
    path = tmp_path / "p.yaml"
    name, description = marker + ' ")\\nimport os #', marker + "'''\\u2028x=1\"\"\"\\\\"
    path.write_text(SMALL.format(name=json.dumps(name), description=json.dumps(description)))  # JSON is YAML
    source = export_source(tracer.load(path))
    tokens = list(tokenize.generate_tokens(io.StringIO(source).readline))
    carriers = [t for t in tokens if marker in t.string]
    assert {t.type for t in carriers} == {tokenize.COMMENT, tokenize.STRING, tokenize.NAME}
    assert all(t.string.isalnum() for t in carriers if t.type == tokenize.NAME)


BLOCKS = {
    "blocks/b.yaml": "name: b\ndims: {D: 3}\ninputs:\n  h: {shape: [2, D], init: randn}\nparams:\n  b: {shape: [D], init: ones}\nsteps:\n  - {id: o, op: add, inputs: [h, b]}\n",
    "blocks/b2.yaml": "name: b2\ndims: {n: 1}\ninputs:\n  h: {shape: [2, 3], init: randn}\nsteps:\n  - {id: o, op: scale, input: h, divide: {sqrt: n}}\n",
    "blocks/b3.yaml": "name: b3\ninputs:\n  h: {shape: [2, 3], init: randn}\n  g: {shape: [2, 3], init: randn}\nsteps:\n  - {id: o, op: add, inputs: [h, g]}\n",
    "blocks/attn.yaml": "name: attn\ndims: {D: 3}\ninputs:\n  h: {shape: [2, D], init: randn}\nsteps:\n  - {id: o, op: softmax, input: h, dim: -1}\n",
    "blocks/held.yaml": "name: held\ndims: {D: 3}\ninputs:\n  h: {shape: [2, D], init: randn}\n  g: {shape: [D], init: randn}\nparams:\n  layer.w: {shape: [D], init: randn}\nsteps:\n  - {id: o, op: add, inputs: [h, layer.w]}\n  - {id: p, op: add, inputs: [o, g]}\n",
}
# a param under a block's path that the block is handed (T5's first layer holds the bias every layer reads)
HELD = "dims: {{D: 3}}\ninputs:\n  x: {{shape: [2, D], init: randn}}\nparams:\n  n.w: {{shape: [D], init: randn}}\n  {param}: {{shape: [D], init: randn}}\nsteps:\n  - {{id: enc.a, op: block, use: blocks/held.yaml, inputs: [x, {param}]{repeat}}}\n"

# Each pipeline is valid; in each, two YAML names could land on one Python name, or a name the
# generated code needs (nn.Module's own attributes, a loop variable, a class, a helper) is shadowed.
COLLISIONS = {
    "dim head vs dim dim_head": "dims: {head: 4, dim_head: 9}\ninputs:\n  x: {shape: [2, 3], init: randn}\nparams:\n  head: {shape: [3], init: randn}\nsteps:\n  - {id: y, op: add, inputs: [x, head]}\n  - {id: z, op: scale, divide: {sqrt: head}}\n",
    "dim head vs param dim_head": "dims: {head: 4}\ninputs:\n  x: {shape: [2, 3], init: randn}\nparams:\n  head: {shape: [3], init: randn}\n  dim_head: {shape: [], init: full, value: 9.0}\nsteps:\n  - {id: y, op: add, inputs: [x, head]}\n  - {id: z, op: scale, divide: {sqrt: head}}\n",
    "dim training": "dims: {training: 4}\ninputs:\n  x: {shape: [2, 3], init: randn}\nsteps:\n  - {id: z, op: scale, input: x, divide: {sqrt: training}}\n",
    "dim bound vs param bound_2": "dims: {bound: 4}\ninputs:\n  x: {shape: [2, 3], init: randn}\nparams:\n  bound_2: {shape: [], init: full, value: 9.0}\n  w: {shape: [3, 3], init: linear}\nsteps:\n  - {id: z, op: scale, input: x, divide: {sqrt: bound}}\n  - {id: l, op: linear, input: z, weight: w}\n",
    "param a.b vs block a": "dims: {D: 3}\ninputs:\n  x: {shape: [2, D], init: randn}\nparams:\n  a.b: {shape: [D], init: randn}\nsteps:\n  - {id: y, op: add, inputs: [x, a.b]}\n  - {id: a, op: block, use: blocks/b.yaml, input: y}\n",
    "param __w (name mangling)": "dims: {D: 3}\ninputs:\n  x: {shape: [2, D], init: randn}\nparams:\n  __w: {shape: [D], init: randn}\nsteps:\n  - {id: y, op: add, inputs: [x, __w]}\n",
    "dim _ in a repeat": "dims: {_: 4}\ninputs:\n  x: {shape: [2, 3], init: randn}\nsteps:\n  - {id: a, op: block, use: blocks/b2.yaml, input: x, repeat: 3, dims: {n: _}}\n",
    "input _ in a shared loop": "inputs:\n  x: {shape: [2, 3], init: randn}\n  _: {shape: [2, 3], init: randn}\nsteps:\n  - {id: a, op: block, use: blocks/b3.yaml, inputs: [x, _], repeat: 3, share_params: true}\n",
    "dim named like a block class": "dims: {Attn: 3}\ninputs:\n  x: {shape: [2, Attn], init: randn}\nsteps:\n  - {id: a, op: block, use: blocks/attn.yaml, input: x, dims: {D: Attn}}\n",
    "dim a vs dim dim_a with block a": "dims: {a: 4, dim_a: 9}\ninputs:\n  x: {shape: [2, 3], init: randn}\nsteps:\n  - {id: a, op: block, use: blocks/b2.yaml, input: x}\n  - {id: z, op: scale, divide: {sqrt: a}}\n",
    "dim _modules": "dims: {_modules: 3}\ninputs:\n  x: {shape: [2, _modules], init: randn}\nsteps:\n  - {id: y, op: softmax, input: x, dim: -1}\n",
    "param forward": "inputs:\n  x: {shape: [2, 3], init: randn}\nparams:\n  forward: {shape: [3], init: randn}\nsteps:\n  - {id: y, op: add, inputs: [x, forward]}\n",
    "param training": "inputs:\n  x: {shape: [2, 3], init: randn}\nparams:\n  training: {shape: [3], init: randn}\nsteps:\n  - {id: y, op: add, inputs: [x, training]}\n",
    "names of the module's imports and helpers": "dims: {torch: 3, F: 2, math: 4, nn: 5, linear_bound: 6, seed: 7, generator: 8, self: 9}\ninputs:\n  x: {shape: [F, torch], init: randn}\nparams:\n  w: {shape: [torch, torch], init: linear}\nsteps:\n  - {id: l, op: linear, input: x, weight: w}\n  - {id: z, op: scale, divide: {sqrt: math * nn * linear_bound * seed * generator * self}}\n",
    "keywords and builtins as ids": "dims: {D: 3}\ninputs:\n  x: {shape: [2, D], init: randn}\nsteps:\n  - {id: 'True', op: softmax, input: x, dim: -1}\n  - {id: print, op: scale, input: 'True', multiply: 2.0}\n  - {id: range, op: add, inputs: [print, x]}\n  - {id: super, op: tanh, input: range}\n",
    "param in a repeated block's first copy": HELD.format(param="enc.a.0.layer.bias", repeat=", repeat: 2"),
    "param in a block beside its own": HELD.format(param="enc.a.extra.bias", repeat=""),
    "param on a block copy's own param": HELD.format(param="enc.a.1.layer.w", repeat=", repeat: 2"),
    "param past a repeated block's copies": HELD.format(param="enc.a.2.bias", repeat=", repeat: 2"),
    "param on a block's holder of params": HELD.format(param="enc.a.layer", repeat=""),
    "param on a block's nn.Module attribute": HELD.format(param="enc.a.0.training.b", repeat=", repeat: 2"),
    "param under another param a block holds": HELD.format(param="enc.a.0.extra", repeat=", repeat: 2").replace(
        "params:\n", "params:\n  enc.a.0.extra.b: {shape: [D], init: randn}\n"
    ),
    "step ids shadowing locals": "dims: {D: 3}\ninputs:\n  x: {shape: [2, D], init: randn}\nsteps:\n  - {id: B, op: softmax, input: x, dim: -1}\n  - {id: D, op: scale, input: B, divide: {sqrt: D}}\n",
}


def _write_case(folder, body: str):
    for name, text in BLOCKS.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text(text)
    (folder / "p.yaml").write_text(f"name: case\nseed: 3\n{body}")
    return folder / "p.yaml"


@pytest.mark.parametrize("case", COLLISIONS, ids=list(COLLISIONS))
def test_export_names_never_collide(tmp_path, case):
    pipeline = tracer.load(_write_case(tmp_path, COLLISIONS[case]))
    try:
        source = export_source(pipeline)
    except tracer.TracerError as error:  # refusing, located, is fine: renaming a param would break its state_dict key
        (diagnostic,) = error.diagnostics
        assert diagnostic.code == "export-name" and diagnostic.position.line > 0 and diagnostic.file.endswith("p.yaml"), error
        return
    module = load_module(source)
    cls = getattr(module, module.__all__[0])
    trace = pipeline.run(keep_values=True)
    params = trace.analysis.pipeline.params
    state = cls(seed=3).state_dict()
    assert state.keys() == {n.replace("/", ".") for n in params}  # the state_dict keys are the param ids
    assert all(torch.equal(state[n.replace("/", ".")], trace[n].tensor) for n in params)
    assert_module_equals_trace(cls(), trace)


@pytest.mark.parametrize(
    ("case", "holder"),
    [("param in a repeated block's first copy", ("enc", "a", "0", "layer")), ("param in a block beside its own", ("enc", "a", "extra"))],
)
def test_a_param_under_a_block_is_held_by_the_blocks_modules(tmp_path, case, holder):
    """As T5's first layer holds the bias every layer reads: the state_dict key is the param's id,
    the attribute path is that key, and the block's own params sit beside it."""
    pipeline = tracer.load(_write_case(tmp_path, COLLISIONS[case]))
    module = load_module(export_source(pipeline))
    made = getattr(module, module.__all__[0])(seed=3)
    owner = made
    for part in holder:
        owner = getattr(owner, part)
    assert isinstance(owner.bias, torch.nn.Parameter)
    assert torch.equal(made.state_dict()[".".join((*holder, "bias"))], pipeline.run(keep_values=True)[".".join((*holder, "bias"))].tensor)


@pytest.mark.parametrize(
    "case",
    [
        "param on a block copy's own param",
        "param past a repeated block's copies",
        "param on a block's holder of params",
        "param on a block's nn.Module attribute",
        "param under another param a block holds",
    ],
)
def test_a_param_under_a_block_that_meets_the_blocks_own_attributes_is_refused(tmp_path, case):
    with pytest.raises(tracer.TracerError) as raised:
        export_source(tracer.load(_write_case(tmp_path, COLLISIONS[case])))
    (diagnostic,) = raised.value.diagnostics
    refused = diagnostic.message.split("'")[1]  # param 'enc.a.1.layer.w' cannot be ...
    line = _write_case(tmp_path, COLLISIONS[case]).read_text().splitlines().index(f"  {refused}: {{shape: [D], init: randn}}") + 1
    assert diagnostic.code == "export-name" and diagnostic.file.endswith("p.yaml") and diagnostic.position.line == line


def test_exported_constructors_leave_the_global_random_stream_alone(tmp_path):
    body = textwrap.dedent(
        """\
        dims: {D: 4}
        inputs:
          x: {shape: [2, D], init: randn}
        params:
          w: {shape: [D, D], init: linear}
          u: {shape: [D], init: randn, seed: 11}
        steps:
          - {id: l, op: linear, input: x, weight: w}
          - {id: y, op: add, inputs: [l, u]}
        """
    )
    pipeline = tracer.load(_write_case(tmp_path, body))
    cls = getattr(module := load_module(export_source(pipeline)), module.__all__[0])
    torch.manual_seed(0)
    before = torch.get_rng_state()
    assert torch.equal(cls(seed=3).w, cls(seed=3).w)  # a seed: the traced run's params, from a private generator
    assert torch.equal(torch.get_rng_state(), before)
    assert torch.equal(cls(seed=3).w, pipeline.run(seed=3, keep_values=True)["w"].tensor)
    torch.manual_seed(0)
    first, second = cls(), cls()  # no seed: PyTorch's own initialisation, as nn.Linear does it
    assert not torch.equal(first.w, second.w)
    torch.manual_seed(0)
    assert torch.equal(cls().w, first.w)
    assert torch.equal(cls().u, cls(seed=9).u)  # the file's own seed for `u` holds either way
