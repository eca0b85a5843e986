"""The telemetry tables' bulk statements, written for PostgreSQL where the ORM's are too
slow at fleet scale, each with the portable ORM path as the fallback (SQLite in tests and
``make run``):

* samples go in with ``COPY`` (about a tenth of the CPU of building ``GpuSample`` objects
  and one multi-row ``INSERT``);
* the newest readings of GPUs and hosts change with one ``UPDATE … FROM
  json_to_recordset(%s)``: the rows travel as one JSON parameter (``bulk_update`` writes a
  ``CASE WHEN`` per field and row, which Django takes most of a second to build for a
  thousand GPUs; a ``VALUES`` list of one placeholder per value made psycopg split and adapt
  a query of thousands of parameters in Python, 11 % of the poll worker's CPU in a profile);
* the minute roll-up is one ``INSERT … SELECT … GROUP BY`` with ``ON CONFLICT`` (nothing
  crosses into Python);
* retention deletes go in chunks of ``TELEMETRY_DELETE_CHUNK`` rows, each its own
  statement and transaction, so a backlog never becomes one giant delete.
"""

from __future__ import annotations

import json
import math
from contextlib import nullcontext
from datetime import datetime

from django.conf import settings
from django.db import connection, transaction
from django.db.models import Avg, Count, F, Max, Min, Q
from django.db.models.functions import TruncMinute
from django.db.models.lookups import GreaterThan

from hosts.models import Gpu, GpuSample, GpuSampleMinute, Host
from hosts.models_telemetry import THROTTLE_REASONS

# The columns of a minute of a GPU's telemetry, as both roll-ups write them.
MINUTE_FIELDS = [
    "samples",
    "utilization_avg",
    "utilization_max",
    "memory_used_max",
    "power_avg",
    "power_max",
    "temperature_max",
    "sm_clock_avg",
    "sm_clock_min",
    "throttled_samples",
    "power_limit_max",
    "sm_clock_max",
    "mem_clock_avg",
    "pcie_tx_avg",
    "pcie_tx_max",
    "pcie_rx_avg",
    "pcie_rx_max",
    "reason_samples",
    *(f"throttle_{key}" for key, _bit, _words in THROTTLE_REASONS),
]

# The sample columns after ``gpu_id`` and ``time``, with how a reading's value is made one
# (the ORM's own conversions: ``int()`` for integer fields, ``float()`` for float fields).
SAMPLE_COLUMNS = (
    ("utilization_pct", float),
    ("memory_used_bytes", int),
    ("power_w", float),
    ("power_limit_w", float),
    ("temperature_c", float),
    ("sm_clock_mhz", int),
    ("mem_clock_mhz", int),
    ("clocks_event_reasons", int),
    ("pcie_tx_kbps", float),
    ("pcie_rx_kbps", float),
)


def postgres() -> bool:
    return connection.vendor == "postgresql"


def sample_value(kind, value):
    """A reading's value as the column holds it; None for what is missing or is no number
    (one odd value must not fail the batch every other host's samples are in)."""
    if value is None or isinstance(value, bool):
        return None
    try:
        value = kind(value)
    except (TypeError, ValueError, OverflowError):
        return None
    if kind is float:
        return value if math.isfinite(value) else None
    # The integer columns are counts, clocks and masks: never negative, within bigint.
    return value if 0 <= value < 2**63 else None


# --- the poll's writes ---------------------------------------------------------------------------
def insert_samples(rows: list[tuple]) -> None:
    """Store ``(gpu_id, time, *SAMPLE_COLUMNS values)`` rows: ``COPY`` on PostgreSQL."""
    if not rows:
        return
    if not postgres():
        names = [name for name, _kind in SAMPLE_COLUMNS]
        GpuSample.objects.bulk_create(
            [
                GpuSample(gpu_id=r[0], time=r[1], **dict(zip(names, r[2:], strict=True)))
                for r in rows
            ]
        )
        return
    columns = ", ".join(["gpu_id", "time", *(name for name, _kind in SAMPLE_COLUMNS)])
    sql = f"COPY hosts_gpusample ({columns}) FROM STDIN"
    with connection.cursor() as cursor:
        # Logged like any query when queries are (DEBUG, tests' CaptureQueriesContext).
        logged = cursor.debug_sql(sql) if hasattr(cursor, "debug_sql") else nullcontext()
        # ``cursor.cursor``: the psycopg 3 cursor under Django's wrapper, which has ``copy``.
        with logged, cursor.cursor.copy(sql) as copy:
            for row in rows:
                copy.write_row(row)


