"""Recording what a load generator measured (from a run of ours or an imported file) on the
run's rows: headline columns, JSON parts, distributions, the request log, price and cost."""

from __future__ import annotations

import math
from dataclasses import dataclass
from decimal import Decimal

from django.conf import settings
from django.db import transaction

from benchmarks import records as request_records
from benchmarks.cost import cost_per_million, gpu_share
from benchmarks.evidence import health_from_document, usable_as_evidence
from benchmarks.metrics import RECORDED
from benchmarks.models import BenchmarkRun, RunPoint, RunRequestLog
from benchmarks.services.prices import hourly_price_for
from controlpanel.choices import OperationStatus
from hosts.choices import Runner

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
    "stopped_on_errors",
    "failures",
    "panel",
    "client_health",
}


def number(value):
    """A finite float, or None for anything else (None, NaN, text, a bool)."""
    if value is None or isinstance(value, bool):
        return None
    try:
        value = float(value)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(value) or math.isinf(value) else value


def clean(value):
    """JSON-safe: NaN and infinities (which PostgreSQL's jsonb refuses) become None."""
    if isinstance(value, float):
        return None if math.isnan(value) or math.isinf(value) else value
    if isinstance(value, dict):
        return {k: clean(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [clean(v) for v in value]
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
    _set_columns(run, document)
    if records:
        run.distributions = request_records.distributions(records)
    host = run.deployment.host
    price, currency, _ = hourly_price_for(host)
    # The run pays for the GPUs its deployment used, not for the host's idle ones.
    share = gpu_share(price, run.gpu_count, host.gpus.count())
    run.hourly_price = round(Decimal(share.charged), 4)
    run.currency = currency
    run.cost_per_million_output = cost_per_million(run.hourly_price, run.output_tokens_per_s)
    with transaction.atomic():
        run.save()
        if records:
            blob = request_records.encode(records)  # warm-up requests are left out
            RunRequestLog.objects.update_or_create(
                run=run, defaults={"count": request_records.count(blob), "data": blob}
            )
        if store_timeline:
            _replace_points(run, document.get("timeline") or [])
    return run


def _set_columns(run: BenchmarkRun, document: dict) -> None:
    """The headline columns and the JSON parts of ``document``, on ``run`` (not saved)."""
    summary = clean({k: v for k, v in document.items() if k not in NOT_SUMMARY})
    for metric in RECORDED:
        value = number(summary.get(metric.summary_key))
        if value is not None and metric.integer:
            value = int(value)
        setattr(run, metric.key, value)
    run.summary = summary
    run.stages = clean(document.get("stages") or {})
    server = dict(document.get("server") or {})
    server.pop("timeline", None)  # the per-second gauges are in the run's points already
    run.server = clean(server)
    run.notes = list(document.get("notes") or [])
    run.stopped_early = (document.get("stopped_early") or "")[:300]
    run.client_health = clean(health_from_document(document, engine_time_scale(run)))


def engine_time_scale(run: BenchmarkRun) -> float | None:
    """The wall seconds per simulated second of the run's engine, where the panel runs it as
    a simulator with a ``time_scale`` (``benchmarks.evidence.health_from_document``); None
    for an engine (or a simulator at real time)."""
    deployment = run.deployment if run.deployment_id else None
    if deployment is None or deployment.runner != Runner.SIMULATOR:
        return None
    options = deployment.simulator if isinstance(deployment.simulator, dict) else {}
    try:
        return float(options["time_scale"]) if "time_scale" in options else None
    except (TypeError, ValueError):
        return None


def _replace_points(run: BenchmarkRun, timeline: list[dict]) -> None:
    RunPoint.objects.filter(run=run).delete()
    RunPoint.objects.bulk_create(
        [
            RunPoint(run=run, t=float(point["t"]), data=clean(point))
            for point in _unique_t(timeline)
        ],
        batch_size=1000,
    )


def _unique_t(points: list[dict]):
    seen = set()
    for point in points:
        t = number(point.get("t"))
        if t is None or t in seen:
            continue
        seen.add(t)
        yield point


# --- whether a run measured a working engine ----------------------------------------------------
def profile_error_rate_limit(profile) -> float:
    """The share of failed requests above which a run of ``profile`` stops and fails: the
    profile's own ``max_error_rate``, else the panel's BENCHMARK_MAX_ERROR_RATE."""
    limit = number((profile.spec or {}).get("max_error_rate")) if profile is not None else None
    return settings.BENCHMARK_MAX_ERROR_RATE if limit is None else limit


def error_rate_limit(run: BenchmarkRun) -> float:
    """The limit that applies to ``run``: the one fixed when it started (a later edit of the
    default does not re-judge it), or for an imported run its profile's or the default."""
    if run.error_rate_limit is not None:
        return run.error_rate_limit
    return profile_error_rate_limit(run.load_profile)


def error_rate_problem(run: BenchmarkRun) -> str | None:
    """What is wrong with ``run``'s error rate (above its limit), or None when it is within
    it. A run without a measured request has nothing to judge: that is a problem too."""
    if run.error_rate is None or not (run.completed or run.failed):
        return f"{run.numbered_name} measured no request"
    limit = error_rate_limit(run)
    if run.error_rate > limit:
        return (
            f"{run.numbered_name} failed {run.error_rate:.1%} of its requests "
            f"({run.failed} of {run.completed + run.failed}), above its limit of {limit:.0%}"
        )
    return None


def error_threshold_problem(run: BenchmarkRun | None) -> str | None:
    """Why ``run`` must not be used for a verdict (as a baseline or a verification), or None
    when it may: the one rule for it. A run that did not succeed (failed, stopped because the
    engine failed, cancelled, still running), or whose error rate is above its limit (an
    imported run, or one judged before this rule), measured no working engine; a client-limited
    run (``benchmarks.evidence.usable_as_evidence``) measured its own load generator."""
    if run is None:
        return "there is no run"
    if run.status != OperationStatus.SUCCEEDED:
        why = f": {run.error}" if run.error else ""
        return f"{run.numbered_name} is {run.get_status_display().lower()}{why}"
    refusal = usable_as_evidence(run).refusal
    if refusal:
        # Its numbers are the load generator's, not the engine's (benchmarks.evidence).
        return f"{run.numbered_name} is {refusal}"
    return error_rate_problem(run)


# --- how a run's status reads -------------------------------------------------------------------
@dataclass(frozen=True)
class StatusBadge:
    """A run's status as every page shows it: its words, its colour, and a longer title."""

    label: str
    colour: str
    title: str = ""


def share_text(share: float) -> str:
    """A share as a percentage that never rounds a failure away ('0.01 %', not '0.0 %')."""
    percent = share * 100
    if 0 < percent < 0.1:
        return f"{percent:.2g} %"
    return f"{percent:.1f} %"


def status_badge(run: BenchmarkRun) -> StatusBadge:
    """The one rule for a run's badge. The status keeps its state machine (a run that ran to
    its end succeeded), but a finished run with any failed request does not read as a clean
    success: "Succeeded with errors: 27.5 % failed" in amber, with how many in the title.
    Any failure counts: a threshold would hide the failures below it."""
    status = run.status_choice
    if status != OperationStatus.SUCCEEDED:
        return StatusBadge(run.get_status_display(), status.colour)
    failed, completed = run.failed, run.completed
    if failed:
        total = failed + (completed or 0)
        share = failed / total if total else 1.0
        how_many = f"{failed:,} of {total:,} requests failed"
    elif failed is None and number(run.error_rate):
        # An imported run may give the rate without the counts.
        share, how_many = run.error_rate, "the imported file gives no count"
    else:
        return StatusBadge(run.get_status_display(), status.colour)
    return StatusBadge(f"Succeeded with errors: {share_text(share)} failed", "amber", f"{how_many}")


# --- what the run page shows of a summary -------------------------------------------------------
# (row label, summary name, what it means) for the latency table; the summary has
# mean_/median_/pNN_<name>_ms of each (benchmarks.loadgen.stats.describe).
LATENCIES = (
    ("TTFT", "ttft", "from the request leaving the client"),
    (
        "TTFT from the scheduled send",
        "ttft_from_scheduled",
        "from when the load pattern wanted it sent: shows what client-side queueing hides",
    ),
    ("Client-side queueing", "client_queue", "scheduled send → sent"),
    ("ITL", "itl", "between streamed chunks"),
    ("TPOT", "tpot", "per output token after the first"),
    ("E2E latency", "e2el", "request sent → last token"),
)
LATENCY_COLUMNS = (("mean", "mean"), ("p50", "median"), ("p90", "p90"), ("p95", "p95"))
LATENCY_COLUMNS += (("p99", "p99"), ("p99.9", "p99_9"))


def latency_rows(summary: dict | None) -> list[dict]:
    """The latency table of a run's summary: one row per latency it has, ``values`` in the
    order of LATENCY_COLUMNS (None where the summary lacks one: an imported file)."""
    summary = summary or {}
    rows = []
    for label, name, note in LATENCIES:
        values = [number(summary.get(f"{prefix}_{name}_ms")) for _, prefix in LATENCY_COLUMNS]
        if any(v is not None for v in values):
            rows.append({"label": label, "note": note, "values": values})
    return rows


def error_causes(run: BenchmarkRun) -> list[dict]:
    """The run's failed requests by cause (``errors_by_cause`` of its summary), each with its
    share of the measured requests; empty for a run recorded before causes were kept (the
    page shows its errors by class instead)."""
    causes = (run.summary or {}).get("errors_by_cause") or []
    total = (run.completed or 0) + (run.failed or 0)
    return [
        {
            **cause,
            "share": cause.get("count", 0) / total if total else None,
            # The load generator's own failure (benchmarks.loadgen.client.CLIENT_ERROR): what
            # the client saw, never what the engine answered.
            "client_side": cause.get("error_class") == "client_error",
        }
        for cause in causes
        if isinstance(cause, dict)
    ]
