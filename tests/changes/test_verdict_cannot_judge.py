"""Issue 37 finding 4, the verdict's side (pure): a noise band too wide to judge still judged.

A change that cut GPU memory utilisation 0.9 → 0.15 reached KV 95.6 % with 7 preemptions and
+44 % TTFT p95, and stayed applied because the band was −4 %…+92 %. Now the hard guards (new
preemptions, a saturated KV cache, an engine restart; the error rate by its own check) roll
back whatever the band says; a band that spans a limit says "cannot judge: run-to-run noise
±X % … spans the limit +Y %" and asks for more measurement (``measure_more``); and each limit is
shown as it applies to the baseline run the verdict compares against (``applied_limit``)."""

from __future__ import annotations

import pytest

from changes import verdict

LIMITS = verdict.Thresholds()  # +1 point, +20 %, +20 %
NUMBERS = {"error_rate": 0.0, "ttft_p95_ms": 400.0, "itl_p95_ms": 20.0, "output_tokens_per_s": 1e3}
BASE = {
    "profile": "chat v3",
    "cache_state": verdict.COLD,
    "prefix_cache_hit_rate": 0.0,
    "kv_cache_usage_max": 0.41,
    "preemptions": 0.0,
    "restarted": None,
    "error_rate": 0.0,
    "requests": 600,
    "problem": None,
    "run": 12,
}
# The issue's band: the change's TTFT p95 lies anywhere from -4 % to +92 %.
WIDE = {"ttft_p95_ms": ((380.0, 420.0), (403.2, 729.6))}
SLOWER = {**NUMBERS, "ttft_p95_ms": 576.0}  # +44 %


def judge(after, verification=SLOWER, noise=WIDE, before=BASE):
    return verdict.verdict(NUMBERS, verification, LIMITS, (before, after), noise=noise)


def test_the_issue_scenario_is_rolled_back_on_its_preemptions_and_full_cache():
    squeezed = {**BASE, "kv_cache_usage_max": 0.956, "preemptions": 7.0, "run": 13}
    result = judge(squeezed)
    assert result["outcome"] == "regressed" and result["regressed"]
    assert result["guards"] == [
        "7 sequences preempted under the change, none in the baseline",
        "the KV cache saturated under the change: 95.6% at its fullest (the baseline 41.0%; "
        "saturated from 95%)",
    ]
    assert result["reason"].startswith("hard guard: 7 sequences preempted")
    assert verdict.verdict_text(result).startswith("regression: hard guard: ")


@pytest.mark.parametrize(
    "after, guard",
    [
        ({"preemptions": 1.0}, "1 sequences preempted under the change, none in the baseline"),
        ({"kv_cache_usage_max": 0.95}, "the KV cache saturated under the change: 95.0%"),
        ({"restarted": "its generation_tokens counters went back"}, "the engine restarted"),
    ],
)
def test_each_hard_guard_counts_whatever_the_band(after, guard):
    result = judge({**BASE, **after}, verification=NUMBERS)  # even +0 % inside a wide band
    assert result["outcome"] == "regressed", result
    assert result["guards"][0].startswith(guard)
    assert not result["measure_more"]


def test_a_rise_in_errors_is_a_regression_inside_any_band():
    """The error rate has its own check (+1 point by default), never relaxed by the latency
    bands (already so before issue 37: a guard kept, not added)."""
    result = judge({**BASE, "error_rate": 0.03}, verification={**NUMBERS, "error_rate": 0.03})
    assert result["outcome"] == "regressed"
    assert result["reason"].startswith("Error rate 0.00% → 3.00%")


def test_what_the_baseline_already_had_or_did_not_report_is_no_guard():
    # Preemptions and a full cache before the change too: the latencies judge it.
    busy = {**BASE, "preemptions": 3.0, "kv_cache_usage_max": 0.97}
    result = judge({**busy, "preemptions": 9.0, "kv_cache_usage_max": 0.99}, before=busy)
    assert result["guards"] == []
    # A baseline without the engine's metrics cannot say "none before".
    unknown = {**BASE, "preemptions": None, "kv_cache_usage_max": None}
    result = judge({**BASE, "preemptions": 9.0, "kv_cache_usage_max": 0.99}, before=unknown)
    assert result["guards"] == []
    # Under saturation is no guard: a memory or batching change moves KV use by design.
    assert judge({**BASE, "kv_cache_usage_max": 0.94})["guards"] == []


