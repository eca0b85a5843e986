"""Hourly aggregates of GPU telemetry (issue 22): the minutes of each GPU folded into one
``GpuSampleHour`` per hour, kept ``TELEMETRY_HOUR_RETENTION_DAYS`` (400 by default), so the
30-day and 1-year charts read 24 rows a GPU a day instead of 1,440 and the minutes can be kept
only as long as the 24 h and 7 d charts need them.

How an hour is made from its minutes: counts add up (samples, throttled samples, samples per
throttle reason), extremes are the extremes of the minutes', and averages are weighted by each
minute's sample count (a minute the poller half missed counts half). The aggregate runs in the
database (one ``GROUP BY`` over the hour's minutes); 4,000 GPUs give 4,000 rows an hour to
upsert, so the ORM's bulk upsert is fast enough on every backend.

When: the downsampling task (every minute) calls ``roll_up_hours`` after the minute roll-up.
An hour is folded once the next one has begun (its last minute is written at the turn of the
hour), and the newest stored hour is folded again with it, taking in minutes that came late.
A backlog (the first run on an existing database, a scheduler that was stopped) is worked off
``BACKLOG_HOURS`` at a time, so no single run scans weeks of minutes.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from django.db.models import Case, F, FloatField, Max, Min, Sum, When
from django.db.models.functions import TruncHour

from hosts.models import GpuSampleHour, GpuSampleMinute
from hosts.models_telemetry import THROTTLE_REASONS

HOUR = timedelta(hours=1)
BACKLOG_HOURS = 6  # at most this many hours folded a run
COUNTS = [
    "samples",
    "throttled_samples",
    "reason_samples",
    *(f"throttle_{key}" for key, _bit, _words in THROTTLE_REASONS),
]
MAXIMA = [
    "utilization_max",
    "memory_used_max",
    "power_max",
    "power_limit_max",
    "temperature_max",
    "sm_clock_max",
    "pcie_tx_max",
    "pcie_rx_max",
]
MINIMA = ["sm_clock_min"]
AVERAGES = [
    "utilization_avg",
    "power_avg",
    "sm_clock_avg",
    "mem_clock_avg",
    "pcie_tx_avg",
    "pcie_rx_avg",
]
HOUR_FIELDS = [*COUNTS, *MAXIMA, *MINIMA, *AVERAGES]


def hour_aggregates(start: datetime, end: datetime) -> list[GpuSampleHour]:
    """One unsaved ``GpuSampleHour`` per GPU and hour of the minutes with
    ``start <= minute < end`` (whole hours)."""
    # Annotation names of their own ("a_..."): one named like a column would shadow it.
    weighted = {
        # sum(avg x samples) over the minutes that have the average, and their samples.
        **{
            f"a_{name}_sum": Sum(F(name) * F("samples"), output_field=FloatField())
            for name in AVERAGES
        },
        **{
            f"a_{name}_samples": Sum(Case(When(**{f"{name}__isnull": False}, then=F("samples"))))
            for name in AVERAGES
        },
    }
    rows = (
        GpuSampleMinute.objects.filter(minute__gte=start, minute__lt=end)
        # Hours of UTC: a TIME_ZONE half an hour off would otherwise cut hours at :30.
        .annotate(h=TruncHour("minute", tzinfo=UTC))
        .values("gpu_id", "h")
        .annotate(
            **{f"a_{name}": Sum(name) for name in COUNTS},
            **{f"a_{name}": Max(name) for name in MAXIMA},
            **{f"a_{name}": Min(name) for name in MINIMA},
            **weighted,
        )
        .order_by("gpu_id", "h")
    )
    return [
        GpuSampleHour(
            gpu_id=r["gpu_id"],
            hour=r["h"],
            **{name: r[f"a_{name}"] or 0 for name in COUNTS},
            **{name: r[f"a_{name}"] for name in (*MAXIMA, *MINIMA)},
            **{name: _weighted(r[f"a_{name}_sum"], r[f"a_{name}_samples"]) for name in AVERAGES},
        )
        for r in rows
    ]


def _weighted(total, samples):
    return None if total is None or not samples else total / samples


def roll_up_hours(now: datetime) -> int:
    """Fold the whole hours after the newest stored one, from the first with minutes in it,
    up to the hour ``now`` is in (at most ``BACKLOG_HOURS`` of them), and the newest stored
    hour again for minutes that came late; returns the hour rows written. Nothing until an
    hour with minutes in it has ended."""
    this_hour = now.replace(minute=0, second=0, microsecond=0)
    newest = GpuSampleHour.objects.aggregate(h=Max("hour"))["h"]
    minutes = GpuSampleMinute.objects.all()
    if newest is not None:
        minutes = minutes.filter(minute__gte=newest + HOUR)
    # The first minute not in an hour yet: a fleet that was empty for a week is not walked
    # through hour by hour.
    first = minutes.aggregate(m=Min("minute"))["m"]
    if first is None:
        return 0
    start = first.replace(minute=0, second=0, microsecond=0)
    end = min(this_hour, start + BACKLOG_HOURS * HOUR)
    if end <= start:
        return 0
    hours = hour_aggregates(start, end)
    if newest is not None:
        hours += hour_aggregates(newest, newest + HOUR)
    return write_hours(sorted(hours, key=lambda h: (h.gpu_id, h.hour)))


def write_hours(hours: list[GpuSampleHour]) -> int:
    """Store ``hours``, replacing a GPU's hour already there (it is recomputed, not added).
    In (GPU, hour) order from every writer: two roll-ups upserting the same hours take their
    row locks in the same order and wait for each other instead of deadlocking."""
    GpuSampleHour.objects.bulk_create(
        hours,
        batch_size=1000,
        update_conflicts=True,
        unique_fields=["gpu", "hour"],
        update_fields=HOUR_FIELDS,
    )
    return len(hours)


def folded_until() -> datetime | None:
    """The end of the newest stored hour: minutes before it are in an hour row."""
    newest = GpuSampleHour.objects.aggregate(h=Max("hour"))["h"]
    return None if newest is None else newest + HOUR
