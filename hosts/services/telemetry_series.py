"""Chart series of a host's GPU telemetry over a time window, bucketed in the database.

A window (a named range ending now, or a zoomed start..end) is read from the finest store that
still covers it: the 1-second samples while the window lies within their retention
(``TELEMETRY_RAW_RETENTION_MINUTES``: 10 min and 1 h by default), else the 1-minute
aggregates (24 h, 7 d) while it lies within theirs and its buckets are under an hour, else
the 1-hour aggregates (30 d, 1 y). Buckets are sized so a series has at most ``MAX_POINTS``
points, and the rows are grouped by bucket in SQL: one query for every GPU and every series,
however many rows the window holds. Values per bucket: utilisation, power and clocks are
averages, memory and temperature maxima (what an operator looks for), throttle reasons the
share of samples with each reason active, PCIe the average throughput in MB/s.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from django.conf import settings
from django.db.models import Avg, Count, Func, IntegerField, Max, Min, Sum
from django.utils import timezone

from hosts.models import GpuSample, GpuSampleHour, GpuSampleMinute, Host
from hosts.models_telemetry import THROTTLE_REASONS
from hosts.services.telemetry_sql import reason_count

RANGES = {
    "10m": timedelta(minutes=10),
    "1h": timedelta(hours=1),
    "24h": timedelta(hours=24),
    "7d": timedelta(days=7),
    "30d": timedelta(days=30),
    "1y": timedelta(days=365),
}
MAX_POINTS = 600
MIN_WINDOW = timedelta(seconds=10)  # a zoom narrower than this shows nothing useful
EMPTY = {
    "raw": "no samples in this window yet: the panel reads the host's GPUs every second "
    "while the host is online",
    "minute": "no minute aggregates in this window yet: they are written every minute",
    "hour": "no hourly aggregates in this window yet: each hour is written once it has ended",
}


class BadSeriesRequest(ValueError):
    """The query string asks for a range or window the charts cannot show (an HTTP 400)."""


@dataclass(frozen=True)
class Window:
    """What to read: ``start``..``end``, from ``source`` ("raw", "minute" or "hour") in buckets of
    ``bucket_s`` seconds."""

    start: datetime
    end: datetime
    source: str
    bucket_s: int
    range: str | None = None


def window_for_request(params, now: datetime | None = None) -> Window:
    """The window the charts ask for: ``?range=10m|1h|24h|7d|30d|1y`` (10m when absent) or a zoom
    ``?start=&end=`` in ms since the epoch; raises ``BadSeriesRequest`` with the reason."""
    now = now or timezone.now()
    if params.get("start") or params.get("end"):
        try:
            start, end = (_from_ms(params.get(key)) for key in ("start", "end"))
        except (TypeError, ValueError, OverflowError, OSError):
            raise BadSeriesRequest(
                "start and end must both be milliseconds since the epoch"
            ) from None
        end = min(end, now)
        if end - start < MIN_WINDOW:
            raise BadSeriesRequest(
                "the window must be at least 10 seconds long, ending after it starts"
            )
        oldest = now - timedelta(days=settings.TELEMETRY_HOUR_RETENTION_DAYS)
        if end - max(start, oldest) < MIN_WINDOW:
            raise BadSeriesRequest("the window lies before the oldest telemetry kept")
        return choose_window(max(start, oldest), end, now)
    name = params.get("range") or "10m"
    if name not in RANGES:
        raise BadSeriesRequest(f"range must be one of {', '.join(RANGES)} (got {name!r})")
    return choose_window(now - RANGES[name], now, now, name)


def choose_window(start: datetime, end: datetime, now: datetime, name=None) -> Window:
    """The finest source that still holds ``start``, with buckets for <= MAX_POINTS points."""
    span = (end - start).total_seconds()
    bucket = max(1, math.ceil(span / MAX_POINTS))
    raw_kept = timedelta(minutes=settings.TELEMETRY_RAW_RETENTION_MINUTES)
    if start >= now - raw_kept:
        return Window(start, end, "raw", bucket, name)
    minutes_kept = timedelta(days=settings.TELEMETRY_MINUTE_RETENTION_DAYS)
    if start >= now - minutes_kept and bucket < 3600:
        return Window(start, end, "minute", 60 * math.ceil(bucket / 60), name)
    return Window(start, end, "hour", 3600 * math.ceil(bucket / 3600), name)


def host_series(host: Host, window: Window) -> dict:
    """``{"range", "source", "bucket_s", "start", "end" (ms), "empty" (a sentence or None),
    "throttle_reasons": [{key, bit, label}], "gpus": {pk: {index, name, memory_total_gib, t: [ms],
    utilization, memory_gib, power_w, power_limit_w, temperature_c, sm_clock_mhz,
    mem_clock_mhz, pcie_tx_mbs, pcie_rx_mbs, throttle: {key: [share 0..1]}}}}``.
    Two queries: the GPUs, then every bucket of every GPU."""
    keys = [key for key, _bit, _words in THROTTLE_REASONS]
    series = {}
    for gpu in host.gpus.order_by("index"):
        series[gpu.pk] = {
            "index": gpu.index,
            "name": gpu.name,
            "memory_total_gib": round(gpu.memory_bytes / 2**30, 1),
            **{name: [] for name in SERIES},
            "throttle": {key: [] for key in keys},
        }
    rows = _bucket_rows(list(series), window) if series else []
    for row in rows:
        s = series[row["gpu_id"]]
        s["t"].append(int(row["t"].timestamp() * 1000))
        s["utilization"].append(_round(row["util"], 1))
        s["memory_gib"].append(None if row["mem"] is None else round(row["mem"] / 2**30, 2))
        s["power_w"].append(_round(row["power"], 1))
        s["power_limit_w"].append(row["power_limit"])
        s["temperature_c"].append(row["temp"])
        s["sm_clock_mhz"].append(_round(row["sm"], 0))
        s["mem_clock_mhz"].append(_round(row["mem_clock"], 0))
        # NVML reports PCIe throughput in kB/s.
        s["pcie_tx_mbs"].append(None if row["tx"] is None else round(row["tx"] / 1000, 3))
        s["pcie_rx_mbs"].append(None if row["rx"] is None else round(row["rx"] / 1000, 3))
        reported = row["reported"] or 0
        for key in keys:
            count = row[f"r_{key}"] or 0
            s["throttle"][key].append(round(count / reported, 4) if reported else None)
    return {
        "range": window.range,
        "source": window.source,
        "bucket_s": window.bucket_s,
        "start": int(window.start.timestamp() * 1000),
        "end": int(window.end.timestamp() * 1000),
        "empty": None if rows else EMPTY[window.source],
        "throttle_reasons": [{"key": k, "bit": b, "label": w} for k, b, w in THROTTLE_REASONS],
        "gpus": series,
    }


SERIES = (
    "t",
    "utilization",
    "memory_gib",
    "power_w",
    "power_limit_w",
    "temperature_c",
    "sm_clock_mhz",
    "mem_clock_mhz",
    "pcie_tx_mbs",
    "pcie_rx_mbs",
)


class EpochBucket(Func):
    """``floor((epoch seconds of the column - origin) / size)``: the bucket a row falls in.

    Django has no portable "seconds since the epoch" (PostgreSQL extracts EPOCH, SQLite
    formats ``%s``), so each backend gets its own SQL. ``origin`` and ``size`` are ints this
    module computes, written into the SQL as literals: the same expression then appears
    identically in SELECT and GROUP BY on every backend."""

    output_field = IntegerField()

    def __init__(self, column: str, origin: int, size: int):
        super().__init__(column)
        self.origin, self.size = int(origin), int(size)

    def as_sql(self, compiler, connection, **extra):
        sql, params = compiler.compile(self.source_expressions[0])
        return (
            f"CAST(FLOOR((EXTRACT(EPOCH FROM {sql}) - {self.origin}) / {self.size}) AS INTEGER)",
            params,
        )

    def as_sqlite(self, compiler, connection, **extra):
        sql, params = compiler.compile(self.source_expressions[0])
        # Rows are never before the origin, so integer division is the floor.
        return (
            f"((CAST(strftime('%%s', {sql}) AS INTEGER) - {self.origin}) / {self.size})",
            params,
        )


def _bucket_rows(gpu_ids: list[int], window: Window):
    origin = math.floor(window.start.timestamp())
    if window.source == "raw":
        rows = GpuSample.objects.filter(
            gpu_id__in=gpu_ids, time__gte=window.start, time__lte=window.end
        )
        column, aggregates = (
            "time",
            {
                "util": Avg("utilization_pct"),
                "mem": Max("memory_used_bytes"),
                "power": Avg("power_w"),
                "power_limit": Max("power_limit_w"),
                "temp": Max("temperature_c"),
                "sm": Avg("sm_clock_mhz"),
                "mem_clock": Avg("mem_clock_mhz"),
                "tx": Avg("pcie_tx_kbps"),
                "rx": Avg("pcie_rx_kbps"),
                "reported": Count("clocks_event_reasons"),
                **{f"r_{key}": reason_count(bit) for key, bit, _words in THROTTLE_REASONS},
            },
        )
    else:
        model, column = (
            (GpuSampleMinute, "minute") if window.source == "minute" else (GpuSampleHour, "hour")
        )
        rows = model.objects.filter(
            gpu_id__in=gpu_ids,
            **{f"{column}__gte": window.start, f"{column}__lte": window.end},
        )
        aggregates = {
            "util": Avg("utilization_avg"),
            "mem": Max("memory_used_max"),
            "power": Avg("power_avg"),
            "power_limit": Max("power_limit_max"),
            "temp": Max("temperature_max"),
            "sm": Avg("sm_clock_avg"),
            "mem_clock": Avg("mem_clock_avg"),
            "tx": Avg("pcie_tx_avg"),
            "rx": Avg("pcie_rx_avg"),
            "reported": Sum("reason_samples"),
            **{f"r_{key}": Sum(f"throttle_{key}") for key, _bit, _words in THROTTLE_REASONS},
        }
    return (
        rows.annotate(bucket=EpochBucket(column, origin, window.bucket_s))
        .values("gpu_id", "bucket")
        .annotate(t=Min(column), **aggregates)
        .order_by("gpu_id", "bucket")
    )


def _from_ms(value) -> datetime:
    return datetime.fromtimestamp(int(value) / 1000, tz=UTC)


def _round(value, digits: int):
    return None if value is None else round(value, digits)
