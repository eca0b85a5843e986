#!/usr/bin/env python3
"""Fleet telemetry at scale (issue 22): 500 hosts x 8 GPUs polled every second by real Celery
worker(s) and beat on PostgreSQL + Redis, against the fleet simulator (hosts.agent.fleet).

1. creates a fresh PostgreSQL database (``--db``, dropped first) and migrates it;
2. starts the fleet simulator (one process, one port per host from ``--base-port``) and
   creates ``--hosts`` agent hosts with their GPUs (the simulator's UUIDs) through the ORM;
3. starts ``celery beat`` and one ``celery worker`` (``--concurrency``) with
   ``TELEMETRY_SHARDS=--shards``, Redis db ``--redis-db`` as broker (flushed first);
4. for ``--seconds`` watches the samples table from outside: every 0.2 s it reads the rows
   committed since its last look (ids skipped by concurrent commits asked for again); a row's
   lag is (when this script first saw it − the reading time the agent stamped): an upper
   bound, 0.2 s resolution plus one query; stored = rows whose reading is in the window;
5. prints poll lag p50/p99/max, samples/s against the 1 Hz target, CPU of the worker(s),
   beat, simulator and PostgreSQL over the window, the tables' growth (pg_total_relation_size)
   per hour and per day, the minute roll-up's duration for one synthetic minute of every
   GPU (240k rows for 4,000 GPUs), bytes per row of raw samples and minute aggregates and the
   growth per day and the size held at each retention, the downsample over the collected
   samples, and the hosts list / dashboard times and query counts with the fleet in place.

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/x REDIS_URL=redis://127.0.0.1:6379/12 \\
      flock /tmp/h/bench.lock .venv/bin/python scripts/bench_fleet.py --seconds 120
"""

from __future__ import annotations

import argparse
import os
import secrets
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import psutil
import psycopg

ROOT = Path(__file__).resolve().parent.parent
PY = sys.executable
sys.path.insert(0, str(ROOT / "scripts"))

import benchkit  # noqa: E402 - after the path it is found on
from benchkit import cpu_model, cpu_used, pct, server_cpu  # noqa: E402


def fresh_database(url: str, name: str) -> str:
    parts = urlsplit(url)
    admin = urlunsplit(parts._replace(path="/postgres"))
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}"')
        conn.execute(f'CREATE DATABASE "{name}"')
    return urlunsplit(parts._replace(path=f"/{name}"))


