"""The rules on the engine under load (changes/advisor/rules_load.py), each both ways: a
snapshot that must raise it (severity, suggestion values, the numbers and window in `seen`),
one just under the threshold, and one missing a fact it needs."""

from __future__ import annotations

from dataclasses import replace

import pytest

from changes.advisor.findings import CRITICAL, INFO, WARNING
from tests.changes.advisor import builders as b
from tests.changes.advisor.builders import none, one


# --- queue-bound -------------------------------------------------------------------------------
def queued(**live):
    s = b.with_config(b.healthy(), max_num_seqs=16)
    busy = dict(
        running_mean=15.0,
        running_max=16,
        waiting_mean=12.0,
        waiting_max=20,
        kv_usage_mean=0.4,
        kv_usage_max=0.5,
        queue_ms=1500.0,
    )
    return b.with_live(s, **{**busy, **live})


def test_queue_bound_raises_to_cover_the_peak():
    f = one(queued(), "queue-bound")
    assert f.severity == CRITICAL  # a 1.5 s mean queue wait
    # running 16 + waiting peak 20 = 36 → 64; KV holds 400,000 × 0.9 / 1,200 = 300.
    assert dict(f.suggestion.settings) == {"max_num_seqs": 64}
    assert "12 requests waiting on average (peak 20)" in f.seen
    assert "1.5 s" in f.seen and "16 of 16 sequences" in f.seen and "50 %" in f.seen
    assert "over the last 60 s (live)" in f.seen
    assert "300 requests" in f.suggestion.action and "36" in f.suggestion.action
    assert f.evidence["waiting_mean"] == 12.0 and f.evidence["max_num_seqs"] == 16
    assert f.source == "live"


def test_queue_bound_is_bounded_by_the_kv_cache():
    s = b.with_config(queued(queue_ms=200.0, waiting_mean=3.0), kv_capacity_tokens=40_000)
    f = one(s, "queue-bound")
    assert f.severity == WARNING  # 3 waiting at 200 ms: likely trouble, not yet seconds
    assert dict(f.suggestion.settings) == {"max_num_seqs": 30}  # 40,000 × 0.9 / 1,200


def test_queue_bound_without_capacity_uses_kv_use():
    f = one(b.with_config(queued(kv_usage_mean=0.25), kv_capacity_tokens=None), "queue-bound")
    # 15 running used 25 % of the cache: 90 % holds 54; the peak wants 64.
    assert dict(f.suggestion.settings) == {"max_num_seqs": 54}


def test_queue_bound_keeps_vllm_batched_tokens_above_seqs():
    f = one(b.with_config(queued(), max_num_batched_tokens=32), "queue-bound")
    assert dict(f.suggestion.settings) == {"max_num_seqs": 64, "max_num_batched_tokens": 64}


def test_queue_bound_sglang_names_its_flag():
    s = b.with_live(b.with_config(b.healthy("sglang"), max_num_seqs=16), **queued().engine.__dict__)
    f = one(s, "queue-bound")
    assert dict(f.suggestion.settings) == {"max_running_requests": 64}


def test_queue_bound_in_a_runs_peak_stage():
    s = b.with_config(b.healthy(), max_num_seqs=16)
    s = b.with_server(
        s, **{k: v for k, v in queued().engine.__dict__.items() if k not in ("source", "seconds")}
    )
    f = one(s, "queue-bound")
    assert f.source == "run 12" and "in run 12 (5 min of server metrics)" in f.seen


@pytest.mark.parametrize(
    "near",
    [
        dict(waiting_mean=0.9),  # under QUEUE_WAITING_MIN
        dict(running_max=14),  # under 0.9 × 16 = 14.4 running
        dict(kv_usage_max=0.8),  # no room: kv-bound's case
    ],
)
def test_queue_bound_near_misses(near):
    assert none(queued(**near), "queue-bound")


def test_queue_bound_needs_its_facts():
    assert none(b.with_config(queued(), max_num_seqs=None), "queue-bound")
    assert none(queued(waiting_mean=None), "queue-bound")
    assert none(queued(kv_usage_max=None), "queue-bound")
    assert none(replace(queued(), engine=None), "queue-bound")


def test_queue_bound_silent_when_the_cache_cannot_hold_more():
    assert none(b.with_config(queued(), kv_capacity_tokens=20_000), "queue-bound")


# --- kv-bound ----------------------------------------------------------------------------------
def full(fraction=0.5, **kw):
    s = b.with_config(b.healthy(), memory_fraction=fraction, **kw)
    s = b.with_gpus(s, memory_used_bytes=int(fraction * 80 * b.GIB))
    return b.with_live(s, kv_usage_mean=0.97, kv_usage_max=1.0, preemptions=25, waiting_mean=6.0)


