"""Benchmark run workflows: start one on a deployment, cancel it, execute it on a worker, and
record what a load generator measured (from a run or an imported file) on the run's rows."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import math
import queue
import tempfile
import threading
import time
from datetime import datetime, timedelta
from pathlib import Path

import httpx
from django.conf import settings
from django.db import IntegrityError, close_old_connections, connection, transaction
from django.db.models import Max
from django.utils import timezone

from benchmarks import records as request_records
from benchmarks.loadgen import __version__ as LOADGEN_VERSION
from benchmarks.loadgen.profile import build_spec, plan, write_replay
from benchmarks.loadgen.runner import LoadGenError, LoadRun, arun_with, new_event_loop_factory
from benchmarks.loadgen.spec import SpecError
from benchmarks.models import GPU_SEPARATOR, BenchmarkRun, LoadProfile, RunPoint, RunRequestLog
from benchmarks.services.prices import hourly_price_for
from controlpanel.choices import OperationStatus
from controlpanel.realtime import group_name, publish
from controlpanel.services import audit
from hosts.engines.metrics import endpoints
from hosts.models import ACTIVE_STATUSES, Deployment, Gpu

log = logging.getLogger(__name__)
ACTIVE = (OperationStatus.QUEUED, OperationStatus.RUNNING)
# GPU readings older than this are refreshed by the run itself (no beat polling the host).
STALE_READING_S = 3.0


class RunRefused(Exception):
    """A benchmark that cannot start or be changed; the message says why."""


# --- starting and cancelling -------------------------------------------------------------------
def time_limit_for(profile: LoadProfile) -> int:
    """Seconds the run's task may take: three times what the profile plans plus five minutes
    for readiness and warm-up, capped by BENCHMARK_MAX_SECONDS (also the limit of a profile
    whose length cannot be known in advance)."""
    _, seconds = plan(profile.spec)
    cap = settings.BENCHMARK_MAX_SECONDS
    if seconds is None:
        return int(cap)
    return int(min(cap, seconds * 3 + 300))


def start_benchmark(
    actor, deployment: Deployment, profile: LoadProfile, *, label: str = "", enqueue: bool = True
) -> BenchmarkRun:
    """Queue a load test of ``deployment`` under ``profile`` with the config it runs now.
    One run per deployment at a time (row lock + partial unique index), and none while an
    apply or restart is under way: either would measure a moving target. ``enqueue=False``
    only records the run, for a caller on a worker that executes it itself (``execute_run``),
    such as a change's verification."""
    from benchmarks import tasks

    try:
        planned_requests, planned_seconds = plan(profile.spec)
    except SpecError as exc:
        raise RunRefused(f"{profile} cannot run: {exc}") from None
    try:
        with transaction.atomic():
            deployment = (
                # of=self: PostgreSQL cannot lock the nullable side of the config join.
                Deployment.objects.select_for_update(of=("self",))
                .select_related("host", "active_config")
                .get(pk=deployment.pk)
            )
            busy = deployment.benchmark_runs.filter(status__in=ACTIVE).first()
            if busy is not None:
                raise RunRefused(
                    f"{busy} is {busy.get_status_display().lower()} on {deployment}: "
                    "one benchmark at a time per engine."
                )
            operation = deployment.operations.filter(status__in=ACTIVE_STATUSES).first()
            if operation is not None:
                raise RunRefused(
                    f"{operation} is {operation.get_status_display().lower()} on {deployment}: "
                    "benchmark it once the engine has settled."
                )
            run = BenchmarkRun.objects.create(
                deployment=deployment,
                engine_config=deployment.active_config,
                load_profile=profile,
                label=label,
                requested_by=actor,
                engine=deployment.engine,
                engine_version=deployment.engine_version,
                model_name=deployment.model,
                loadgen_version=LOADGEN_VERSION,
                planned_requests=planned_requests,
                planned_duration_s=planned_seconds,
            )
            audit(
                actor,
                "benchmark.start",
                run,
                after={
                    "deployment": str(deployment),
                    "config_version": deployment.active_config.version
                    if deployment.active_config
                    else None,
                    "profile": str(profile),
                },
            )
            limit = time_limit_for(profile)
            if enqueue:
                transaction.on_commit(
                    lambda: tasks.run_benchmark.apply_async(
                        (run.pk,), soft_time_limit=limit + 60, time_limit=limit + 120
                    )
                )
    except IntegrityError:
        raise RunRefused(f"Another benchmark just started on {deployment}.") from None
    publish_status(run)
    return run