def tree_cpu(procs: list[psutil.Process]) -> float:
    total = 0.0
    for proc in procs:
        for p in [proc, *proc.children(recursive=True)]:
            try:
                t = p.cpu_times()
                total += t.user + t.system
            except psutil.Error:
                pass
    return total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hosts", type=int, default=500)
    parser.add_argument("--gpus", default="h100-sxm:8")
    parser.add_argument("--shards", type=int, default=4)
    parser.add_argument("--concurrency", type=int, default=2)
    parser.add_argument("--seconds", type=int, default=120)
    parser.add_argument("--warmup", type=int, default=15)
    parser.add_argument("--base-port", type=int, default=20000)
    parser.add_argument("--db", default="controlpanel_fleet_bench")
    parser.add_argument("--redis-db", type=int, default=12)
    parser.add_argument("--no-pages", action="store_true", help="skip the page timings")
    args = parser.parse_args()

    print(f"nproc {os.cpu_count()}, CPU {cpu_model()}, load at start {os.getloadavg()}")
    db_url = fresh_database(
        os.environ.get("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/postgres"), args.db
    )
    redis_url = f"redis://127.0.0.1:6379/{args.redis_db}"
    token = secrets.token_urlsafe(24)
    env = {
        **os.environ,
        "DATABASE_URL": db_url,
        "REDIS_URL": redis_url,
        "TELEMETRY_SHARDS": str(args.shards),
        "DJANGO_SETTINGS_MODULE": "controlpanel.settings",
        # Pages are fetched in-process over plain http (no TLS proxy in front here).
        "HTTPS": "false",
        "ADVISOR_INTERVAL_SECONDS": os.environ.get("ADVISOR_INTERVAL_SECONDS", "0"),
    }
    env.setdefault("SECRET_KEY", "bench-only-" + "x" * 50)
    env.setdefault("VAR_DIR", tempfile.mkdtemp(prefix="bench_fleet_"))
    os.environ.update(env)
    import redis  # the panel's own client library

    redis.Redis.from_url(redis_url).flushdb()  # this benchmark's db only
    t0 = time.monotonic()
    subprocess.run([PY, "manage.py", "migrate", "-v", "0"], cwd=ROOT, env=env, check=True)
    print(f"migrated in {time.monotonic() - t0:.1f} s")

    import django

    django.setup()
    from django.db import connection

    gpu_count = benchkit.create_fleet(args.hosts, args.gpus, args.base_port, token)
    print(f"{args.hosts} hosts, {gpu_count} GPUs created")

    logs = Path(env["VAR_DIR"])
    fleet, worker, beat = benchkit.start_fleet(
        args.hosts, args.gpus, args.base_port, token, args.concurrency, env, logs
    )
    procs = {p: psutil.Process(p.pid) for p in (worker, beat, fleet)}
    lags: list[float] = []
    try:
        with connection.cursor() as cur:
            time.sleep(args.warmup)
            cur.execute("SELECT coalesce(max(id), 0) FROM hosts_gpusample")
            last_id = cur.fetchone()[0]
            size_sql = (
                "SELECT pg_total_relation_size('hosts_gpusample'),"
                " pg_total_relation_size('hosts_gpusampleminute')"
            )
            cur.execute(size_sql)
            size0 = cur.fetchone()
            cpu0 = {p: tree_cpu([proc]) for p, proc in procs.items()}
            pg0, redis0, wall0 = (
                server_cpu("postgres"),
                server_cpu("redis-server"),
                time.monotonic(),
            )
            start = time.time()
            # Ids are taken at insert and committed in another order by concurrent shard
            # transactions: a row with a lower id than one already seen can still appear.
            # Such ids are kept as holes and asked for again (a hole older than 10 s is a
            # sequence gap that never fills); "id > last" alone missed ~7 % of the rows.
            holes: dict[int, float] = {}
            while time.time() - start < args.seconds:
                time.sleep(0.2)
                cur.execute(
                    "SELECT id, extract(epoch FROM time)::float8 FROM hosts_gpusample"
                    " WHERE id > %s OR id = ANY(%s)",
                    [last_id, list(holes)],
                )
                seen = time.time()
                found = cur.fetchall()
                ids = set()
                for row_id, stamp in found:
                    ids.add(row_id)
                    holes.pop(row_id, None)
                    if stamp >= start:  # readings taken inside the window
                        lags.append(seen - stamp)
                top = max(ids, default=last_id)
                for row_id in range(last_id + 1, top):
                    if row_id not in ids:
                        holes[row_id] = seen
                last_id = max(last_id, top)
                holes = {k: t for k, t in holes.items() if seen - t < 10}
            wall = time.monotonic() - wall0
            # Stored: every row whose reading was taken inside the window, counted once the
            # window's last batches have committed.
            time.sleep(2)
            cur.execute(
                "SELECT count(*) FROM hosts_gpusample WHERE time >= to_timestamp(%s)"
                " AND time < to_timestamp(%s)",
                [start, start + args.seconds],
            )
            rows = cur.fetchone()[0]
            cpu1 = {p: tree_cpu([proc]) for p, proc in procs.items()}
            pg1, redis1 = server_cpu("postgres"), server_cpu("redis-server")
            cur.execute(size_sql)
            size1 = cur.fetchone()
            load = os.getloadavg()
            # The poll's updates of the newest readings: in place (HOT) where the pages have
            # room (hosts migration 0010's fillfactor), else new index entries and dead rows.
            time.sleep(1)  # the statistics collector's report lags the commits a little
            cur.execute(
                "SELECT relname, n_tup_upd, n_tup_hot_upd, pg_total_relation_size(relid)"
                " FROM pg_stat_user_tables WHERE relname IN ('hosts_gpu', 'hosts_host')"
                " ORDER BY relname"
            )
            updates = cur.fetchall()
        expected = gpu_count * args.seconds
        print(
            f"\n--- {args.seconds} s, {args.shards} shards, worker concurrency {args.concurrency}"
        )
        print(f"load during (1 min avg at end): {load}")
        print(
            f"samples: {rows} stored = {rows / args.seconds:.0f}/s "
            f"({100 * rows / expected:.1f} % of {gpu_count} GPUs x 1 Hz)"
        )
        print(
            f"poll lag (reading time at the agent -> row seen committed), s: "
            f"p50 {pct(lags, 50):.3f}  p99 {pct(lags, 99):.3f}  max {max(lags or [0]):.3f}"
        )
        for table, updated, hot, size in updates:
            print(
                f"{table}: {updated} row updates since the start, {100 * hot / max(updated, 1):.0f}"
                f" % in place (HOT); {size / 2**20:.1f} MiB"
            )
        for name, p in (("worker", worker), ("beat", beat), ("fleet simulator", fleet)):
            used = cpu1[p] - cpu0[p]
            print(
                f"CPU {name}: {used:.1f} s over {wall:.0f} s = {100 * used / wall:.0f} % of a core"
            )
        print(
            f"CPU postgres: {100 * cpu_used(pg0, pg1) / wall:.0f} % of a core, redis:"
            f" {100 * cpu_used(redis0, redis1) / wall:.0f} % (processes running at the end)"
        )
        for i, table in enumerate(("raw samples", "minute aggregates")):
            per_s = (size1[i] - size0[i]) / wall
            print(
                f"{table}: {size1[i] / 2**20:.1f} MiB now, +{per_s * 3600 / 2**20:.0f} MiB/h,"
                f" {per_s * 86400 / 2**30:.2f} GiB/day at this rate"
            )
        if not args.no_pages:
            pages()
        # Polling stops here: the roll-up and retention are timed alone, and beat's own
        # downsample cannot fold the synthetic minute meanwhile.
        for proc in (beat, worker):
            proc.terminate()
            proc.wait(30)
        rollup_and_storage(gpu_count)
    finally:
        for proc in (beat, worker):
            proc.terminate()
        fleet.terminate()
        for proc in (beat, worker):
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()


