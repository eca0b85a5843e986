#!/usr/bin/env python3
"""How the benchmark history page holds up with many runs (docs/: "Benchmarks").

Fills a throwaway database with ``--runs`` finished runs (default 10,000) spread over hosts,
deployments, config versions, load profiles and people, each with a realistic summary and
latency distributions in its JSON columns (which the list must not read), then times the
history page as a logged-in viewer through Django's test client: the default sort, a sort on
a key number, a filter, a deep page, and a compare of four runs. Prints milliseconds (median
of ``--repeat`` requests) and the number of SQL queries of each.

    .venv/bin/python scripts/bench_history.py [--runs 10000] [--repeat 5]
    .venv/bin/python scripts/bench_history.py --postgres postgres://user:pw@127.0.0.1/panel

SQLite: a temporary file, deleted afterwards. PostgreSQL: Django's test database
(``test_<name>``) is created on that server and dropped afterwards.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import tempfile
import time
import warnings
from decimal import Decimal
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", type=int, default=10_000)
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--postgres", metavar="URL", help="a PostgreSQL server to use instead")
    p.add_argument("--seed", type=int, default=1)
    return p.parse_args()


def setup(args, scratch: Path):
    os.environ["VAR_DIR"] = str(scratch)
    os.environ.pop("REDIS_URL", None)
    os.environ["DATABASE_URL"] = args.postgres or f"sqlite:///{scratch / 'history.sqlite3'}"
    # As docker-compose.yml runs the web process: connections kept between requests, so the
    # numbers are the page's, not a PostgreSQL login's.
    os.environ.setdefault("DATABASE_CONN_MAX_AGE", "60")
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "controlpanel.settings")
    import django

    django.setup()
    from django.conf import settings

    settings.ALLOWED_HOSTS = [*settings.ALLOWED_HOSTS, "testserver"]
    settings.STORAGES = {
        **settings.STORAGES,
        "staticfiles": {"BACKEND": "django.contrib.staticfiles.storage.StaticFilesStorage"},
    }
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
    from django.db import connection

    if args.postgres:
        connection.creation.create_test_db(verbosity=0, autoclobber=True, serialize=False)
    else:
        from django.core.management import call_command

        call_command("migrate", verbosity=0)


def fill(count: int, seed: int):
    """``count`` finished runs; returns a viewer to log in as."""
    from django.contrib.auth import get_user_model
    from django.contrib.auth.models import Group
    from django.utils import timezone

    from benchmarks import records
    from benchmarks.models import BenchmarkRun, LoadProfile
    from hosts.models import Deployment, EngineConfig, Gpu, Host

    rng = random.Random(seed)
    users = [get_user_model().objects.create_user(f"engineer-{i}") for i in range(8)]
    viewer = get_user_model().objects.create_user("bench-viewer")
    viewer.groups.add(Group.objects.get(name="Viewer"))
    gpus = ["NVIDIA H100 80GB HBM3", "NVIDIA A100-SXM4-80GB", "NVIDIA L40S", "NVIDIA H200"]
    models = ["meta-llama/Llama-3.1-8B-Instruct", "Qwen/Qwen2.5-7B-Instruct", "mistral-7b"]
    deployments, configs = [], {}
    for h in range(25):
        host = Host.objects.create(
            name=f"gpu-{h:03d}", address="127.0.0.1", port=9100, hourly_price=Decimal("3.20")
        )
        Gpu.objects.create(
            host=host, index=0, uuid=f"GPU-{h}", name=gpus[h % 4], memory_bytes=80 * 2**30
        )
        for d in range(2):
            deployment = Deployment.objects.create(
                host=host,
                name=f"engine-{d}",
                engine="vllm" if (h + d) % 3 else "sglang",
                engine_version="0.11.0",
                model=models[(h + d) % 3],
                port=8000 + d,
            )
            deployments.append(deployment)
            configs[deployment.pk] = [
                EngineConfig.objects.create_next(deployment, {"max_num_seqs": 64 * (v + 1)})
                for v in range(4)
            ]
    profiles = [
        LoadProfile.objects.create_next(name, {"stages": [{"name": "main", "concurrency": c}]})
        for name in ("Chat", "RAG", "Batch", "Prefix")
        for c in (8, 16)
    ]
    quantiles = len(records.QUANTILES)
    now = timezone.now()
    rows = []
    for i in range(count):
        deployment = deployments[i % len(deployments)]
        ttft = rng.lognormvariate(5.3, 0.5)
        itl = rng.lognormvariate(2.5, 0.3)
        tokens = rng.uniform(300, 6000)
        ok = rng.random() > 0.03
        rows.append(
            BenchmarkRun(
                deployment=deployment,
                engine_config=rng.choice(configs[deployment.pk]),
                load_profile=rng.choice(profiles),
                label=rng.choice(["", "baseline", "prefix caching on", f"sweep {i % 50}"]),
                requested_by=rng.choice(users),
                status="succeeded" if ok else "failed",
                source=rng.choice(["panel"] * 8 + ["loadgen", "vllm-bench"]),
                created_at=now - timedelta_minutes(count - i),
                engine=deployment.engine,
                engine_version=deployment.engine_version,
                model_name=deployment.model,
                gpu_model=gpus[(i % len(deployments)) // 2 % 4],
                gpu_count=1,
                progress=1.0,
                duration_s=60.0,
                completed=600,
                failed=rng.randint(0, 6),
                error_rate=rng.random() * 0.01,
                ttft_p50_ms=ttft,
                ttft_p95_ms=ttft * 2.1,
                ttft_p99_ms=ttft * 3.0,
                itl_p50_ms=itl,
                itl_p95_ms=itl * 1.6,
                itl_p99_ms=itl * 2.4,
                tpot_p50_ms=itl * 1.05,
                e2el_p99_ms=ttft * 3 + itl * 400,
                request_throughput=tokens / 200,
                output_tokens_per_s=tokens,
                goodput_share=rng.uniform(0.7, 1.0),
                goodput_rps=tokens / 230,
                hourly_price=Decimal("3.20"),
                currency="USD",
                cost_per_million_output=3.2 / (tokens * 3600) * 1e6,
                # What a real run carries in JSON: ~3 KB of summary, ~4 KB of CDF points.
                summary={f"p{p}_{m}_ms": rng.random() * 500 for p in range(40) for m in "ab"},
                distributions={
                    "q": list(records.QUANTILES),
                    "ttft_ms": sorted(rng.random() * 900 for _ in range(quantiles)),
                    "itl_ms": sorted(rng.random() * 40 for _ in range(quantiles)),
                },
                environment={"host": {"name": deployment.host.name, "cpu_model": "x" * 60}},
            )
        )
    BenchmarkRun.objects.bulk_create(rows, batch_size=500)
    from django.db import connection

    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:  # what autovacuum would have done by now
            cursor.execute("ANALYZE")
    return viewer


def timedelta_minutes(minutes: int):
    from datetime import timedelta

    return timedelta(minutes=minutes)


def measure(client, url: str, repeat: int) -> tuple[float, int, int]:
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    client.get(url)  # warm caches (templates, the database's pages)
    times = []
    for _ in range(repeat):
        with CaptureQueriesContext(connection) as queries:
            start = time.perf_counter()
            response = client.get(url)
            times.append((time.perf_counter() - start) * 1000)
        assert response.status_code == 200, (url, response.status_code)
    if os.environ.get("BENCH_SQL"):
        for query in queries.captured_queries:
            print(f"   {query['time']:>6} {query['sql'][:150]}")
    return statistics.median(times), len(queries), len(response.content)


def main() -> int:
    args = parse_args()
    warnings.filterwarnings("ignore", message="No directory at")
    with tempfile.TemporaryDirectory(prefix="bench-history-") as scratch:
        setup(args, Path(scratch))
        from django.db import connection
        from django.test import Client
        from django.urls import reverse

        from benchmarks.models import BenchmarkRun

        started = time.perf_counter()
        viewer = fill(args.runs, args.seed)
        filled = time.perf_counter() - started
        client = Client()
        client.force_login(viewer)
        history = reverse("benchmarks:list")
        ids = list(BenchmarkRun.objects.order_by("-pk").values_list("pk", flat=True)[:4])
        cases = [
            ("default (newest first, 25 a page)", history),
            ("sorted by p95 TTFT", f"{history}?sort=ttft_p95_ms"),
            (
                "sorted by cost per 1M, 100 a page",
                f"{history}?sort=cost_per_million_output&per_page=100",
            ),
            (
                "filtered: GPU + engine + profile",
                f"{history}?gpu=NVIDIA+H100+80GB+HBM3&engine=vllm&profile=Chat",
            ),
            ("label search", f"{history}?q=prefix"),
            ("page 200", f"{history}?page=200"),
            (
                "compare 4 runs",
                reverse("benchmarks:compare") + "?" + "&".join(f"runs={i}" for i in ids),
            ),
        ]
        print(
            f"{connection.vendor} · {args.runs:,} runs (filled in {filled:.1f} s) · "
            f"median of {args.repeat} requests"
        )
        print(f"{'page':<40}{'ms':>8}{'queries':>9}{'KiB':>8}")
        for name, url in cases:
            ms, queries, size = measure(client, url, args.repeat)
            print(f"{name:<40}{ms:>8.1f}{queries:>9}{size / 1024:>8.0f}")
        if args.postgres:
            connection.creation.destroy_test_db(
                connection.settings_dict["NAME"].removeprefix("test_"), verbosity=0
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
