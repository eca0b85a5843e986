"""SGLang 0.5.3's /metrics (``--enable-metrics``), fed by the simulated engine.

Mirrors ``python/sglang/srt/metrics/collector.py`` at the v0.5.3 tag: the scheduler's
``SchedulerMetricsCollector`` (labels ``model_name``, ``engine_type``, ``tp_rank``,
``pp_rank``) and the tokenizer's ``TokenizerMetricsCollector`` (label ``model_name``), with their
buckets, and the cadence of ``managers/scheduler_metrics_mixin.py``: the scheduler's gauges are
written on each prefill batch, on every ``decode_log_interval``-th (40) decode batch and every
30 s while idle, so between those they hold the last logged value, as the real ones do.

SGLang serves /metrics from prometheus_client's ``MultiProcessCollector`` (``utils/common.py``
``add_prometheus_middleware``), so this does what that collector does to the families: a
family shows only once something wrote to it, counters and histograms carry no ``_created``
sample, every help text is "Multiprocess metric", and the gauges declared without a
``multiprocess_mode`` (``num_retracted_reqs``, ``num_paused_reqs``) carry the writer's ``pid``.

Shown at the zero a real engine shows with the feature off (they are written on every log):
speculative decoding (``spec_accept_length``), SWA (``swa_token_usage``), grammar queue, offline
batch, paused requests, PD-disaggregation queues and KV transfer, ``utilization`` (0.5.3 only
computes it from ``max_running_requests_under_SLO``, which nothing sets) and the two startup
gauges (declared, never set in 0.5.3). Absent, as on a real unified engine without those
features: ``max_running_requests_under_SLO``, bootstrap/transfer failure counters, grammar
histograms and counters, ``num_so_requests_total``, the token-length histograms (only with
``--collect-tokens-histogram``), the HiCache storage metrics and ``func_latency_seconds``
(declared, never observed in 0.5.3).
"""

from __future__ import annotations

import os
import time

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.metrics_core import Metric

from hosts.simulator.config import SimConfig
from hosts.simulator.core import EngineCore, Request, StepResult

SCHEDULER_LABELS = ("model_name", "engine_type", "tp_rank", "pp_rank")
TOKENIZER_LABELS = ("model_name",)
DECODE_LOG_INTERVAL = 40  # server_args.decode_log_interval default
# scheduler_output_processor_mixin.py: a non-streamed request's output goes out every 50 tokens
FORCE_STREAM_INTERVAL = 50
IDLE_LOG_SECONDS = 30  # scheduler.check_memory: "During idle time, also collect metrics every 30s"
QUEUE_TIME_BUCKETS = (0.0, 0.1, 0.2, 0.5, 1, 2, 3, 4, 5, 10, 15, 20, 30, 40, 50, 60, 70, 80)
QUEUE_TIME_BUCKETS += (90, 100, 200, 300, 400, 500, 600, 700, 800, 900, 1000, 1200, 1400)
QUEUE_TIME_BUCKETS += (1600, 1800, 2000, 2500, 3000)
# exponential_buckets(start=0.001, width=1.62, length=30) in metrics/utils.py
PER_STAGE_BUCKETS = tuple(0.001 * 1.62**i for i in range(30))
TTFT_BUCKETS = (0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10, 20, 40, 60, 80, 100, 200, 400)
E2E_BUCKETS = (0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10, 20, 40, 60, 80, 100, 200, 400)
E2E_BUCKETS += (600, 1200, 1800, 2400)
ITL_BUCKETS = (0.002, 0.004, 0.006, 0.008, 0.010, 0.015, 0.020, 0.025, 0.030, 0.035, 0.040)
ITL_BUCKETS += (0.060, 0.080, 0.100, 0.200, 0.400, 0.600, 0.800, 1.000, 2.000, 4.000, 6.000)
ITL_BUCKETS += (8.000,)
# SchedulerStats fields logged as gauges on every log_stats, in collector order; the ones the
# simulator reads are set in _log, the rest stay at SchedulerStats' default 0.
MOSTRECENT_GAUGES = (
    "num_running_reqs",
    "num_used_tokens",
    "token_usage",
    "swa_token_usage",
    "gen_throughput",
    "num_queue_reqs",
    "num_grammar_queue_reqs",
    "num_running_reqs_offline_batch",
    "cache_hit_rate",
    "spec_accept_length",
    "num_prefill_prealloc_queue_reqs",
    "num_prefill_inflight_queue_reqs",
    "num_decode_prealloc_queue_reqs",
    "num_decode_transfer_queue_reqs",
    "kv_transfer_speed_gb_s",
    "kv_transfer_latency_ms",
    "utilization",
    "engine_startup_time",
    "engine_load_weights_time",
)
ALL_MODE_GAUGES = ("num_retracted_reqs", "num_paused_reqs")  # multiprocess_mode "all": + pid