def rollup_and_storage(gpu_count: int) -> None:
    """The roll-up and retention costs for one full minute of the fleet (60 synthetic
    samples of every GPU, 240k rows for 4,000 GPUs, in a minute 20 minutes back: inside the
    raw retention, before anything beat folds), the database growth per day from the tables'
    measured bytes per row, then one downsample over the samples the run collected."""
    from datetime import timedelta

    from django.conf import settings
    from django.db import connection, transaction
    from django.utils import timezone

    from hosts.models import GpuSample, GpuSampleMinute
    from hosts.services import telemetry_sql
    from hosts.services.telemetry import downsample_telemetry

    minute = timezone.now().replace(second=0, microsecond=0) - timedelta(minutes=20)
    end = minute + timedelta(minutes=1)
    columns = ", ".join(name for name, _kind in telemetry_sql.SAMPLE_COLUMNS)
    with connection.cursor() as cur:
        t0 = time.perf_counter()
        cur.execute(
            f"INSERT INTO hosts_gpusample (gpu_id, time, {columns})"  # noqa: S608 - constants
            " SELECT g.id, %s + s * interval '1 second', random() * 100, 64424509440, 300 +"
            " random() * 400, 700, 40 + random() * 40, 1980 - (random() * 500)::int, 2619,"
            " (ARRAY[0, 1, 4, 36])[1 + (random() * 3)::int], random() * 1e6, random() * 1e6"
            " FROM hosts_gpu g CROSS JOIN generate_series(0, 59) s",
            [minute],
        )
        synthetic = cur.rowcount
        print(f"\nsynthetic minute: {synthetic} rows inserted in {time.perf_counter() - t0:.2f} s")
    t0 = time.perf_counter()
    with transaction.atomic():
        written = telemetry_sql.roll_up(minute, end)
    took = time.perf_counter() - t0
    print(
        f"minute roll-up (one INSERT … SELECT … GROUP BY): {took:.2f} s for one minute of "
        f"{gpu_count} GPUs ({synthetic} rows -> {written} minute rows)"
    )
    t0 = time.perf_counter()
    again = telemetry_sql.roll_up(minute, end)
    print(f"  the same minute again (idempotent, ON CONFLICT): {time.perf_counter() - t0:.2f} s")
    assert again == written
    with connection.cursor() as cur:
        cur.execute("ANALYZE hosts_gpusample")
        cur.execute("ANALYZE hosts_gpusampleminute")
        cur.execute(
            "SELECT pg_total_relation_size('hosts_gpusample'), (SELECT count(*) FROM"
            " hosts_gpusample), pg_total_relation_size('hosts_gpusampleminute'), (SELECT"
            " count(*) FROM hosts_gpusampleminute)"
        )
        raw_size, raw_rows, minute_size, minute_rows = cur.fetchone()
    raw_row, minute_row = raw_size / max(raw_rows, 1), minute_size / max(minute_rows, 1)
    retention_min = settings.TELEMETRY_RAW_RETENTION_MINUTES
    retention_days = settings.TELEMETRY_MINUTE_RETENTION_DAYS
    raw_per_day = gpu_count * 86400  # 1 Hz
    minutes_per_day = gpu_count * 1440
    gib = 2**30
    print(
        f"raw samples: {raw_row:.0f} bytes/row (pg_total_relation_size / {raw_rows} rows); "
        f"{raw_per_day:,} rows/day = {raw_per_day * raw_row / gib:.1f} GiB/day written, held at "
        f"{gpu_count * retention_min * 60 * raw_row / gib:.2f} GiB by the {retention_min}-min "
        f"retention"
    )
    print(
        f"minute aggregates: {minute_row:.0f} bytes/row ({minute_rows} rows); "
        f"{minutes_per_day:,} rows/day = {minutes_per_day * minute_row / gib:.2f} GiB/day, held at "
        f"{minutes_per_day * retention_days * minute_row / gib:.1f} GiB by the "
        f"{retention_days}-day retention"
    )
    t0 = time.perf_counter()
    deleted = telemetry_sql.delete_before(GpuSample, "time", end)  # the synthetic minute only
    print(
        f"retention delete: {deleted} rows in {time.perf_counter() - t0:.2f} s "
        f"(chunks of {settings.TELEMETRY_DELETE_CHUNK})"
    )
    GpuSampleMinute.objects.filter(minute=minute).delete()
    hour_roll_up(gpu_count)

    t0 = time.perf_counter()
    folded = downsample_telemetry(timezone.now() + timedelta(minutes=1))
    print(
        f"downsample of the run's own samples: {time.perf_counter() - t0:.2f} s -> "
        f"{folded['aggregated']} minute rows, {folded['raw_deleted']} raw rows past retention"
    )


