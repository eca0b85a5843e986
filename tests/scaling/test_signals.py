"""Snapshots over time → live signals: 1- and 5-minute percentile windows from bucket
deltas, rates over the last minute across an engine restart, arrivals including the queue's
growth, the pending prompt tokens estimate with its basis, and too little history."""

from __future__ import annotations

from pathlib import Path

import pytest

from scaling.planning.expo import parse_snapshot
from scaling.planning.signals import compute
from scaling.planning.types import Signals

LE = [0.1, 0.5, 1.0, 5.0]
T0 = 1_700_000_000.0


def snap(
    *,
    waiting=0.0,
    running=0.0,
    kv=0.1,
    finished=0.0,
    prompt=0.0,
    generation=0.0,
    preemptions=0.0,
    ttft=(0, 0, 0, 0),
    ttft_count=None,
    prompt_len=None,
    engine="vllm",
):
    """A snapshot as ``parse_snapshot`` makes it; ``ttft`` cumulative counts per bound."""
    hists = {
        "ttft": {
            "le": LE,
            "counts": [float(c) for c in ttft],
            "count": float(ttft[-1] if ttft_count is None else ttft_count),
            "sum": 0.0,
        },
        "itl": {"le": LE, "counts": [0.0] * 4, "count": 0.0, "sum": 0.0},
    }
    if prompt_len is not None:  # (sum, count)
        hists["prompt_len"] = {
            "le": [100.0, 1000.0, 10000.0],
            "counts": [0.0, prompt_len[1], prompt_len[1]],
            "count": prompt_len[1],
            "sum": prompt_len[0],
        }
    counters = {"requests_finished": finished, "prompt_tokens": prompt}
    counters["generation_tokens"] = generation
    if engine == "vllm":
        counters["preemptions"] = preemptions
    return {
        "engine": engine,
        "gauges": {"waiting": waiting, "running": running, "kv_cache_usage": kv},
        "counters": counters,
        "histograms": hists,
        "missing": [],
    }


def test_gauges_come_from_the_newest_snapshot():
    s = compute([(T0, snap(waiting=1, running=2, kv=0.2)), (T0 + 1, snap(waiting=7, kv=0.6))])
    assert (s.requests_waiting, s.requests_running, s.kv_cache_usage_ratio) == (7, 0, 0.6)
    assert s.at == T0 + 1 and s.engine == "vllm"


def test_windows_are_bucket_deltas_over_1_and_5_minutes():
    # Every 10 s for 6 minutes: 10 fast TTFTs (≤ 0.1 s) per step until the last minute,
    # then 10 slow ones (1–5 s) per step.
    snaps, fast, slow = [], 0, 0
    for step in range(37):
        t = T0 + 10 * step
        if step > 0:
            if t > T0 + 300:
                slow += 10
            else:
                fast += 10
        snaps.append((t, snap(ttft=(fast, fast, fast, fast + slow))))
    s = compute(snaps)
    one, five = s.ttft["1m"], s.ttft["5m"]
    assert one.seconds == 60 and one.requests == 60
    assert 1.0 < one.p50 <= 5.0 and 1.0 < one.p95 <= 5.0  # only slow ones in the minute
    assert five.seconds == 300 and five.requests == 300  # 240 fast + 60 slow
    assert five.p50 <= 0.1 and 1.0 < five.p95 <= 5.0
    assert s.itl["1m"].requests == 0 and s.itl["1m"].p95 is None


def test_with_less_history_the_window_covers_what_there_is():
    s = compute([(T0, snap()), (T0 + 20, snap(ttft=(4, 4, 4, 4)))])
    assert s.ttft["1m"].seconds == 20 and s.ttft["5m"].seconds == 20
    assert s.ttft["5m"].requests == 4 and s.ttft["5m"].p50 == pytest.approx(0.05)


def test_rates_over_the_last_minute():
    s = compute(
        [
            (T0, snap(finished=0, prompt=0, generation=0)),  # older than the minute
            (T0 + 40, snap(finished=100, prompt=50_000, generation=9_000, preemptions=3)),
            (T0 + 100, snap(finished=160, prompt=80_000, generation=21_000, preemptions=9)),
        ]
    )
    assert s.finished_rps == pytest.approx(1.0)
    assert s.input_tokens_per_s == pytest.approx(500.0)
    assert s.output_tokens_per_s == pytest.approx(200.0)
    assert s.preemptions_per_s == pytest.approx(0.1)


