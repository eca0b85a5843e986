#!/usr/bin/env python3
"""How the runs API holds up with many runs (docs/: "API").

Fills a throwaway database with ``--runs`` finished runs (default 10,000) with
``bench_history``'s generator (JSON parts and all), then times the runs API with a viewer's
Bearer token through Django's test client, in process: the list (default, sorted by p95 TTFT,
filtered, the gate's "latest baseline" lookup, a deep page), one run, and a verdict. Prints
the median and p95 of ``--repeat`` requests in milliseconds, the SQL queries and the size.

    .venv/bin/python scripts/bench_api.py [--runs 10000] [--repeat 20]
    .venv/bin/python scripts/bench_api.py --postgres postgres://user:pw@127.0.0.1/panel

SQLite: a temporary file, deleted afterwards. PostgreSQL: Django's test database
(``test_<name>``) is created on that server and dropped afterwards.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_history import fill, setup  # noqa: E402 - the scripts folder is on the path now

TARGET_P95_MS = 100.0


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", type=int, default=10_000)
    p.add_argument("--repeat", type=int, default=20)
    p.add_argument("--postgres", metavar="URL", help="a PostgreSQL server to use instead")
    p.add_argument("--seed", type=int, default=1)
    return p.parse_args()


def measure(client, url: str, repeat: int) -> tuple[float, float, int, int]:
    """Median and p95 milliseconds of ``repeat`` GETs, the queries and bytes of the last."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    client.get(url)  # warm caches (the token's last use, the database's pages)
    times = []
    for _ in range(repeat):
        with CaptureQueriesContext(connection) as queries:
            start = time.perf_counter()
            response = client.get(url)
            times.append((time.perf_counter() - start) * 1000)
        assert response.status_code == 200, (url, response.status_code, response.content[:300])
    times.sort()
    p95 = times[min(len(times) - 1, round(0.95 * (len(times) - 1)))]
    return statistics.median(times), p95, len(queries), len(response.content)


def main() -> int:
    args = parse_args()
    warnings.filterwarnings("ignore", message="No directory at")
    with tempfile.TemporaryDirectory(prefix="bench-api-") as scratch:
        setup(args, Path(scratch))
        from django.db import connection
        from django.test import Client

        from api import tokens
        from benchmarks.models import BenchmarkRun

        started = time.perf_counter()
        viewer = fill(args.runs, args.seed)
        filled = time.perf_counter() - started
        _, raw = tokens.issue(viewer, "bench", None, actor=viewer)
        client = Client(HTTP_AUTHORIZATION=f"Bearer {raw}")
        newest = BenchmarkRun.objects.order_by("-pk").only("pk", "deployment", "load_profile")[0]
        older = (
            BenchmarkRun.objects.filter(
                deployment=newest.deployment_id,
                load_profile=newest.load_profile_id,
                status="succeeded",
            )
            .exclude(pk=newest.pk)
            .order_by("-pk")
            .values_list("pk", flat=True)[0]
        )
        runs = "/api/v1/runs/"
        cases = [
            ("list: default (newest first, 50)", runs),
            ("list: sorted by p95 TTFT", f"{runs}?ordering=ttft_p95_ms"),
            (
                "list: filtered GPU+engine+profile",
                f"{runs}?gpu=NVIDIA+H100+80GB+HBM3&engine=vllm&profile_name=Chat&status=succeeded",
            ),
            (
                "list: gate's latest baseline",
                f"{runs}?deployment={newest.deployment_id}&profile={newest.load_profile_id}"
                "&status=succeeded&ordering=-date&page_size=1",
            ),
            ("list: page 50", f"{runs}?page=50"),
            ("one run (detail, results)", f"{runs}{newest.pk}/"),
            ("verdict against a baseline", f"{runs}{newest.pk}/verdict/?baseline={older}"),
        ]
        print(
            f"{connection.vendor} · {args.runs:,} runs (filled in {filled:.1f} s) · "
            f"{args.repeat} requests each · Bearer token · target p95 < {TARGET_P95_MS:.0f} ms"
        )
        print(f"{'request':<36}{'median ms':>10}{'p95 ms':>8}{'queries':>9}{'KiB':>6}")
        slow = 0
        for name, url in cases:
            median, p95, queries, size = measure(client, url, args.repeat)
            slow += p95 >= TARGET_P95_MS
            mark = "" if p95 < TARGET_P95_MS else "  over target"
            print(f"{name:<36}{median:>10.1f}{p95:>8.1f}{queries:>9}{size / 1024:>6.0f}{mark}")
        if args.postgres:
            connection.creation.destroy_test_db(
                connection.settings_dict["NAME"].removeprefix("test_"), verbosity=0
            )
    return 1 if slow else 0


if __name__ == "__main__":
    sys.exit(main())