def hour_roll_up(gpu_count: int) -> None:
    """The hourly roll-up on a synthetic hour of minutes of every GPU (240k minute rows for
    4,000 GPUs, three days back, out of the way of the run's own rows): its cost, the hour
    rows' bytes and what the hour retention holds."""
    from datetime import timedelta

    from django.conf import settings
    from django.db import connection
    from django.utils import timezone

    from hosts.models import GpuSampleHour, GpuSampleMinute
    from hosts.services import telemetry_hours

    hour = timezone.now().replace(minute=0, second=0, microsecond=0) - timedelta(days=3)
    with connection.cursor() as cur:
        cur.execute(
            "INSERT INTO hosts_gpusampleminute (gpu_id, minute, samples, utilization_avg,"
            " utilization_max, memory_used_max, power_avg, power_max, power_limit_max,"
            " temperature_max, sm_clock_avg, sm_clock_min, sm_clock_max, mem_clock_avg,"
            " pcie_tx_avg, pcie_tx_max, pcie_rx_avg, pcie_rx_max, throttled_samples,"
            " reason_samples, throttle_sw_power_cap, throttle_hw_slowdown, throttle_sync_boost,"
            " throttle_sw_thermal, throttle_hw_thermal, throttle_power_brake)"
            " SELECT g.id, %s + m * interval '1 minute', 60, random() * 100, 100, 64424509440,"
            " 500, 700, 700, 80, 1800, 1500, 1980, 2619, 1e5, 1e6, 1e5, 1e6, 3, 60, 3, 0, 0, 0,"
            " 0, 0 FROM hosts_gpu g CROSS JOIN generate_series(0, 59) m",
            [hour],
        )
        synthetic = cur.rowcount
    t0 = time.perf_counter()
    aggregated = telemetry_hours.hour_aggregates(hour, hour + timedelta(hours=1))
    t1 = time.perf_counter()
    written = telemetry_hours.write_hours(aggregated)
    t2 = time.perf_counter()
    print(
        f"hour roll-up: {t2 - t0:.2f} s for an hour of {gpu_count} GPUs ({synthetic} minute rows"
        f" -> {written} hour rows; GROUP BY {t1 - t0:.2f} s, upsert {t2 - t1:.2f} s)"
    )
    with connection.cursor() as cur:
        cur.execute("ANALYZE hosts_gpusamplehour")
        cur.execute(
            "SELECT pg_total_relation_size('hosts_gpusamplehour'),"
            " (SELECT count(*) FROM hosts_gpusamplehour)"
        )
        size, rows = cur.fetchone()
    hour_row, days = size / max(rows, 1), settings.TELEMETRY_HOUR_RETENTION_DAYS
    per_day = gpu_count * 24
    print(
        f"hour aggregates: {hour_row:.0f} bytes/row ({rows} rows); {per_day:,} rows/day = "
        f"{per_day * hour_row / 2**20:.0f} MiB/day, held at "
        f"{per_day * days * hour_row / 2**30:.1f} GiB by the {days}-day retention"
    )
    GpuSampleMinute.objects.filter(minute__gte=hour, minute__lt=hour + timedelta(hours=1)).delete()
    GpuSampleHour.objects.filter(hour=hour).delete()


