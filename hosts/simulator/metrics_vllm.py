"""vLLM 0.11's /metrics, fed by the simulated engine.

Mirrors ``PrometheusStatLogger`` in ``vllm/v1/metrics/loggers.py`` at the v0.11.0 tag: the same
family names, types, label names (``model_name``, ``engine``) and buckets, and the same
readings: ``IterationStats`` / ``FinishedRequestStats`` in ``vllm/v1/metrics/stats.py`` say what
each one observes and when. vLLM serves them from prometheus_client's default registry, which
also carries the process, platform and GC collectors, so this registry does too.

Left out, as vLLM 0.11 leaves them out by default: the ``gpu_``-prefixed cache metrics (hidden
since 0.10, shown only with ``--show-hidden-metrics-for-version``), speculative decoding
(only with ``--speculative-config``) and ``lora_requests_info`` (only with ``--enable-lora``).
Not modelled: the HTTP families (``http_requests_total`` …) that prometheus-fastapi-instrumentator
adds from the API server's middleware.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.gc_collector import GCCollector
from prometheus_client.metrics_core import Metric
from prometheus_client.platform_collector import PlatformCollector
from prometheus_client.process_collector import ProcessCollector

from hosts.simulator.config import SimConfig
from hosts.simulator.core import EngineCore, Request, StepResult

LABELS = ("model_name", "engine")
FINISH_REASONS = ("stop", "length", "abort")  # vllm/v1/engine/__init__.py FINISH_REASON_STRINGS
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5)
TTFT_BUCKETS += (5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
TOKEN_LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0)
TOKEN_LATENCY_BUCKETS += (2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0)
REQUEST_LATENCY_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0)
REQUEST_LATENCY_BUCKETS += (50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)
ITERATION_TOKEN_BUCKETS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)
PARAMS_N_BUCKETS = (1, 2, 5, 10, 20)


def build_1_2_5_buckets(max_value: int) -> list[int]:
    """1, 2, 5, 10, 20, 50 … up to ``max_value`` (vLLM's ``build_1_2_5_buckets``)."""
    buckets, exponent = [], 0
    while True:
        for mantissa in (1, 2, 5):
            value = mantissa * 10**exponent
            if value > max_value:
                return buckets
            buckets.append(value)
        exponent += 1


def cache_config_labels(cfg: SimConfig) -> dict[str, str]:
    """``CacheConfig.metrics_info()`` as the API server holds it after the engine reported
    its blocks: every field of ``vllm/config/cache.py`` (plus ``swap_space_bytes``, set in
    ``__post_init__``) as ``str(value)``, in the class's order, then ``engine``. Values are
    the simulated engine's own settings; ``num_cpu_blocks`` is set in the engine-core process
    only, so the API server's copy says None."""
    s = cfg.settings
    swap_space = s.get("swap_space", 4)
    return {
        "block_size": str(cfg.block_size),
        "gpu_memory_utilization": str(s.get("gpu_memory_utilization", 0.9)),
        "swap_space": str(swap_space),
        "cache_dtype": str(s.get("kv_cache_dtype", "auto")),
        "is_attention_free": "False",
        "num_gpu_blocks_override": str(s.get("num_gpu_blocks_override")),
        "sliding_window": "None",
        "enable_prefix_caching": str(cfg.prefix_caching),
        "prefix_caching_hash_algo": str(s.get("prefix_caching_hash_algo", "sha256")),
        "cpu_offload_gb": str(s.get("cpu_offload_gb", 0)),
        "calculate_kv_scales": str(s.get("calculate_kv_scales", False)),
        "cpu_kvcache_space_bytes": "None",
        "mamba_page_size_padded": "None",
        "mamba_cache_dtype": str(s.get("mamba_cache_dtype", "auto")),
        "mamba_ssm_cache_dtype": str(s.get("mamba_ssm_cache_dtype", "auto")),
        "num_gpu_blocks": str(cfg.num_blocks),
        "num_cpu_blocks": "None",
        "kv_sharing_fast_prefill": str(s.get("kv_sharing_fast_prefill", False)),
        "kv_cache_memory_bytes": str(s.get("kv_cache_memory_bytes")),
        "swap_space_bytes": str(swap_space * 2**30),
        "engine": "0",
    }


class Renamed:
    """A collector serving another metric's families under a new name."""

    def __init__(self, source, name: str, documentation: str):
        self.source = source
        self.name = name
        self.documentation = documentation

    def describe(self):
        return [Metric(self.name, self.documentation, "histogram")]

    def collect(self):
        for family in self.source.collect():
            out = Metric(self.name, self.documentation, family.type)
            for sample in family.samples:
                suffix = sample.name[len(family.name) :]
                out.add_sample(self.name + suffix, sample.labels, sample.value)
            yield out


class VllmMetrics:
    """The registry of one simulated vLLM 0.11 engine (engine index 0)."""

    def __init__(self, cfg: SimConfig, registry: CollectorRegistry | None = None):
        self.cfg = cfg
        r = self.registry = registry or CollectorRegistry()
        ProcessCollector(registry=r)
        PlatformCollector(registry=r)
        GCCollector(registry=r)
        values = (cfg.served_model_name, "0")

        def gauge(name, doc):
            return Gauge("vllm:" + name, doc, LABELS, registry=r).labels(*values)

        def counter(name, doc):
            return Counter("vllm:" + name, doc, LABELS, registry=r).labels(*values)

        def histogram(name, doc, buckets):
            return Histogram("vllm:" + name, doc, LABELS, buckets=buckets, registry=r).labels(
                *values
            )

        self.running = gauge("num_requests_running", "Number of requests in model execution.")
        self.waiting = gauge("num_requests_waiting", "Number of requests waiting.")
        self.kv_usage = gauge("kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent.")
        self.prefix_queries = counter("prefix_cache_queries", "Prefix cache queries, tokens.")
        self.prefix_hits = counter("prefix_cache_hits", "Prefix cache hits, tokens.")
        self.preemptions = counter("num_preemptions", "Cumulative number of preemptions.")
        self.prompt_tokens = counter("prompt_tokens", "Number of prefill tokens processed.")
        self.generation_tokens = counter("generation_tokens", "Number of generation tokens.")
        success = Counter(
            "vllm:request_success",
            "Count of successfully processed requests.",
            (*LABELS, "finished_reason"),
            registry=r,
        )
        # vLLM creates one child per finish reason up front, so all three read 0 from start.
        self.success = {reason: success.labels(*values, reason) for reason in FINISH_REASONS}
        per_len = build_1_2_5_buckets(cfg.max_model_len)
        self.prompt_len = histogram("request_prompt_tokens", "Prefill tokens.", per_len)
        self.generation_len = histogram("request_generation_tokens", "Generated.", per_len)
        self.iteration_tokens = histogram(
            "iteration_tokens_total", "Tokens per engine_step.", ITERATION_TOKEN_BUCKETS
        )
        self.max_generation = histogram(
            "request_max_num_generation_tokens", "Max generation tokens requested.", per_len
        )
        self.params_n = histogram("request_params_n", "The n parameter.", PARAMS_N_BUCKETS)
        self.params_max_tokens = histogram(
            "request_params_max_tokens", "The max_tokens parameter.", per_len
        )
        self.ttft = histogram("time_to_first_token_seconds", "TTFT.", TTFT_BUCKETS)
        itl = Histogram(
            "vllm:inter_token_latency_seconds",
            "Histogram of inter-token latency in seconds.",
            LABELS,
            buckets=TOKEN_LATENCY_BUCKETS,
            registry=r,
        )
        self.itl = itl.labels(*values)
        # Deprecated in 0.11 (hidden from 0.12) but shown by 0.11, observed with exactly the
        # gaps ITL gets and with the same buckets: served as a copy of ITL under its name
        # rather than observed twice per token.
        r.register(
            Renamed(
                itl,
                "vllm:time_per_output_token_seconds",
                "Histogram of time per output token in seconds."
                "DEPRECATED: Use vllm:inter_token_latency_seconds instead.",
            )
        )
        self.request_tpot = histogram(
            "request_time_per_output_token_seconds", "TPOT per request.", TOKEN_LATENCY_BUCKETS
        )
        latency = REQUEST_LATENCY_BUCKETS
        self.e2e = histogram("e2e_request_latency_seconds", "E2E latency.", latency)
        self.queue = histogram("request_queue_time_seconds", "WAITING phase.", latency)
        self.inference = histogram("request_inference_time_seconds", "RUNNING phase.", latency)
        self.prefill = histogram("request_prefill_time_seconds", "PREFILL phase.", latency)
        self.decode = histogram("request_decode_time_seconds", "DECODE phase.", latency)
        info = cache_config_labels(cfg)
        Gauge(
            "vllm:cache_config_info",
            "Information of the LLMEngine CacheConfig",
            tuple(info),
            registry=r,
        ).labels(**info).set(1)
        self._queries_seen = self._hits_seen = self._preemptions_seen = 0
        # Parent id → [children still running, most tokens any child generated].
        self._parents: dict[str, list[int]] = {}

    def on_step(self, core: EngineCore, step: StepResult) -> None:
        """One ``record()`` of the stat logger: scheduler stats, then the iteration's."""
        self.running.set(step.num_running)
        self.waiting.set(step.num_waiting)
        kv = core.kv
        self.kv_usage.set(kv.usage)
        self.prefix_queries.inc(kv.queries - self._queries_seen)
        self.prefix_hits.inc(kv.hits - self._hits_seen)
        self.preemptions.inc(core.num_preemptions - self._preemptions_seen)
        self._queries_seen, self._hits_seen = kv.queries, kv.hits
        self._preemptions_seen = core.num_preemptions
        # IterationStats.update_from_output: a request's whole prompt (cached tokens too)
        # counts once, in the step that produced its first token.
        prompt_tokens = 0
        end = step.end
        for req in step.emitted:
            if req.num_output == 1:
                prompt_tokens += req.prompt_len
                self.ttft.observe(end - req.arrival)
        generated = len(step.emitted)
        self.prompt_tokens.inc(prompt_tokens)
        self.generation_tokens.inc(generated)
        self.iteration_tokens.observe(prompt_tokens + generated)

    def append(self, seconds: float) -> None:
        """One inter-token gap: vLLM observes it as ITL and as the deprecated TPOT (the
        ``Renamed`` copy)."""
        self.itl.observe(seconds)

    def on_finished(self, req: Request) -> None:
        """``update_from_finished_request`` and the parent's n / max-generation histograms.
        Requests a client aborted never get here in vLLM either (the output processor drops
        them without stats); the core's own aborts have no vLLM counterpart."""
        if req.finish_reason == "abort" or req.first_token is None:
            if req.parent_id is not None:
                self._parents.pop(req.parent_id, None)  # its siblings are aborted with it
            return
        self.success[req.finish_reason].inc()
        self.e2e.observe(req.finished_at - req.arrival)
        self.queue.observe(req.first_scheduled - req.arrival)
        self.prefill.observe(req.first_token - req.first_scheduled)
        self.decode.observe(req.last_token - req.first_token)
        self.inference.observe(req.last_token - req.first_scheduled)
        self.prompt_len.observe(req.prompt_len)
        self.generation_len.observe(req.num_output)
        decode = req.last_token - req.first_token
        self.request_tpot.observe(decode / (req.num_output - 1) if req.num_output > 1 else 0)
        if req.max_tokens:
            self.params_max_tokens.observe(req.max_tokens)
        self._parent_finished(req)

    def _parent_finished(self, req: Request) -> None:
        # ParentRequest.observe_finished_request: once per client request, when its last
        # child finishes, with the most tokens any of its n choices generated.
        if req.parent_id is None or req.params_n <= 1:
            self.params_n.observe(req.params_n)
            self.max_generation.observe(req.num_output)
            return
        left = self._parents.setdefault(req.parent_id, [req.params_n, 0])
        left[0] -= 1
        left[1] = max(left[1], req.num_output)
        if left[0] <= 0:
            del self._parents[req.parent_id]
            self.params_n.observe(req.params_n)
            self.max_generation.observe(left[1])

    def exposition(self) -> bytes:
        return generate_latest(self.registry)