def test_a_counter_that_went_down_is_an_engine_restart_not_a_negative_rate():
    s = compute(
        [
            (T0, snap(finished=1000, generation=50_000, ttft=(10, 10, 10, 10))),
            (T0 + 30, snap(finished=1030, generation=51_500, ttft=(40, 40, 40, 40))),
            # restarted: counting again from zero
            (T0 + 40, snap(finished=5, generation=100, ttft=(0, 5, 5, 5))),
            (T0 + 60, snap(finished=25, generation=1_100, ttft=(0, 25, 25, 25))),
        ]
    )
    assert s.finished_rps == pytest.approx((30 + 5 + 20) / 60)
    assert s.output_tokens_per_s == pytest.approx((1_500 + 100 + 1_000) / 60)
    one = s.ttft["1m"]
    # 30 fast ones before the restart, 25 in (0.1, 0.5] after it
    assert one.requests == 55
    assert one.p50 <= 0.1 < one.p95 <= 0.5


def test_histogram_bounds_that_change_restart_the_window():
    before = snap(ttft=(3, 3, 3, 3))
    after = snap(ttft=(0, 2, 2, 2))
    after["histograms"]["ttft"] = {"le": [0.2, 2.0], "counts": [2.0, 2.0], "count": 2.0, "sum": 0}
    s = compute([(T0, before), (T0 + 10, after)])
    assert s.ttft["1m"].requests == 2 and s.ttft["1m"].p95 <= 0.2


def test_arrivals_are_finished_plus_the_growth_of_the_queue():
    s = compute(
        [
            (T0, snap(waiting=0, running=4, finished=0)),
            (T0 + 60, snap(waiting=30, running=8, finished=60)),
        ]
    )
    assert s.finished_rps == pytest.approx(1.0)
    assert s.arrival_rps == pytest.approx(1.0 + 34 / 60)


def test_arrivals_never_go_negative():
    s = compute([(T0, snap(waiting=90, finished=0)), (T0 + 60, snap(waiting=0, finished=6))])
    assert s.arrival_rps == 0.0


def test_pending_prompt_tokens_from_the_prompt_length_histogram():
    s = compute(
        [
            (T0, snap(waiting=0, finished=0, prompt=0, prompt_len=(0.0, 0.0))),
            # the counters say 1,000 a request; the histogram, observed at finish, 800
            (T0 + 120, snap(waiting=4, finished=10, prompt=10_000, prompt_len=(8_000.0, 10.0))),
        ]
    )
    assert s.pending_prompt_tokens == pytest.approx(3_200)
    assert "4 waiting × 800 tokens" in s.pending_basis
    assert "10 requests finished in the last 5 min" in s.pending_basis
    assert "histogram" in s.pending_basis and "120 s covered" in s.pending_basis


def test_pending_prompt_tokens_from_the_counters_without_a_histogram():
    s = compute(
        [
            (T0, snap(engine="sglang", finished=10, prompt=5_000)),
            (T0 + 300, snap(engine="sglang", waiting=3, finished=30, prompt=35_000)),
        ]
    )
    assert s.engine == "sglang" and s.preemptions_per_s is None
    assert s.pending_prompt_tokens == pytest.approx(3 * 1_500)
    assert "1,500 tokens" in s.pending_basis and "counters" in s.pending_basis


def test_pending_is_unknown_when_nothing_finished_and_zero_when_nothing_waits():
    stuck = compute([(T0, snap(finished=7)), (T0 + 300, snap(waiting=5, finished=7))])
    assert stuck.pending_prompt_tokens is None
    assert "no request finished in the last 5 min" in stuck.pending_basis
    idle = compute([(T0, snap(finished=7)), (T0 + 300, snap(waiting=0, finished=7))])
    assert idle.pending_prompt_tokens == 0 and idle.pending_basis == "no request is waiting"


def test_empty_history_and_a_single_snapshot():
    assert compute([]) == Signals(pending_basis="no /metrics snapshot yet")
    s = compute([(T0, snap(waiting=2, running=1))])
    assert s.requests_waiting == 2
    assert s.finished_rps is None and s.arrival_rps is None and s.output_tokens_per_s is None
    assert s.ttft["1m"].seconds == 0 and s.ttft["1m"].p95 is None
    assert s.pending_prompt_tokens is None


def test_signals_of_real_expositions_survive_the_stored_format():
    text = (Path(__file__).parent / "fixtures" / "expo_sglang_sim_0_5_3.txt").read_text()
    newest = parse_snapshot(text)
    older = parse_snapshot(text)
    older["counters"]["requests_finished"] = 0.0
    older["counters"]["prompt_tokens"] = 0.0
    s = compute([(T0, older), (T0 + 30, newest)])
    assert s.engine == "sglang" and s.finished_rps == pytest.approx(5 / 30)
    assert Signals.from_dict(s.as_dict()) == s
