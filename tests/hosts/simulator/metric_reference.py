"""The real engines' /metrics families, copied as data from their source (issue 15 items 5, 6).

Each table maps a family name, as ``prometheus_client.parser`` reports it (counters without
``_total``), to ``Family(type, label names, buckets, shown)``. ``shown`` says whether the real
engine, started with the simulator's defaults and after ordinary traffic, exposes it:

* ``SHOWN``: exposed; the simulator must expose it with the same type, labels and buckets.
* anything else: a reason the real engine does not show it in that state (a feature that is
  off, a deprecated name hidden by default, a metric declared but never written); the
  simulator must not show it either.
* ``NOT_MODELLED``: the real engine shows it, the simulator does not (listed in docs/simulator.md).

Buckets are the ``le`` bounds without ``+Inf``, or None for a family that has none; a bucket
list that depends on ``max_model_len`` is given for the lengths the tests use.
"""

from __future__ import annotations

from typing import NamedTuple

SHOWN = "shown"
NOT_MODELLED = "not modelled: the HTTP middleware of the API server (prometheus-fastapi-"
NOT_MODELLED += "instrumentator), which the simulator's server does not run"


class Family(NamedTuple):
    type: str
    labels: tuple[str, ...]
    buckets: tuple[float, ...] | None = None
    shown: str = SHOWN


# vllm/v1/metrics/loggers.py build_1_2_5_buckets(max_model_len), written out for the lengths
# the tests start engines with.
ONE_TWO_FIVE = {
    8192: (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000),
    131072: (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 20000, 50000, 100000),
}
BY_MAX_MODEL_LEN = "1-2-5 up to max_model_len"

# --- vLLM 0.11.0 -----------------------------------------------------------------------------
# vllm/v1/metrics/loggers.py (PrometheusStatLogger) at tag v0.11.0; vllm/v1/spec_decode/
# metrics.py (SpecDecodingProm); vllm/config/cache.py (CacheConfig fields → cache_config_info
# labels via metrics_info(), plus swap_space_bytes from __post_init__ and "engine");
# vllm/entrypoints/openai/api_server.py mount_metrics (default REGISTRY + Instrumentator).
E = ("model_name", "engine")
TOKEN_LATENCY = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0)
TOKEN_LATENCY += (7.5, 10.0, 20.0, 40.0, 80.0)
REQUEST_LATENCY = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0)
REQUEST_LATENCY += (60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)
CACHE_CONFIG_LABELS = (
    "block_size",
    "gpu_memory_utilization",
    "swap_space",
    "cache_dtype",
    "is_attention_free",
    "num_gpu_blocks_override",
    "sliding_window",
    "enable_prefix_caching",
    "prefix_caching_hash_algo",
    "cpu_offload_gb",
    "calculate_kv_scales",
    "cpu_kvcache_space_bytes",
    "mamba_page_size_padded",
    "mamba_cache_dtype",
    "mamba_ssm_cache_dtype",
    "num_gpu_blocks",
    "num_cpu_blocks",
    "kv_sharing_fast_prefill",
    "kv_cache_memory_bytes",
    "swap_space_bytes",
    "engine",
)
HIDDEN = "hidden: deprecated in 0.9.2, shown only with --show-hidden-metrics-for-version=0.10"
SPEC = "only with --speculative-config"

