"""The advisor's snapshot of one deployment (``changes.advisor.facts``), gathered from the
panel: the running config with the engine's defaults filled in, the GPUs' telemetry over the
last few minutes, the host, a short live scrape of the engine's /metrics, the latest
benchmark runs and, when one was run, a traffic sample's lengths.

Every part that cannot be had is None (the rules then say nothing rather than guess); the
scrape's failure is kept as words (``Gathered.engine_error``) for the pages.

Bounded work: a fixed number of queries whatever the number of runs (no query per run), and
what a finished run yields (its lengths, error messages, server gauges) is computed once per
process and kept, since a finished run never changes.
"""

from __future__ import annotations

import re
import threading
import time
from collections import Counter
from dataclasses import dataclass
from datetime import timedelta

from django.conf import settings as conf
from django.db.models import Avg, Count, Max
from django.utils import timezone

from benchmarks import records as request_records
from benchmarks.evidence import usable_as_evidence
from benchmarks.models import BenchmarkRun, RunPoint, RunRequestLog
from benchmarks.services import compare
from changes.advisor.facts import (
    ConfigFacts,
    EngineWindow,
    GpuFacts,
    HostFacts,
    LengthFacts,
    RunFacts,
    Snapshot,
    StageFacts,
)
from changes.services.diagnosis_scrape import as_int as _int
from changes.services.diagnosis_scrape import gauge as _gauge
from changes.services.diagnosis_scrape import scrape_engine
from changes.services.diagnosis_traffic import lengths as _lengths
from changes.services.diagnosis_traffic import traffic_facts
from controlpanel.choices import OperationStatus
from hosts.engines import cpulist, get_spec, sglang, vllm
from hosts.engines.catalog import GPUS, UnknownModel, resolve_model
from hosts.models import Deployment, Gpu, GpuSample
from hosts.services.gpus import gpu_facts
from hosts.simulator.config import StartupError, build_config
from hosts.transport.nvidia_smi import THROTTLE_REASONS

# The newest runs a snapshot carries: enough to see a trend, few enough to read every minute.
RUNS = 5
# A request log longer than this is read only this far for lengths and error messages: a
# percentile over 20,000 requests is as good as over 100,000 and costs a fifth.
LOG_ROWS = 20_000
# Finished runs whose derived facts are kept in memory (per process).
RUN_CACHE = 256

# vLLM and SGLang name the same settings differently.
SEQS = {"vllm": "max_num_seqs", "sglang": "max_running_requests"}
CONTEXT = {"vllm": "max_model_len", "sglang": "context_length"}
MEMORY = {"vllm": "gpu_memory_utilization", "sglang": "mem_fraction_static"}
TP = {"vllm": "tensor_parallel_size", "sglang": "tp_size"}


@dataclass(frozen=True)
class Gathered:
    """A snapshot and what the pages say about how it was gathered."""

    snapshot: Snapshot
    engine_status: str  # "live", "skipped" (not asked), "unavailable"
    engine_error: str = ""


# --- config --------------------------------------------------------------------------------
def _snake(word: str) -> str:
    """NVML's ``SwPowerCap`` → ``sw_power_cap`` (the advisor's spelling)."""
    return re.sub(r"(?<!^)(?=[A-Z])", "_", word).lower()


def _gpu_spec(deployment: Deployment):
    key, count, memory = gpu_facts(deployment)
    return (GPUS.get(key) if key else None), count, memory


