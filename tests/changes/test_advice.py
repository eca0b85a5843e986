"""Domain warnings, predicted impact and the verification verdict (pure functions)."""

from __future__ import annotations

import pytest

from changes import advice, verdict


def codes(warnings):
    return [w.code for w in warnings]


def test_one_setting_changed_gives_no_warning():
    assert advice.warnings_for("vllm", {"max_num_seqs": (64, 128)}, {"max_num_seqs": 128}) == []


def test_several_settings_at_once():
    diff = {"max_num_seqs": (64, 128), "max_num_batched_tokens": (2048, 8192)}
    (warning,) = advice.warnings_for("vllm", diff, {"max_num_seqs": 128})
    assert warning.code == "several_settings"
    assert "2 settings change at once (max_num_batched_tokens, max_num_seqs)" in warning.message


@pytest.mark.parametrize(
    ("engine", "flag"), [("vllm", "gpu_memory_utilization"), ("sglang", "mem_fraction_static")]
)
def test_memory_fraction_above_095(engine, flag):
    over = advice.warnings_for(engine, {flag: (0.9, 0.96)}, {flag: 0.96})
    assert codes(over) == ["memory_headroom"] and f"{flag} = 0.96" in over[0].message
    assert advice.warnings_for(engine, {flag: (0.9, 0.95)}, {flag: 0.95}) == []


def test_context_far_above_the_observed_p99():
    diff = {"max_model_len": (8192, 32768)}
    far = advice.warnings_for("vllm", diff, {"max_model_len": 32768}, observed_p99_tokens=2000)
    assert codes(far) == ["context_too_long"]
    assert "16× the p99" in far[0].message and "2,000" in far[0].message
    near = advice.warnings_for("vllm", diff, {"max_model_len": 32768}, observed_p99_tokens=9000)
    assert near == []
    unknown = advice.warnings_for("vllm", diff, {"max_model_len": 32768})
    assert unknown == [], "no measurement, no claim"


def test_tensor_parallel_on_a_model_that_fits_one_gpu():
    diff = {"tensor_parallel_size": (1, 2)}
    small = advice.warnings_for(
        "vllm",
        diff,
        {"tensor_parallel_size": 2},
        model="meta-llama/Llama-3.1-8B-Instruct",
        gpu_memory_bytes=80 * 2**30,
    )
    assert (
        codes(small) == ["tp_small_model"] and "(15 GiB) fit one GPU (80 GiB)" in small[0].message
    )
    big = advice.warnings_for(
        "vllm",
        diff,
        {"tensor_parallel_size": 2},
        model="meta-llama/Llama-3.1-70B-Instruct",
        gpu_memory_bytes=80 * 2**30,
    )
    assert big == []


def test_flags_and_engine_versions():
    lacking = advice.warnings_for(
        "vllm",
        {"enable_log_requests": (None, True)},
        {"enable_log_requests": True},
        engine_version="0.10.0",
    )
    assert "unsupported_flag" in codes(lacking)
    assert any("added in 0.10.1" in w.message for w in lacking)
    going = advice.warnings_for(
        "vllm", {"swap_space": (None, 4.0)}, {"swap_space": 4.0}, engine_version="0.11.0"
    )
    assert "flag_going_away" in codes(going)
    unknown = advice.warnings_for("vllm", {"swap_space": (None, 4.0)}, {"swap_space": 4.0})
    assert "version_unknown" in codes(unknown)
    logging_only = advice.warnings_for(
        "vllm",
        {"disable_log_stats": (None, True)},
        {"disable_log_stats": True},
        engine_version="0.11.0",
    )
    assert codes(logging_only) == ["no_speed_effect"]


def test_an_empty_diff_says_nothing_changes():
    (warning,) = advice.warnings_for("vllm", {}, {"max_num_seqs": 128})
    assert warning.code == "no_change"


def test_rules_list_their_warnings_in_order_and_per_flag():
    diff = {
        "gpu_memory_utilization": (0.9, 0.97),
        "swap_space": (None, 4.0),
        "disable_log_stats": (None, True),
    }
    proposed = {"gpu_memory_utilization": 0.97, "swap_space": 4.0, "disable_log_stats": True}
    found = advice.warnings_for("vllm", diff, proposed)
    # Whole-change rules first, then each changed flag in name order with its own rules.
    assert codes(found) == [
        "several_settings",
        "memory_headroom",
        "no_speed_effect",  # disable_log_stats
        "flag_going_away",  # swap_space
        "version_unknown",
        "no_speed_effect",
    ]
    assert [rule.__name__ for rule in advice.RULES][-1] == "flag_warnings"