VLLM_0_11_0: dict[str, Family] = {
    "vllm:num_requests_running": Family("gauge", E),
    "vllm:num_requests_waiting": Family("gauge", E),
    "vllm:kv_cache_usage_perc": Family("gauge", E),
    "vllm:gpu_cache_usage_perc": Family("gauge", E, shown=HIDDEN),
    "vllm:gpu_prefix_cache_queries": Family("counter", E, shown=HIDDEN),
    "vllm:gpu_prefix_cache_hits": Family("counter", E, shown=HIDDEN),
    "vllm:prefix_cache_queries": Family("counter", E),
    "vllm:prefix_cache_hits": Family("counter", E),
    "vllm:num_preemptions": Family("counter", E),
    "vllm:prompt_tokens": Family("counter", E),
    "vllm:generation_tokens": Family("counter", E),
    "vllm:request_success": Family("counter", (*E, "finished_reason")),
    "vllm:request_prompt_tokens": Family("histogram", E, BY_MAX_MODEL_LEN),
    "vllm:request_generation_tokens": Family("histogram", E, BY_MAX_MODEL_LEN),
    "vllm:iteration_tokens_total": Family(
        "histogram", E, (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)
    ),
    "vllm:request_max_num_generation_tokens": Family("histogram", E, BY_MAX_MODEL_LEN),
    "vllm:request_params_n": Family("histogram", E, (1, 2, 5, 10, 20)),
    "vllm:request_params_max_tokens": Family("histogram", E, BY_MAX_MODEL_LEN),
    "vllm:time_to_first_token_seconds": Family(
        "histogram",
        E,
        (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5)
        + (10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0),
    ),
    # "Deprecated in 0.11 … TODO: in 0.12, only enable if show_hidden_metrics": 0.11 shows it.
    "vllm:time_per_output_token_seconds": Family("histogram", E, TOKEN_LATENCY),
    "vllm:inter_token_latency_seconds": Family("histogram", E, TOKEN_LATENCY),
    "vllm:request_time_per_output_token_seconds": Family("histogram", E, TOKEN_LATENCY),
    "vllm:e2e_request_latency_seconds": Family("histogram", E, REQUEST_LATENCY),
    "vllm:request_queue_time_seconds": Family("histogram", E, REQUEST_LATENCY),
    "vllm:request_inference_time_seconds": Family("histogram", E, REQUEST_LATENCY),
    "vllm:request_prefill_time_seconds": Family("histogram", E, REQUEST_LATENCY),
    "vllm:request_decode_time_seconds": Family("histogram", E, REQUEST_LATENCY),
    "vllm:lora_requests_info": Family(
        "gauge",
        ("max_lora", "waiting_lora_adapters", "running_lora_adapters"),
        shown="only with --enable-lora",
    ),
    "vllm:cache_config_info": Family("gauge", CACHE_CONFIG_LABELS),
    "vllm:spec_decode_num_drafts": Family("counter", E, shown=SPEC),
    "vllm:spec_decode_num_draft_tokens": Family("counter", E, shown=SPEC),
    "vllm:spec_decode_num_accepted_tokens": Family("counter", E, shown=SPEC),
    "vllm:spec_decode_num_accepted_tokens_per_pos": Family("counter", (*E, "position"), shown=SPEC),
    # prometheus_client's default REGISTRY, which vLLM serves (process_collector.py,
    # platform_collector.py, gc_collector.py).
    "process_virtual_memory_bytes": Family("gauge", ()),
    "process_resident_memory_bytes": Family("gauge", ()),
    "process_start_time_seconds": Family("gauge", ()),
    "process_cpu_seconds": Family("counter", ()),
    "process_open_fds": Family("gauge", ()),
    "process_max_fds": Family("gauge", ()),
    "python_info": Family("gauge", ("implementation", "major", "minor", "patchlevel", "version")),
    "python_gc_objects_collected": Family("counter", ("generation",)),
    "python_gc_objects_uncollectable": Family("counter", ("generation",)),
    "python_gc_collections": Family("counter", ("generation",)),
    # prometheus_fastapi_instrumentator 7.x metrics.default(), added by mount_metrics.
    "http_requests": Family("counter", ("handler", "method", "status"), shown=NOT_MODELLED),
    "http_request_size_bytes": Family("summary", ("handler",), shown=NOT_MODELLED),
    "http_response_size_bytes": Family("summary", ("handler",), shown=NOT_MODELLED),
    "http_request_duration_highr_seconds": Family("histogram", (), shown=NOT_MODELLED),
    "http_request_duration_seconds": Family(
        "histogram", ("handler", "method"), (0.1, 0.5, 1), shown=NOT_MODELLED
    ),
}