def config_facts(deployment: Deployment) -> ConfigFacts:
    """The active config with every unset flag resolved as the engine resolves it at start:
    the simulator's derivation (``hosts.simulator.config.build_config``, the engines' own
    rules) when it models the model and GPU, else the flag table's static defaults and the
    engine's GPU-dependent ones."""
    engine = deployment.engine
    config = deployment.active_config
    stored = dict(config.settings) if config else {}
    spec = get_spec(engine)
    effective = spec.effective(stored, deployment.engine_version or None)
    gpu, count, memory = _gpu_spec(deployment)
    sim = None
    if gpu is not None:
        try:
            sim = build_config(engine, deployment.model, stored, gpu, count or 1)
        except (StartupError, UnknownModel, ValueError):
            sim = None
    if engine == "vllm":
        auto = vllm.auto_defaults(memory or 0, gpu.nvml_name if gpu else "") if memory else {}
        chunked = effective.get("enable_chunked_prefill")
        chunked = auto.get("enable_chunked_prefill") if chunked is None else chunked
        prefix = effective.get("enable_prefix_caching")
        prefix = auto.get("enable_prefix_caching") if prefix is None else prefix
        budget = effective.get("max_num_batched_tokens") or auto.get("max_num_batched_tokens")
        memory_fraction = effective.get("gpu_memory_utilization")
    else:
        tp = effective.get("tp_size") or 1
        auto = sglang.auto_defaults(memory, tp) if memory else {}
        chunk = effective.get("chunked_prefill_size") or auto.get("chunked_prefill_size")
        chunked = None if chunk is None else chunk != -1
        prefix = not effective.get("disable_radix_cache", False)
        budget = chunk
        memory_fraction = effective.get("mem_fraction_static") or auto.get("mem_fraction_static")
    seqs = effective.get(SEQS[engine]) or auto.get("max_num_seqs")
    context = effective.get(CONTEXT[engine])
    if context in (-1, 0):
        context = None
    kv_dtype = effective.get("kv_cache_dtype") or "auto"
    quantization = effective.get("quantization") or None
    try:
        model = resolve_model(deployment.model)
    except UnknownModel:
        model = None
    weights = kv_per_token = None
    if model is not None:
        quantization = quantization or model.quantization
        weights = int(model.weight_bytes)
        dtype_bytes = 1.0 if str(kv_dtype).startswith("fp8") else 2.0
        kv_per_token = int(model.kv_bytes_per_token(dtype_bytes))
        context = context or model.max_position
    capacity = None
    if sim is not None:
        seqs, context, budget = sim.max_num_seqs, sim.max_model_len, sim.token_budget
        chunked, prefix = sim.chunked_prefill, sim.prefix_caching
        capacity = sim.kv_capacity_tokens
        weights = int(sim.weights_bytes_per_gpu * sim.tp)
    placement = (config.placement or {}) if config else {}
    cpus = placement.get("cpus")
    return ConfigFacts(
        engine=engine,
        engine_version=deployment.engine_version,
        model=deployment.model,
        settings=stored,
        tensor_parallel=int(effective.get(TP[engine]) or 1),
        max_num_seqs=seqs,
        max_model_len=context,
        max_num_batched_tokens=budget,
        chunked_prefill=chunked,
        prefix_caching=prefix,
        memory_fraction=memory_fraction,
        kv_cache_dtype=kv_dtype,
        quantization=quantization,
        weights_bytes=weights,
        kv_bytes_per_token=kv_per_token,
        kv_capacity_tokens=capacity,
        cpus=_cpu_list(cpus) if cpus else None,
        numa_node=placement.get("numa_node"),
    )


def _cpu_list(value) -> tuple[int, ...] | None:
    """``"0-3,8"`` or ``[0, 1]`` → ``(0, 1, 2, 3, 8)``; None when it cannot be read or is
    beyond a CPU list's limits (hosts.engines.cpulist: a host reports what it likes)."""
    if isinstance(value, list | tuple):
        if len(value) > cpulist.MAX_CPU + 1:
            return None
        try:
            return tuple(int(v) for v in value)
        except (TypeError, ValueError):
            return None
    try:
        return tuple(cpulist.parse(str(value))) if str(value).strip() else ()
    except cpulist.CpuListError:
        return None


