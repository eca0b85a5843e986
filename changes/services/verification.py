"""The measurements the pipeline judges a change by: the panel's own health check of the
engine after a restart, and the baseline and verification benchmarks, run inline on the
pipeline's worker as ordinary runs (their pages stream live and they join the history)."""

from __future__ import annotations

import httpx
from django.conf import settings as conf
from django.urls import reverse

from benchmarks import records
from benchmarks.models import BenchmarkRun, RunRequestLog
from benchmarks.services import runs as benchmark_runs
from benchmarks.services.results import error_threshold_problem
from changes import verdict
from changes.models import ChangeRequest
from hosts.choices import OperationOutcome
from hosts.engines import readiness
from hosts.models import Deployment, EngineOperation


def health_problem(deployment: Deployment) -> str | None:
    """None when the engine is ready by ``hosts.engines.readiness`` (``/health`` and a model
    on ``/v1/models``, asked with the deployment's API key) within CHANGE_HEALTH_TIMEOUT,
    else what is wrong."""
    key = deployment.api_key()
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    with httpx.Client(base_url=deployment.engine_url, headers=headers, timeout=5) as client:
        return readiness.wait_ready(
            lambda: readiness.probe(client, engine=deployment.engine).problem,
            conf.CHANGE_HEALTH_TIMEOUT,
            interval_s=1,
        )


BENCHMARK_FIELDS = {"baseline": "baseline_run", "verification": "verification_run"}


def run_benchmark(change: ChangeRequest, purpose: str) -> tuple[BenchmarkRun | None, str]:
    """Run the change's verification profile on the engine now, inline on this worker (the
    run is an ordinary run: its page streams live and it joins the history). The run is on
    the change before it starts, so a rollback request can cancel it. ``(run, "")``, or
    ``(None, why it could not start)``."""
    field = BENCHMARK_FIELDS[purpose]
    earlier = getattr(change, field)
    if earlier is not None and not earlier.is_finished:
        # The pipeline's previous worker died during this run: it measured for nobody.
        benchmark_runs.fail_run(earlier, "the change's pipeline stopped during the run")
    try:
        run = benchmark_runs.start_benchmark(
            change.applied_by,
            change.deployment,
            change.verify_profile,
            label=f"change #{change.pk} {purpose}",
            enqueue=False,
            owner=change,
        )
    except benchmark_runs.RunRefused as exc:
        return None, f"the {purpose} benchmark could not start: {exc}"
    setattr(change, field, run)
    change.save(update_fields=[field])
    try:
        benchmark_runs.execute_run(
            BenchmarkRun.objects.select_related(
                "deployment__host", "deployment__active_config", "engine_config", "load_profile"
            ).get(pk=run.pk)
        )
    except Exception as exc:  # noqa: BLE001 - recorded on the run, judged by the pipeline
        benchmark_runs.fail_run(run, f"{type(exc).__name__}: {exc}")
    run.refresh_from_db()
    return run, ""


def numbers(run: BenchmarkRun | None) -> dict:
    """The numbers the verdict reads (``benchmarks.metrics`` via ``changes.verdict``)."""
    return verdict.run_numbers(run) if run is not None else {}


def cache_state(run: BenchmarkRun) -> str:
    """The engine's cache at the start of ``run``: ``cold`` when it is the first run since the
    engine last (re)started through the panel, ``warm`` when other runs came before it since,
    ``unknown`` when no such start is recorded before it (an imported run, an engine the
    panel never restarted)."""
    if run.started_at is None:
        return verdict.UNKNOWN
    started = (
        EngineOperation.objects.filter(
            deployment_id=run.deployment_id,
            outcome__in=(OperationOutcome.READY, OperationOutcome.ROLLED_BACK),
            finished_at__lte=run.started_at,
        )
        .order_by("-finished_at")
        .values_list("finished_at", flat=True)
        .first()
    )
    if started is None:
        return verdict.UNKNOWN
    before = BenchmarkRun.objects.filter(
        deployment_id=run.deployment_id, started_at__gte=started, started_at__lt=run.started_at
    ).exclude(pk=run.pk)
    return verdict.WARM if before.exists() else verdict.COLD


