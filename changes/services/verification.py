"""The measurements the pipeline judges a change by: the panel's own health check of the
engine after a restart, and the baseline and verification benchmarks, run inline on the
pipeline's worker as ordinary runs (their pages stream live and they join the history)."""

from __future__ import annotations

import math

import httpx
from django.conf import settings as conf
from django.db.models import Q
from django.urls import reverse

from benchmarks import records
from benchmarks.evidence import usable_as_evidence
from benchmarks.loadgen import stats
from benchmarks.models import BenchmarkRun, RunRequestLog
from benchmarks.services import runs as benchmark_runs
from benchmarks.services.results import error_threshold_problem
from changes import verdict
from changes.models import ChangeRequest
from controlpanel.choices import OperationStatus
from hosts.choices import OperationOutcome
from hosts.engines import readiness
from hosts.models import Deployment, EngineConfig, EngineOperation
from hosts.transport.tls import system_trust


def health_problem(deployment: Deployment, config: EngineConfig | None = None) -> str | None:
    """None when the engine is ready by ``hosts.engines.readiness`` (``/health`` and a model
    on ``/v1/models``) within CHANGE_HEALTH_TIMEOUT, else what is wrong. Asked with the API
    key of ``config``, the config just applied (a change may set a new key: the engine then
    refuses the old one), else of the deployment's running config."""
    key = config.api_key() if config is not None else deployment.api_key()
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    with httpx.Client(
        base_url=deployment.engine_url, headers=headers, timeout=5, verify=system_trust()
    ) as client:
        return readiness.wait_ready(
            lambda: readiness.probe(client, engine=deployment.engine).problem,
            conf.CHANGE_HEALTH_TIMEOUT,
            interval_s=1,
        )


BENCHMARK_FIELDS = {"baseline": "baseline_run", "verification": "verification_run"}
# An extra verification run, measured when the noise band is too wide to judge: it joins the
# change's ``extra_runs`` instead of a field of its own.
EXTRA = "extra verification"


def run_benchmark(change: ChangeRequest, purpose: str) -> tuple[BenchmarkRun | None, str]:
    """Run the change's verification profile on the engine now, inline on this worker (the
    run is an ordinary run: its page streams live and it joins the history). The run is on
    the change before it starts, so a rollback request can cancel it. ``(run, "")``, or
    ``(None, why it could not start)``."""
    field = BENCHMARK_FIELDS.get(purpose)
    close_unfinished([getattr(change, field)] if field else list(change.extra_runs.all()))
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
    if field:
        setattr(change, field, run)
        change.save(update_fields=[field])
    else:
        change.extra_runs.add(run)
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


def close_unfinished(runs) -> None:
    """Fail the runs a previous worker of the pipeline left running: it died during them, so
    they measured for nobody."""
    for run in runs:
        if run is not None and not run.is_finished:
            benchmark_runs.fail_run(run, "the change's pipeline stopped during the run")


def verdict_numbers(run: BenchmarkRun | None) -> dict:
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
        "preemptions": None if (pre := count(server, "preemptions")) is None else round(pre),
        "restarted": restarted(run),
        "error_rate": run.error_rate,
        "requests": run.completed,
        "run": run.pk,
        "problem": error_threshold_problem(run),
    }


def count(server: dict, key: str) -> float | None:
    """A counter's increase over the run as the engine reported it, or None unreported."""
    value = server.get(key)
    return float(value) if isinstance(value, int | float) and value == value else None


# The engine's counters only grow while it runs: one that went back over a run means the
# process behind the port started again in between.
RESTART_COUNTERS = ("prompt_tokens", "generation_tokens")


def restarted(run: BenchmarkRun) -> str | None:
    """How the engine restarted during ``run``, or None: its own counters went back (a new
    process starts them at zero), or an engine operation on the deployment ran within the
    run's window (someone restarted or re-applied it)."""
    server = run.server if isinstance(run.server, dict) else {}
    back = [key for key in RESTART_COUNTERS if (count(server, key) or 0) < 0]
    if back:
        return f"its {' and '.join(back)} counters went back"
    if run.started_at is None or run.finished_at is None:
        return None
    operation = (
        EngineOperation.objects.filter(
            deployment_id=run.deployment_id,
            started_at__lt=run.finished_at,
        )
        .filter(Q(finished_at__isnull=True) | Q(finished_at__gt=run.started_at))
        .order_by("started_at")
        .first()
    )
    if operation is None:
        return None
    return (
        f"engine operation #{operation.pk} ({operation.get_kind_display().lower()}) ran during it"
    )