def cancel_benchmark(actor, run: BenchmarkRun) -> BenchmarkRun:
    """Stop a run: a queued one is cancelled at once; a running one is asked to stop (the
    worker sees the flag within a second, aborts requests in flight and keeps what it
    measured)."""
    with transaction.atomic():
        run = BenchmarkRun.objects.select_for_update().get(pk=run.pk)
        if not run.cancellable:
            raise RunRefused(f"{run} is {run.get_status_display().lower()}: nothing to cancel.")
        if run.status == OperationStatus.QUEUED:
            run.transition_to(OperationStatus.CANCELLED, error="cancelled before it started")
        else:
            run.cancel_requested = True
            run.save(update_fields=["cancel_requested"])
        audit(actor, "benchmark.cancel", run, before={"status": run.status})
    publish_status(run)
    return run


# --- on the worker -----------------------------------------------------------------------------
def execute_run(run: BenchmarkRun) -> BenchmarkRun:
    """The worker's part: build the spec, record the environment, drive the load, stream
    each second to the run's page, then store the results on the run."""
    if run.is_finished:
        return run
    if run.status == OperationStatus.RUNNING:
        # A redelivered task: the worker that ran it died, and its measurements with it.
        return fail_run(run, "the worker stopped during the run; its measurements were lost")
    if run.load_profile is None:
        return fail_run(run, "the run has no load profile")
    run.transition_to(OperationStatus.RUNNING)
    publish_status(run)
    deployment = run.deployment
    with tempfile.TemporaryDirectory(prefix="benchmark-") as scratch:
        try:
            trace = None
            if run.load_profile.spec.get("replay"):
                trace = write_replay(run.load_profile.spec, Path(scratch) / "replay.jsonl")
            spec = build_spec(
                run.load_profile.spec,
                deployment.engine_url,
                deployment.model,
                api_key=deployment.api_key(),
                trace_path=trace,
            )
            spec = dataclasses.replace(spec, ready_timeout_s=settings.BENCHMARK_READY_TIMEOUT)
        except SpecError as exc:
            return fail_run(run, f"the profile cannot run: {exc}")
        run.environment = environment(run, spec)
        run.save(update_fields=["environment"])
        run.append_log(
            f"{spec.base_url} · {run.load_profile} · config "
            + (f"v{run.engine_config.version}" if run.engine_config else "not recorded")
        )
        sink = PointSink(run)
        load = LoadRun(spec, on_progress=sink.put)
        sink.start(load, deadline=time.monotonic() + time_limit_for(run.load_profile))
        try:
            with asyncio.Runner(loop_factory=new_event_loop_factory()) as runner:
                result = runner.run(arun_with(load))
        except LoadGenError as exc:
            sink.stop()
            return fail_run(run, str(exc))
        except BaseException:
            sink.stop()
            raise
        sink.stop()
    document = result.to_dict()
    records = document.pop("records", None) or []
    run.refresh_from_db()
    if run.is_finished:
        # Closed by the stale-run sweep while this worker still went on (it had stopped
        # reporting for too long): that verdict and its reason stand.
        return run
    store_results(run, document, records)
    run.progress = 1.0 if not result.cancelled else run.progress
    run.save(update_fields=["progress"])
    run.append_log(
        f"{run.completed} succeeded, {run.failed} failed"
        + (f"; stopped early: {run.stopped_early}" if run.stopped_early else "")
    )
    if result.cancelled:
        run.transition_to(OperationStatus.CANCELLED, error="cancelled while running")
    else:
        run.transition_to(OperationStatus.SUCCEEDED)
    publish_status(run)
    return run


def fail_run(run: BenchmarkRun, error: str) -> BenchmarkRun:
    run.refresh_from_db()
    if not run.is_finished:
        if run.status == OperationStatus.QUEUED:
            run.transition_to(OperationStatus.RUNNING)
        run.append_log(error)
        run.transition_to(OperationStatus.FAILED, error=error[:2000])
        publish_status(run)
    return run


# Before its first point a run records its environment, asks the engine for /version (3 s),
# waits for readiness (BENCHMARK_READY_TIMEOUT) and for /tokenize (10 s); and a point's ``t``
# counts from the load generator's clock, which starts after all that. So a point happened
# up to this long plus the readiness timeout after started_at + t.
SETUP_ALLOWANCE_S = 60.0


