"""Issue 14 item 11, the verdict's side (pure): a verification is judged against its baseline
only when both measured the same engine under the same load. A warm prefix cache against a
cold one, another profile version, an unusable baseline or too few requests give no verdict
("inconclusive", with the reason), never "within limits" and never a regression."""

from __future__ import annotations

from changes import verdict

LIMITS = verdict.Thresholds(
    error_rate_increase=0.01, ttft_p95_regression=0.2, itl_p95_regression=0.2
)
NUMBERS = {"error_rate": 0.0, "ttft_p95_ms": 400.0, "itl_p95_ms": 20.0, "output_tokens_per_s": 1e3}
COLD = {
    "profile": "chat v3",
    "cache_state": verdict.COLD,
    "prefix_cache_hit_rate": 0.0,
    "kv_cache_usage_max": 0.3,
    "error_rate": 0.0,
    "requests": 600,
    "problem": None,
}
WARM = {**COLD, "cache_state": verdict.WARM, "prefix_cache_hit_rate": 0.986}


def judge(before, after, baseline=NUMBERS, verification=NUMBERS, **kw):
    return verdict.verdict(baseline, verification, LIMITS, (before, after), **kw)


def test_the_issue_scenario_a_warm_baseline_is_no_ground_for_a_regression():
    """Baseline on a warm engine at 98.6 % prefix-cache hits, verification right after the
    restart at 0 %: TTFT p95 +1489 %. Before, this rolled a harmless change back."""
    slow = {**NUMBERS, "ttft_p95_ms": 400.0 * 15.89}
    result = judge(WARM, COLD, verification=slow)
    assert result["outcome"] == "inconclusive" and not result["regressed"]
    assert "baseline ran with 98.6% prefix-cache hits, verification with 0.0%" in result["reason"]
    assert "conditions differ" in result["reason"]
    text = verdict.verdict_text(result)
    assert text.startswith("inconclusive: ") and "within limits" not in text
    # What was measured is still said, for whoever looks.
    assert "TTFT p95 +1489%" in text


def test_the_same_conditions_give_a_verdict_either_way():
    assert judge(COLD, COLD)["outcome"] == "verified"
    slow = {**NUMBERS, "ttft_p95_ms": 600.0}
    result = judge(COLD, COLD, verification=slow)
    assert result["outcome"] == "regressed" and result["regressed"]
    assert result["reason"] == "TTFT p95 400.0 → 600.0 ms (+50%) (limit +20%)"


def test_a_small_difference_in_hit_rate_is_the_same_condition():
    after = {**COLD, "prefix_cache_hit_rate": verdict.PREFIX_HIT_TOLERANCE - 0.01}
    assert judge(COLD, after)["outcome"] == "verified"
    after = {**COLD, "prefix_cache_hit_rate": verdict.PREFIX_HIT_TOLERANCE + 0.01}
    assert judge(COLD, after)["outcome"] == "inconclusive"


def test_a_change_that_alters_the_cache_is_judged_on_its_effect_from_the_same_start():
    """Turning prefix caching off moves the hit rate by design: from the same cold start
    that is the change's effect, so its latencies are judged (here: a regression)."""
    off = {**COLD, "prefix_cache_hit_rate": 0.0}
    on = {**COLD, "prefix_cache_hit_rate": 0.6}
    slow = {**NUMBERS, "ttft_p95_ms": 800.0}
    result = judge(on, off, verification=slow, cache_changed=True)
    assert result["outcome"] == "regressed"
    fine = judge(on, off, cache_changed=True)
    assert fine["outcome"] == "verified"
    assert "the change alters the prefix cache" in verdict.verdict_text(fine)
    # From different starts it is not: a warm baseline could be why.
    warm_on = {**on, "cache_state": verdict.WARM}
    assert judge(warm_on, off, cache_changed=True)["outcome"] == "inconclusive"


def test_another_load_profile_is_no_baseline():
    result = judge({**COLD, "profile": "chat v2"}, COLD)
    assert result["outcome"] == "inconclusive"
    assert (
        "the baseline ran chat v2, the verification chat v3: not the same load"
        in (result["reason"])
    )


def test_a_baseline_above_its_error_threshold_is_never_used():
    bad = {**COLD, "error_rate": 0.925, "problem": "error rate 92.5% is above its limit 5.0%"}
    result = judge(bad, COLD, baseline={**NUMBERS, "error_rate": 0.925})
    assert result["outcome"] == "inconclusive"
    assert result["reason"].startswith("the baseline cannot be used: error rate 92.5%")


def test_an_unusable_verification_is_a_regression_not_a_pass():
    """The new config's own benchmark failed its error threshold: it is not shown to be safe,
    whatever its latencies (a failed request is fast)."""
    bad = {**COLD, "problem": "#7 failed: the engine stopped answering"}
    result = judge(COLD, bad, verification={**NUMBERS, "ttft_p95_ms": 100.0})
    assert result["outcome"] == "regressed"
    assert result["reason"].startswith("the verification cannot be used: #7 failed")