class MultiprocessView:
    """What ``MultiProcessCollector`` makes of a registry's families (see the module doc)."""

    def __init__(self, inner: CollectorRegistry, with_pid: frozenset[str]):
        self.inner = inner
        self.with_pid = with_pid

    def collect(self):
        pid = str(os.getpid())
        for family in self.inner.collect():
            samples = [s for s in family.samples if not s.name.endswith("_created")]
            if not samples:
                continue
            out = Metric(family.name, "Multiprocess metric", family.type)
            for sample in samples:
                labels = dict(sample.labels)
                if family.name in self.with_pid:
                    labels["pid"] = pid
                out.add_sample(sample.name, labels, sample.value)
            yield out


class SglangMetrics:
    """The registry of one simulated SGLang 0.5.3 server (DP 1, PP 1, unified mode)."""

    def __init__(self, cfg: SimConfig):
        self.cfg = cfg
        inner = CollectorRegistry(auto_describe=True)
        self.registry = CollectorRegistry()
        self.registry.register(
            MultiprocessView(inner, frozenset("sglang:" + n for n in ALL_MODE_GAUGES))
        )
        model = cfg.served_model_name
        # Every TP rank runs a scheduler; only attn_tp_rank 0 logs the gauges
        # (current_scheduler_metrics_enabled), but each observes the queue histograms.
        self.rank_labels = [
            {"model_name": model, "engine_type": "unified", "tp_rank": str(rank), "pp_rank": "0"}
            for rank in range(max(cfg.tp, 1))
        ]
        self.gauges = {
            name: Gauge("sglang:" + name, name, SCHEDULER_LABELS, registry=inner)
            for name in (*MOSTRECENT_GAUGES, *ALL_MODE_GAUGES)
        }
        self.queue_time = Histogram(
            "sglang:queue_time_seconds",
            "Queueing time.",
            SCHEDULER_LABELS,
            buckets=QUEUE_TIME_BUCKETS,
            registry=inner,
        )
        self.per_stage = Histogram(
            "sglang:per_stage_req_latency_seconds",
            "The latency of each stage of requests.",
            (*SCHEDULER_LABELS, "stage"),
            buckets=PER_STAGE_BUCKETS,
            registry=inner,
        )

        def counter(name):
            return Counter("sglang:" + name, name, TOKENIZER_LABELS, registry=inner)

        def histogram(name, buckets):
            return Histogram(
                "sglang:" + name, name, TOKENIZER_LABELS, buckets=buckets, registry=inner
            )

        self.tokenizer = {"model_name": model}
        self.prompt_tokens = counter("prompt_tokens_total")
        self.generation_tokens = counter("generation_tokens_total")
        self.cached_tokens = counter("cached_tokens_total")
        self.num_requests = counter("num_requests_total")
        self.num_aborted = counter("num_aborted_requests_total")
        self.ttft = histogram("time_to_first_token_seconds", TTFT_BUCKETS)
        self.itl = histogram("inter_token_latency_seconds", ITL_BUCKETS)
        self.e2e = histogram("e2e_request_latency_seconds", E2E_BUCKETS)
        self._itl_child = None  # the per-token path: skip the labels() lookup
        self.core: EngineCore | None = None
        self._hits_seen = 0
        self._retracted = 0  # Scheduler.num_retracted_reqs: the last retraction's size
        self._decode_steps = 0
        self._decode_tokens = 0
        self._last_decode_log = 0.0  # simulated seconds
        self._gen_throughput = 0.0
        self._hit_rate = 0.0
        self._last_log_wall = time.monotonic()

    # --- the scheduler's side -------------------------------------------------------------
    def on_step(self, core: EngineCore, step: StepResult) -> None:
        if self.core is None:
            self.core = core
            core.on_abort = self.on_abort
        if step.preempted:
            self._retracted = len(step.preempted)
        end = step.end
        for req in step.emitted:
            # The tokenizer's first output: the first token of a streamed request; for a
            # non-streamed one the 50th (DEFAULT_FORCE_STREAM_INTERVAL) or, if it finishes
            # sooner, its last (see on_finished).
            if req.num_output == (1 if req.stream else FORCE_STREAM_INTERVAL):
                self.ttft.labels(**self.tokenizer).observe(end - req.arrival)
        if step.prefilled:
            self._prefill_batch(core, step)
        elif step.emitted:
            self._decode_steps += 1
            self._decode_tokens += len(step.emitted)
            if self._decode_steps % DECODE_LOG_INTERVAL == 0:
                gap = end - self._last_decode_log
                self._gen_throughput = self._decode_tokens / gap if gap > 0 else 0.0
                self._decode_tokens = 0
                self._last_decode_log = end
                self._log(core, step.num_running, step.num_waiting, 0.0)

    def _prefill_batch(self, core: EngineCore, step: StepResult) -> None:
        """get_new_batch_prefill: each request of the batch ends a ``prefill_waiting`` stage;
        one entering the forward pass for the first time observes its queueing time; then
        log_prefill_stats with this batch's cache hit rate."""
        start = step.start
        for req in step.prefilled:
            waited = start - (req.arrival if req.stage_tic is None else req.stage_tic)
            req.stage_tic = start
            first = req.first_scheduled == start
            for labels in self.rank_labels:
                self.per_stage.labels(**labels, stage="prefill_waiting").observe(waited)
                if first:
                    self.queue_time.labels(**labels).observe(start - req.arrival)
        hits = core.kv.hits - self._hits_seen
        self._hits_seen = core.kv.hits
        total = hits + step.num_prefill_tokens
        # running_bs: the decode batch beside this prefill batch.
        running = max(step.num_running - len(step.prefilled), 0)
        self._log(core, running, step.num_waiting, hits / total if total else 0.0)

    def _log(self, core, running: int, queued: int, hit_rate: float, idle=False) -> None:
        """SchedulerMetricsCollector.log_stats on the logging rank (tp 0)."""
        kv = core.kv if core is not None else None
        used = (kv.num_blocks - kv.num_free) * kv.block_size if kv else 0
        usage = kv.usage if kv else 0.0
        readings = {
            "num_running_reqs": running,
            "num_used_tokens": used,
            "token_usage": round(usage, 2) if idle else usage,
            "gen_throughput": 0.0 if idle else self._gen_throughput,
            "num_queue_reqs": queued,
            "cache_hit_rate": hit_rate,
        }
        if not idle:
            # The prefill/decode logs hand the retraction count over and reset it; the idle
            # log writes the stats object as it is.
            readings["num_retracted_reqs"] = self._retracted
            self._retracted = 0
        self._hit_rate = hit_rate
        labels = self.rank_labels[0]
        for name, gauge in self.gauges.items():
            value = readings.get(name)
            child = gauge.labels(**labels)
            if value is not None:
                child.set(value)
            # else: a field this engine never changes keeps SchedulerStats' default, 0.
        self._last_log_wall = time.monotonic()

    def _idle_log(self) -> None:
        core = self.core
        if core is not None and core.has_work:
            return
        if time.monotonic() - self._last_log_wall < IDLE_LOG_SECONDS:
            return
        running = len(core.running) if core is not None else 0
        waiting = len(core.waiting) if core is not None else 0
        # The idle log leaves cache_hit_rate as the last log set it.
        self._log(core, running, waiting, self._hit_rate, idle=True)

    # --- the tokenizer's side -------------------------------------------------------------
    def append(self, seconds: float) -> None:
        """One inter-token gap (stream_interval 1: one token per streamed output)."""
        if self._itl_child is None:
            self._itl_child = self.itl.labels(**self.tokenizer)
        self._itl_child.observe(seconds)

    def on_finished(self, req: Request) -> None:
        """observe_one_finished_request: the whole prompt, cached tokens too, counts in
        ``prompt_tokens_total``, so ``cached_tokens_total / prompt_tokens_total`` is the hit
        rate over finished requests."""
        if req.first_token is None:
            return  # the core's own abort of a request that can never fit: not a request here
        if not req.stream and req.num_output < FORCE_STREAM_INTERVAL:
            self.ttft.labels(**self.tokenizer).observe(req.finished_at - req.arrival)
        self._count_finished(req)

    def _count_finished(self, req: Request) -> None:
        labels = self.tokenizer
        self.prompt_tokens.labels(**labels).inc(req.prompt_len)
        self.generation_tokens.labels(**labels).inc(req.num_output)
        if req.cached_tokens > 0:
            self.cached_tokens.labels(**labels).inc(req.cached_tokens)
        self.num_requests.labels(**labels).inc()
        self.e2e.labels(**labels).observe(req.finished_at - req.arrival)

    def on_abort(self, req: Request, was_running: bool) -> None:
        """TokenizerManager.abort_request counts every abort; a running request is then
        finished by the scheduler and its last output goes through collect_metrics like any
        other: a first output (even with no token) observes TTFT, and the request counts as
        finished. A waiting one is dropped without metrics (_handle_abort_req)."""
        self.num_aborted.labels(**self.tokenizer).inc()
        if not was_running:
            return
        first_output_sent = req.num_output >= (1 if req.stream else FORCE_STREAM_INTERVAL)
        if not first_output_sent:
            self.ttft.labels(**self.tokenizer).observe(req.finished_at - req.arrival)
        self._count_finished(req)

    def exposition(self) -> bytes:
        self._idle_log()
        return generate_latest(self.registry)
