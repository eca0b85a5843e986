"""The engines' Prometheus metric names our readers use, and their HTTP endpoints (pure).

One row per quantity: our key, its Prometheus kind, and each engine's names **newest first**.
Engines rename metrics and keep (or hide, then drop) the old name for a few releases, so a
reader that knows the older names too can read every version we manage; when an exposition has
both, the newest name wins (they carry the same numbers, and adding them would count twice).
Counter names are written without the ``_total`` suffix the exporters add.

Sources: vLLM ``vllm/v1/metrics/loggers.py`` (PrometheusStatLogger) and ``docs/design/metrics.md``;
SGLang ``python/sglang/srt/metrics/collector.py`` (SchedulerMetricsCollector,
TokenizerMetricsCollector) and ``docs/references/production_metrics.md``.
"""

from __future__ import annotations

from dataclasses import dataclass

ENGINE_PREFIXES = {"vllm": "vllm:", "sglang": "sglang:"}


@dataclass(frozen=True)
class Metric:
    """One quantity the engines export, under each engine's names (newest first)."""

    key: str
    kind: str  # "gauge", "counter" or "histogram"
    vllm: tuple[str, ...] = ()
    sglang: tuple[str, ...] = ()
    help: str = ""

    def names(self, engine: str) -> tuple[str, ...]:
        return self.vllm if engine == "vllm" else self.sglang if engine == "sglang" else ()


METRICS: tuple[Metric, ...] = (
    # --- gauges: the scheduler's state now ------------------------------------------------------
    Metric(
        "running",
        "gauge",
        ("vllm:num_requests_running",),
        ("sglang:num_running_reqs",),
        "Requests in the running batch.",
    ),
    Metric(
        "waiting",
        "gauge",
        ("vllm:num_requests_waiting",),
        ("sglang:num_queue_reqs",),
        "Requests queued, not yet scheduled.",
    ),
    # vllm-project/vllm#18354 (2025, the 0.9/0.10 releases) renamed the gpu_-prefixed cache
    # metrics; the old names were then hidden and dropped (#30041 points at the new one).
    Metric(
        "kv_cache_usage",
        "gauge",
        ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"),
        ("sglang:token_usage",),
        "Share of the KV-cache pool in use, 0-1.",
    ),
    Metric("kv_used_tokens", "gauge", (), ("sglang:num_used_tokens",), "Tokens held in the pool."),
    # SGLang writes this gauge from the last prefill batch alone and sets it to 0 on every
    # decode-batch log (scheduler_metrics_mixin.py, 0.5.3): not a run's hit rate. Read
    # cached_prompt_tokens / prompt_tokens for that.
    Metric(
        "cache_hit_rate",
        "gauge",
        (),
        ("sglang:cache_hit_rate",),
        "Prefix-cache hit rate of the last logged prefill batch (0 after a decode log).",
    ),
    Metric(
        "gen_throughput", "gauge", (), ("sglang:gen_throughput",), "Recent generation tokens/s."
    ),
    # --- counters: cumulative since start ----------------------------------------------------
    # Both count every prompt token, cached ones too: vLLM when a request's first token comes
    # (IterationStats.update_from_output adds prompt_len), SGLang when it finishes
    # (observe_one_finished_request adds len(origin_input_ids)).
    Metric(
        "prompt_tokens",
        "counter",
        ("vllm:prompt_tokens",),
        ("sglang:prompt_tokens",),
        "Prompt tokens of the requests served, prefix-cache hits included.",
    ),
    Metric(
        "generation_tokens",
        "counter",
        ("vllm:generation_tokens",),
        ("sglang:generation_tokens",),
        "Tokens generated.",
    ),
    # SGLang's counterpart of a preemption is a retraction (a running request sent back to the
    # queue when the KV pool runs out), but 0.5.3 exports no cumulative count of them: only
    # the gauge sglang:num_retracted_reqs, the size of the last retraction, reset at each log.
    Metric(
        "preemptions",
        "counter",
        ("vllm:num_preemptions",),
        (),
        "Requests preempted (vLLM).",
    ),
    # Before #18354 these were gpu_prefix_cache_* and counted blocks, not tokens; their ratio
    # (the hit rate, which is what we read) means the same either way.
    Metric(
        "prefix_cache_queries",
        "counter",
        ("vllm:prefix_cache_queries", "vllm:gpu_prefix_cache_queries"),
        (),
        "Prompt tokens looked up in the prefix cache.",
    ),
    Metric(
        "prefix_cache_hits",
        "counter",
        ("vllm:prefix_cache_hits", "vllm:gpu_prefix_cache_hits"),
        (),
        "Prompt tokens found in the prefix cache.",
    ),
    # SGLang's req.cached_tokens, counted when the request finishes; over prompt_tokens it is
    # the prefix-cache hit rate (vLLM's prefix_cache_hits / prefix_cache_queries). Only
    # written when a request had a hit, so with none yet the family is absent: read as 0.
    Metric(
        "cached_prompt_tokens",
        "counter",
        (),
        ("sglang:cached_tokens",),
        "Prompt tokens served from the prefix cache.",
    ),
    Metric(
        "requests_finished",
        "counter",
        ("vllm:request_success",),
        ("sglang:num_requests",),
        "Requests finished (any finish reason).",
    ),
    Metric(
        "requests_aborted", "counter", (), ("sglang:num_aborted_requests",), "Requests aborted."
    ),
    # --- histograms: one observation per request (or per token gap) -------------------------------
    Metric(
        "ttft",
        "histogram",
        ("vllm:time_to_first_token_seconds",),
        ("sglang:time_to_first_token_seconds",),
        "Time to first token, seconds.",
    ),
    # vLLM: TPOT deprecated in favour of ITL in 0.11 (vllm-project/vllm#24110), hidden in 0.12,
    # removed by #32661. SGLang: renamed in sgl-project/sglang#3988, old name removed in #4914.
    Metric(
        "itl",
        "histogram",
        ("vllm:inter_token_latency_seconds", "vllm:time_per_output_token_seconds"),
        ("sglang:inter_token_latency_seconds", "sglang:time_per_output_token_seconds"),
        "Gap between streamed outputs, seconds.",
    ),
    Metric(
        "e2e",
        "histogram",
        ("vllm:e2e_request_latency_seconds",),
        ("sglang:e2e_request_latency_seconds",),
        "Request latency end to end, seconds.",
    ),
    Metric(
        "queue",
        "histogram",
        ("vllm:request_queue_time_seconds",),
        ("sglang:queue_time_seconds",),
        "Time waiting before the first schedule, seconds.",
    ),
    Metric(
        "prefill",
        "histogram",
        ("vllm:request_prefill_time_seconds",),
        (),
        "Time in the prefill phase, seconds.",
    ),
    Metric(
        "decode",
        "histogram",
        ("vllm:request_decode_time_seconds",),
        (),
        "Time in the decode phase, seconds.",
    ),
    Metric(
        "inference",
        "histogram",
        ("vllm:request_inference_time_seconds",),
        (),
        "Time running (prefill + decode), seconds.",
    ),
    Metric(
        "prompt_len",
        "histogram",
        ("vllm:request_prompt_tokens",),
        ("sglang:prompt_tokens_histogram",),
        "Prompt length, tokens.",
    ),
    Metric(
        "generation_len",
        "histogram",
        ("vllm:request_generation_tokens",),
        ("sglang:generation_tokens_histogram",),
        "Output length, tokens.",
    ),
    # A histogram whose name happens to end in _total: matched as written, never stripped.
    Metric(
        "iteration_tokens",
        "histogram",
        ("vllm:iteration_tokens_total",),
        (),
        "Tokens per engine step.",
    ),
)

