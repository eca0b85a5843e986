"""Max load at SLO on synthetic monotone measures: bisection and the step walk of real trials."""

import pytest

from benchmarks.sweep import Slo, bisect_max_load, step_search

SLO = Slo(ttft_p95_ms=500)


def threshold_measure(limit: float, calls: list | None = None):
    """TTFT grows with load and crosses 500 ms exactly at ``limit``."""

    def measure(load):
        if calls is not None:
            calls.append(load)
        return {"ttft_p95_ms": 500 * load / limit, "error_rate": 0.0}

    return measure


def test_bisect_finds_the_threshold_within_tolerance():
    result = bisect_max_load(threshold_measure(37.0), SLO, low=1, high=100, rel_tol=0.03)
    assert result.best is not None and result.best.ok
    assert 37.0 * 0.97 <= result.best.load <= 37.0
    assert result.closest is None and "highest load meeting the SLO" in result.note
    assert len(result.probes) <= 12


def test_bisect_integer_loads():
    result = bisect_max_load(threshold_measure(21.0), SLO, low=1, high=200, integer=True)
    assert result.best.load == 21 and all(isinstance(p.load, int) for p in result.probes)


def test_bisect_all_fail_gives_the_closest():
    result = bisect_max_load(threshold_measure(0.5), SLO, low=1, high=100)
    assert result.best is None and result.closest.load == 1
    assert result.closest.margin == pytest.approx(-1.0)
    assert "no load from 1 to 100" in result.note and len(result.probes) == 3


def test_bisect_limited_by_high():
    result = bisect_max_load(threshold_measure(500), SLO, low=1, high=100)
    assert result.best.load == 100 and len(result.probes) == 1
    assert "the limit is above it" in result.note


def test_bisect_measures_low_only_when_the_middle_misses():
    calls = []
    bisect_max_load(threshold_measure(80.0, calls), SLO, low=1, high=100)
    assert calls[:2] == [100, 50.5] and 1 not in calls
    calls.clear()
    bisect_max_load(threshold_measure(20.0, calls), SLO, low=1, high=100)
    assert calls[:3] == [100, 50.5, 1]


def test_bisect_respects_max_steps():
    result = bisect_max_load(threshold_measure(37.3), SLO, low=1, high=1000, max_steps=4)
    assert len(result.probes) == 4 and result.best.ok and "stopped after 4" in result.note


def test_step_search_walks_up_then_bisects():
    calls = []
    result = step_search(
        threshold_measure(40.0, calls), SLO, start=20, min_load=1, max_load=500, max_steps=6
    )
    assert len(calls) <= 6 and len(set(calls)) == len(calls)
    assert calls[:4] == pytest.approx([20, 25, 31.25, 39.0625])  # up by 1.25 while met
    assert result.best.ok and result.best.load <= 40.0
    assert min(p.load for p in result.probes if not p.ok) > 40.0


def test_step_search_walks_down():
    calls = []
    result = step_search(
        threshold_measure(10.0, calls), SLO, start=20, min_load=1, max_load=500, max_steps=6
    )
    assert calls[:2] == [20, 16] and len(calls) == 6  # 20, 16, 12.8, 10.24 missed; 8.19 met
    assert result.best.ok and 8 < result.best.load <= 10.0


def test_step_search_bounds_and_steps():
    calls = []
    result = step_search(
        threshold_measure(1000.0, calls), SLO, start=20, min_load=1, max_load=30, max_steps=6
    )
    assert result.best.load == 30 and "highest load allowed" in result.note
    calls.clear()
    result = step_search(
        threshold_measure(0.1, calls), SLO, start=2, min_load=1, max_load=30, max_steps=6
    )
    assert result.best is None and result.closest is not None and calls[-1] == 1
    calls.clear()
    result = step_search(
        threshold_measure(1e6, calls), SLO, start=1, min_load=1, max_load=1e9, max_steps=3
    )
    assert len(calls) == 3 and "without finding its limit" in result.note


def test_step_search_integer_never_repeats_a_load():
    calls = []
    result = step_search(
        threshold_measure(3.0, calls), SLO, start=2, integer=True, min_load=1, max_load=64
    )
    assert len(set(calls)) == len(calls) and result.best.load == 3


def test_step_search_lets_exceptions_through():
    def cancelled(load):
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        step_search(cancelled, SLO, start=5, min_load=1, max_load=10)