def update_gpus(rows: list[tuple[int, dict, datetime]]) -> None:
    """Set ``last_sample`` and ``last_sample_at`` of each ``(gpu_id, sample, time)``."""
    if not rows:
        return
    rows = sorted(rows, key=lambda r: r[0])  # one lock order for every writer
    if not postgres():
        Gpu.objects.bulk_update(
            [
                Gpu(pk=pk, last_sample=finite(sample), last_sample_at=when)
                for pk, sample, when in rows
            ],
            ["last_sample", "last_sample_at"],
        )
        return
    _update_from_json(
        "hosts_gpu",
        ["last_sample = v.sample", "last_sample_at = v.at"],
        "id bigint, sample jsonb, at timestamptz",
        [{"id": pk, "sample": sample, "at": when.isoformat()} for pk, sample, when in rows],
    )


HOST_COLUMNS = ("host_readings", "telemetry_source", "telemetry_note", "last_seen_at")


def update_hosts(hosts: list[Host]) -> None:
    """Write each host's ``host_readings``, ``telemetry_source``, ``telemetry_note``,
    ``last_seen_at`` and ``last_poll_at`` (the same time), as set on the objects."""
    if not hosts:
        return
    hosts = sorted(hosts, key=lambda h: h.pk)
    if not postgres():
        for host in hosts:
            host.host_readings = finite(host.host_readings)
        Host.objects.bulk_update(hosts, [*HOST_COLUMNS, "last_poll_at"])
        return
    _update_from_json(
        "hosts_host",
        [
            "host_readings = v.readings",
            "telemetry_source = v.source",
            "telemetry_note = v.note",
            "last_seen_at = v.at",
            "last_poll_at = v.at",
        ],
        "id bigint, readings jsonb, source text, note text, at timestamptz",
        [
            {
                "id": h.pk,
                "readings": h.host_readings,
                "source": h.telemetry_source,
                "note": h.telemetry_note,
                "at": h.last_seen_at.isoformat(),
            }
            for h in hosts
        ],
    )


def _update_from_json(table: str, assignments: list[str], columns: str, rows: list[dict]):
    try:
        document = json.dumps(rows, allow_nan=False)
    except ValueError:
        # NaN or infinity from an agent: JSON (and so jsonb) has no such number. Rare, so
        # the walk that replaces them happens only when the fast dump has refused.
        document = json.dumps(finite(rows))
    sql = (
        # Names and column types are this module's constants; the rows are one parameter.
        f"UPDATE {table} AS t SET {', '.join(assignments)} "  # noqa: S608
        f"FROM json_to_recordset(%s::json) AS v({columns}) WHERE t.id = v.id"
    )
    with connection.cursor() as cursor:
        cursor.execute(sql, [document])


def finite(value):
    """``value`` with every NaN or infinite float inside it made None: what a reading's JSON
    may hold (Python's parser accepts ``NaN``) but a JSON column cannot store."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [finite(v) for v in value]
    return value


# --- the minute roll-up --------------------------------------------------------------------------
_ROLLUP = """
INSERT INTO hosts_gpusampleminute (
    gpu_id, minute, samples, utilization_avg, utilization_max, memory_used_max, power_avg,
    power_max, power_limit_max, temperature_max, sm_clock_avg, sm_clock_min, sm_clock_max,
    mem_clock_avg, pcie_tx_avg, pcie_tx_max, pcie_rx_avg, pcie_rx_max, throttled_samples,
    reason_samples, {throttle_columns}
)
SELECT
    gpu_id, date_trunc('minute', time), count(*), avg(utilization_pct), max(utilization_pct),
    max(memory_used_bytes), avg(power_w), max(power_w), max(power_limit_w), max(temperature_c),
    avg(sm_clock_mhz), min(sm_clock_mhz), max(sm_clock_mhz), avg(mem_clock_mhz),
    avg(pcie_tx_kbps), max(pcie_tx_kbps), avg(pcie_rx_kbps), max(pcie_rx_kbps),
    -- Idle is bit 0x1: any other reason makes the mask 2 or more.
    count(*) FILTER (WHERE clocks_event_reasons > 1),
    count(clocks_event_reasons),
    {throttle_counts}