BY_KEY: dict[str, Metric] = {m.key: m for m in METRICS}


def _index() -> dict[str, tuple[str, Metric, int]]:
    index: dict[str, tuple[str, Metric, int]] = {}
    for metric in METRICS:
        for engine in ENGINE_PREFIXES:
            for rank, name in enumerate(metric.names(engine)):
                if name in index:
                    raise ValueError(f"metric name {name!r} appears twice in the table")
                index[name] = (engine, metric, rank)
    return index


_BY_NAME = _index()


def lookup(family: str) -> tuple[str, Metric, int] | None:
    """``(engine, metric, rank)`` for a metric family name as a Prometheus parser reports it,
    or None when we do not read it; rank 0 is the newest name, higher ranks older ones.
    Untyped expositions keep a counter's ``_total`` suffix in the family name, so that is
    tried without the suffix when the name as written is not in the table."""
    found = _BY_NAME.get(family)
    if found is None and family.endswith("_total"):
        found = _BY_NAME.get(family.removesuffix("_total"))
        if found is not None and found[1].kind != "counter":
            return None
    return found


# --- HTTP endpoints ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Endpoints:
    """Where an engine answers what the panel asks."""

    health: str  # 200 once the engine serves; vLLM binds its port before that, so poll it
    models: str  # OpenAI model list; the served model name(s)
    metrics: str  # Prometheus text exposition
    version: str  # a JSON object with the engine's version under ``version_key``
    version_key: str = "version"
    health_generate: str | None = None  # health that runs a one-token generation
    metrics_flag: str | None = None  # the setting without which ``metrics`` is a 404


ENDPOINTS: dict[str, Endpoints] = {
    # vllm/entrypoints/openai/api_server.py: /health, /v1/models, /metrics and /version,
    # which answers {"version": VLLM_VERSION}.
    "vllm": Endpoints(
        health="/health", models="/v1/models", metrics="/metrics", version="/version"
    ),
    # python/sglang/srt/entrypoints/http_server.py: no /version route; /get_server_info returns
    # the server args plus "version": __version__ (newer releases also name it /server_info and
    # keep /get_server_info as an alias). /metrics only with --enable-metrics.
    "sglang": Endpoints(
        health="/health",
        models="/v1/models",
        metrics="/metrics",
        version="/get_server_info",
        health_generate="/health_generate",
        metrics_flag="enable_metrics",
    ),
}


def endpoints(engine: str) -> Endpoints:
    try:
        return ENDPOINTS[engine]
    except KeyError:
        raise ValueError(f"unknown engine {engine!r} (choose from vllm, sglang)") from None