def conditions(run: BenchmarkRun | None) -> dict:
    """What ``run`` measured under, for ``verdict.compare_conditions``: its load (profile
    version), the engine's cache state at its start, the prefix-cache hit rate and KV use the
    engine reported, its errors and whether it may be used for a verdict at all
    (``benchmarks.services.results.error_threshold_problem``)."""
    if run is None:
        return {"problem": "there is no run"}
    server = run.server if isinstance(run.server, dict) else {}

    def share(key):
        value = server.get(key)
        return float(value) if isinstance(value, int | float) and value == value else None

    profile = run.load_profile
    return {
        # The load is the profile version at the load it ran: a sweep's run at 12 req/s
        # and the profile's own run are different loads.
        "profile": (
            f"{profile.name} v{profile.version}"
            + (f" at {run.load_text}" if run.load_override else "")
            if profile is not None
            else None
        ),
        "cache_state": cache_state(run),
        "prefix_cache_hit_rate": share("prefix_cache_hit_rate"),
        "kv_cache_usage_max": share("kv_cache_usage_max"),
        "error_rate": run.error_rate,
        "requests": run.completed,
        "problem": error_threshold_problem(run),
    }


def judge(change: ChangeRequest) -> dict:
    """The verdict on ``change``: its verification against its baseline, under its
    thresholds, the change's flags saying whether a moved prefix-cache hit rate is its effect."""
    return judge_runs(
        change.baseline_run,
        change.verification_run,
        verdict.Thresholds(
            change.max_error_rate_increase,
            change.max_ttft_p95_regression,
            change.max_itl_p95_regression,
        ),
        cache_changed=verdict.alters_cache(change.deployment.engine, _changed_flags(change)),
    )


def judge_runs(
    baseline: BenchmarkRun | None,
    run: BenchmarkRun | None,
    thresholds: verdict.Thresholds,
    *,
    cache_changed: bool = False,
) -> dict:
    """The verdict on ``run`` against ``baseline`` (``verdict.verdict``): their numbers, the
    conditions each measured under and the TTFT p95 noise bands of their request logs. One
    rule for a change's verification and for any two runs (the API's verdict, the CI gate)."""
    return verdict.verdict(
        numbers(baseline),
        numbers(run),
        thresholds,
        (conditions(baseline), conditions(run)),
        cache_changed=cache_changed,
        noise={"ttft_p95_ms": (ttft_p95_band(baseline), ttft_p95_band(run))},
    )


def ttft_p95_band(run: BenchmarkRun | None):
    """The run-to-run noise band of the run's TTFT p95, from its successful requests' TTFTs
    (its request log), or None without a log or with too few requests. ITL has no such band:
    the log keeps each request's mean and worst gap, not the pooled gaps a p95 ITL is of."""
    if run is None:
        return None
    blob = RunRequestLog.objects.filter(run=run).values_list("data", flat=True).first()
    if blob is None:
        return None
    try:
        ttfts = [
            row["ttft_ms"]
            for row in records.iter_rows(bytes(blob))
            if row["error_class"] is None and row["ttft_ms"] is not None
        ]
    except records.RecordLogError:
        return None
    return verdict.quantile_interval(ttfts)


def _changed_flags(change: ChangeRequest) -> set[str]:
    before = change.snapshot_config.settings if change.snapshot_config else {}
    after = change.applied_config.settings if change.applied_config else change.settings
    return {key for key in set(before) | set(after) if before.get(key) != after.get(key)}


def run_numbers(run: BenchmarkRun) -> str:
    """A benchmark in one line on the timeline."""
    return verdict.numbers_text(verdict.run_numbers(run))


verdict_text = verdict.verdict_text


def link(run: BenchmarkRun | None) -> str:
    return run.get_absolute_url() if run is not None else ""


def compare_link(a: BenchmarkRun | None, b: BenchmarkRun) -> str:
    if a is None or not a.pk or not b.pk:
        return ""
    return f"{reverse('benchmarks:compare')}?runs={a.pk}&runs={b.pk}"