def test_without_a_hit_rate_the_cache_state_decides():
    """SGLang reports no prefix-cache queries/hits: the engine's state at the start (cold after
    a restart, warm after other runs) is then all there is to go on."""
    sglang_cold = {**COLD, "prefix_cache_hit_rate": None}
    assert judge(sglang_cold, sglang_cold)["outcome"] == "verified"
    sglang_warm = {**sglang_cold, "cache_state": verdict.WARM}
    result = judge(sglang_warm, sglang_cold)
    assert result["outcome"] == "inconclusive"
    assert "did not report prefix-cache hits" in result["reason"]
    unknown = {**sglang_cold, "cache_state": verdict.UNKNOWN}
    assert judge(unknown, sglang_cold)["outcome"] == "inconclusive"
    # With hit rates that agree, a different start is only noted.
    noted = judge({**COLD, "cache_state": verdict.WARM}, COLD)
    assert noted["outcome"] == "verified"
    assert "with the same prefix-cache hit rate" in verdict.verdict_text(noted)


def test_kv_use_is_shown_but_never_refuses_a_verdict():
    """A memory or batching change moves KV use by design (up to saturation, a hard guard:
    ``test_verdict_cannot_judge.py``)."""
    result = judge(COLD, {**COLD, "kv_cache_usage_max": 0.9})
    assert result["outcome"] == "verified"
    kv = next(row for row in result["conditions"] if row["key"] == "kv_cache_usage_max")
    assert (kv["baseline"], kv["after"]) == (0.3, 0.9)


def test_too_few_requests_cannot_tell_a_p95():
    few = {**COLD, "requests": verdict.MIN_REQUESTS - 1}
    result = judge(COLD, few, verification={**NUMBERS, "ttft_p95_ms": 900.0})
    assert result["outcome"] == "inconclusive"
    assert "too few requests" in result["reason"]
    # Errors are still judged on few requests: more errors is a regression.
    result = judge(COLD, few, verification={**NUMBERS, "error_rate": 0.2})
    assert result["outcome"] == "regressed"


def test_the_conditions_are_listed_side_by_side():
    result = judge(WARM, COLD)
    rows = {row["key"]: (row["baseline"], row["after"]) for row in result["conditions"]}
    assert rows["prefix_cache_hit_rate"] == (0.986, 0.0)
    assert rows["cache_state"] == ("warm", "cold")
    assert rows["profile"] == ("chat v3", "chat v3")
    assert set(rows) >= {"kv_cache_usage_max", "error_rate", "requests"}


def test_which_flags_alter_the_cache():
    assert verdict.alters_cache("vllm", {"enable_prefix_caching"})
    assert verdict.alters_cache("sglang", {"disable_radix_cache", "max_running_requests"})
    assert not verdict.alters_cache("vllm", {"max_num_seqs"})


# --- run-to-run noise ---------------------------------------------------------------------------
def test_the_p95_band_comes_from_order_statistics():
    assert verdict.quantile_interval(range(verdict.MIN_REQUESTS - 1)) is None
    # 100 requests: the p95 lies between the 91st and the 100th with 95 % confidence.
    assert verdict.quantile_interval(float(v) for v in range(1, 101)) == (91.0, 100.0)
    # More requests, a narrower band around the 950th of 1000.
    low, high = verdict.quantile_interval(float(v) for v in range(1, 1001))
    assert 930 < low < 950 < high < 965


def band(p95: float, spread: float) -> tuple[float, float]:
    return p95 * (1 - spread), p95 * (1 + spread)


def test_a_difference_within_the_noise_cannot_tell_either_way():
    """+25 % against a limit of +20 %, each p95 known only to ±15 %: no rollback on noise."""
    slow = {**NUMBERS, "ttft_p95_ms": 500.0}
    noisy = {"ttft_p95_ms": (band(400.0, 0.15), band(500.0, 0.15))}
    result = judge(COLD, COLD, verification=slow, noise=noisy)
    assert result["outcome"] == "inconclusive" and not result["regressed"]
    ttft = next(c for c in result["checks"] if c["metric"] == "ttft_p95_ms")
    assert ttft["ok"] is None and ttft["note"].startswith("cannot judge: run-to-run noise")
    assert "cannot judge TTFT p95: run-to-run noise" in verdict.verdict_text(result)
    # +10 % is no pass either when the band reaches past the limit.
    near = {**NUMBERS, "ttft_p95_ms": 440.0}
    result = judge(
        COLD, COLD, verification=near, noise={"ttft_p95_ms": (band(400, 0.15), band(440, 0.15))}
    )
    assert result["outcome"] == "inconclusive"


def test_a_difference_beyond_the_noise_is_judged():
    tight = {"ttft_p95_ms": (band(400.0, 0.02), band(500.0, 0.02))}
    result = judge(COLD, COLD, verification={**NUMBERS, "ttft_p95_ms": 500.0}, noise=tight)
    assert result["outcome"] == "regressed"
    ttft = next(c for c in result["checks"] if c["metric"] == "ttft_p95_ms")
    assert ttft["noise"][0] > 0.2
    same = {"ttft_p95_ms": (band(400.0, 0.02), band(410.0, 0.02))}
    result = judge(COLD, COLD, verification={**NUMBERS, "ttft_p95_ms": 410.0}, noise=same)
    assert result["outcome"] == "verified"
    # Without a band (no request log) the p95s are compared as they are.
    result = judge(COLD, COLD, noise={"ttft_p95_ms": (None, band(400.0, 0.5))})
    assert result["outcome"] == "verified"