FROM hosts_gpusample
WHERE time < %s{since}
GROUP BY gpu_id, date_trunc('minute', time)
ON CONFLICT (gpu_id, minute) DO UPDATE SET {updates}
"""


ROLLUP_LOCK = 0x7E1E_0001  # the roll-up's advisory lock key (any constant of its own)


def roll_up(start: datetime | None, end: datetime) -> int:
    """Aggregate the raw samples with ``start <= time < end`` (``start`` None: all before
    ``end``) into one ``GpuSampleMinute`` per GPU and minute, replacing a minute already
    there (a minute is recomputed from all its samples, never added to). ``start`` and
    ``end`` are whole minutes. Returns the minute rows written."""
    if not postgres():
        return _roll_up_orm(start, end)

    sql = _ROLLUP.format(
        throttle_columns=", ".join(f"throttle_{key}" for key, _bit, _words in THROTTLE_REASONS),
        throttle_counts=",\n    ".join(
            f"count(*) FILTER (WHERE clocks_event_reasons & {int(bit)} > 0)"
            for _key, bit, _words in THROTTLE_REASONS
        ),
        updates=", ".join(f"{f} = EXCLUDED.{f}" for f in MINUTE_FIELDS),
        since="" if start is None else " AND time >= %s",
    )
    with transaction.atomic(), connection.cursor() as cursor:
        # One roll-up at a time (a late one overlapping the next minute's): two upserts of
        # the same minutes take their row locks in no set order and can deadlock.
        cursor.execute("SELECT pg_advisory_xact_lock(%s)", [ROLLUP_LOCK])
        cursor.execute(sql, [end] if start is None else [end, start])
        return cursor.rowcount


def _roll_up_orm(start: datetime | None, end: datetime) -> int:

    minutes = minute_aggregates(start, end)
    GpuSampleMinute.objects.bulk_create(
        minutes,
        batch_size=500,
        update_conflicts=True,
        unique_fields=["gpu", "minute"],
        update_fields=MINUTE_FIELDS,
    )
    return len(minutes)


# --- retention -----------------------------------------------------------------------------------
def delete_before(model, column: str, cutoff: datetime, *, chunk: int | None = None) -> int:
    """Delete ``model`` rows with ``column < cutoff``, at most ``chunk`` rows a statement,
    each statement committed on its own (the index on ``column`` finds them). Returns the
    rows deleted."""
    chunk = chunk or settings.TELEMETRY_DELETE_CHUNK
    table = model._meta.db_table
    sql = (
        # A model's table and a column named by this package; the cutoff is a parameter.
        f"DELETE FROM {table} WHERE id IN "  # noqa: S608
        f"(SELECT id FROM {table} WHERE {column} < %s LIMIT {int(chunk)})"
    )
    deleted = 0
    while True:
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute(sql, [connection.ops.adapt_datetimefield_value(cutoff)])
            count = cursor.rowcount
        deleted += count
        if count < chunk:
            return deleted


# --- the portable roll-up (SQLite): the same columns -------------------------------------------
def minute_aggregates(start: datetime | None, end: datetime) -> list[GpuSampleMinute]:
    """One unsaved ``GpuSampleMinute`` per GPU and minute of the raw samples with
    ``start <= time < end`` (the portable roll-up: SQLite)."""
    raw = GpuSample.objects.filter(time__lt=end)
    if start is not None:
        raw = raw.filter(time__gte=start)
    rows = (
        raw.annotate(m=TruncMinute("time"))
        .values("gpu_id", "m")
        .annotate(
            n=Count("id"),
            util_avg=Avg("utilization_pct"),
            util_max=Max("utilization_pct"),
            mem_max=Max("memory_used_bytes"),
            power_avg=Avg("power_w"),
            power_max=Max("power_w"),
            power_limit_max=Max("power_limit_w"),
            temp_max=Max("temperature_c"),
            sm_avg=Avg("sm_clock_mhz"),
            sm_min=Min("sm_clock_mhz"),
            sm_max=Max("sm_clock_mhz"),
            mem_clock_avg=Avg("mem_clock_mhz"),
            pcie_tx_avg=Avg("pcie_tx_kbps"),
            pcie_tx_max=Max("pcie_tx_kbps"),
            pcie_rx_avg=Avg("pcie_rx_kbps"),
            pcie_rx_max=Max("pcie_rx_kbps"),
            # Idle is bit 0x1: any other reason makes the mask 2 or more.
            throttled=Count("id", filter=Q(clocks_event_reasons__gt=1)),
            reason_samples=Count("clocks_event_reasons"),
            **{f"throttle_{key}": reason_count(bit) for key, bit, _words in THROTTLE_REASONS},
        )
    )
    return [
        GpuSampleMinute(
            gpu_id=r["gpu_id"],
            minute=r["m"],
            samples=r["n"],
            utilization_avg=r["util_avg"],
            utilization_max=r["util_max"],
            memory_used_max=r["mem_max"],
            power_avg=r["power_avg"],
            power_max=r["power_max"],
            power_limit_max=r["power_limit_max"],
            temperature_max=r["temp_max"],
            sm_clock_avg=r["sm_avg"],
            sm_clock_min=r["sm_min"],
            sm_clock_max=r["sm_max"],
            mem_clock_avg=r["mem_clock_avg"],
            pcie_tx_avg=r["pcie_tx_avg"],
            pcie_tx_max=r["pcie_tx_max"],
            pcie_rx_avg=r["pcie_rx_avg"],
            pcie_rx_max=r["pcie_rx_max"],
            throttled_samples=r["throttled"],
            reason_samples=r["reason_samples"],
            **{f"throttle_{k}": r[f"throttle_{k}"] for k, _bit, _words in THROTTLE_REASONS},
        )
        for r in rows
    ]


def reason_count(bit: int) -> Count:
    """How many samples had clock-event reason ``bit`` set (bitwise AND in SQL: the same
    on SQLite and PostgreSQL)."""
    return Count("id", filter=Q(GreaterThan(F("clocks_event_reasons").bitand(bit), 0)))
