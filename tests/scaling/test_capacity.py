"""Capacity at the SLO from measured load levels (pure)."""

from __future__ import annotations

import pytest

from scaling.planning.capacity import capacity_at_slo, meets
from scaling.planning.types import SLO, Capacity, LoadPoint

SLO_500 = SLO(ttft_p95_ms=500.0)


def stage(name, clients, rps, ttft, *, waiting=None, kv=None, errors=0.0, prompt=None, **kw):
    return LoadPoint(
        run_id=12,
        run_name="run #12",
        stage=name,
        mode="concurrency",
        offered=clients,
        achieved_rps=rps,
        ttft_p95_ms=ttft,
        error_rate=errors,
        waiting_mean=waiting,
        kv_usage_max=kv,
        mean_prompt_tokens=prompt,
        **kw,
    )


def test_measured_between_the_last_good_and_the_first_breaking_level():
    points = [
        stage("warm", 16, 4.0, 150, waiting=0, kv=0.2, prompt=500),
        stage("peak", 48, 9.1, 410, waiting=4, kv=0.6, prompt=500),
        stage("burst", 64, 9.4, 730, waiting=14, kv=0.9, prompt=500),
    ]
    cap = capacity_at_slo(points, SLO_500)
    assert cap.status == "measured"
    assert cap.rps == 9.1
    assert cap.concurrency == 48
    assert cap.best.stage == "peak" and cap.breach.stage == "burst"
    # 500 ms lies 90/320 of the way from 410 to 730 ms.
    share = 90 / 320
    assert cap.queue_at_breach == pytest.approx(4 + 10 * share)
    assert cap.kv_at_breach == pytest.approx(0.6 + 0.3 * share)
    assert cap.pending_tokens_at_breach == pytest.approx((4 + 10 * share) * 500)
    text = cap.explanation
    assert "run #12 stage 'peak' (48 clients): 9.1 req/s at p95 TTFT 410 ms ≤ 500 ms" in text
    assert "stage 'burst'" in text and "730 ms" in text and "14 waiting" in text
    assert "interpolated" in text


def test_the_breach_is_the_lightest_breaking_level_above_the_best():
    points = [
        stage("a", 8, 3.0, 200, waiting=1),
        stage("b", 16, 6.0, 300, waiting=2),
        stage("d", 64, 8.0, 2000, waiting=40),
        stage("c", 32, 7.5, 900, waiting=10),
    ]
    cap = capacity_at_slo(points, SLO_500)
    assert cap.breach.stage == "c"
    assert cap.best.stage == "b"


def test_an_overloaded_open_loop_level_is_above_even_when_it_achieved_less():
    """Same mode: ordered by the offered load (the saturated level achieves less)."""
    good = LoadPoint(
        run_id=1,
        stage="ok",
        mode="rate",
        offered=9,
        achieved_rps=9.0,
        ttft_p95_ms=300,
        running_mean=20.0,
    )
    over = LoadPoint(
        run_id=1, stage="over", mode="rate", offered=14, achieved_rps=8.5, ttft_p95_ms=5000
    )
    cap = capacity_at_slo([over, good], SLO_500)
    assert cap.status == "measured"
    assert cap.breach.stage == "over"
    assert cap.concurrency == 20.0  # open loop: the engine's running mean
    assert cap.queue_at_breach is None  # no gauges: nothing invented


def test_above_tested_when_every_level_met_it():
    cap = capacity_at_slo(
        [stage("a", 8, 3.0, 200, waiting=1), stage("b", 16, 6.0, 300, waiting=3)], SLO_500
    )
    assert cap.status == "above_tested"
    assert cap.rps == 6.0 and cap.breach is None
    assert cap.queue_at_breach == 3
    assert "at least" in cap.explanation


def test_none_meets_when_even_the_lightest_broke_it():
    cap = capacity_at_slo([stage("a", 8, 3.0, 900), stage("b", 16, 4.0, 1900)], SLO_500)
    assert cap.status == "none_meets"
    assert cap.rps is None and cap.best is None
    assert cap.breach.stage == "a"
    assert "lightest" in cap.explanation


def test_no_evidence_without_usable_points():
    assert capacity_at_slo([], SLO_500).status == "no_evidence"
    cap = capacity_at_slo([stage("a", 8, None, None)], SLO_500)
    assert cap.status == "no_evidence"
    assert "1 load level" in cap.explanation


def test_errors_and_itl_break_the_slo_too():
    slo = SLO(ttft_p95_ms=500, itl_p95_ms=50, max_error_rate=0.01)
    assert not meets(stage("a", 8, 3.0, 100, errors=0.05), slo)
    assert not meets(stage("a", 8, 3.0, 100, itl_p95_ms=80), slo)
    assert meets(stage("a", 8, 3.0, 100, itl_p95_ms=40), slo)
    # An ITL the SLO does not set does not count.
    assert meets(stage("a", 8, 3.0, 100, itl_p95_ms=80), SLO_500)
    cap = capacity_at_slo([stage("a", 8, 3.0, 100), stage("b", 16, 6.0, 200, errors=0.2)], slo)
    assert cap.status == "measured" and cap.breach.stage == "b"
    assert "20.0% errors" in cap.explanation


def test_mixed_sources_and_modes_are_compared_by_achieved_rate():
    run = stage("peak", 48, 9.1, 410, waiting=4)
    sweep = LoadPoint(
        source="sweep",
        sweep_id=3,
        run_name="sweep #3 trial 1",
        mode="rate",
        offered=11.0,
        achieved_rps=10.8,
        ttft_p95_ms=480,
    )
    breaking = stage("burst", 96, 11.5, 900, waiting=20)
    cap = capacity_at_slo([run, breaking, sweep], SLO_500)
    assert cap.status == "measured"
    assert cap.best.source == "sweep" and cap.rps == 10.8
    assert cap.concurrency is None  # open-loop best without a running mean
    assert cap.breach.stage == "burst"
    assert "compared by achieved req/s" in cap.explanation
    assert "sweep #3 trial 1" in cap.explanation


def test_round_trips_as_a_dict():
    cap = capacity_at_slo(
        [stage("a", 8, 3.0, 200, waiting=1), stage("b", 16, 6.0, 800, waiting=9)], SLO_500
    )
    assert Capacity.from_dict(cap.as_dict()) == cap
