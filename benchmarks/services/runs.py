"""The life of a benchmark run: start one on a deployment, cancel it, execute it on a worker,
fail it (and sweep the runs whose worker is gone). The live points of a running run are
``points``, what it records about its environment ``environment``, its results ``results``."""

from __future__ import annotations

import asyncio
import dataclasses
import tempfile
import time
from datetime import datetime, timedelta
from pathlib import Path

from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import Max
from django.utils import timezone

from benchmarks.loadgen import __version__ as LOADGEN_VERSION
from benchmarks.loadgen.profile import build_spec, plan, write_replay
from benchmarks.loadgen.runner import ErrorStop, LoadGenError, LoadRun, arun_with
from benchmarks.loadgen.spec import LoadSpec, SpecError
from benchmarks.loadgen.transport import new_event_loop_factory
from benchmarks.models import BenchmarkRun, LoadProfile, spec_with_override
from benchmarks.services import shards as sharding
from benchmarks.services.environment import environment
from benchmarks.services.points import PointSink
from benchmarks.services.results import (
    error_rate_limit,
    error_rate_problem,
    profile_error_rate_limit,
    status_badge,
    store_results,
)
from controlpanel import lostwork, timelimits
from controlpanel.choices import OperationStatus
from controlpanel.jobs import enqueue_on_commit
from controlpanel.realtime import group_name, publish
from controlpanel.services import audit
from hosts.models import Deployment
from hosts.services import occupancy

ACTIVE = (OperationStatus.QUEUED, OperationStatus.RUNNING)
RUN_TASK = "benchmarks.tasks.run_benchmark"
# Before its first point a run records its environment, asks the engine for /version (3 s),
# waits for readiness (BENCHMARK_READY_TIMEOUT) and for /tokenize (10 s); and a point's ``t``
# counts from the load generator's clock, which starts after all that. So a point happened
# up to this long plus the readiness timeout after started_at + t.
SETUP_ALLOWANCE_S = 60.0


class RunRefused(Exception):
    """A benchmark that cannot start or be changed; the message says why."""


# --- starting and cancelling -------------------------------------------------------------------
def time_limit_for(profile: LoadProfile, spec: dict | None = None) -> int:
    """Seconds the run's task may take: three times what the profile plans plus five minutes
    for readiness and warm-up, capped by BENCHMARK_MAX_SECONDS (also the limit of a profile
    whose length cannot be known in advance). ``spec``: the document actually run, when a
    load override changed it (``BenchmarkRun.profile_spec``)."""
    _, seconds = plan(profile.spec if spec is None else spec)
    return timelimits.benchmark_budget(seconds, settings.BENCHMARK_MAX_SECONDS)


def start_benchmark(
    actor,
    deployment: Deployment,
    profile: LoadProfile,
    *,
    label: str = "",
    enqueue: bool = True,
    owner=None,
    load_override: dict | None = None,
    shards: int = 1,
) -> BenchmarkRun:
    """Queue a load test of ``deployment`` under ``profile`` with the config it runs now,
    when nothing else uses the engine (``hosts.services.occupancy``: another run, an apply or
    restart, a change holding its lock: each would make it measure a moving target), under a
    row lock on the deployment, a partial unique index behind it. ``owner``: the holder asking
    (a change's pipeline measuring its own deployment). ``enqueue=False`` only records the
    run, for a caller on a worker that executes it itself (``execute_run``), such as a
    change's verification. ``load_override``: run the profile at another load
    (``{"mode": "rate"|"concurrency", "value": x, "seed": n}``, a sweep's search), recorded on
    the run. ``shards``: load generators on the ``loadgen`` queue sending its one schedule
    between them (``shards``; 1: the run's own worker sends it all)."""
    spec = spec_with_override(profile.spec, load_override)
    try:
        planned = plan(spec)
    except SpecError as exc:
        raise RunRefused(f"{profile} cannot run: {exc}") from None
    if problem := sharding.refusal(spec, shards):
        raise RunRefused(problem)
    try:
        with transaction.atomic():
            deployment = (
                # of=self: PostgreSQL cannot lock the nullable side of the config join.
                Deployment.objects.select_for_update(of=("self",))
                .select_related("host", "active_config")
                .get(pk=deployment.pk)
            )
            try:
                occupancy.require_free(deployment, occupancy.Purpose.RUN, owner=owner)
            except occupancy.DeploymentBusy as busy:
                raise RunRefused(str(busy)) from None
            run = _create_run(actor, deployment, profile, label, planned, load_override, shards)
            if enqueue:
                _enqueue(run, time_limit_for(profile, spec))
    except IntegrityError:
        raise RunRefused(f"Another benchmark just started on {deployment}.") from None
    publish_status(run)
    return run


