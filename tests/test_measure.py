"""benchmarks/measure.py, the statistics every benchmark target is judged on, on made-up timings."""

from __future__ import annotations

import pytest

from benchmarks.measure import Sample, growth, interleaved, ratios, summary, target_line


def _samples(seconds: list[float]) -> list[Sample]:
    return [Sample(s, s / 2, 0) for s in seconds]


def test_ratios_are_paired_per_round_and_judged_on_their_median():
    """Load that slows a whole round (both sides alike) leaves the per-round ratio alone, where a
    ratio of the two sides' medians would follow whichever rounds were slow for one side."""
    load = [1.0, 3.0, 1.0, 3.0, 1.0, 3.0, 1.0]
    samples = {"eager": _samples([10 * f for f in load]), "traced": _samples([10.2 * f for f in load])}
    found = ratios(samples, "traced", "eager")
    assert found.median == pytest.approx(1.02) and found.low == pytest.approx(1.02) and found.high == pytest.approx(1.02)
    assert ratios(samples, "traced", "eager", "cpu").median == pytest.approx(1.02)
    line = target_line("traced vs eager", found, 1.05, "x")
    assert line.startswith("target: traced vs eager 1.020x (target <= 1.05x) met; 95% CI 1.020x-1.020x")


def test_an_interval_that_straddles_the_limit_says_so():
    noisy = summary([0.95, 0.98, 1.0, 1.01, 1.04, 1.09, 0.97, 1.03, 1.06])
    assert noisy.low < 1.02 < noisy.high and noisy.q1 <= noisy.median <= noisy.q3
    assert "NOT MET" not in target_line("x", noisy, 1.02, "x") and "straddles the limit" in target_line("x", noisy, 1.02, "x")
    assert target_line("x", summary([1.5, 1.6, 1.7]), 1.02, "x").split(") ", 1)[1].startswith("NOT MET;")


def test_growth_is_the_slope_over_every_size_of_the_per_size_medians():
    """Quadratic timings fit 2.0 although another process slowed the largest size in one round
    (a fit to the endpoints of that round says 2.8); the interval and the quartiles show it."""
    sizes = [125, 250, 500, 1000]
    slowed = {(1000, 2): 5.0}
    found = growth({n: _samples([(n / 1000) ** 2 * slowed.get((n, r), 1.0) for r in range(5)]) for n in sizes})
    assert found.median == pytest.approx(2.0) and found.low == pytest.approx(2.0) and found.n == 5
    assert found.max > 2.5 and found.q3 == pytest.approx(2.0)
    assert growth({n: _samples([n * 1e-6] * 3) for n in sizes}, "cpu").median == pytest.approx(1.0)


def test_interleaved_rotates_the_order_each_round():
    order = []
    samples = interleaved({name: (lambda name=name: order.append(name)) for name in "abc"}, rounds=3, per_round=2)
    assert order == ["a", "a", "b", "b", "c", "c", "b", "b", "c", "c", "a", "a", "c", "c", "a", "a", "b", "b"]
    assert all(len(v) == 3 and all(s.wall >= 0 and s.cpu >= 0 for s in v) for v in samples.values())