# --- GPUs and host -------------------------------------------------------------------------
def gpu_and_host_facts(
    deployment: Deployment, seconds: float
) -> tuple[tuple[GpuFacts, ...], HostFacts]:
    """Each GPU of the deployment (the host's when the deployment names none) over the last
    ``seconds`` of telemetry: two queries whatever the number of GPUs."""
    gpus = list(deployment.gpus.all()) or list(Gpu.objects.filter(host_id=deployment.host_id))
    since = timezone.now() - timedelta(seconds=seconds)
    window = GpuSample.objects.filter(gpu__in=gpus, time__gte=since)
    means = {
        row["gpu_id"]: row
        for row in window.values("gpu_id").annotate(
            n=Count("id"),
            util=Avg("utilization_pct"),
            power=Avg("power_w"),
            limit=Max("power_limit_w"),
            temperature=Max("temperature_c"),
            clock=Avg("sm_clock_mhz"),
            tx=Avg("pcie_tx_kbps"),
            rx=Avg("pcie_rx_kbps"),
        )
    }
    # Clock events: the share of samples each reason was active in (a bitmask per sample).
    masks: dict[int, Counter] = {}
    totals: Counter = Counter()
    for gpu_id, mask, n in (
        window.exclude(clocks_event_reasons__isnull=True)
        .values_list("gpu_id", "clocks_event_reasons")
        .annotate(n=Count("id"))
    ):
        totals[gpu_id] += n
        for bit, word in THROTTLE_REASONS.items():
            if mask & bit:
                masks.setdefault(gpu_id, Counter())[_snake(word)] += n
    facts = []
    for gpu in gpus:
        row, last = means.get(gpu.pk) or {}, gpu.last_sample or {}
        total = totals.get(gpu.pk)
        events = {k: v / total for k, v in (masks.get(gpu.pk) or {}).items()} if total else {}
        facts.append(
            GpuFacts(
                index=gpu.index,
                model=gpu.name,
                memory_total_bytes=gpu.memory_bytes,
                numa_node=gpu.numa_node,
                utilization_pct=row.get("util"),
                memory_used_bytes=last.get("memory_used_bytes"),
                power_w=row.get("power"),
                power_limit_w=row.get("limit") or last.get("power_limit_w"),
                temperature_c=row.get("temperature"),
                sm_clock_mhz=row.get("clock"),
                max_sm_clock_mhz=last.get("max_sm_clock_mhz"),
                clock_events=events,
                pcie_tx_kbps=row.get("tx"),
                pcie_rx_kbps=row.get("rx"),
            )
        )
    host = deployment.host
    readings = host.host_readings or {}
    load = readings.get("load_avg") or [None]
    numa = {}
    for node in host.numa_nodes or []:
        cpus = _cpu_list(node.get("cpus", ""))
        if cpus is not None and node.get("node") is not None:
            numa[int(node["node"])] = cpus
    host_facts = HostFacts(
        cpu_count=host.cpu_count,
        load_1m=load[0],
        cpu_util_pct=readings.get("cpu_percent"),
        numa_cpus=numa,
    )
    return tuple(facts), host_facts


# --- benchmark runs ------------------------------------------------------------------------
def _log_facts(blob: bytes, prefix_len: int) -> tuple[LengthFacts | None, dict]:
    """Lengths of the successful requests and failures by message, from a run's request log
    (its first ``LOG_ROWS`` requests)."""
    inputs, outputs, messages = [], [], Counter()
    prefix_tokens = 0
    for n, row in enumerate(request_records.iter_rows(blob)):
        if n >= LOG_ROWS:
            break
        if row["error_class"] is not None:
            messages[row["error"] or row["error_class"]] += 1
            continue
        sent = row["prompt_tokens"] or row["input_len"] or 0
        inputs.append(sent)
        outputs.append(row["output_tokens"] or 0)
        if row["prefix_id"] is not None and prefix_len:
            # What this request carried of its prefix: all of it since the prefix comes on
            # top of the input; under the former rule it was cut to the prompt.
            prefix_tokens += min(prefix_len, sent)
    return _lengths(inputs, outputs, prefix_tokens if inputs else None), dict(messages)


# Per process, by run id: what a finished run's request log and points yield (both final).
# Shared by the process's threads (the advisor's passes, pages, API requests): read and
# changed under the lock, never across a query; each caller answers from its own copy, so
# another thread clearing a full cache meanwhile costs a re-read, not a KeyError.
_log_cache: dict[int, tuple[LengthFacts | None, dict]] = {}
_gauge_cache: dict[int, dict] = {}
_cache_lock = threading.Lock()


def clear_caches() -> None:
    """Forget what was read of runs (tests; a run re-imported under the same id)."""
    with _cache_lock:
        _log_cache.clear()
        _gauge_cache.clear()


