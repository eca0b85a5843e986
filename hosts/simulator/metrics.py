"""Prometheus metrics with the real engines' names, labels and buckets.

vLLM: vllm/v1/metrics/loggers.py (labels model_name, engine). SGLang:
docs/references/production_metrics.md (label model_name). prometheus_client adds ``_total`` to
counters, as the engines' exporters do.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from hosts.simulator.config import SimConfig
from hosts.simulator.core import EngineCore, Request, StepResult

TTFT_BUCKETS = (
    0.001,
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
    160.0,
    640.0,
    2560.0,
)
ITL_BUCKETS = (
    0.01,
    0.025,
    0.05,
    0.075,
    0.1,
    0.15,
    0.2,
    0.3,
    0.4,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
)
LATENCY_BUCKETS = (
    0.3,
    0.5,
    0.8,
    1.0,
    1.5,
    2.0,
    2.5,
    5.0,
    10.0,
    15.0,
    20.0,
    30.0,
    40.0,
    50.0,
    60.0,
    120.0,
    240.0,
    480.0,
    960.0,
    1920.0,
    7680.0,
)
TOKEN_BUCKETS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 20000, 50000)


class EngineMetrics:
    """Updates the registry from engine steps and finished requests."""

    def __init__(self, cfg: SimConfig):
        self.cfg = cfg
        self.registry = CollectorRegistry()
        r = self.registry
        if cfg.engine == "vllm":
            names, labels = (
                ("model_name", "engine"),
                {"model_name": cfg.served_model_name, "engine": "0"},
            )
            p = "vllm:"
            self.running = Gauge(
                p + "num_requests_running", "Requests in model execution.", names, registry=r
            ).labels(**labels)
            self.waiting = Gauge(
                p + "num_requests_waiting", "Requests waiting.", names, registry=r
            ).labels(**labels)
            self.kv_usage = Gauge(
                p + "kv_cache_usage_perc", "KV-cache usage, 1 = full.", names, registry=r
            ).labels(**labels)
            self.prefix_queries = Counter(
                p + "prefix_cache_queries", "Prefix-cache queries, in tokens.", names, registry=r
            ).labels(**labels)
            self.prefix_hits = Counter(
                p + "prefix_cache_hits", "Prefix-cache hits, in tokens.", names, registry=r
            ).labels(**labels)
            self.preemptions = Counter(
                p + "num_preemptions", "Cumulative preemptions.", names, registry=r
            ).labels(**labels)
            self.prompt_tokens = Counter(
                p + "prompt_tokens", "Prefill tokens processed.", names, registry=r
            ).labels(**labels)
            self.generation_tokens = Counter(
                p + "generation_tokens", "Generated tokens.", names, registry=r
            ).labels(**labels)
            self.success = Counter(
                p + "request_success", "Finished requests.", (*names, "finished_reason"), registry=r
            )
            self.labels = labels
            hist = {
                "ttft": ("time_to_first_token_seconds", TTFT_BUCKETS),
                "itl": ("inter_token_latency_seconds", ITL_BUCKETS),
                "e2e": ("e2e_request_latency_seconds", LATENCY_BUCKETS),
                "queue": ("request_queue_time_seconds", LATENCY_BUCKETS),
                "prefill": ("request_prefill_time_seconds", LATENCY_BUCKETS),
                "decode": ("request_decode_time_seconds", LATENCY_BUCKETS),
                "inference": ("request_inference_time_seconds", LATENCY_BUCKETS),
                "prompt_len": ("request_prompt_tokens", TOKEN_BUCKETS),
                "generation_len": ("request_generation_tokens", TOKEN_BUCKETS),
            }
        else:
            names, labels = ("model_name",), {"model_name": cfg.served_model_name}
            p = "sglang:"
            self.running = Gauge(
                p + "num_running_reqs", "Running requests.", names, registry=r
            ).labels(**labels)
            self.waiting = Gauge(
                p + "num_queue_reqs", "Queued requests.", names, registry=r
            ).labels(**labels)
            self.kv_usage = Gauge(
                p + "token_usage", "KV pool usage, 1 = full.", names, registry=r
            ).labels(**labels)
            self.used_tokens = Gauge(
                p + "num_used_tokens", "Tokens held in the KV pool.", names, registry=r
            ).labels(**labels)
            self.hit_rate = Gauge(
                p + "cache_hit_rate", "Prefix-cache hit rate.", names, registry=r
            ).labels(**labels)
            self.gen_throughput = Gauge(
                p + "gen_throughput", "Generation tokens/s.", names, registry=r
            ).labels(**labels)
            self.prompt_tokens = Counter(
                p + "prompt_tokens", "Prefill tokens processed.", names, registry=r
            ).labels(**labels)
            self.generation_tokens = Counter(
                p + "generation_tokens", "Generated tokens.", names, registry=r
            ).labels(**labels)
            self.preemptions = self.prefix_queries = self.prefix_hits = self.success = None
            self.labels = labels
            hist = {
                "ttft": ("time_to_first_token_seconds", TTFT_BUCKETS),
                "itl": ("inter_token_latency_seconds", ITL_BUCKETS),
                "e2e": ("e2e_request_latency_seconds", LATENCY_BUCKETS),
                "queue": ("queue_time_seconds", LATENCY_BUCKETS),
            }
        self.hist = {
            key: Histogram(
                p + name, name.replace("_", " "), names, buckets=buckets, registry=r
            ).labels(**labels)
            for key, (name, buckets) in hist.items()
        }
        self._queries_seen = self._hits_seen = self._preemptions_seen = 0

    def on_step(self, core: EngineCore, step: StepResult) -> None:
        self.running.set(step.num_running)
        self.waiting.set(step.num_waiting)
        self.kv_usage.set(core.kv.usage)
        self.prompt_tokens.inc(step.num_prefill_tokens)
        self.generation_tokens.inc(len(step.emitted))
        ttft = self.hist["ttft"]
        end = step.end
        for req in step.emitted:
            if req.num_output == 1:
                ttft.observe(end - req.arrival)
        kv = core.kv
        if self.cfg.engine == "vllm":
            self.prefix_queries.inc(kv.queries - self._queries_seen)
            self.prefix_hits.inc(kv.hits - self._hits_seen)
            self.preemptions.inc(core.num_preemptions - self._preemptions_seen)
        else:
            self.used_tokens.set(int(kv.usage * self.cfg.kv_capacity_tokens))
            self.hit_rate.set(kv.hits / kv.queries if kv.queries else 0.0)
            if step.duration > 0:
                self.gen_throughput.set(len(step.emitted) / step.duration)
        self._queries_seen, self._hits_seen = kv.queries, kv.hits
        self._preemptions_seen = core.num_preemptions

    def append(self, seconds: float) -> None:
        """Inter-token gaps arrive here (the core's ``itl`` sink)."""
        self.hist["itl"].observe(seconds)

    def on_finished(self, req: Request) -> None:
        if req.finish_reason == "abort" or req.first_token is None:
            return
        h = self.hist
        h["e2e"].observe(req.finished_at - req.arrival)
        h["queue"].observe(req.first_scheduled - req.arrival)
        if "prefill" in h:
            h["prefill"].observe(req.first_token - req.first_scheduled)
            h["decode"].observe(req.finished_at - req.first_token)
            h["inference"].observe(req.finished_at - req.first_scheduled)
            h["prompt_len"].observe(req.prompt_len)
            h["generation_len"].observe(req.num_output)
            self.success.labels(**self.labels, finished_reason=req.finish_reason).inc()

    def exposition(self) -> bytes:
        return generate_latest(self.registry)
