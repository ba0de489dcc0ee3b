"""Rank bodies that fail on purpose, for tests/runtime/test_parallel_run.py. A module of their own:
each rank the fork server starts imports the module of the function it runs (and the launcher script
of the SIGKILL test imports it too), and this one imports nothing the fork server has not loaded."""

import time

from tracer.runtime import sharded


def rank_failing_in(step: str, failing: int, failure, rank: int, *args) -> None:
    """``sharded.run_rank`` with ``failure()`` run in ``step`` on rank ``failing``: the launcher's
    body for a test (the ranks are started afresh by the fork server, and import this module)."""
    module_call = sharded._module_call

    def patched(module, step_id, mode):
        call = module_call(module, step_id, mode)
        if step_id != step or rank != failing:
            return call

        def failing_call(*inputs):
            failure()
            return call(*inputs)

        return failing_call

    sharded._module_call = patched
    sharded.run_rank(rank, *args)


def broken():
    raise ValueError("a broken rank")


def hang():
    time.sleep(600)
