#!/usr/bin/env python3
"""Where a page view's CPU goes (issue 22): database (ORM + driver), templates, middleware
(sessions, auth, CSRF, throttling, static), figures/JSON, and the rest (views, Python).

Production settings (DEBUG off, PostgreSQL, Redis cache) on a fresh database seeded as
``scripts/bench_web.py`` seeds it (``--hosts`` hosts with deployments, ``--runs`` runs with a
minute of points each, ``--changes`` changes, and ``--fleet`` more hosts × 8 GPUs with a last
reading on every GPU, as a polled fleet has), then, in this process, a Viewer's requests
through Django's handler with its middleware (no network, no server: the numbers are the
panel's own work). For each page: median CPU ms per view over ``--repeat`` views
(``time.thread_time``), SQL statements per view, response size, and the split of the CPU by
where the functions live (``cProfile`` self time, so nothing is counted twice; the profiler's
own overhead inflates every bucket alike, so read the split as shares).

    .venv/bin/python scripts/profile_pages.py [--fleet 500] [--repeat 30]
"""

from __future__ import annotations

import argparse
import cProfile
import json
import os
import pstats
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

import benchkit  # noqa: E402 - after the path it is found on

BUCKETS = (
    # (name, path fragments of the functions whose self time it counts): first match wins.
    ("database", ("/django/db/", "/psycopg", "/psycopg_pool")),
    (
        "templates",
        (
            "/django/template",
            "templatetags",
            "/django/utils/html",
            "safestring",
            "/django/forms/",
            "/html/__init__",
            "controlpanel/widgets",
        ),
    ),
    (
        "middleware",
        (
            "/django/middleware",
            "/django/contrib/sessions",
            "/django/contrib/auth",
            "/axes/",
            "/whitenoise/",
            "/django/core/handlers",
            "/django/test/",
            "metrics_middleware",
            "/django/contrib/messages",
            "/prometheus",
        ),
    ),
    ("figures/JSON", ("/plotly", "/json/", "orjson")),
)


def bucket_of(filename: str) -> str | None:
    """The bucket of code in ``filename``; None for built-ins and the standard library, whose
    time belongs to whoever called them."""
    for name, parts in BUCKETS:
        if any(part in filename for part in parts):
            return name
    if filename == "~" or ("/lib/python3" in filename and "site-packages" not in filename):
        return None
    return "other"


def split_by_bucket(stats: dict) -> dict[str, float]:
    """Self time per bucket; a built-in's or standard library function's goes to its callers'
    buckets (up the chain until one has a bucket), in proportion to the time each call edge
    took."""

    def owner(func, seen=()) -> dict[str, float]:
        key = bucket_of(func[0])
        if key is not None:
            return {key: 1.0}
        callers = stats.get(func, (0, 0, 0, 0, {}))[4]
        weights = {c: edge[2] + edge[3] for c, edge in callers.items() if c not in seen}
        total = sum(weights.values())
        if not total:
            return {"other": 1.0}
        out: dict[str, float] = {}
        for caller, weight in weights.items():
            for k, share in owner(caller, (*seen, func)).items():
                out[k] = out.get(k, 0.0) + share * weight / total
        return out

    split: dict[str, float] = {}
    for func, (_, _, self_time, _, _) in stats.items():
        for key, share in owner(func).items():
            split[key] = split.get(key, 0.0) + self_time * share
    return split


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--fleet", type=int, default=500, help="fleet hosts × 8 GPUs (0: none)")
    p.add_argument("--hosts", type=int, default=20)
    p.add_argument("--runs", type=int, default=200)
    p.add_argument("--changes", type=int, default=100)
    p.add_argument("--repeat", type=int, default=30)
    p.add_argument("--database-url", default="postgres://postgres@127.0.0.1:5432")
    p.add_argument("--redis-url", default="redis://127.0.0.1:6379/10")
    p.add_argument(
        "--sql", action="store_true", help="also list each page's statements with their CPU ms"
    )
    p.add_argument("--top", type=int, default=0, help="also list the N costliest functions")
    return p.parse_args(argv)


def fill_readings() -> None:
    """A last reading on every GPU, as a polled fleet has (the seed leaves them empty)."""
    from django.utils import timezone

    from hosts.models import Gpu

    rng, now = random.Random(7), timezone.now()
    gpus = list(Gpu.objects.only("pk", "memory_bytes"))
    for gpu in gpus:
        gpu.last_sample = {
            "memory_total_bytes": gpu.memory_bytes,
            "memory_used_bytes": rng.randint(0, gpu.memory_bytes),
            "utilization_gpu_pct": rng.randint(0, 100),
            "temperature_c": rng.randint(30, 80),
            "power_w": rng.uniform(80, 700),
            "power_limit_w": 700.0,
            "sm_clock_mhz": 1980,
            "throttle_reasons": [],
        }
        gpu.last_sample_at = now
    Gpu.objects.bulk_update(gpus, ["last_sample", "last_sample_at"], batch_size=1000)


