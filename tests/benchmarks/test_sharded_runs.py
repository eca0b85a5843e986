"""A run split over load generator shards (issue 22): the coordinator waits for the shards'
check-in, starts them together, merges their ticks into live points and their records into
the results a one-process run stores; a shard nobody takes, a silent or failed one fails the
run with its reason; a cancel before the start cancels it. And a real shard's side against the
fixed-latency test server (the Celery workers themselves: tests/integration)."""

from __future__ import annotations

import math
import os
import random
import time

import pytest
from django.utils import timezone

from benchmarks import records as request_records
from benchmarks.loadgen.profile import build_spec
from benchmarks.loadgen.stats import RequestRecord, summarize
from benchmarks.models import BenchmarkRun, RunRequestLog, RunShard, RunShardChunk
from benchmarks.services import environment, runs, shard_worker, shards
from controlpanel.choices import OperationStatus
from tests.benchmarks.loadgen.conftest import fixed_server  # noqa: F401 - shared fixture
from tests.factories import make_deployment, make_host, make_profile

pytestmark = [pytest.mark.django_db, pytest.mark.sqlite]

N = 90
PROFILE = {
    "stages": [{"name": "a", "request_rate": 50, "num_requests": N}],
    "input_len": {"kind": "fixed", "mean": 16},
    "output_len": {"kind": "fixed", "mean": 8},
    "warmup_requests": 0,
    "slo": {"ttft": 40},
    "max_error_rate": 1,
}
READY = RunShard.Status.READY


class FakeSink:
    """Stands in for PointSink (its thread and GPU polls are tested elsewhere)."""

    points: list[dict] = []

    def __init__(self, run):
        FakeSink.points = []

    def start(self, load, deadline):
        self.load = load

    def put(self, point):
        FakeSink.points.append(point)

    def stop(self):
        pass


@pytest.fixture
def coordinated(settings, monkeypatch):
    """A sharded run whose shards are played by ``script`` (a generator, one step per
    coordinator poll) instead of Celery workers."""
    settings.EMBEDDED = False
    monkeypatch.setattr(shards, "enqueue", lambda *a, **kw: None)
    monkeypatch.setattr(shards, "PointSink", FakeSink)
    monkeypatch.setattr(environment, "engine_report", lambda deployment: {})

    def run_with(script, shard_count=2, profile=PROFILE):
        run = runs.start_benchmark(
            None, make_deployment(), make_profile(spec=profile), shards=shard_count
        )
        steps, polls = script(run), []

        def poll(seconds):
            polls.append(seconds)
            # A coordinator that misses what the script did would wait out real deadlines.
            assert len(polls) < 200, "the coordinator never came to an end"
            next(steps)

        monkeypatch.setattr(shards.time, "sleep", poll)
        runs.execute_run(BenchmarkRun.objects.get(pk=run.pk))
        run.refresh_from_db()
        return run

    return run_with


def check_in(run, numbers=(0, 1)):
    for n in numbers:
        RunShard.objects.filter(run=run, number=n).update(
            status=READY, hostname=f"w{n}@h", pid=100 + n, heartbeat_at=timezone.now()
        )


def make_records(seed=1) -> list[RequestRecord]:
    rng = random.Random(seed)
    out = []
    for i in range(N):
        sent = i * 0.02 + rng.uniform(0, 0.005)
        ok = rng.random() > 0.1
        first = sent + rng.expovariate(30) if ok else None
        chunks = [first + 0.004 * k for k in range(rng.randint(1, 8))] if ok else []
        out.append(
            RequestRecord(
                index=i,
                stage="a",
                warmup=False,
                input_len=16,
                max_tokens=8,
                scheduled=i * 0.02,
                sent=sent,
                first_token=first,
                chunk_times=chunks,
                end=chunks[-1] if chunks else sent + 0.01,
                output_tokens=len(chunks),
                status=200 if ok else 500,
                error_class=None if ok else "http_500",
                error="" if ok else "HTTP 500: boom",
            )
        )
    return out