# --- SGLang 0.5.3 ----------------------------------------------------------------------------
# python/sglang/srt/metrics/collector.py at tag v0.5.3 (SchedulerMetricsCollector, labels from
# managers/scheduler_metrics_mixin.py init_metrics; TokenizerMetricsCollector, labels from
# managers/tokenizer_manager.py; StorageMetricsCollector), metrics/func_timer.py and
# metrics/startup_func_log_and_timer.py. Served through MultiProcessCollector: a gauge without
# multiprocess_mode ("all") carries a pid label, and a family nobody wrote to is absent.
S = ("model_name", "engine_type", "tp_rank", "pp_rank")
T = ("model_name",)
QUEUE_TIME = (0.0, 0.1, 0.2, 0.5, 1, 2, 3, 4, 5, 10, 15, 20, 30, 40, 50, 60, 70, 80, 90, 100)
QUEUE_TIME += (200, 300, 400, 500, 600, 700, 800, 900, 1000, 1200, 1400, 1600, 1800, 2000)
QUEUE_TIME += (2500, 3000)
# exponential_buckets(start=0.001, width=1.62, length=30), metrics/utils.py
PER_STAGE = tuple(0.001 * 1.62**i for i in range(30))
SG_TTFT = (0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10, 20, 40, 60, 80, 100, 200, 400)
SG_E2E = SG_TTFT + (600, 1200, 1800, 2400)
SG_ITL = (0.002, 0.004, 0.006, 0.008, 0.010, 0.015, 0.020, 0.025, 0.030, 0.035, 0.040, 0.060)
SG_ITL += (0.080, 0.100, 0.200, 0.400, 0.600, 0.800, 1.000, 2.000, 4.000, 6.000, 8.000)
GRAMMAR = "only for requests with a grammar (json_schema, regex, ebnf, structural_tag)"
PD = "only in PD disaggregation (--disaggregation-mode prefill/decode)"
HICACHE = "only with the HiCache storage backend (--hicache-storage-backend)"
NEVER = "declared but never written in 0.5.3"
TOKENS_HISTOGRAM = "only with --collect-tokens-histogram"

SGLANG_0_5_3: dict[str, Family] = {
    "sglang:num_running_reqs": Family("gauge", S),
    "sglang:num_used_tokens": Family("gauge", S),
    "sglang:token_usage": Family("gauge", S),
    "sglang:swa_token_usage": Family("gauge", S),
    "sglang:gen_throughput": Family("gauge", S),
    "sglang:num_queue_reqs": Family("gauge", S),
    "sglang:num_grammar_queue_reqs": Family("gauge", S),
    "sglang:num_running_reqs_offline_batch": Family("gauge", S),
    "sglang:cache_hit_rate": Family("gauge", S),
    "sglang:spec_accept_length": Family("gauge", S),
    "sglang:num_retracted_reqs": Family("gauge", (*S, "pid")),
    "sglang:num_paused_reqs": Family("gauge", (*S, "pid")),
    "sglang:num_prefill_prealloc_queue_reqs": Family("gauge", S),
    "sglang:num_prefill_inflight_queue_reqs": Family("gauge", S),
    "sglang:num_decode_prealloc_queue_reqs": Family("gauge", S),
    "sglang:num_decode_transfer_queue_reqs": Family("gauge", S),
    "sglang:num_bootstrap_failed_reqs": Family("counter", S, shown=PD),
    "sglang:num_transfer_failed_reqs": Family("counter", S, shown=PD),
    "sglang:kv_transfer_speed_gb_s": Family("gauge", S),
    "sglang:kv_transfer_latency_ms": Family("gauge", S),
    "sglang:utilization": Family("gauge", S),
    "sglang:max_running_requests_under_SLO": Family("gauge", S, shown=NEVER),
    "sglang:engine_startup_time": Family("gauge", S),
    "sglang:engine_load_weights_time": Family("gauge", S),
    "sglang:queue_time_seconds": Family("histogram", S, QUEUE_TIME),
    "sglang:grammar_compilation_time_seconds": Family("histogram", S, shown=GRAMMAR),
    "sglang:num_grammar_cache_hit": Family("counter", S, shown=GRAMMAR),
    "sglang:num_grammar_aborted": Family("counter", S, shown=GRAMMAR),
    "sglang:num_grammar": Family("counter", S, shown=GRAMMAR),
    "sglang:grammar_schema_count": Family("histogram", S, shown=GRAMMAR),
    "sglang:grammar_ebnf_size": Family("histogram", S, shown=GRAMMAR),
    "sglang:grammar_tree_traversal_time_avg": Family("histogram", S, shown=GRAMMAR),
    "sglang:grammar_tree_traversal_time_max": Family("histogram", S, shown=GRAMMAR),
    "sglang:per_stage_req_latency_seconds": Family("histogram", (*S, "stage"), PER_STAGE),
    "sglang:prompt_tokens": Family("counter", T),
    "sglang:generation_tokens": Family("counter", T),
    "sglang:prompt_tokens_histogram": Family("histogram", T, shown=TOKENS_HISTOGRAM),
    "sglang:generation_tokens_histogram": Family("histogram", T, shown=TOKENS_HISTOGRAM),
    "sglang:cached_tokens": Family("counter", T),
    "sglang:num_requests": Family("counter", T),
    "sglang:num_so_requests": Family("counter", T, shown=GRAMMAR),
    "sglang:num_aborted_requests": Family("counter", T),
    "sglang:time_to_first_token_seconds": Family("histogram", T, SG_TTFT),
    "sglang:inter_token_latency_seconds": Family("histogram", T, SG_ITL),
    "sglang:e2e_request_latency_seconds": Family("histogram", T, SG_E2E),
    "sglang:prefetched_tokens": Family("counter", (), shown=HICACHE),
    "sglang:backuped_tokens": Family("counter", (), shown=HICACHE),
    "sglang:prefetch_pgs": Family("histogram", (), shown=HICACHE),
    "sglang:backup_pgs": Family("histogram", (), shown=HICACHE),
    "sglang:prefetch_bandwidth": Family("histogram", (), shown=HICACHE),
    "sglang:backup_bandwidth": Family("histogram", (), shown=HICACHE),
    "sglang:func_latency_seconds": Family("histogram", ("name",), shown=NEVER),
    "sglang:startup_latency_breakdown_seconds_max": Family(
        "gauge", ("context",), shown="enable_startup_timer() is never called in 0.5.3"
    ),
}

