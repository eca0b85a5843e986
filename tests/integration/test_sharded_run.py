"""A sharded benchmark on the production processes (issue 22): the compose worker runs the
run's task as coordinator, two workers of compose's loadgen service (the loadgen queue only)
each run one shard against the fixed-latency test server, and the run stores what one process
would: its results over the union of both shards' requests, its live points streamed over the
Redis channel layer, and each shard's health naming the worker that ran it; a cancel stops
both shards."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from decimal import Decimal

import pytest
from asgiref.sync import sync_to_async
from celery import Celery
from django.db import connection
from django.utils import timezone

from benchmarks import records as request_records
from benchmarks.loadgen.stats import percentile
from benchmarks.models import RunPoint, RunRequestLog, RunShard, RunShardChunk
from benchmarks.services import runs as services
from tests.benchmarks.loadgen.conftest import fixed_server  # noqa: F401 - shared fixture
from tests.factories import make_deployment, make_gpu, make_host, make_profile
from tests.integration.processes import compose_command, run_events, use_redis_channel_layer

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]

REQUESTS = 120
PROFILE = {
    "stages": [{"name": "main", "request_rate": 40, "num_requests": REQUESTS}],
    "input_len": {"kind": "fixed", "mean": 64},
    "output_len": {"kind": "fixed", "mean": 16},
    "warmup_requests": 2,
    "slo": {"ttft": 2000},
}


def loadgen_command(number: int) -> list[str]:
    """Compose's loadgen service, named apart as two containers' hostnames would be."""
    cmd = compose_command("loadgen")
    assert "--queues=loadgen" in cmd, cmd
    return [f"--hostname=loadgen{number}@%h" if c.startswith("--hostname=") else c for c in cmd]


def test_two_loadgen_workers_run_a_two_shard_benchmark_and_a_cancel_stops_both(
    production_env,  # noqa: F811
    start,  # noqa: F811
    fixed_server,  # noqa: F811
    settings,
    postgres,
):
    settings.EMBEDDED = False  # this process's panel is embedded; the started ones are not
    use_redis_channel_layer(settings, production_env["REDIS_URL"])
    server = fixed_server(ttft_ms=20, itl_ms=2)
    host = make_host(address="127.0.0.1", hourly_price=Decimal("2.00"))
    gpu = make_gpu(host)
    # A fresh reading for the whole test: the run polls no agent (there is none here).
    gpu.last_sample = {"utilization_gpu_pct": 50, "memory_used_bytes": 2**30, "power_w": 300}
    gpu.last_sample_at = timezone.now() + timedelta(minutes=10)
    gpu.save()
    deployment = make_deployment(host, port=server.port, model="fixed-latency")
    workers = [
        start("worker", compose_command("worker"), production_env),
        start("loadgen1", loadgen_command(1), production_env),
        start("loadgen2", loadgen_command(2), production_env),
    ]
    for worker in workers:
        worker.wait_for_output("ready.", timeout=120)

    run = services.start_benchmark(
        None, deployment, make_profile(spec=PROFILE), shards=2, enqueue=False
    )
    broker = Celery(broker=production_env["REDIS_URL"], set_as_current=False)
    events = asyncio.run(stream(broker, run, workers))

    run.refresh_from_db()
    logs = "\n".join(w.output()[-2000:] for w in workers)
    assert run.status == "succeeded", (run.error, run.log, logs)
    shards = list(RunShard.objects.filter(run=run).order_by("number"))
    # Both loadgen workers ran a shard, each in its own process; the coordinator ran neither.
    names = {s.hostname.partition("@")[0] for s in shards}
    assert names == {"loadgen1", "loadgen2"}, [(s.hostname, s.pid) for s in shards]
    assert len({s.pid for s in shards}) == 2 and all(s.pid for s in shards)
    assert [s.status for s in shards] == ["done", "done"]
    assert [s.sent for s in shards] == [REQUESTS // 2, REQUESTS // 2]
    assert all(abs(s.offset_ms) < 50 and s.late_p99_ms is not None for s in shards)
    # The merged counts are the profile's: every request once, warm-up left out.
    assert (run.completed, run.failed) == (REQUESTS, 0)
    assert sum(s.done for s in shards) == REQUESTS
    log = request_records.decode(bytes(RunRequestLog.objects.get(run=run).data))
    assert sorted(row["index"] for row in log) == list(range(REQUESTS))
    # The stored summary is the statistics over the union of both shards' stored requests
    # (the log keeps float32 milliseconds rounded to 3 places: equal to 0.01 ms).
    summary = run.summary
    assert summary["shards"] == 2 and summary["warmup_requests"] == 2
    assert summary["total_output_tokens"] == sum(row["output_tokens"] for row in log)
    ttfts = sorted(row["ttft_ms"] for row in log)
    for key, p in (("median_ttft_ms", 50), ("p95_ttft_ms", 95), ("p99_ttft_ms", 99)):
        assert summary[key] == pytest.approx(percentile(ttfts, p), abs=0.01), key
    assert run.ttft_p50_ms >= 20
    # Live: the merged seconds were streamed and stored like a one-process run's.
    points = [e for e in events if e["type"] == "run.point"]
    assert points and len(points) == RunPoint.objects.filter(run=run).count()
    assert points[-1]["data"]["completed"] == REQUESTS
    assert points[-1]["data"]["gpus"][0]["utilization_pct"] == 50
    assert not RunShardChunk.objects.filter(shard__run=run).exists()

    # A cancel reaches both shards: each stops, keeps what it measured, and the run says so.
    long = dict(PROFILE, stages=[{"name": "main", "request_rate": 40, "num_requests": 4000}])
    run = services.start_benchmark(
        None, deployment, make_profile(spec=long), shards=2, enqueue=False
    )
    events = asyncio.run(stream(broker, run, workers, cancel_after=40))
    run.refresh_from_db()
    assert run.status == "cancelled", (run.error, run.log)
    shards = list(RunShard.objects.filter(run=run))
    assert [s.status for s in shards] == ["done", "done"]
    assert 40 <= run.completed < 4000 and all(0 < s.sent < 2000 for s in shards)
    assert not RunShardChunk.objects.filter(shard__run=run).exists()


async def stream(broker, run, workers, cancel_after: int | None = None) -> list[dict]:
    """The run's events while the workers run it; cancelled once a point counts
    ``cancel_after`` completed requests."""
    asked = []

    async def maybe_cancel(message):
        if (
            cancel_after is not None
            and not asked
            and message["type"] == "run.point"
            and message["data"]["completed"] >= cancel_after
        ):
            asked.append(True)
            await sync_to_async(cancel)(run)

    return await run_events(broker, run, workers, timeout=180, on_event=maybe_cancel)


def cancel(run) -> None:
    """Cancel on a helper thread, closing its connection (the test database is dropped at
    the end, which an open session would prevent)."""
    try:
        services.cancel_benchmark(None, run)
    finally:
        connection.close()