def report(number, records, shard_count=2):
    mine = [r.to_dict() for r in records if r.index % shard_count == number]
    return {
        "shard": number,
        "hostname": f"w{number}@h",
        "epoch_wall": 1000.0,
        "offset_s": 0.002 * number,
        "offset_uncertainty_s": 0.0005,
        "records": mine,
        "timeline": [],
        "sent": len(mine),
        "done": sum(1 for d in mine if d["error_class"] is None),
        "failed": sum(1 for d in mine if d["error_class"] is not None),
        "late_p99_ms": 80.0 if number else 1.5,
        "error": None,
        "server": {"available": False},
        "notes": [],
        "cancelled": False,
        "stopped_early": None,
        "stopped_on_errors": None,
        "timestamps": "read",
        "warmup_requests": 0,
    }


def tick(k, completed):
    return {
        "t": k + 1.0,
        "stage": "a",
        "in_flight": 1,
        "completed": completed,
        "failed": 0,
        "requests_per_s": 10.0,
        "errors_per_s": 0.0,
        "output_tokens_per_s": 80.0,
        "ttft_p50_ms": 20.0,
        "ttft_p95_ms": 30.0 + k,
        "server_waiting": None,
        "server_running": None,
        "kv_cache_usage": None,
        "ttfts": [[k + 0.5, 20.0]],
    }


def test_shards_report_and_the_merge_is_what_one_process_computes(coordinated):
    records = make_records()

    def script(run):
        check_in(run)
        yield
        assert all(s.start_at is not None for s in RunShard.objects.filter(run=run))
        # Shard 0 ticks three times, shard 1 twice: its count carries into the third point.
        for number, ticks in ((0, 3), (1, 2)):
            shard = RunShard.objects.get(run=run, number=number)
            for k in range(ticks):
                RunShardChunk.objects.create(
                    shard=shard, kind="tick", seq=k, data=shards.pack(tick(k, 10 * (k + 1)))
                )
            shard_worker.store_report(shard, report(number, records))
        while True:
            yield

    run = coordinated(script)
    assert run.status == OperationStatus.SUCCEEDED, (run.error, run.log)
    spec = build_spec(PROFILE, "http://x", "m")
    single = summarize(records, spec.goodput)
    # Every number of the summary is the one process's over the same records, exactly.
    for key, value in single.items():
        stored = run.summary[key]
        if isinstance(value, float) and math.isnan(value):
            assert stored is None, key
        else:
            assert stored == value, key
    assert run.summary["shards"] == 2
    assert (run.completed, run.failed) == (single["completed"], single["failed"])
    assert run.ttft_p99_ms == single["p99_ttft_ms"]
    assert run.goodput_rps == single["request_goodput"]
    # The same rows a one-process run stores: the request log, every request once.
    log = request_records.decode(bytes(RunRequestLog.objects.get(run=run).data))
    assert sorted(row["index"] for row in log) == list(range(N))
    # Live points: tick n of both shards added up; shard 1's count carried over.
    assert [p["completed"] for p in FakeSink.points] == [20, 40, 50]
    assert [p["ttft_p95_ms"] for p in FakeSink.points] == [30.0, 31.0, 32.0]
    # Each shard's health; the chunks are gone.
    health = shards.shard_health(run)
    assert [(h["hostname"], h["pid"], h["status"]) for h in health] == [
        ("w0@h", 100, "done"),
        ("w1@h", 101, "done"),
    ]
    assert [h["sent"] for h in health] == [45, 45]
    assert sum(h["done"] for h in health) == single["completed"]
    assert [h["behind"] for h in health] == [False, True]
    assert health[1]["offset_ms"] == pytest.approx(2.0)
    assert not RunShardChunk.objects.filter(shard__run=run).exists()


def test_a_shard_no_worker_takes_fails_the_run_with_that_reason(coordinated, monkeypatch):
    def script(run):
        check_in(run, numbers=[0])
        monkeypatch.setattr(shards, "PICKUP_TIMEOUT_S", 0.0)  # shard 1's time is up
        while True:
            yield

    run = coordinated(script)
    assert run.status == OperationStatus.FAILED
    assert "shard 1: no worker of the loadgen queue took it within 0 s" in run.error
    shard0, shard1 = RunShard.objects.filter(run=run).order_by("number")
    assert shard0.stop_reason.startswith("the run failed: shard 1")  # told to stop
    assert shard1.status == "failed" and "no worker" in shard1.error


