"""A run's stored points as the live charts read them: the page's first load, its backfill
after a reconnect, and the API's timeline."""

from __future__ import annotations

from benchmarks.models import BenchmarkRun, RunPoint

# Only the run's last RECENT_WITH_SAMPLES points carry their per-request TTFT samples (up to
# 100 a second): the scatter shows the recent past, and a 3-hour run would otherwise send about
# a million samples per page view. Older points are read without them, key by key in SQL.
RECENT_WITH_SAMPLES = 300
# What run_live.js draws from a point (its CHARTS); older points are read as just these keys.
CHART_KEYS = (
    "ttft_p50_ms",
    "ttft_p95_ms",
    "output_tokens_per_s",
    "requests_per_s",
    "in_flight",
    "server_running",
    "server_waiting",
    "errors_per_s",
    "failed",
    "kv_cache_usage",
    "gpus",
)
# The backfill's page: a reconnect after a long sleep fetches what it missed in pages.
BACKFILL_PAGE = 600


def points_after(run: BenchmarkRun, since: float | None = None, limit: int | None = None):
    """The run's points after ``since``, oldest first, at most ``limit`` (and whether more
    follow); the per-request TTFT samples only on the run's last RECENT_WITH_SAMPLES points."""
    rows = RunPoint.objects.filter(run=run)
    if since is not None:
        rows = rows.filter(t__gt=since)
    # Where the points with samples begin: the RECENT_WITH_SAMPLES-th newest point's t.
    edge = list(
        RunPoint.objects.filter(run=run)
        .order_by("-t")
        .values_list("t", flat=True)[RECENT_WITH_SAMPLES - 1 : RECENT_WITH_SAMPLES]
    )
    want = None if limit is None else limit + 1
    points = []
    if edge:
        older = rows.filter(t__lt=edge[0]).order_by("t")
        older = older.values_list("t", *(f"data__{key}" for key in CHART_KEYS))
        points = [
            {"t": row[0], **dict(zip(CHART_KEYS, row[1:], strict=True))}
            for row in (older if want is None else older[:want])
        ]
        rows = rows.filter(t__gte=edge[0])
    if want is None or len(points) < want:
        recent = rows.order_by("t").values_list("data", flat=True)
        points += list(recent if want is None else recent[: want - len(points)])
    more = limit is not None and len(points) > limit
    return (points[:limit] if more else points), more