def test_kv_bound_raises_memory_fraction_when_there_is_room():
    f = one(full(), "kv-bound")
    assert f.severity == CRITICAL  # preemptions
    assert dict(f.suggestion.settings) == {"gpu_memory_utilization": 0.9}
    assert f.suggestion.settings["gpu_memory_utilization"] <= 0.95
    assert "97 %" in f.seen and "25 sequences were preempted" in f.seen
    assert "over the last 60 s (live)" in f.seen
    assert f.evidence["preemptions"] == 25


def test_kv_bound_then_fp8_cache():
    f = one(full(0.9), "kv-bound")
    assert dict(f.suggestion.settings) == {"kv_cache_dtype": "fp8"}
    s = full(0.9)
    s = b.with_live(b.with_config(b.healthy("sglang"), memory_fraction=0.9), **s.engine.__dict__)
    assert dict(one(s, "kv-bound").suggestion.settings) == {"kv_cache_dtype": "fp8_e4m3"}


def test_kv_bound_not_more_memory_when_another_process_holds_it():
    s = b.with_gpus(full(0.5), memory_used_bytes=int(0.8 * 80 * b.GIB))
    assert dict(one(s, "kv-bound").suggestion.settings) == {"kv_cache_dtype": "fp8"}


def test_kv_bound_then_fewer_sequences():
    f = one(full(0.9, kv_cache_dtype="fp8", max_num_seqs=512), "kv-bound")
    # 400,000 tokens × 0.9 / 1,200 per request = 300 → 256.
    assert dict(f.suggestion.settings) == {"max_num_seqs": 256}


def test_kv_bound_else_an_action():
    f = one(full(0.9, kv_cache_dtype="fp8", max_num_seqs=128), "kv-bound")
    assert not f.suggestion.settings and "tensor parallelism" in f.suggestion.action


def test_kv_bound_full_without_preemptions_is_a_warning():
    s = b.with_live(b.healthy(), kv_usage_mean=0.92, preemptions=0)
    assert one(s, "kv-bound").severity == WARNING


def test_kv_bound_near_miss_and_missing():
    assert none(b.with_live(b.healthy(), kv_usage_mean=0.89, preemptions=0), "kv-bound")
    s = b.with_live(b.healthy(), kv_usage_mean=None, preemptions=None)
    assert none(b.with_server(s, kv_usage_mean=None, preemptions=None), "kv-bound")


# --- prefill-bound -----------------------------------------------------------------------------
def long_prompts(**kw):
    s = b.with_config(b.healthy(), **{"max_num_batched_tokens": 2048, **kw})
    return b.with_live(s, ttft_ms=2000.0, prefill_ms=1500.0, prompt_tokens=600 * 6000.0)


def test_prefill_bound_raises_the_budget():
    f = one(long_prompts(), "prefill-bound")
    assert f.severity == WARNING
    assert dict(f.suggestion.settings) == {"max_num_batched_tokens": 8192}  # 6,000 → 8,192
    assert "2.0 s" in f.seen and "1.5 s" in f.seen and "75 %" in f.seen
    assert "6,000 tokens" in f.seen and "over the last 60 s (live)" in f.seen


def test_prefill_bound_budget_is_capped():
    s = b.with_live(long_prompts(), prompt_tokens=600 * 30_000.0)
    assert dict(one(s, "prefill-bound").suggestion.settings) == {"max_num_batched_tokens": 16384}


def test_prefill_bound_turns_chunking_on():
    s = long_prompts(chunked_prefill=False, max_num_batched_tokens=16384)
    assert dict(one(s, "prefill-bound").suggestion.settings) == {"enable_chunked_prefill": True}
    sg = b.with_config(b.healthy("sglang"), chunked_prefill=False)
    sg = b.with_live(sg, **long_prompts().engine.__dict__)
    assert dict(one(sg, "prefill-bound").suggestion.settings) == {"chunked_prefill_size": 8192}


def test_prefill_bound_budget_already_covers_the_prompt():
    f = one(b.with_config(long_prompts(), max_num_batched_tokens=8192), "prefill-bound")
    assert not f.suggestion.settings and "shorter prompts" in f.suggestion.action


@pytest.mark.parametrize(
    "near",
    [
        dict(prefill_ms=979.0),  # 49 % of TTFT
        dict(ttft_ms=499.0, prefill_ms=400.0),  # fast enough
        dict(prompt_tokens=600 * 1023.0),  # short prompts
    ],
)
def test_prefill_bound_near_misses(near):
    assert none(b.with_live(long_prompts(), **near), "prefill-bound")


def test_prefill_bound_needs_prefill_time():
    s = b.with_live(long_prompts(), prefill_ms=None)
    assert none(s, "prefill-bound")


# --- decode-bound ------------------------------------------------------------------------------
def slow_decode(itl=55.0, concurrency=1, **kw):
    stages = (b.stage("low", concurrency, itl_p50_ms=itl), *b.STAGES[1:])
    return b.with_config(b.with_run(b.healthy(), stages=stages), **kw)