def _run_logs(runs: list[BenchmarkRun]) -> dict[int, tuple[LengthFacts | None, dict]]:
    """Lengths and failures by message of each run that has a request log: one query for
    the logs of runs not read before, none otherwise."""
    with _cache_lock:
        found = {r.pk: _log_cache[r.pk] for r in runs if r.pk in _log_cache}
    missing = [r for r in runs if r.pk not in found]
    if missing:
        prefix = {
            r.pk: int(
                ((r.load_profile.spec if r.load_profile else None) or {}).get("prefix_len") or 0
            )
            for r in missing
        }
        read: dict[int, tuple[LengthFacts | None, dict]] = {pk: (None, {}) for pk in prefix}
        for run_id, blob in RunRequestLog.objects.filter(run_id__in=list(prefix)).values_list(
            "run_id", "data"
        ):
            read[run_id] = _log_facts(bytes(blob), prefix[run_id])
        with _cache_lock:
            if len(_log_cache) > RUN_CACHE:
                _log_cache.clear()
            _log_cache.update(read)
        found.update(read)
    return {r.pk: found[r.pk] for r in runs}


def _run_gauges(run_pks: list[int]) -> dict[int, dict]:
    """Mean/max of the server's waiting, running and KV-cache gauges over each run's points:
    one query for the runs not seen before, then kept (a finished run's points are final)."""
    with _cache_lock:
        known = {pk: _gauge_cache[pk] for pk in run_pks if pk in _gauge_cache}
    missing = [pk for pk in run_pks if pk not in known]
    if missing:
        found: dict[int, list[dict]] = {pk: [] for pk in missing}
        for run_id, data in RunPoint.objects.filter(run_id__in=missing).values_list(
            "run_id", "data"
        ):
            found[run_id].append(
                {
                    "running": data.get("server_running"),
                    "waiting": data.get("server_waiting"),
                    "kv_cache_usage": data.get("kv_cache_usage"),
                }
            )
        read = {
            pk: {key: _gauge(points, key) for key in ("running", "waiting", "kv_cache_usage")}
            for pk, points in found.items()
        }
        with _cache_lock:
            if len(_gauge_cache) > RUN_CACHE:
                _gauge_cache.clear()
            _gauge_cache.update(read)
        known.update(read)
    return {pk: known[pk] for pk in run_pks}


def _stage(name: str, data: dict) -> StageFacts:
    def num(key):
        value = data.get(key)
        return float(value) if isinstance(value, int | float) else None

    completed, failed = data.get("completed") or 0, data.get("failed") or 0
    return StageFacts(
        name=name,
        concurrency=data.get("max_concurrency") or data.get("concurrency"),
        request_rate=num("request_rate"),
        requests=completed + failed,
        error_rate=num("error_rate"),
        ttft_p50_ms=num("median_ttft_ms") or num("p50_ttft_ms"),
        ttft_p95_ms=num("p95_ttft_ms"),
        ttft_p99_ms=num("p99_ttft_ms"),
        itl_p50_ms=num("median_itl_ms") or num("p50_itl_ms"),
        itl_p95_ms=num("p95_itl_ms"),
        itl_p99_ms=num("p99_itl_ms"),
        output_tokens_per_s=num("output_throughput"),
        max_concurrent=data.get("max_concurrent_requests"),
    )


def _stage_load(profile_spec: dict) -> dict[str, dict]:
    """Each stage's offered load as its profile states it (the result's stage summary carries
    only what was measured)."""
    return {
        s.get("name"): s for s in (profile_spec or {}).get("stages") or [] if isinstance(s, dict)
    }