def profile(pages, session: str, repeat: int, show_sql: bool = False, top: int = 0) -> None:
    from django.db import connection
    from django.test import Client

    client = Client(HTTP_X_FORWARDED_PROTO="https", HTTP_HOST="127.0.0.1")
    client.cookies["sessionid"] = session
    statements = []

    def count(execute, sql, params, many, context):
        # CPU of this thread while the statement is sent, run and its rows turned into Python
        # (waiting on PostgreSQL costs no thread CPU); the ORM's compiling happens before.
        t0 = time.thread_time()
        try:
            return execute(sql, params, many, context)
        finally:
            statements.append((sql, (time.thread_time() - t0) * 1000))

    print(f"\n{'page':11s} {'cpu ms':>7s} {'SQL':>4s} {'KiB':>5s}   share of the CPU (profiled)")
    for name, url in pages:
        for _ in range(3):  # warm caches, the pool, compiled templates
            response = client.get(url, secure=True)
            assert response.status_code == 200, (url, response.status_code)
        times = []
        for _ in range(repeat):
            t0 = time.thread_time()
            client.get(url, secure=True)
            times.append((time.thread_time() - t0) * 1000)
        statements.clear()
        with connection.execute_wrapper(count):
            client.get(url, secure=True)
        queries = len(statements)
        if show_sql:
            for sql, ms in statements:
                print(f"    {ms:6.2f} ms  {sql[:150]}")
        profiler = cProfile.Profile(time.thread_time)  # CPU, not waiting on PostgreSQL
        profiler.enable()
        for _ in range(repeat):
            client.get(url, secure=True)
        profiler.disable()
        stats = pstats.Stats(profiler)
        split = split_by_bucket(stats.stats)
        total = sum(split.values()) or 1.0
        order = ("database", "templates", "middleware", "figures/JSON", "other")
        shares = "  ".join(f"{k} {100 * split.get(k, 0) / total:3.0f} %" for k in order)
        print(
            f"{name:11s} {statistics.median(times):7.1f} {queries:4d} "
            f"{len(response.content) / 1024:5.0f}   {shares}"
        )
        if top:
            costliest = sorted(stats.stats.items(), key=lambda kv: -kv[1][3])[:top]
            for (path, line, func), (_, _, _, cumulative, _) in costliest:
                where = "/".join(Path(path).parts[-2:])
                print(f"    {1000 * cumulative / repeat:6.2f} ms  {where}:{line} {func}")


def main(args) -> int:

    database = benchkit.create_database(args.database_url, "profile_pages")
    var_dir = tempfile.mkdtemp(prefix="profile-pages-")
    env = benchkit.panel_env(
        f"{args.database_url}/{database}", args.redis_url, var_dir, "profile-pages", HTTPS="true"
    )
    try:
        for step in (["migrate", "--noinput", "-v0"], ["collectstatic", "--noinput", "-v0"]):
            subprocess.run([sys.executable, "manage.py", *step], env=env, cwd=ROOT, check=True)
        seed = [sys.executable, str(ROOT / "scripts" / "bench_web.py"), "seed", "--viewers", "1"]
        seed += ["--hosts", str(args.hosts), "--runs", str(args.runs)]
        seed += ["--changes", str(args.changes), "--fleet", str(args.fleet), "--token", "t" * 32]
        out = subprocess.run(seed, env=env, cwd=ROOT, check=True, capture_output=True, text=True)
        seeded = json.loads(out.stdout.strip().splitlines()[-1])
        os.environ.update(env)
        import django

        django.setup()
        fill_readings()
        print(
            f"nproc {os.cpu_count()}  CPU {benchkit.cpu_model()}  load {os.getloadavg()}\n"
            f"{args.hosts + args.fleet} hosts ({args.fleet} × 8 GPUs with readings), "
            f"{args.runs} runs, {args.changes} changes; PostgreSQL, production settings"
        )
        pages = [
            ("dashboard", "/"),
            ("hosts list", "/hosts/"),
            ("host page", f"/hosts/{seeded['host']}/"),
            ("history", "/benchmarks/"),
            ("run page", f"/benchmarks/{seeded['runs'][0]}/"),
        ]
        profile(pages, seeded["sessions"][0], args.repeat, args.sql, args.top)
    finally:
        from django.db import connections

        connections.close_all()
        benchkit.drop_database(args.database_url, database)
    return 0


if __name__ == "__main__":
    sys.exit(main(parse_args()))