def test_decode_bound_suggests_fp8_weights():
    f = one(slow_decode(), "decode-bound")
    assert f.severity == WARNING
    assert dict(f.suggestion.settings) == {"quantization": "fp8"}
    assert "ITL p50 55 ms (18 tokens/s per stream) at concurrency 1" in f.seen
    assert "in run 12, stage low" in f.seen


def test_decode_bound_already_quantised_is_an_action():
    f = one(slow_decode(quantization="awq"), "decode-bound")
    assert not f.suggestion.settings and "awq" in f.suggestion.action


def test_decode_bound_from_the_live_window():
    s = b.with_live(b.healthy(), itl_ms=50.0, running_mean=2.0)
    f = one(b.with_run(s, config_current=False), "decode-bound")
    assert "over the last 60 s (live)" in f.seen and f.evidence["itl_ms"] == 50.0


def test_decode_bound_near_misses_and_missing():
    assert none(slow_decode(itl=39.9), "decode-bound")
    assert none(slow_decode(concurrency=8), "decode-bound")  # batching may explain it
    stages = (b.stage("low", None, itl_p50_ms=55.0, max_concurrent=None),)
    assert none(b.with_run(b.healthy(), stages=stages), "decode-bound")


# --- prefix-cache ------------------------------------------------------------------------------
def shared(share=0.5, engine="vllm", **kw):
    s = b.with_config(b.healthy(engine), **kw)
    return b.with_lengths(s, shared_prefix_share=share)


def test_prefix_cache_off_with_shared_prefixes():
    f = one(shared(prefix_caching=False), "prefix-cache")
    assert f.severity == WARNING
    assert dict(f.suggestion.settings) == {"enable_prefix_caching": True}
    assert "50 %" in f.seen and "traffic sample" in f.seen
    f = one(shared(prefix_caching=False, engine="sglang"), "prefix-cache")
    assert dict(f.suggestion.settings) == {"disable_radix_cache": False}


def test_prefix_cache_low_hit_rate():
    s = b.with_live(shared(), hit_rate=0.1)
    f = one(s, "prefix-cache")
    assert f.severity == INFO and not f.suggestion.settings
    assert "10 %" in f.seen and "over the last 60 s (live)" in f.seen


def test_prefix_cache_near_misses_and_missing():
    assert none(shared(0.19, prefix_caching=False), "prefix-cache")
    assert none(b.with_live(shared(), hit_rate=0.25), "prefix-cache")  # half of 50 %
    assert none(shared(None, prefix_caching=False), "prefix-cache")
    s = b.with_run(replace(shared(prefix_caching=False), traffic=None), lengths=None)
    assert none(s, "prefix-cache")


# --- tail-growth -------------------------------------------------------------------------------
def tail(p99=2400.0, p50=600.0, **kw):
    stages = (*b.STAGES[:2], b.stage("peak", 64, ttft_p50_ms=p50, ttft_p99_ms=p99))
    return b.with_config(b.with_run(b.healthy(), stages=stages), **kw)


def test_tail_growth():
    f = one(tail(), "tail-growth")
    assert f.severity == WARNING and not f.suggestion.settings
    assert "1.8× (p50 100 ms, p99 180 ms) at stage low" in f.seen
    assert "4.0× (p50 600 ms, p99 2.4 s) at stage peak" in f.seen and "run 12" in f.seen


def test_tail_growth_orders_stages_by_load():
    f = one(b.with_run(tail(), stages=tuple(reversed(tail().runs[0].stages))), "tail-growth")
    assert f.evidence["high_ratio"] == 4.0


def test_tail_growth_orders_rate_driven_stages_by_rate():
    """A rate-driven stage's concurrency is only its cap: the rate is the load."""
    loads = {"low": (2.0, 64), "normal": (5.0, 16), "peak": (8.0, 1)}
    stages = tuple(
        replace(st, request_rate=loads[st.name][0], concurrency=loads[st.name][1])
        for st in tail().runs[0].stages
    )
    f = one(b.with_run(tail(), stages=stages), "tail-growth")
    assert [st["name"] for st in f.evidence["stages"]] == ["low", "normal", "peak"]


def test_tail_growth_without_chunked_prefill():
    f = one(tail(chunked_prefill=False, max_num_batched_tokens=8192), "tail-growth")
    assert dict(f.suggestion.settings) == {"enable_chunked_prefill": True}


def test_tail_growth_near_misses_and_missing():
    assert none(tail(p99=1740.0), "tail-growth")  # 2.9×
    assert none(tail(p99=1999.0, p50=250.0), "tail-growth")  # 8×, but p99 under 2 s
    stages = (
        b.stage("low", 1, ttft_p50_ms=1000.0, ttft_p99_ms=3000.0),
        b.stage("peak", 64, ttft_p50_ms=1000.0, ttft_p99_ms=4000.0),
    )
    assert none(b.with_run(b.healthy(), stages=stages), "tail-growth")  # 3× → 4×: not grown
    assert none(b.with_run(tail(), stages=tail().runs[0].stages[-1:]), "tail-growth")
    assert none(b.with_run(tail(), config_current=False), "tail-growth")