def occupants(deployment: Deployment) -> list[occupancy.Occupant]:
    """The ``occupancy`` holder of this module: a run queued or running on the deployment
    (registered by ``BenchmarksConfig.ready``)."""
    run = deployment.benchmark_runs.filter(status__in=ACTIVE).select_related("requested_by").first()
    if run is None:
        return []
    who = run.requested_by or "the system"
    text = (
        f"Benchmark {run.numbered_name} by {who} is {run.get_status_display().lower()}: "
        "one benchmark at a time per engine, and nothing changes an engine while it is measured."
    )
    return [occupancy.Occupant(run, text)]


def _create_run(
    actor,
    deployment: Deployment,
    profile: LoadProfile,
    label: str,
    planned,
    load_override=None,
    shards: int = 1,
):
    """The queued run row, with what the deployment runs now, and its audit entry."""
    planned_requests, planned_seconds = planned
    config = deployment.active_config
    run = BenchmarkRun.objects.create(
        deployment=deployment,
        engine_config=config,
        load_profile=profile,
        label=label,
        load_override=load_override or {},
        requested_by=actor,
        engine=deployment.engine,
        engine_version=deployment.engine_version,
        model_name=deployment.model,
        loadgen_version=LOADGEN_VERSION,
        planned_requests=planned_requests,
        planned_duration_s=planned_seconds,
        error_rate_limit=profile_error_rate_limit(profile),
        shards=shards,
    )
    audit(
        actor,
        "benchmark.start",
        run,
        after={
            "deployment": str(deployment),
            "config_version": config.version if config else None,
            "profile": str(profile),
            **({"load": load_override} if load_override else {}),
            **({"shards": shards} if shards > 1 else {}),
        },
    )
    return run


def _enqueue(run: BenchmarkRun, limit: int) -> None:
    """Send the run's task once the row is committed, with the profile's own time limits."""
    enqueue_on_commit(RUN_TASK, run.pk, **timelimits.benchmark(limit).options())


def cancel_benchmark(actor, run: BenchmarkRun) -> BenchmarkRun:
    """Stop a run: a queued one is cancelled at once; a running one is asked to stop (the
    worker sees the flag within a second, aborts requests in flight and keeps what it
    measured); one whose worker was lost (``controlpanel.lostwork``) is ended at once, as no
    worker will read the request."""
    with transaction.atomic():
        run = BenchmarkRun.objects.select_for_update().get(pk=run.pk)
        if not run.cancellable:
            raise RunRefused(f"{run} is {run.get_status_display().lower()}: nothing to cancel.")
        if run.status == OperationStatus.QUEUED:
            run.transition_to(OperationStatus.CANCELLED, error="cancelled before it started")
        elif (lost := lostwork.lost_claim(run)) is not None:
            run.append_log("cancelled: " + lostwork.lost_text(lost))
            run.transition_to(OperationStatus.CANCELLED, error="cancelled; its worker was lost")
            lostwork.release(run)
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
    with tempfile.TemporaryDirectory(prefix="benchmark-") as scratch:
        try:
            spec = run_spec(run, Path(scratch))
        except SpecError as exc:
            return fail_run(run, f"the profile cannot run: {exc}")
        _record_environment(run, spec)
        try:
            if run.shards > 1:
                limit = time_limit_for(run.load_profile, run.profile_spec)
                result = sharding.measure_sharded(run, spec, limit, error_stop(run))
            else:
                result = _measure(run, spec)
        except LoadGenError as exc:
            return fail_run(run, str(exc))
    return _record(run, result)


def run_spec(run: BenchmarkRun, scratch: Path) -> LoadSpec:
    """The load generator spec of the run's profile, aimed at its deployment (a replay's
    trace is written to ``scratch``)."""
    doc, deployment = run.profile_spec, run.deployment
    trace = None
    if doc.get("replay"):
        trace = write_replay(doc, scratch / "replay.jsonl")
    spec = build_spec(
        doc,
        deployment.engine_url,
        deployment.model,
        api_key=deployment.api_key(),
        trace_path=trace,
    )
    return dataclasses.replace(spec, ready_timeout_s=settings.BENCHMARK_READY_TIMEOUT)


