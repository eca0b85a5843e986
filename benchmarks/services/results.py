"""Recording what a load generator measured (from a run of ours or an imported file) on the
run's rows: headline columns, JSON parts, distributions, the request log, price and cost."""

from __future__ import annotations

import math
from decimal import Decimal

from django.conf import settings
from django.db import transaction

from benchmarks import records as request_records
from benchmarks.cost import cost_per_million, gpu_share
from benchmarks.metrics import RECORDED
from benchmarks.models import BenchmarkRun, RunPoint, RunRequestLog
from benchmarks.services.prices import hourly_price_for
from controlpanel.choices import OperationStatus

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
    imported run, or one judged before this rule), measured no working engine."""
    if run is None:
        return "there is no run"
    if run.status != OperationStatus.SUCCEEDED:
        why = f": {run.error}" if run.error else ""
        return f"{run.numbered_name} is {run.get_status_display().lower()}{why}"
    return error_rate_problem(run)
