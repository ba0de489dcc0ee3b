# Two commands do everything on a fresh clone: `make demo` and `make test`.
VENV    := .venv
PY      := $(VENV)/bin/python
STAMP   := $(VENV)/.installed

# Let Python cache the bytecode of what it imports (in .venv and the checkout's __pycache__ folders):
# some machines set PYTHONDONTWRITEBYTECODE, which would recompile torch in every process.
unexport PYTHONDONTWRITEBYTECODE

.PHONY: install test demo fuzz bench bench-docs schema clean graphviz chromium

install: $(STAMP)

$(STAMP): pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install -q uv==0.13.9
	# everything by uv, which fetches the ~60 packages in parallel: 5 s where pip takes 30 s. torch
	# pinned: on these machines 2.13.0 is a local CPU wheel in pip's find-links folders (given to uv,
	# which unpacks it in 10 s where pip took 20); other specs download gigabytes. Where no such wheel
	# is in pip's find-links (a machine configured otherwise), pip installs torch first, as pip is
	# configured, and uv keeps it. Nothing byte-compiled up front (all of torch costs 40 s): Python
	# compiles what it imports (below, and in the tests: see PYTHONDONTWRITEBYTECODE). compat: a plain
	# .pth, no import hook at startup
	links="$${PIP_FIND_LINKS:-$$($(PY) -m pip config get global.find-links 2>/dev/null)}"; \
	if ls $$links 2>/dev/null | grep -q '^torch-2\.13\.0'; then \
		flags=$$(for dir in $$links; do printf -- '--find-links %s ' "$$dir"; done); \
	else \
		flags=; $(PY) -m pip install -q --no-compile torch==2.13.0; \
	fi; \
	$(VENV)/bin/uv pip install -q --python $(PY) $$flags torch==2.13.0 -e '.[dev,diagrams]' --config-settings editable_mode=compat
	$(PY) -m compileall -q tracer  # bytecode, as a wheel install has: keeps `tracer check` fast where PYTHONDONTWRITEBYTECODE is set
	# and for the torch modules every `tracer run` imports; meanwhile, on another core, for the libraries without torch
	# that the suite's collection imports (sympy alone is 400 files): each pytest-xdist worker compiled them, both at once
	$(PY) -c 'import sympy, networkx, hypothesis, pydantic, huggingface_hub, jinja2, nbclient, yaml, pygments, psutil, graphviz' & \
		libraries=$$!; $(PY) -c 'import torch, tracer.api' && wait $$libraries
	@command -v dot >/dev/null 2>&1 || $(MAKE) --no-print-directory graphviz
	@$(MAKE) --no-print-directory chromium
	touch $(STAMP)

# The Graphviz renderer (`dot`). Debian/Ubuntu as root; elsewhere the `diagrams` extra's graphviz-pure
# (pip, no root) draws SVG and PNG, and tracer finds it in .venv/bin.
graphviz:
	@if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
		(apt-get install -y -qq graphviz >/dev/null 2>&1 || (apt-get update -qq >/dev/null && apt-get install -y -qq graphviz >/dev/null)) \
		&& echo "installed graphviz"; \
	else echo "note: no Graphviz 'dot' (it needs root here): diagrams use graphviz-pure (SVG, PNG); for PDF install Graphviz (see README)."; fi

# Headless Chromium for the HTML report's browser tests (Debian's package; they skip without it).
chromium:
	@command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1 || \
	if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
		(apt-get install -y -qq chromium >/dev/null 2>&1 || (apt-get update -qq >/dev/null && apt-get install -y -qq chromium >/dev/null)) \
		&& echo "installed chromium"; \
	else echo "note: no chromium; the HTML report's browser tests will be skipped (Debian/Ubuntu: apt-get install chromium)."; fi

# Style first (about a second): a lint or format slip fails before any test runs.
test: install chromium
	$(VENV)/bin/ruff check tracer tests benchmarks
	$(VENV)/bin/ruff format --check tracer tests benchmarks
	$(PY) -m pytest -q -n auto --dist loadgroup -m 'dist or not dist'  # every core (pytest-xdist; tests/conftest.py: FORK_SERVER); the wheel check too

demo: install
	$(PY) -m tracer.gallery pipelines docs/gallery

fuzz: install
	$(PY) -m tests.fuzz 10000

bench: install  # the report goes to build/benchmarks.md; `make bench-docs` updates the published docs/benchmarks.md
	$(PY) benchmarks/run.py

bench-docs: install
	$(PY) benchmarks/run.py --output docs/benchmarks.md

schema: install  # docs/format.md, docs/pipeline.schema.json and the copy in the package
	$(PY) -m tracer.docgen docs

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache
