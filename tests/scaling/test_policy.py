"""Scaler thresholds and desired replicas (pure)."""

from __future__ import annotations

import pytest

from scaling.planning.policy import decide, hold_seconds, raw_desired, thresholds
from scaling.planning.types import SLO, Capacity, LoadPoint, PolicyConfig, Signals, Window

CAP = Capacity(
    status="measured",
    slo=SLO(ttft_p95_ms=500.0),
    rps=10.0,
    best=LoadPoint(run_id=12, run_name="run #12", stage="peak"),
    queue_at_breach=10.0,
    kv_at_breach=0.85,
    pending_tokens_at_breach=5000.0,
    explanation="run #12 stage 'peak' …",
)
CONFIG = PolicyConfig(min_replicas=1, max_replicas=8, target=0.8, engine_start_s=95.0)


def sig(rps, *, waiting=0.0, running=4.0, p95_s=0.2, r1=None, r5=None):
    """One replica's signals; ``r1``/``r5``: request rates over the 1- and 5-minute windows."""
    r1 = rps if r1 is None else r1
    r5 = rps if r5 is None else r5
    return Signals(
        arrival_rps=rps,
        requests_waiting=waiting,
        requests_running=running,
        ttft={
            "1m": Window(seconds=60, requests=r1 * 60, p50=p95_s / 2, p95=p95_s),
            "5m": Window(seconds=300, requests=r5 * 300, p50=p95_s / 2, p95=p95_s),
        },
    )


def test_thresholds_come_from_the_capacity_at_the_target():
    t = thresholds(CAP, CONFIG)
    assert t.requests_waiting == 8.0
    assert 0 < t.activation_requests_waiting < t.requests_waiting
    assert t.pending_prompt_tokens == 4000.0
    assert t.requests_per_s == 8.0
    assert t.kv_cache_usage_ratio == 0.85
    assert t.ttft_p95_seconds == 0.5
    assert t.itl_p95_seconds is None
    assert "run #12" in t.evidence and "80 %" in t.evidence.replace("80%", "80 %")


def test_a_small_queue_still_gives_a_threshold_of_one():
    t = thresholds(Capacity(**{**CAP.__dict__, "queue_at_breach": 0.4}), CONFIG)
    assert t.requests_waiting == 1.0


def test_steady_load_within_capacity_is_ok():
    d = decide([sig(7.0)], CAP, current=1, config=CONFIG, recent_raw=[1, 1])
    assert (d.status, d.desired, d.raw_desired) == ("ok", 1, 1)
    assert d.demand_rps == 7.0 and d.forecast_rps == 7.0


def test_scale_up_at_once_with_the_reason():
    d = decide([sig(10.0), sig(11.4)], CAP, current=2, config=CONFIG, recent_raw=[2, 2, 2])
    assert d.raw_desired == 3 and d.desired == 3 and d.status == "under"
    assert d.reason.startswith("3 replicas: 21.4 req/s arriving")
    assert "one replica carries 10.0 req/s at p95 ≤ 500 ms (run #12)" in d.reason
    assert "80%" in d.reason


def test_rising_demand_is_forecast_over_the_engine_start():
    # 1-minute rate 8, 5-minute rate 6: +2 req/s over 120 s, +1.58 over a 95 s start.
    d = decide([sig(8.0, r1=8.0, r5=6.0)], CAP, current=1, config=CONFIG, recent_raw=[])
    assert d.forecast_rps == pytest.approx(8.0 + 2.0 / 120 * 95, abs=0.01)
    assert d.desired == 2
    assert "rising to 9.6 by the time a new replica is ready (engine start 95 s)" in d.reason
    # Falling demand never forecasts below the demand.
    d = decide([sig(4.0, r1=4.0, r5=8.0)], CAP, current=1, config=CONFIG, recent_raw=[])
    assert d.forecast_rps == 4.0


def test_scale_down_waits_for_the_whole_stabilisation_window():
    low = [sig(3.0)]  # one replica would do
    held = decide(low, CAP, current=3, config=CONFIG, recent_raw=[1, 1, 3, 1])
    assert held.desired == 3 and held.raw_desired == 1 and held.status == "ok"
    assert "held at 3" in held.reason
    down = decide(low, CAP, current=3, config=CONFIG, recent_raw=[1, 2, 1])
    assert down.desired == 2 and down.status == "over"  # the window's highest
    # No history yet: nothing proves the demand stayed low.
    assert decide(low, CAP, current=3, config=CONFIG, recent_raw=[]).desired == 3


def test_a_slow_engine_start_holds_replicas_longer_than_the_stabilisation_window():
    """A replica let go is back only after the engine's start time: with a 10-minute start
    the hold is 10 minutes, not the 5 of the stabilisation window."""
    quick = PolicyConfig(stabilisation_s=300.0, engine_start_s=30.0)
    slow = PolicyConfig(stabilisation_s=300.0, engine_start_s=600.0)
    assert hold_seconds(quick) == 300.0 and hold_seconds(slow) == 600.0
    assert hold_seconds(PolicyConfig(stabilisation_s=300.0)) == 300.0
    held = decide([sig(3.0)], CAP, current=3, config=slow, recent_raw=[1, 3])
    assert held.desired == 3
    assert "lower for 600 s" in held.reason and "start time" in held.reason


def test_warm_minimum_covers_todays_demand_and_the_policy_minimum():
    config = PolicyConfig(min_replicas=2, max_replicas=8, target=0.8, engine_start_s=95.0)
    d = decide([sig(1.0)], CAP, current=2, config=config, recent_raw=[1, 1])
    assert d.warm_minimum == 2 and d.desired == 2
    # Demand needing 3 keeps 3 warm even after a long quiet window's lower raw values.
    d = decide([sig(20.0)], CAP, current=3, config=CONFIG, recent_raw=[1, 1])
    assert d.warm_minimum == 3 and d.desired == 3


def test_queue_guardrail_asks_for_one_more():
    d = decide([sig(5.0, waiting=30.0)], CAP, current=1, config=CONFIG, recent_raw=[])
    assert d.raw_desired == 2 and d.desired == 2
    assert "30 waiting" in d.reason


def test_latency_guardrail_only_under_load():
    slow = decide([sig(5.0, p95_s=0.9)], CAP, current=1, config=CONFIG, recent_raw=[])
    assert slow.desired == 2 and "p95 TTFT 900 ms" in slow.reason
    idle = decide([sig(0.0, p95_s=0.9, running=0.0)], CAP, current=1, config=CONFIG, recent_raw=[1])
    assert idle.desired == 1


def test_bounds_clamp_the_desired():
    config = PolicyConfig(min_replicas=1, max_replicas=3, target=0.8, engine_start_s=95.0)
    d = decide([sig(60.0)], CAP, current=2, config=config, recent_raw=[])
    assert d.raw_desired == 8 and d.desired == 3
    assert "capped at max 3" in d.reason
    zero = PolicyConfig(min_replicas=0, max_replicas=3, target=0.8)
    assert decide([sig(0.0, running=0)], CAP, 1, zero, [0, 0]).desired == 0


def test_unknown_without_capacity_or_signals():
    none = Capacity(status="no_evidence", slo=SLO())
    d = decide([sig(5.0)], none, current=2, config=CONFIG, recent_raw=[])
    assert (d.status, d.desired) == ("unknown", 2)
    assert "no finished benchmark" in d.reason
    d = decide([], CAP, current=2, config=CONFIG, recent_raw=[])
    assert (d.status, d.desired) == ("unknown", 2)
    assert "no fresh signals" in d.reason
    assert raw_desired([], CAP, 1, CONFIG) is None
    d = decide([Signals()], CAP, current=1, config=CONFIG, recent_raw=[])
    assert d.status == "unknown" and "no request rate" in d.reason


def test_finished_rate_stands_in_for_the_arrival_rate():
    s = Signals(finished_rps=17.0)
    assert decide([s], CAP, 1, CONFIG, []).desired == 3