def test_a_tp_warning_needs_a_model_the_simulator_knows():
    diff = {"tensor_parallel_size": (1, 2)}
    unknown = advice.warnings_for(
        "vllm", diff, {"tensor_parallel_size": 2}, model="acme/x", gpu_memory_bytes=80 * 2**30
    )
    assert unknown == []


@pytest.mark.parametrize(
    ("name", "key"),
    [
        ("NVIDIA H100 80GB HBM3", "h100-sxm"),
        ("NVIDIA A100-SXM4-80GB", "a100-80g"),
        ("NVIDIA H200", "h200"),
        ("Tesla T4", None),
    ],
)
def test_gpu_names_map_to_the_simulator(name, key):
    assert advice.gpu_key(name) == key


def test_workloads_follow_the_profile_stages():
    profile = {
        "stages": [
            {"name": "low", "concurrency": 4, "num_requests": 50},
            {"name": "peak", "request_rate": 20, "duration_s": 60, "burstiness": 0.5},
        ],
        "input_len": {"kind": "uniform", "low": 100, "high": 300},
        "output_len": {"kind": "fixed", "mean": 64},
        "prefix_len": 512,
        "prefix_groups": 4,
    }
    (low_name, low), (peak_name, peak) = advice.workloads(profile)
    assert (low_name, low.concurrency, low.request_rate, low.num_requests) == ("low", 4, None, 50)
    # The 512-token prefix comes on top of the 200-token mean input (vLLM's
    # --random-prefix-len); the spread (±100 tokens) is the own part's.
    assert (low.input_tokens, low.input_jitter, low.output_tokens, low.output_jitter) == (
        712,
        pytest.approx(100 / 712),
        64,
        0.0,
    )
    assert (peak.request_rate, peak.burstiness, peak.num_requests) == (20.0, 0.5, 300)
    assert (peak.shared_prefix_tokens, peak.num_prefixes) == (512, 4)


def test_predicted_impact_of_fewer_sequences():
    profile = {
        "stages": [{"name": "main", "concurrency": 16, "num_requests": 64}],
        "input_len": {"kind": "fixed", "mean": 256},
        "output_len": {"kind": "fixed", "mean": 64},
    }
    result = advice.predicted_impact(
        "vllm",
        "meta-llama/Llama-3.1-8B-Instruct",
        {"max_num_seqs": 64},
        {"max_num_seqs": 2},
        "h100-sxm",
        1,
        profile,
    )
    metrics = {m["key"]: m for m in result["stages"][0]["metrics"]}
    assert result["available"] and result["stages"][0]["requests"] == 64
    assert metrics["ttft_p95_ms"]["after"] > 2 * metrics["ttft_p95_ms"]["before"]
    assert metrics["ttft_p95_ms"]["verdict"] == "worse"
    assert metrics["output_throughput"]["verdict"] == "worse"
    # The sampler's memory scales with max_num_seqs a little; under 2 % is "no change".
    assert metrics["kv_cache_capacity_tokens"]["verdict"] is None


def test_a_config_that_cannot_start_is_predicted_as_such():
    result = advice.predicted_impact(
        "vllm",
        "meta-llama/Llama-3.1-8B-Instruct",
        {},
        {"gpu_memory_utilization": 0.12},
        "h100-sxm",
        1,
        {},
    )
    stage = result["stages"][0]
    assert stage["before_error"] is None
    assert "No available memory for the cache blocks" in stage["after_error"]


def test_no_prediction_for_unknown_models():
    result = advice.predicted_impact("vllm", "acme/secret-model", {}, {}, "h100-sxm", 1, {})
    assert result == {"available": False, "reason": result["reason"]}
    assert "not in the simulator's catalog" in result["reason"]


LIMITS = verdict.Thresholds(
    error_rate_increase=0.01, ttft_p95_regression=0.2, itl_p95_regression=0.2
)
BASE = {"error_rate": 0.0, "ttft_p95_ms": 400.0, "itl_p95_ms": 20.0, "output_tokens_per_s": 1000}