def fail_stale_runs(now: datetime | None = None) -> list[BenchmarkRun]:
    """Fail the runs whose worker is gone without a redelivery to say so (its machine died,
    the broker lost the message): running ones that have written no point for
    BENCHMARK_STALE_SECONDS (their worker writes one a second), and queued ones that no worker
    took within their time limit. Run by beat every minute; returns the runs it failed."""
    now = now or timezone.now()
    grace = settings.BENCHMARK_STALE_SECONDS
    allowance = settings.BENCHMARK_READY_TIMEOUT + SETUP_ALLOWANCE_S
    failed = []
    running = BenchmarkRun.objects.filter(status=OperationStatus.RUNNING).annotate(
        newest_t=Max("points__t")
    )
    for run in running:
        started = run.started_at or run.created_at
        last = started + timedelta(seconds=run.newest_t or 0.0)
        quiet = (now - last).total_seconds() - allowance
        if quiet > grace:
            said = (
                f"its last point was at {run.newest_t:.0f} s"
                if run.newest_t is not None
                else "it wrote no point"
            )
            failed.append(
                fail_run(
                    run,
                    f"no word from its worker for over {grace:.0f} s ({said}): "
                    "the worker is gone and its measurements with it",
                )
            )
    queued = BenchmarkRun.objects.filter(status=OperationStatus.QUEUED).select_related(
        "load_profile"
    )
    for run in queued:
        try:
            limit = (
                time_limit_for(run.load_profile)
                if run.load_profile
                else settings.BENCHMARK_MAX_SECONDS
            )
        except SpecError:
            limit = settings.BENCHMARK_MAX_SECONDS
        if (now - run.created_at).total_seconds() > limit:
            failed.append(
                fail_run(
                    run,
                    f"no worker started it within its time limit ({limit:.0f} s); it was never run",
                )
            )
    return failed


def environment(run: BenchmarkRun, spec) -> dict:
    """What makes the run reproducible, as the host reported it when the run started."""
    deployment = run.deployment
    host = deployment.host
    gpus = list(deployment.gpus.all()) or list(host.gpus.all())
    names = sorted({g.name for g in gpus})
    run.gpu_model = GPU_SEPARATOR.join(names)[:100]
    run.gpu_count = len(gpus) or None
    run.save(update_fields=["gpu_model", "gpu_count"])
    config = run.engine_config
    return {
        "host": {
            "name": host.name,
            "hostname": host.hostname,
            "transport": host.transport,
            "agent_version": host.agent_version,
            "driver_version": host.driver_version,
            "cuda_version": host.cuda_version,
            # The engines' Python packages (vllm, torch, triton, NCCL, ...) as the host last
            # reported them: what /version does not say but changes the numbers.
            "libraries": dict(host.libraries or {}),
            "cpu_model": host.cpu_model,
            "cpu_count": host.cpu_count,
            "telemetry_source": host.telemetry_source,
        },
        "gpus": [
            {"index": g.index, "name": g.name, "uuid": g.uuid, "memory_bytes": g.memory_bytes}
            for g in gpus
        ],
        "engine": {
            "kind": deployment.engine,
            "declared_version": deployment.engine_version,
            "reported": engine_report(deployment),
            "model": deployment.model,
            "runner": deployment.runner,
            "url": deployment.engine_url,
        },
        "config": {
            "id": config.pk,
            "version": config.version,
            "settings": {k: ("•••" if _secret(k) else v) for k, v in config.settings.items()},
            "env": {k: ("•••" if _secret(k) else v) for k, v in config.env.items()},
            "placement": config.placement,
        }
        if config
        else None,
        "profile": {
            "id": run.load_profile_id,
            "name": run.load_profile.name,
            "version": run.load_profile.version,
        },
        "loadgen_version": LOADGEN_VERSION,
        "spec": spec.to_dict(),
    }


def _secret(name: str) -> bool:
    """Environment variables whose values the run record must not keep (VLLM_API_KEY, ...)."""
    return any(word in name.upper() for word in ("KEY", "TOKEN", "SECRET", "PASSWORD"))


def engine_report(deployment: Deployment) -> dict:
    """The engine's own word on its version (vLLM ``/version``, SGLang ``/get_server_info``);
    empty when it does not answer: the run goes on, the record says it is unknown."""
    path = endpoints(deployment.engine).version
    if not path:
        return {}
    headers = {}
    if key := deployment.api_key():
        headers["Authorization"] = f"Bearer {key}"
    try:
        response = httpx.get(deployment.engine_url + path, headers=headers, timeout=3)
        data = response.json() if response.status_code == 200 else {}
    except (httpx.HTTPError, ValueError):
        return {}
    if not isinstance(data, dict):
        return {}
    keep = ("version", "sglang_version", "torch_version", "cuda_version", "flashinfer_version")
    return {k: str(data[k])[:80] for k in keep if k in data}