def pages() -> None:
    from django.conf import settings
    from django.contrib.auth import get_user_model
    from django.db import connection
    from django.test import Client
    from django.test.utils import CaptureQueriesContext, override_settings

    # No collectstatic in a throwaway VAR_DIR: plain static URLs instead of the manifest's.
    plain = {"BACKEND": "django.contrib.staticfiles.storage.StaticFilesStorage"}
    override_settings(STORAGES={**settings.STORAGES, "staticfiles": plain}).enable()
    user = get_user_model().objects.create_superuser("bench", "bench@example.com", "x" * 20)
    client = Client(HTTP_HOST="localhost", HTTP_X_FORWARDED_PROTO="https", secure=True)
    client.force_login(user)
    for url in ("/hosts/", "/"):
        times = []
        for _ in range(6):
            with CaptureQueriesContext(connection) as captured:
                t0 = time.perf_counter()
                response = client.get(url)
                times.append(time.perf_counter() - t0)
        print(
            f"page {url}: {response.status_code}, {len(captured.captured_queries)} queries,"
            f" {len(response.content) / 1024:.0f} KiB,"
            f" median {statistics.median(times[1:]) * 1000:.0f} ms"
            f" (max {max(times[1:]) * 1000:.0f} ms, in-process, while the fleet is polled)"
        )


if __name__ == "__main__":
    main()