def run_facts(
    deployment: Deployment, limit: int = RUNS
) -> tuple[tuple[RunFacts, ...], tuple[tuple[int, str], ...]]:
    """The deployment's newest finished runs, newest first, in a fixed number of queries, and
    those among them refused as evidence (client-limited, ``benchmarks.evidence``) with why:
    the rules never read a refused run's numbers."""
    fetched = list(
        BenchmarkRun.objects.filter(
            deployment=deployment,
            status__in=(
                OperationStatus.SUCCEEDED,
                OperationStatus.FAILED,
                OperationStatus.CANCELLED,
            ),
        )
        .select_related("load_profile")
        .order_by("-finished_at", "-pk")[:limit]
    )
    refused = tuple(
        (run.pk, evidence.refusal)
        for run in fetched
        if (evidence := usable_as_evidence(run)).limited
    )
    runs = [run for run in fetched if run.pk not in dict(refused)]
    if not runs:
        return (), refused
    logs = _run_logs(runs)
    gauges = _run_gauges([r.pk for r in runs])
    active = deployment.active_config_id
    out = []
    for i, run in enumerate(runs):
        spec = run.load_profile.spec if run.load_profile else {}
        lengths, messages = logs[run.pk]
        summary = run.summary or {}
        loads = _stage_load(spec)
        stages = tuple(
            _stage(name, {**loads.get(name, {}), **data})
            for name, data in (run.stages or {}).items()
            if isinstance(data, dict)
        )
        out.append(
            RunFacts(
                run_id=run.pk,
                label=run.label,
                profile=f"{run.load_profile.name} v{run.load_profile.version}"
                if run.load_profile
                else "",
                finished_at=(run.finished_at or run.created_at).timestamp(),
                status=run.status,
                config_current=bool(active and run.engine_config_id == active),
                completed=run.completed or 0,
                failed=run.failed or 0,
                error_rate=run.error_rate,
                errors_by_class=dict(summary.get("errors_by_class") or {}),
                errors_by_message=messages,
                warmup_requests=int(summary.get("warmup_requests") or 0),
                stages=stages,
                lengths=lengths,
                server=_server_window(run, gauges.get(run.pk) or {}),
                output_tokens_per_s=run.output_tokens_per_s,
                faster_than=getattr(compare.faster_than(run, runs[i + 1 :]), "pk", None),
            )
        )
    return tuple(out), refused


def _server_window(run: BenchmarkRun, gauges: dict) -> EngineWindow | None:
    server = run.server or {}
    if not server.get("available"):
        return None
    running = gauges.get("running") or (None, None)
    waiting = gauges.get("waiting") or (None, None)
    kv = gauges.get("kv_cache_usage") or (None, None)
    return EngineWindow(
        seconds=float(run.duration_s or 0.0),
        ended_at=float(server.get("scraped_at") or (run.finished_at or run.created_at).timestamp()),
        source=f"run {run.pk}",
        requests=_int(server.get("server_e2e_count")),
        running_mean=running[0],
        running_max=running[1],
        waiting_mean=waiting[0],
        waiting_max=waiting[1],
        kv_usage_mean=kv[0],
        kv_usage_max=server.get("kv_cache_usage_max") or kv[1],
        preemptions=_int(server.get("preemptions")),
        prefix_cache_queries=server.get("prefix_cache_queries"),
        prefix_cache_hits=server.get("prefix_cache_hits"),
        hit_rate=server.get("prefix_cache_hit_rate"),
        queue_ms=server.get("server_mean_queue_ms"),
        prefill_ms=server.get("server_mean_prefill_ms"),
        decode_ms=server.get("server_mean_decode_ms"),
        ttft_ms=server.get("server_mean_ttft_ms"),
        itl_ms=server.get("server_mean_itl_ms"),
        prompt_tokens=server.get("prompt_tokens"),
        generation_tokens=server.get("generation_tokens"),
    )


# --- the whole snapshot --------------------------------------------------------------------
def scrape_seconds() -> float:
    return float(getattr(conf, "ADVISOR_SCRAPE_SECONDS", 5.0))


def gather(
    deployment: Deployment,
    *,
    live: bool = True,
    scraped: tuple[EngineWindow | None, str] | None = None,
) -> Gathered:
    """Everything the rules read about ``deployment`` now; ``live`` scrapes the engine for
    ADVISOR_SCRAPE_SECONDS (else the live window is left out) unless ``scraped`` brings a
    scrape already made (the fleet sweep scrapes every engine at once)."""
    deployment = Deployment.objects.select_related("host", "active_config").get(pk=deployment.pk)
    telemetry_s = float(getattr(conf, "ADVISOR_TELEMETRY_SECONDS", 300.0))
    gpus, host = gpu_and_host_facts(deployment, telemetry_s)
    engine, status, error = None, "skipped", ""
    if live:
        engine, error = scraped or scrape_engine(deployment, scrape_seconds())
        status = "live" if engine is not None else "unavailable"
    runs, refused = run_facts(deployment)
    snapshot = Snapshot(
        deployment=str(deployment),
        taken_at=time.time(),
        config=config_facts(deployment),
        gpus=gpus,
        engine=engine,
        host=host,
        runs=runs,
        refused_runs=refused,
        traffic=traffic_facts(deployment),
        telemetry_seconds=telemetry_s,
    )
    return Gathered(snapshot, status, error)