def judge(change: ChangeRequest) -> dict:
    """The verdict on ``change``: its verification (with its extra runs) against its
    baseline, under its thresholds, the change's flags saying whether a moved prefix-cache hit
    rate is its effect; with the budget of extra runs and how much of it was spent."""
    extra = list(change.extra_runs.order_by("pk")) if change.pk else []
    result = judge_runs(
        change.baseline_run,
        change.verification_run,
        verdict.Thresholds(
            change.max_error_rate_increase,
            change.max_ttft_p95_regression,
            change.max_itl_p95_regression,
        ),
        cache_changed=verdict.alters_cache(change.deployment.engine, _changed_flags(change)),
        extra=extra,
    )
    result["extra_runs"] = {
        "budget": change.max_extra_runs,
        "measured": len(extra),
        "pooled": max(0, len(result["verification_runs"]) - 1),
    }
    if result["measure_more"] and len(extra) >= change.max_extra_runs:
        result["reason"] += (
            f" (after {len(extra)} extra verification run{'s' if len(extra) != 1 else ''},"
            f" the change's budget of {change.max_extra_runs})"
        )
    return result


def judge_runs(
    baseline: BenchmarkRun | None,
    run: BenchmarkRun | None,
    thresholds: verdict.Thresholds,
    *,
    cache_changed: bool = False,
    extra: list[BenchmarkRun] = (),
) -> dict:
    """The verdict on ``run`` against ``baseline`` (``verdict.verdict``): their numbers, the
    conditions each measured under and the TTFT p95 noise bands of their request logs. One
    rule for a change's verification and for any two runs (the API's verdict, the CI gate).

    ``extra``: more runs of the verification's config (``pool``): those measured under the
    baseline's conditions add their requests to the verification's TTFT p95 and its band;
    every one of them counts for the hard guards; their ITL p95s are pooled too
    (``itl_p95_band``)."""
    before, after = conditions(baseline), conditions(run)
    ttfts = request_ttfts(run)
    values = verdict_numbers(run)
    pooled = [run] if run is not None else []
    if run is not None and extra:
        after, ttfts = pool(before, after, ttfts, extra, cache_changed=cache_changed)
        pooled += [r for r in extra if r.pk in after["runs"]]
        if ttfts and len(pooled) > 1:
            values["ttft_p95_ms"] = stats.percentile(sorted(ttfts), 95)
    itl_p95, itl_band = itl_p95_band(pooled)
    if len(pooled) > 1 and itl_p95 is not None:
        values["itl_p95_ms"] = itl_p95
    return refuse_client_limited(
        verdict.verdict(
            verdict_numbers(baseline),
            values,
            thresholds,
            (before, after),
            cache_changed=cache_changed,
            noise={
                "ttft_p95_ms": (
                    ttft_p95_band(baseline),
                    verdict.quantile_interval(ttfts) if ttfts is not None else None,
                ),
                "itl_p95_ms": (itl_p95_band([baseline] if baseline else [])[1], itl_band),
            },
        ),
        baseline,
        run,
    )


def refuse_client_limited(result: dict, baseline, run) -> dict:
    """A verdict on a client-limited run (``benchmarks.evidence.usable_as_evidence``) is
    "cannot judge", whatever its checks say: its latencies and errors are the load
    generator's. The engine's own hard guards (preemptions, KV, restarts) still regress."""
    refused = [
        f"the {side} run {r.numbered_name} is {evidence.refusal}"
        for side, r in (("baseline", baseline), ("verification", run))
        if r is not None and (evidence := usable_as_evidence(r)).limited
    ]
    if not refused or result.get("guards"):
        return result
    return {
        **result,
        "outcome": "inconclusive",
        "regressed": False,
        "reason": verdict.CANNOT_JUDGE + "; ".join(refused),
        "measure_more": False,
    }