def test_a_band_wider_than_the_limit_says_cannot_judge_and_asks_for_more():
    result = judge({**BASE, "run": 13})
    assert result["outcome"] == "inconclusive" and not result["regressed"]
    ttft = next(c for c in result["checks"] if c["metric"] == "ttft_p95_ms")
    assert ttft["ok"] is None and ttft["noisy"]
    assert ttft["note"] == (
        "cannot judge: run-to-run noise ±48% (-4% to +92%) spans the limit +20%"
    )
    assert result["reason"] == (
        "cannot judge TTFT p95: run-to-run noise ±48% (-4% to +92%) spans the limit +20%"
    )
    assert result["measure_more"]
    assert verdict.verdict_text(result).startswith("inconclusive: cannot judge TTFT p95")


def test_no_more_measurement_when_the_conditions_differ():
    """Another load or cache start is not settled by more requests of the same runs."""
    other = {**BASE, "profile": "chat v4"}
    result = judge(other)
    assert result["outcome"] == "inconclusive" and not result["measure_more"]


def test_a_narrow_band_is_judged_without_more():
    tight = {"ttft_p95_ms": ((396.0, 404.0), (570.0, 582.0))}
    result = judge(BASE, noise=tight)
    assert result["outcome"] == "regressed" and not result["measure_more"]


def test_the_limit_applies_to_the_baseline_the_verdict_compares_against():
    """One rule: the limit is a share fixed at the proposal, applied to the verdict's own
    baseline run, and the check says which run and what it comes to."""
    assert verdict.applied_limit(0.2, 412.0) == pytest.approx(494.4)
    result = judge({**BASE, "run": 13}, noise=None)
    ttft = next(c for c in result["checks"] if c["metric"] == "ttft_p95_ms")
    assert ttft["limit_value"] == 480.0
    assert ttft["limit_applied"] == "+20% of run #12's 400.0 ms = 480.0 ms"
    errors = next(c for c in result["checks"] if c["metric"] == "error_rate")
    assert errors["limit_applied"] == "+1.0% points on run #12's 0.00% = 1.00%"
    assert result["baseline_run"] == 12
    # The same relative limit on another baseline comes to another bound, said so.
    other = verdict.verdict(
        {**NUMBERS, "ttft_p95_ms": 300.0}, SLOWER, LIMITS, ({**BASE, "run": 7}, BASE)
    )
    ttft = next(c for c in other["checks"] if c["metric"] == "ttft_p95_ms")
    assert ttft["limit"] == "+20%" and ttft["limit_applied"].startswith("+20% of run #7's 300.0")


@pytest.mark.parametrize(
    "running, proposed, limit",
    [
        ({"max_num_seqs": 32}, {"max_num_seqs": 64}, 1.0),  # twice the sequences per step
        ({"max_num_seqs": 32}, {"max_num_seqs": 48}, 0.5),
        ({"max_num_seqs": 64}, {"max_num_seqs": 65}, 0.2),  # never below the default
        ({"max_num_seqs": 8}, {"max_num_seqs": 256}, 1.0),  # at most doubled
        ({"max_running_requests": 16}, {"max_running_requests": 24}, 0.5),
        ({}, {"max_num_seqs": 64}, None),  # the running cap is the engine's default: unknown
        ({"max_num_seqs": 64}, {"max_num_seqs": 32}, None),  # a smaller batch: no allowance
    ],
)
def test_a_larger_batch_gets_an_itl_limit_from_the_change_alone(running, proposed, limit):
    """The allowance for a batch-growing change depends on the change, never on the run it
    was proposed from (it was +56 % or +20 % by the run before)."""
    assert verdict.batch_itl_limit(proposed, running, default=0.2) == limit