def test_a_failed_shard_fails_the_run_naming_its_worker(coordinated):
    def script(run):
        check_in(run)
        yield
        RunShard.objects.filter(run=run, number=1).update(
            status="failed", error="LoadGenError: cannot reach a ready server"
        )
        while True:
            yield

    run = coordinated(script)
    assert run.status == OperationStatus.FAILED
    assert run.error == "shard 1 on w1@h (pid 101): LoadGenError: cannot reach a ready server"
    assert "the run failed" in RunShard.objects.get(run=run, number=0).stop_reason


def test_a_silent_shard_fails_the_run(coordinated, monkeypatch):
    monkeypatch.setattr(shards, "SILENCE_S", 0.0)

    def script(run):
        check_in(run)
        while True:
            yield  # nobody stamps a heartbeat again

    run = coordinated(script)
    assert run.status == OperationStatus.FAILED
    assert "no word from it for 0 s: its worker is gone" in run.error


def test_a_run_cancelled_before_the_start_is_cancelled_and_its_shards_told(coordinated):
    def script(run):
        BenchmarkRun.objects.filter(pk=run.pk).update(cancel_requested=True)
        while True:
            yield

    run = coordinated(script)
    assert run.status == OperationStatus.CANCELLED
    assert all(
        s.stop_reason == "the run was cancelled before the load started"
        for s in RunShard.objects.filter(run=run)
    )


def test_the_services_refuse_what_cannot_be_sharded(settings):
    deployment = make_deployment()
    rate = make_profile(spec=PROFILE)
    with pytest.raises(runs.RunRefused, match="1 to 16 load generators, not 17"):
        runs.start_benchmark(None, deployment, rate, shards=17)
    settings.EMBEDDED = True
    with pytest.raises(runs.RunRefused, match="loadgen queue .* embedded"):
        runs.start_benchmark(None, deployment, rate, shards=2)
    settings.EMBEDDED = False
    closed = make_profile(spec={"stages": [{"name": "c", "concurrency": 4, "num_requests": 9}]})
    with pytest.raises(runs.RunRefused, match="Stage\\(s\\) c run a fixed number of users"):
        runs.start_benchmark(None, deployment, closed, shards=2)
    assert not BenchmarkRun.objects.exists()
    run = runs.start_benchmark(None, deployment, rate, shards=2)
    assert run.shards == 2


# --- a real shard's side ---------------------------------------------------------------------
@pytest.mark.django_db(transaction=True)
def test_two_shards_send_the_one_schedule_and_merge(fixed_server, settings):  # noqa: F811
    """Each shard (run one after the other here: SQLite takes one writer) checks in, starts at
    the start time on its row, sends its share, and reports; the coordinator's merge has every
    request once."""
    settings.EMBEDDED = False
    server = fixed_server(ttft_ms=10, itl_ms=1)
    deployment = make_deployment(
        make_host(address="127.0.0.1"), port=server.port, model="fixed-latency"
    )
    profile = make_profile(
        spec=dict(
            PROFILE,
            warmup_requests=3,
            stages=[{"name": "a", "request_rate": 100, "num_requests": 40}],
        )
    )
    run = runs.start_benchmark(None, deployment, profile, shards=2, enqueue=False)
    run.transition_to(OperationStatus.RUNNING)
    rows = RunShard.objects.bulk_create([RunShard(run=run, number=n) for n in range(2)])
    for row in rows:
        RunShard.objects.filter(pk=row.pk).update(start_at=time.time() + 0.3)
        shard = RunShard.objects.select_related("run__deployment__host").get(pk=row.pk)
        shard_worker.execute_shard(shard, f"loadgen{row.number}@test")
    health = shards.shard_health(run)
    assert [h["status"] for h in health] == ["done", "done"], health
    assert [h["hostname"] for h in health] == ["loadgen0@test", "loadgen1@test"]
    assert {h["pid"] for h in health} == {os.getpid()}
    assert [h["sent"] for h in health] == [20, 20] and sum(h["done"] for h in health) == 40
    assert all(abs(h["offset_ms"]) < 50 and h["late_p99_ms"] is not None for h in health)
    assert RunShardChunk.objects.filter(shard__run=run, kind="tick").exists()
    spec = runs.run_spec(run, None)
    result = shards.Coordinator(run, spec, 60)._result(0.0)
    assert result.summary["completed"] == 40 and result.summary["warmup_requests"] == 3
    assert sorted(r["index"] for r in result.records) == list(range(40))
    # Records are on the shared start's clock: seconds, not 1.7e9. (The shards run one after
    # the other here, each from its own start: on a starved machine the second began 5 s on,
    # and a shard's estimate of the reference clock may put its first send a hair before 0.)
    times = [r["scheduled"] for r in result.records]
    assert -60 < min(times) and max(times) < 600, (min(times), max(times))


