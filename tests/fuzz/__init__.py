"""Fuzz the whole pipeline: hostile and mutated files must end in a success or a located TracerError.

``python -m tests.fuzz N [--seed S] [--start I]`` runs cases I .. I+N-1 (``make fuzz`` runs 10,000).
Every case is a file written to a scratch folder and taken through everything a user can reach:
``load_spec`` → ``analyze`` at the declared dims → (when valid) a run on ``device="meta"``, its
table, JSON and DOT, and for small pipelines a real CPU run with values; some cases also go
through the CLI (``tracer check`` and ``tracer run --json``), and some re-run at degenerate
``--dim`` overrides (0, 1, huge).

The oracle: nothing but ``TracerError`` may escape, every line of its message (and of every
diagnostic) starts ``FILE:LINE:COL:`` or ``FILE:``, the CLI never exits 3, and no case takes longer
than ``CASE_SECONDS`` of CPU time (a hang). Case ``i`` of seed ``S`` is generated from ``random.Random(f"S:i")``,
so ``python -m tests.fuzz 1 --seed S --start i --show`` replays any reported case.

The generators take any ``random.Random``-like object, so ``tests/fuzz/test_fuzz.py`` drives the very
same code from hypothesis (``st.randoms()``) for CI.

Modules: ``pools`` (hostile values, keys, the bundled pipelines), ``mutations`` (edits of a document
or its text), ``generators`` (the strategies, each ``rng -> bytes``), ``oracle`` (``run_case``:
one file through everything, judged), ``driver`` (``campaign`` and the command line).
"""
