"""Benchmark run workflows: start one on a deployment, cancel it, execute it on a worker, and
record what a load generator measured (from a run or an imported file) on the run's rows."""

from __future__ import annotations

import math

from django.db import transaction

from benchmarks import records as request_records
from benchmarks.models import BenchmarkRun, RunPoint, RunRequestLog
from benchmarks.services.prices import hourly_price_for

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
            RunRequestLog.objects.update_or_create(
                run=run,
                defaults={"count": len(records), "data": request_records.encode(records)},
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