class FakeLoad:
    def __init__(self):
        self.calls = []

    def cancel(self, reason=None):
        self.calls.append(reason)


def test_a_shard_reads_its_start_and_stops_when_told(settings):
    settings.EMBEDDED = False
    run = runs.start_benchmark(
        None, make_deployment(), make_profile(spec=PROFILE), shards=3, enqueue=False
    )
    run.transition_to(OperationStatus.RUNNING)
    links = []
    for number in range(3):
        shard = RunShard.objects.create(run=run, number=number, status=READY)
        link = shard_worker.ShardLink(shard)
        link.load = FakeLoad()
        links.append(link)
    timed, cancelled, closed = links
    timed._handle("tick", tick(0, 5))
    timed._watch()
    assert timed.start_at is None and timed.load.calls == []
    assert shards.unpack(RunShardChunk.objects.get(kind="tick").data)["completed"] == 5
    RunShard.objects.filter(run=run).update(start_at=123.5)
    timed._watch()
    assert timed.start_at == 123.5 and RunShard.objects.get(number=0).status == "running"
    # The coordinator's reason (its time limit), passed on once.
    RunShard.objects.filter(number=0).update(stop_reason="stopped at the run's time limit")
    timed._watch()
    timed._watch()
    assert timed.load.calls == ["stopped at the run's time limit"]
    # A user's cancel: cancelled, keeping what was measured.
    BenchmarkRun.objects.filter(pk=run.pk).update(cancel_requested=True)
    cancelled._watch()
    assert cancelled.load.calls == [None]
    # The run closed under it (the stale sweep, a coordinator that failed).
    BenchmarkRun.objects.filter(pk=run.pk).update(status=OperationStatus.FAILED)
    closed._watch()
    assert closed.load.calls == ["the run was closed while it ran"]


def test_a_redelivered_or_late_shard_fails_instead_of_sending(settings):
    settings.EMBEDDED = False
    run = runs.start_benchmark(
        None, make_deployment(), make_profile(spec=PROFILE), shards=2, enqueue=False
    )
    run.transition_to(OperationStatus.RUNNING)
    started = RunShard.objects.create(run=run, number=0, status=READY)
    shard_worker.execute_shard(started, "w")
    started.refresh_from_db()
    assert started.status == "failed" and "its worker stopped during the shard" in started.error
    late = RunShard.objects.create(run=run, number=1, stop_reason="the run failed: x")
    shard_worker.execute_shard(late, "w")
    late.refresh_from_db()
    assert late.status == "failed" and "the run had ended" in late.error


def test_shards_that_never_get_ready_fail_the_run(coordinated, monkeypatch):
    def script(run):
        RunShard.objects.filter(run=run).update(
            status="starting", hostname="w@h", heartbeat_at=timezone.now()
        )
        monkeypatch.setattr(shards, "CHECK_IN_MARGIN_S", -1e6)  # its time is up
        while True:
            RunShard.objects.filter(run=run).update(heartbeat_at=timezone.now())
            yield

    run = coordinated(script)
    assert run.status == OperationStatus.FAILED
    assert "shard(s) [0, 1] were not ready within" in run.error