class PointSink:
    """Takes the load generator's per-second points off its event loop (``put`` only queues,
    so measuring never waits on the database), and on its own thread adds the deployment's
    GPU readings, stores each point, moves the progress bar, streams it to the run's group,
    and watches for a cancel request or the time limit."""

    def __init__(self, run: BenchmarkRun):
        self.run = run
        self.queue: queue.Queue = queue.Queue()
        self.thread: threading.Thread | None = None
        self.timed_out = False
        self._cancelled = False
        self.started = time.monotonic()
        self._last_poll = 0.0

    def put(self, point: dict) -> None:
        self.queue.put(point)

    def start(self, load: LoadRun, deadline: float) -> None:
        self.load, self.deadline = load, deadline
        self.thread = threading.Thread(target=self._work, name=f"run-{self.run.pk}", daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self.queue.put(None)
        if self.thread is not None:
            self.thread.join(timeout=30)

    def _work(self) -> None:
        try:
            while True:
                try:
                    point = self.queue.get(timeout=1.0)
                except queue.Empty:
                    point = False
                if point is None:
                    return
                try:
                    if point:
                        self._store(point)
                    self._watch()
                except Exception:  # noqa: BLE001 - a lost point must not stop the run
                    log.exception("benchmark %s: could not record a point", self.run.pk)
        finally:
            connection.close()

    def _watch(self) -> None:
        close_old_connections()
        row = BenchmarkRun.objects.filter(pk=self.run.pk).values_list("cancel_requested", "status")
        cancel, status = row[0] if row else (False, OperationStatus.RUNNING)
        if status != OperationStatus.RUNNING and not self._cancelled:
            # Failed by the stale-run sweep (or deleted): measuring on is wasted load.
            self._cancelled = True
            self.load.cancel(reason="the run was closed while it ran")
        elif cancel and not self._cancelled:
            self._cancelled = True
            self.load.cancel()
        elif time.monotonic() > self.deadline and not self.timed_out:
            self.timed_out = True
            self.load.cancel(reason="stopped at the run's time limit")

    def _store(self, point: dict) -> None:
        run = self.run
        point = dict(point)
        point["gpus"] = self._gpus()
        point["progress"], point["eta_s"] = self._progress(point)
        point = _clean(point)
        RunPoint.objects.update_or_create(run=run, t=float(point["t"]), defaults={"data": point})
        BenchmarkRun.objects.filter(pk=run.pk).update(progress=point["progress"])
        publish(group_name("run", run.pk), "run.point", point)

    def _progress(self, point: dict) -> tuple[float, float | None]:
        run = self.run
        elapsed = float(point["t"])
        fractions = []
        if run.planned_requests:
            fractions.append((point["completed"] + point["failed"]) / run.planned_requests)
        if run.planned_duration_s:
            fractions.append(elapsed / run.planned_duration_s)
        if not fractions:
            return 0.0, None
        # Whichever bound the stages hit first ends the run: the larger fraction.
        done = min(max(fractions), 1.0)
        eta = elapsed * (1 - done) / done if done > 0.01 else None
        return round(done, 4), (round(eta, 1) if eta is not None else None)

    def _gpus(self) -> list[dict]:
        from hosts.services import poll_host

        deployment = self.run.deployment
        gpu_ids = list(deployment.gpus.values_list("pk", flat=True)) or list(
            Gpu.objects.filter(host_id=deployment.host_id).values_list("pk", flat=True)
        )
        rows = list(Gpu.objects.filter(pk__in=gpu_ids).order_by("index"))
        now = timezone.now()
        stale = not rows or any(
            g.last_sample_at is None or (now - g.last_sample_at).total_seconds() > STALE_READING_S
            for g in rows
        )
        if stale and time.monotonic() - self._last_poll > 2.0:
            self._last_poll = time.monotonic()
            poll_host(deployment.host)
            if not gpu_ids:  # the poll may have just learned the host's GPUs
                gpu_ids = list(
                    Gpu.objects.filter(host_id=deployment.host_id).values_list("pk", flat=True)
                )
            rows = list(Gpu.objects.filter(pk__in=gpu_ids).order_by("index"))
        now = timezone.now()
        out = []
        for g in rows:
            if g.last_sample_at is None or (now - g.last_sample_at).total_seconds() > 10:
                continue  # an old reading shown as this second's would mislead
            sample = g.last_sample or {}
            used = sample.get("memory_used_bytes")
            out.append(
                {
                    "index": g.index,
                    "utilization_pct": sample.get("utilization_gpu_pct"),
                    "memory_used_gib": round(used / 2**30, 2) if used is not None else None,
                    "power_w": sample.get("power_w"),
                    "sm_clock_mhz": sample.get("sm_clock_mhz"),
                }
            )
        return out


def publish_status(run: BenchmarkRun) -> None:
    publish(
        group_name("run", run.pk),
        "run.status",
        {
            "id": run.pk,
            "status": run.status,
            "label": run.get_status_display(),
            "progress": run.progress,
            "cancel_requested": run.cancel_requested,
            "error": run.error,
            "finished": run.is_finished,
        },
    )


# --- results -----------------------------------------------------------------------------------

# Result-document keys that are not part of the summary.
NOT_SUMMARY = {
    "stages",
    "timeline",
    "server",
    "spec",
    "notes",
    "records",
    "cancelled",
    "stopped_early",
    "panel",
}
# Run column ← summary key (the load generator's names, which are vllm bench serve's).
COLUMNS = {
    "duration_s": "duration",
    "completed": "completed",
    "failed": "failed",
    "error_rate": "error_rate",
    "ttft_p50_ms": "median_ttft_ms",
    "ttft_p95_ms": "p95_ttft_ms",
    "ttft_p99_ms": "p99_ttft_ms",
    "itl_p50_ms": "median_itl_ms",
    "itl_p95_ms": "p95_itl_ms",
    "itl_p99_ms": "p99_itl_ms",
    "tpot_p50_ms": "median_tpot_ms",
    "e2el_p99_ms": "p99_e2el_ms",
    "request_throughput": "request_throughput",
    "output_tokens_per_s": "output_throughput",
    "input_tokens_total": "total_input_tokens",
    "output_tokens_total": "total_output_tokens",
    "goodput_rps": "request_goodput",
    "goodput_share": "goodput_share",
}
INTEGER_COLUMNS = {"completed", "failed", "input_tokens_total", "output_tokens_total"}


def _number(value):
    if value is None or isinstance(value, bool):
        return None
    try:
        value = float(value)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(value) or math.isinf(value) else value


def _clean(value):
    """JSON-safe: NaN and infinities (which PostgreSQL's jsonb refuses) become None."""
    if isinstance(value, float):
        return None if math.isnan(value) or math.isinf(value) else value
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_clean(v) for v in value]
    return value