TABLES = {("vllm", "0.11.0"): VLLM_0_11_0, ("sglang", "0.5.3"): SGLANG_0_5_3}


# --- comparing an exposition with a table ----------------------------------------------------
def families(text: str) -> dict[str, tuple[str, frozenset[str], tuple[float, ...] | None]]:
    """Family name → (type, label names, bucket bounds without +Inf) of an exposition.
    The ``*_created`` gauges prometheus_client writes beside counters and histograms are the
    exporter's timestamps, not families of the engine: left out."""
    from prometheus_client.parser import text_string_to_metric_families

    parsed = list(text_string_to_metric_families(text))
    names = {f.name for f in parsed}
    out = {}
    for family in parsed:
        if family.name.endswith("_created") and family.name.removesuffix("_created") in names:
            continue
        labels = frozenset(k for s in family.samples for k in s.labels if k not in ("le",))
        bounds = sorted(
            {float(s.labels["le"]) for s in family.samples if s.name.endswith("_bucket")}
        )
        buckets = tuple(b for b in bounds if b != float("inf")) if bounds else None
        out[family.name] = (family.type, labels, buckets)
    return out


def mismatches(table: dict[str, Family], text: str, max_model_len: int) -> list[str]:
    """Every way the exposition differs from the table: a shown family missing or with
    another type, label set or buckets; a family shown that the engine does not show; a
    family the table does not know."""
    import math

    actual = families(text)
    problems = []
    for name, want in table.items():
        if want.shown != SHOWN:
            if name in actual:
                problems.append(f"{name}: shown, but the real engine does not ({want.shown})")
            continue
        if name not in actual:
            problems.append(f"{name}: missing")
            continue
        kind, labels, buckets = actual[name]
        if kind != want.type:
            problems.append(f"{name}: type {kind}, the engine's is {want.type}")
        if labels != frozenset(want.labels):
            problems.append(f"{name}: labels {sorted(labels)}, the engine's {sorted(want.labels)}")
        expected = ONE_TWO_FIVE[max_model_len] if want.buckets == BY_MAX_MODEL_LEN else want.buckets
        if want.type == "histogram":
            same = buckets is not None and len(buckets) == len(expected)
            pairs = zip(buckets or (), expected, strict=False)
            same = same and all(math.isclose(a, b, rel_tol=1e-9) for a, b in pairs)
            if not same:
                problems.append(f"{name}: buckets {buckets}, the engine's {tuple(expected)}")
    for name in actual.keys() - table.keys():
        problems.append(f"{name}: not a family of the engine")
    return problems