def _record_environment(run: BenchmarkRun, spec: LoadSpec) -> None:
    run.environment = environment(run, spec)
    run.save(update_fields=["environment"])
    run.append_log(
        f"{spec.base_url} · {run.load_profile} · config "
        + (f"v{run.engine_config.version}" if run.engine_config else "not recorded")
    )


def _measure(run: BenchmarkRun, spec: LoadSpec):
    """Drive the load to its end (or a cancel, or the time limit), each second's point going
    through a ``PointSink``; returns the load generator's result."""
    sink = PointSink(run)
    load = LoadRun(spec, on_progress=sink.put, error_stop=error_stop(run))
    limit = time_limit_for(run.load_profile, run.profile_spec)
    sink.start(load, deadline=time.monotonic() + limit)
    try:
        with asyncio.Runner(loop_factory=new_event_loop_factory()) as runner:
            return runner.run(arun_with(load))
    finally:
        sink.stop()


def error_stop(run: BenchmarkRun) -> ErrorStop:
    """When the run stops because the engine fails: above its error rate limit (fixed when it
    started) over the last BENCHMARK_ERROR_WINDOW requests, or when none of the first
    BENCHMARK_NO_SUCCESS_REQUESTS succeeded. (In the issue, a run went on for 90 s at a
    killed engine: 212,429 failed, 40 completed, "Succeeded".)"""
    return ErrorStop(
        error_rate_limit(run),
        window=settings.BENCHMARK_ERROR_WINDOW,
        no_success=settings.BENCHMARK_NO_SUCCESS_REQUESTS,
    )


def _record(run: BenchmarkRun, result) -> BenchmarkRun:
    """Store the result on the run and close it: cancelled, failed (the engine's failures
    stopped it, or it ended above its error rate limit: the reason names the engine's state),
    else succeeded."""
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
    elif problem := _engine_problem(run, result):
        run.append_log(problem)
        run.transition_to(OperationStatus.FAILED, error=problem[:2000])
    else:
        run.transition_to(OperationStatus.SUCCEEDED)
    publish_status(run)
    return run


def _engine_problem(run: BenchmarkRun, result) -> str | None:
    """Why the run measured no working engine, or None: the reason its error rule stopped it,
    or its error rate above its limit at the end, with what the failures say."""
    if result.stopped_on_errors:
        return f"stopped early: {result.stopped_on_errors}"
    problem = error_rate_problem(run)
    if problem and result.failures:
        problem = f"{problem}; {result.failures}"
    return problem


def fail_run(run: BenchmarkRun, error: str) -> BenchmarkRun:
    """Close the run as failed with ``error`` (nothing when it is already finished)."""
    run.refresh_from_db()
    if not run.is_finished:
        if run.status == OperationStatus.QUEUED:
            run.transition_to(OperationStatus.RUNNING)
        run.append_log(error)
        run.transition_to(OperationStatus.FAILED, error=error[:2000])
        publish_status(run)
    if run.shards > 1:
        # A coordinator that died left its shards' pieces; its shards stop on their own
        # once they see the run closed.
        sharding.discard_chunks(run)
    return run


# --- runs whose worker is gone -----------------------------------------------------------------
def fail_stale_runs(now: datetime | None = None) -> list[BenchmarkRun]:
    """Fail the runs whose worker is gone without a redelivery to say so (its machine died,
    the broker lost the message): running ones that have written no point for
    BENCHMARK_STALE_SECONDS (their worker writes one a second), and queued ones that no worker
    took within their time limit. Run by beat every minute; returns the runs it failed."""
    now = now or timezone.now()
    return _fail_silent_runs(now) + _fail_unstarted_runs(now)


def _fail_silent_runs(now: datetime) -> list[BenchmarkRun]:
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
    return failed


def _fail_unstarted_runs(now: datetime) -> list[BenchmarkRun]:
    failed = []
    queued = BenchmarkRun.objects.filter(status=OperationStatus.QUEUED).select_related(
        "load_profile"
    )
    for run in queued:
        try:
            limit = (
                time_limit_for(run.load_profile, run.profile_spec)
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


def publish_status(run: BenchmarkRun) -> None:
    """Tell the run's page (and anyone watching its group) where the run stands; the badge's
    words and colour are the pages' own (a success with failed requests says so)."""
    badge = status_badge(run)
    publish(
        group_name("run", run.pk),
        "run.status",
        {
            "id": run.pk,
            "status": run.status,
            "label": badge.label,
            "colour": badge.colour,
            "title": badge.title,
            "progress": run.progress,
            "cancel_requested": run.cancel_requested,
            "error": run.error,
            "finished": run.is_finished,
        },
    )
