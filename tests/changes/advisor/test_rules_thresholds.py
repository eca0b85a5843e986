"""Each threshold pinned from both sides: a snapshot 5 % over it (or at it, for counts) raises
the rule, one 5 % under it (or one below) does not. Moving any constant by 10 % either way
fails one of these (checked by mutating each constant in turn)."""

from __future__ import annotations

import pytest

from changes.advisor.findings import CRITICAL, INFO, WARNING
from tests.changes.advisor import builders as b
from tests.changes.advisor.builders import none, one
from tests.changes.advisor.test_rules_config import refused
from tests.changes.advisor.test_rules_host import off_node, starved, throttled
from tests.changes.advisor.test_rules_load import full, long_prompts, queued, shared, slow_decode
from tests.changes.advisor.test_rules_runs import faster, unlike


def tail(low_p99, p50, p99):
    stages = (
        b.stage("low", 1, ttft_p50_ms=100.0, ttft_p99_ms=low_p99),
        b.stage("peak", 64, ttft_p50_ms=p50, ttft_p99_ms=p99),
    )
    return b.with_run(b.healthy(), stages=stages)


def prompts(n):
    return b.with_live(long_prompts(), prompt_tokens=600.0 * n)


def numa(local, remote):
    return off_node(tuple(range(0, local)) + tuple(range(32, 32 + remote)))


def first_stage(p99):
    stages = (b.stage("low", 1, ttft_p50_ms=100.0, ttft_p99_ms=p99), *b.STAGES[1:])
    return b.with_run(b.healthy(), warmup_requests=0, stages=stages)


def error_rate(rate):
    return b.with_run(faster(base_in_snapshot=False), error_rate=rate)


def rise(rate):
    """Run 13 against run 12 at 1 % errors."""
    s = faster(base_failed=10)
    return b.with_run(s, error_rate=rate)


def capped(running_max):
    """100 sequences allowed; the KV cache holds 300 of these requests."""
    return b.with_config(queued(running_max=running_max, queue_ms=200.0), max_num_seqs=100)


def fraction_half(used_share):
    """KV full at memory fraction 0.5, with ``used_share`` of the GPU's memory in use."""
    return b.with_gpus(full(0.5), memory_used_bytes=int(used_share * 80 * b.GIB))


# (threshold, rule, raises, stays quiet)
PAIRS = [
    ("QUEUE_WAITING_MIN", "queue-bound", queued(waiting_mean=1.05), queued(waiting_mean=0.95)),
    ("SEQS_FULL_SHARE", "queue-bound", capped(94.5), capped(85.5)),
    ("QUEUE_KV_ROOM", "queue-bound", queued(kv_usage_max=0.76), queued(kv_usage_max=0.84)),
    (
        "PREEMPTIONS_MIN",
        "kv-bound",
        b.with_live(b.healthy(), preemptions=1),
        b.with_live(b.healthy(), preemptions=0),
    ),
    (
        "PREFILL_SHARE_MIN",
        "prefill-bound",
        b.with_live(long_prompts(), prefill_ms=1050.0),
        b.with_live(long_prompts(), prefill_ms=950.0),
    ),
    (
        "PREFILL_TTFT_MIN_MS",
        "prefill-bound",
        b.with_live(long_prompts(), ttft_ms=525.0, prefill_ms=400.0),
        b.with_live(long_prompts(), ttft_ms=475.0, prefill_ms=400.0),
    ),
    ("LONG_PROMPT_TOKENS", "prefill-bound", prompts(1024), prompts(1023)),
    ("ITL_SLOW_MS", "decode-bound", slow_decode(itl=42.0), slow_decode(itl=38.0)),
    ("LOW_CONCURRENCY", "decode-bound", slow_decode(concurrency=4), slow_decode(concurrency=5)),
    (
        "SHARED_PREFIX_MIN",
        "prefix-cache",
        shared(0.21, prefix_caching=False),
        shared(0.19, prefix_caching=False),
    ),
    (
        "HIT_RATE_OF_SHARED_MIN",
        "prefix-cache",
        b.with_live(shared(0.5), hit_rate=0.2375),
        b.with_live(shared(0.5), hit_rate=0.2625),
    ),
    ("TAIL_RATIO_MAX", "tail-growth", tail(180.0, 1000.0, 3150.0), tail(180.0, 1000.0, 2850.0)),
    ("TAIL_GROWTH_MIN", "tail-growth", tail(250.0, 1000.0, 3940.0), tail(250.0, 1000.0, 3560.0)),
    ("TAIL_P99_MIN_MS", "tail-growth", tail(180.0, 500.0, 2100.0), tail(180.0, 500.0, 1900.0)),
    (
        "LENGTH_REJECT_SHARE_MIN",
        "length-rejections",
        refused(n=21, ok=1979),
        refused(n=19, ok=1981),
    ),
    (
        "THROTTLE_SHARE_MIN",
        "gpu-throttled",
        throttled({"SwPowerCap": 0.105}),
        throttled({"SwPowerCap": 0.095}),
    ),
    (
        "BUSY_UTIL_PCT",
        "gpu-throttled",
        throttled({"SwPowerCap": 0.5}, util=52.5),
        throttled({"SwPowerCap": 0.5}, util=47.5),
    ),
    (
        "CLOCK_SHARE_MAX",
        "gpu-throttled",
        b.with_gpus(throttled({"SwPowerCap": 0.5}), sm_clock_mhz=0.855 * 1980),
        b.with_gpus(throttled({"SwPowerCap": 0.5}), sm_clock_mhz=0.945 * 1980),
    ),
    ("GPU_UTIL_LOW_PCT", "cpu-bound", starved(util=71.0), starved(util=79.0)),
    ("CPU_WAITING_MIN", "cpu-bound", starved(waiting=1), starved(waiting=0.95)),
    ("LOAD_PER_CPU_MAX", "cpu-bound", starved(load=67.2), starved(load=60.8)),
    (
        "CPU_UTIL_MAX_PCT",
        "cpu-bound",
        starved(load=10.0, cpu_pct=94.5),
        starved(load=10.0, cpu_pct=85.5),
    ),
    ("NUMA_LOCAL_SHARE_MIN", "numa-mismatch", numa(19, 21), numa(21, 19)),
    ("ERROR_RATE_MAX", "errors-behind-speed", error_rate(0.0105), error_rate(0.0095)),
    ("ERROR_RATE_RISE", "errors-behind-speed", rise(0.0205), rise(0.0195)),
    (
        "ERROR_RATE_HIGH",
        "errors-behind-speed",
        b.with_run(b.healthy(), error_rate=0.0525),
        b.with_run(b.healthy(), error_rate=0.0475),
    ),
    (
        "PROFILE_RATIO_MAX",
        "profile-unlike-traffic",
        unlike(input_p50=2100.0),
        unlike(input_p50=1900.0),
    ),
    (
        "PROFILE_RATIO_MAX",
        "profile-unlike-traffic",
        unlike(input_p50=476.0),
        unlike(input_p50=526.0),
    ),
    (
        "PREFIX_SHARE_DIFF_MAX",
        "profile-unlike-traffic",
        unlike(shared_prefix_share=0.615),
        unlike(shared_prefix_share=0.585),
    ),
]