def pool(before: dict, after: dict, ttfts, extra, *, cache_changed: bool):
    """The verification's conditions and TTFTs with its extra runs: a run that measured under
    the baseline's conditions (``verdict.compare_conditions``, the rule the verdict applies to
    the verification) and is usable adds its requests; every run adds its preemptions, KV
    peak and restarts, which the hard guards read. Returns the conditions and the pooled TTFTs;
    ``after["runs"]`` lists the runs pooled (the verification first)."""
    after = {**after, "runs": [after["run"]]}
    ttfts = list(ttfts or [])
    for run in extra:
        if run.status != OperationStatus.SUCCEEDED:
            continue
        more = conditions(run)
        for key, worse in (("preemptions", sum), ("kv_cache_usage_max", max)):
            known = [v for v in (after.get(key), more.get(key)) if v is not None]
            after[key] = worse(known) if known else None
        after["restarted"] = after.get("restarted") or more.get("restarted")
        differ = verdict.compare_conditions(before, more, cache_changed=cache_changed)["differ"]
        logged = request_ttfts(run)
        if differ or more.get("problem") or logged is None or usable_as_evidence(run).limited:
            continue
        ttfts += logged
        after["runs"].append(run.pk)
        after["requests"] = (after.get("requests") or 0) + (more.get("requests") or 0)
    return after, ttfts


def itl_p95_band(runs: list[BenchmarkRun]):
    """The ITL p95 of ``runs`` of one config and its noise band: ``(p95, (low, high))``. One
    run: its p95 and the band of its batch-means standard error (the load generator's
    ``p95_itl_se_ms``). Several (a verification with its extra runs): the p95s' mean weighted
    by each run's successful requests, with the weighted standard error, so each run measured
    narrows the band. ``(p95 or None, None)`` where a run lacks its standard error (recorded
    before it, imported, too few requests): then ITL is judged without a band, as before."""
    measured = []
    for run in runs:
        p95 = run.itl_p95_ms
        summary = run.summary if isinstance(run.summary, dict) else {}
        se = summary.get("p95_itl_se_ms")
        if p95 is None or not run.completed:
            continue
        measured.append((run.completed, p95, se if isinstance(se, int | float) else None))
    if not measured:
        return None, None
    total = sum(weight for weight, _, _ in measured)
    p95 = sum(weight * value for weight, value, _ in measured) / total
    if any(se is None for _, _, se in measured):
        return (p95 if len(measured) == 1 else None), None
    se = math.sqrt(sum((weight * se) ** 2 for weight, _, se in measured)) / total
    return p95, verdict.estimate_interval(p95, se)


def request_ttfts(run: BenchmarkRun | None) -> list[float] | None:
    """The TTFTs of the run's successful requests (its request log), or None without a log."""
    if run is None:
        return None
    blob = RunRequestLog.objects.filter(run=run).values_list("data", flat=True).first()
    if blob is None:
        return None
    try:
        return [
            row["ttft_ms"]
            for row in records.iter_rows(bytes(blob))
            if row["error_class"] is None and row["ttft_ms"] is not None
        ]
    except records.RecordLogError:
        return None


def ttft_p95_band(run: BenchmarkRun | None):
    """The run-to-run noise band of the run's TTFT p95, from its successful requests' TTFTs
    (its request log), or None without a log or with too few requests. ITL's band comes from
    the load generator instead (``itl_p95_band``): the log keeps each request's mean and
    worst gap, not the pooled gaps a p95 ITL is of."""
    ttfts = request_ttfts(run)
    return verdict.quantile_interval(ttfts) if ttfts is not None else None


def _changed_flags(change: ChangeRequest) -> set[str]:
    before = change.snapshot_config.settings if change.snapshot_config else {}
    after = change.applied_config.settings if change.applied_config else change.settings
    return {key for key in set(before) | set(after) if before.get(key) != after.get(key)}


def run_numbers_text(run: BenchmarkRun) -> str:
    """A benchmark in one line on the timeline."""
    return verdict.numbers_text(verdict.run_numbers(run))


verdict_text = verdict.verdict_text


def link(run: BenchmarkRun | None) -> str:
    return run.get_absolute_url() if run is not None else ""


def compare_link(a: BenchmarkRun | None, b: BenchmarkRun) -> str:
    if a is None or not a.pk or not b.pk:
        return ""
    return f"{reverse('benchmarks:compare')}?runs={a.pk}&runs={b.pk}"
