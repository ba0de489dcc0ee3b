"""tracer's tests (a package, so `python -m tests.fuzz` runs and tests import `tests.conftest`)."""