@pytest.mark.parametrize(
    ("rule_id", "raises", "quiet"),
    [pytest.param(rule_id, over, under, id=name) for name, rule_id, over, under in PAIRS],
)
def test_threshold_both_sides(rule_id, raises, quiet):
    one(raises, rule_id)
    assert none(quiet, rule_id)


# Thresholds that set a severity or a value rather than whether the rule speaks.
@pytest.mark.parametrize(
    ("s", "rule_id", "severity"),
    [
        (queued(queue_ms=1050.0, waiting_mean=3.0), "queue-bound", CRITICAL),  # QUEUE_CRITICAL_MS
        (queued(queue_ms=950.0, waiting_mean=3.0), "queue-bound", WARNING),
        (refused(n=105, ok=1895), "length-rejections", CRITICAL),  # LENGTH_REJECT_CRITICAL
        (refused(n=95, ok=1905), "length-rejections", WARNING),
        (starved(queue_ms=1050.0), "cpu-bound", CRITICAL),  # CPU_QUEUE_CRITICAL_MS
        (starved(queue_ms=950.0), "cpu-bound", WARNING),
        (first_stage(525.0), "warmup-included", WARNING),  # WARMUP_TAIL_RATIO
        (first_stage(475.0), "warmup-included", INFO),
    ],
)
def test_severity_thresholds(s, rule_id, severity):
    assert one(s, rule_id).severity == severity


@pytest.mark.parametrize(
    ("p99", "new"),
    [
        (3200.0, 4096),  # × 1.25 = 4,000 (× 1.375 would be 8,192)
        (1700.0, 4096),  # × 1.25 = 2,125 (× 1.125 would be 2,048)
    ],
)
def test_context_margin(p99, new):
    s = b.with_config(b.healthy(), max_model_len=131072)
    s = b.with_lengths(s, total_p99=p99)
    assert dict(one(s, "max-model-len-oversized").suggestion.settings) == {"max_model_len": new}


@pytest.mark.parametrize(
    ("used", "suggested"),
    [  # OTHER_MEMORY_SLACK: in use up to 5 % over the fraction is the engine's own
        (0.5475, {"gpu_memory_utilization": 0.9}),
        (0.5525, {"kv_cache_dtype": "fp8"}),
    ],
)
def test_other_memory_slack(used, suggested):
    assert dict(one(fraction_half(used), "kv-bound").suggestion.settings) == suggested


def test_prefill_budget_floor():
    """A 1,024-token prompt over a 512-token budget gets vLLM's small-GPU default, 2,048."""
    s = b.with_config(prompts(1024), max_num_batched_tokens=512)
    assert dict(one(s, "prefill-bound").suggestion.settings) == {"max_num_batched_tokens": 2048}


def test_numa_share_is_over_the_engines_cpus():
    f = one(numa(19, 21), "numa-mismatch")
    assert f.evidence["local_share"] == pytest.approx(19 / 40)
    assert "47.5 % of the engine's 40 CPUs" in f.seen