def test_within_limits_is_not_a_regression():
    after = {
        "error_rate": 0.005,
        "ttft_p95_ms": 470.0,
        "itl_p95_ms": 21.0,
        "output_tokens_per_s": 1500,
    }
    result = verdict.verdict(BASE, after, LIMITS)
    assert not result["regressed"] and result["reason"] == ""
    assert result["throughput_change"] == 0.5
    ttft = next(c for c in result["checks"] if c["metric"] == "ttft_p95_ms")
    assert ttft["change"] == 0.175 and ttft["ok"]


def test_p95_ttft_regression():
    after = {**BASE, "ttft_p95_ms": 500.0}  # +25 % > 20 %
    result = verdict.verdict(BASE, after, LIMITS)
    assert result["regressed"]
    assert result["reason"] == "TTFT p95 400.0 → 500.0 ms (+25%) (limit +20%)"


def test_a_speed_up_that_raises_errors_is_not_a_success():
    after = {
        "error_rate": 0.03,
        "ttft_p95_ms": 200.0,
        "itl_p95_ms": 10.0,
        "output_tokens_per_s": 3000,
    }
    result = verdict.verdict(BASE, after, LIMITS)
    assert result["regressed"] and result["reason"].startswith("Error rate 0.00% → 3.00%")


def test_itl_regression_and_missing_numbers():
    result = verdict.verdict(BASE, {**BASE, "itl_p95_ms": 30.0}, LIMITS)
    assert result["regressed"] and "ITL p95" in result["reason"]
    missing = verdict.verdict(BASE, {"ttft_p95_ms": 400.0, "itl_p95_ms": 20.0}, LIMITS)
    assert missing["regressed"], "a run without an error rate cannot prove it is safe"


def test_the_verdict_reads_its_numbers_and_labels_from_the_metric_registry():
    assert [m.key for m in verdict.VERDICT_METRICS] == [
        "error_rate",
        "ttft_p95_ms",
        "itl_p95_ms",
        "output_tokens_per_s",
    ]
    result = verdict.verdict(BASE, BASE, LIMITS)
    assert [c["label"] for c in result["checks"]] == ["Error rate", "TTFT p95", "ITL p95"]


def test_run_numbers_and_their_line():
    class Run:
        error_rate, ttft_p95_ms, itl_p95_ms, output_tokens_per_s = 0.0123, 412.4, 21.6, 1532.5
        ttft_p50_ms = 100.0  # not a verdict number: not read

    numbers = verdict.run_numbers(Run())
    assert numbers == {
        "error_rate": 0.0123,
        "ttft_p95_ms": 412.4,
        "itl_p95_ms": 21.6,
        "output_tokens_per_s": 1532.5,
    }
    assert (
        verdict.numbers_text(numbers) == "TTFT p95 412 ms, ITL p95 22 ms, 1532 tok/s, errors 1.2%"
    )
    assert verdict.run_numbers(None) == {}
    assert verdict.numbers_text({}) == "TTFT p95 —, ITL p95 —, —, errors —"


def test_verdict_text_says_how_far_each_number_moved():
    after = {**BASE, "ttft_p95_ms": 440.0, "itl_p95_ms": 19.0, "output_tokens_per_s": 1200}
    result = verdict.verdict(BASE, after, LIMITS)
    assert verdict.verdict_text(result) == (
        "within limits: TTFT p95 +10%, ITL p95 -5%, output tok/s +20%"
    )
    unmeasured = verdict.verdict({}, {"error_rate": 0.0}, LIMITS)
    # Nothing to compare latencies with: said, not passed off as "within limits".
    assert verdict.verdict_text(unmeasured) == (
        "inconclusive: not judged: TTFT p95 (not measured), ITL p95 (not measured)"
    )
    assert unmeasured["outcome"] == "inconclusive" and not unmeasured["regressed"]


def test_a_latency_from_zero_is_an_unbounded_regression():
    result = verdict.verdict({**BASE, "ttft_p95_ms": 0.0}, BASE, LIMITS)
    assert result["regressed"]
    assert "TTFT p95 0.0 → 400.0 (limit +20%)" in result["reason"]