def store_results(
    run: BenchmarkRun,
    document: dict,
    records: list[dict] | None = None,
    *,
    store_timeline: bool = False,
) -> BenchmarkRun:
    """Write a load generator result document (``Result.to_dict()`` without ``records``, or an
    imported file converted to that shape) onto ``run``: headline columns, JSON parts, latency
    distributions, the compressed request log, the price and cost per million output tokens.
    ``store_timeline`` also writes the document's timeline as ``RunPoint`` rows (imports; a
    live run has written its points as they came)."""
    from benchmarks.cost import cost_per_million

    summary = _clean({k: v for k, v in document.items() if k not in NOT_SUMMARY})
    for column, key in COLUMNS.items():
        value = _number(summary.get(key))
        if value is not None and column in INTEGER_COLUMNS:
            value = int(value)
        setattr(run, column, value)
    run.summary = summary
    run.stages = _clean(document.get("stages") or {})
    server = dict(document.get("server") or {})
    server.pop("timeline", None)  # the per-second gauges are in the run's points already
    run.server = _clean(server)
    run.notes = list(document.get("notes") or [])
    run.stopped_early = (document.get("stopped_early") or "")[:300]
    if records:
        run.distributions = request_records.distributions(records)
    price, currency, _ = hourly_price_for(run.deployment.host)
    run.hourly_price, run.currency = price, currency
    run.cost_per_million_output = cost_per_million(price, run.output_tokens_per_s)
    with transaction.atomic():
        run.save()
        if records:
            blob = request_records.encode(records)  # warm-up requests are left out
            RunRequestLog.objects.update_or_create(
                run=run, defaults={"count": request_records.count(blob), "data": blob}
            )
        if store_timeline:
            RunPoint.objects.filter(run=run).delete()
            RunPoint.objects.bulk_create(
                [
                    RunPoint(run=run, t=float(point["t"]), data=_clean(point))
                    for point in _unique_t(document.get("timeline") or [])
                ],
                batch_size=1000,
            )
    return run


def _unique_t(points: list[dict]):
    seen = set()
    for point in points:
        t = _number(point.get("t"))
        if t is None or t in seen:
            continue
        seen.add(t)
        yield point
