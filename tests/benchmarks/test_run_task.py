"""The run's task and its worker-side bookkeeping: the progress bar and ETA of each point, the
per-run time limits the task is sent with, what the task records when it runs out of time or
breaks, GPU readings the run refreshes itself, and a replay profile end to end."""

from __future__ import annotations

from contextlib import nullcontext
from datetime import timedelta
from unittest import mock

import pytest
from celery.exceptions import SoftTimeLimitExceeded
from django.utils import timezone

from benchmarks import records, tasks
from benchmarks.models import BenchmarkRun, RunPoint, RunRequestLog
from benchmarks.services import runs as services
from benchmarks.services.points import STALE_READING_S, PointSink
from controlpanel.choices import OperationStatus
from hosts.models import Gpu
from tests.benchmarks.test_runs import engine, start
from tests.factories import make_deployment, make_gpu, make_host, make_profile, make_run
from tests.hosts.simulator.conftest import sim_server  # noqa: F401 - shared fixture

# 100 requests at 2 req/s: 100 planned requests over 50 planned seconds.
BOUNDED = {"stages": [{"name": "m", "request_rate": 2, "num_requests": 100}]}
# A closed loop: how long it takes cannot be known in advance.
UNBOUNDED = {"stages": [{"name": "m", "concurrency": 4, "num_requests": 100}]}


# --- progress and ETA ----------------------------------------------------------------------------


def progress(planned_requests, planned_duration_s, t, completed, failed=0):
    run = BenchmarkRun(planned_requests=planned_requests, planned_duration_s=planned_duration_s)
    sink = PointSink(run)
    return sink._progress({"t": t, "completed": completed, "failed": failed})


@pytest.mark.parametrize(
    ("requests", "seconds", "t", "completed", "failed", "expected"),
    [
        # Requests only: 25 of 100 done (failures count) after 10 s → 30 s to go.
        (100, None, 10.0, 20, 5, (0.25, 30.0)),
        # Duration only: 15 of 60 s → a quarter, 45 s to go.
        (None, 60.0, 15.0, 0, 0, (0.25, 45.0)),
        # Both: the bound hit first sets the pace (time: 10 of 40 s beats 10 of 100 requests).
        (100, 40.0, 10.0, 10, 0, (0.25, 30.0)),
        # Both, requests ahead: 40 of 50 after 20 s of 100 → 0.8, 20 × 0.2 / 0.8 = 5 s.
        (50, 100.0, 20.0, 40, 0, (0.8, 5.0)),
        # A third after 7 s: 14 s to go; the fraction is rounded to 4 places.
        (3, None, 7.0, 1, 0, (0.3333, 14.0)),
        # More than planned (retries, a slow last second): capped at done, nothing to go.
        (100, None, 30.0, 120, 0, (1.0, 0.0)),
        (None, 10.0, 12.5, 0, 0, (1.0, 0.0)),
        # Too little done to extrapolate from (≤ 1 %): progress but no ETA.
        (1000, None, 1.0, 5, 0, (0.005, None)),
        (1000, None, 2.0, 10, 0, (0.01, None)),
        # Nothing planned (closed loop bounded by count is planned; an unknown length is not).
        (None, None, 30.0, 50, 0, (0.0, None)),
        (0, 0.0, 30.0, 50, 0, (0.0, None)),
    ],
)
def test_progress_and_eta_from_the_plan(requests, seconds, t, completed, failed, expected):
    assert progress(requests, seconds, t, completed, failed) == expected


@pytest.mark.django_db
def test_a_stored_point_carries_its_progress_and_eta_and_moves_the_bar(monkeypatch):
    run = start(make_deployment(), make_profile(spec=BOUNDED))
    assert (run.planned_requests, run.planned_duration_s) == (100, 50.0)
    sink = PointSink(run)
    monkeypatch.setattr(sink, "_gpus", lambda: [])
    sink._store({"t": 10.0, "completed": 18, "failed": 2, "ttfts": []})
    point = RunPoint.objects.get(run=run, t=10.0).data
    # 20 of 100 requests and 10 of 50 s: a fifth, so 10 × 0.8 / 0.2 = 40 s to go.
    assert (point["progress"], point["eta_s"]) == (0.2, 40.0)
    run.refresh_from_db()
    assert run.progress == 0.2

    unplanned = start(make_deployment(), make_profile(spec=UNBOUNDED))
    unplanned.planned_requests = None  # as a run whose profile could say nothing
    sink = PointSink(unplanned)
    monkeypatch.setattr(sink, "_gpus", lambda: [])
    sink._store({"t": 5.0, "completed": 7, "failed": 0, "ttfts": []})
    point = RunPoint.objects.get(run=unplanned).data
    assert (point["progress"], point["eta_s"]) == (0.0, None)


# --- the task's time limits ----------------------------------------------------------------------


def sent_limits(deployment, profile, django_capture_on_commit_callbacks):
    with mock.patch("benchmarks.tasks.run_benchmark.apply_async") as apply_async:
        with django_capture_on_commit_callbacks(execute=True):
            run = start(deployment, profile)
            assert not apply_async.called  # not before the row is committed
    apply_async.assert_called_once()
    args, kwargs = apply_async.call_args
    assert args == ((run.pk,),)
    return kwargs


@pytest.mark.django_db
def test_the_task_is_sent_with_the_profiles_own_time_limits(
    settings, django_capture_on_commit_callbacks
):
    settings.BENCHMARK_MAX_SECONDS = 3600
    profile = make_profile(spec=BOUNDED)
    limit = services.time_limit_for(profile)
    assert limit == 50 * 3 + 300
    kwargs = sent_limits(make_deployment(), profile, django_capture_on_commit_callbacks)
    assert kwargs == {"soft_time_limit": limit + 60, "time_limit": limit + 120}
    assert kwargs == {"soft_time_limit": 510, "time_limit": 570}


@pytest.mark.django_db
def test_a_run_of_unknown_or_too_great_length_gets_the_cap(
    settings, django_capture_on_commit_callbacks
):
    settings.BENCHMARK_MAX_SECONDS = 3600
    kwargs = sent_limits(
        make_deployment(), make_profile(spec=UNBOUNDED), django_capture_on_commit_callbacks
    )
    assert kwargs == {"soft_time_limit": 3660, "time_limit": 3720}
    # Known but long: 10 000 requests at 1 req/s would be 30 300 s; the cap wins.
    huge = make_profile(spec={"stages": [{"name": "m", "request_rate": 1, "num_requests": 10000}]})
    kwargs = sent_limits(make_deployment(), huge, django_capture_on_commit_callbacks)
    assert kwargs == {"soft_time_limit": 3660, "time_limit": 3720}


@pytest.mark.django_db
def test_a_run_recorded_for_its_caller_sends_no_task(django_capture_on_commit_callbacks):
    with mock.patch("benchmarks.tasks.run_benchmark.apply_async") as apply_async:
        with django_capture_on_commit_callbacks(execute=True) as callbacks:
            services.start_benchmark(
                None, make_deployment(), make_profile(spec=BOUNDED), enqueue=False
            )
    assert callbacks == [] and not apply_async.called


# --- the task's failure paths --------------------------------------------------------------------


@pytest.fixture
def breaking(monkeypatch):
    """Make execute_run start the run (as it does) and then raise ``exc``."""

    def use(exc):
        def execute(run):
            run.transition_to(OperationStatus.RUNNING)
            raise exc

        monkeypatch.setattr(services, "execute_run", execute)

    return use


@pytest.mark.django_db
def test_a_run_past_its_soft_time_limit_is_failed_as_out_of_time(breaking):
    run = make_run()
    breaking(SoftTimeLimitExceeded())
    assert tasks.run_benchmark(run.pk) is None  # handled: the task itself ends cleanly
    run.refresh_from_db()
    assert run.status == "failed" and run.error == "the run ran out of time"
    assert "the run ran out of time" in run.log and run.finished_at is not None


@pytest.mark.django_db
def test_a_run_out_of_time_before_it_started_is_failed_too(monkeypatch):
    run = make_run()

    def execute(run):
        raise SoftTimeLimitExceeded()

    monkeypatch.setattr(services, "execute_run", execute)
    tasks.run_benchmark.run(run.pk)
    run.refresh_from_db()
    assert run.status == "failed" and run.error == "the run ran out of time"


@pytest.mark.django_db
def test_an_unexpected_error_is_recorded_by_type_and_re_raised(breaking):
    run = make_run()
    breaking(RuntimeError("the disk is full"))
    with pytest.raises(RuntimeError, match="the disk is full"):
        tasks.run_benchmark(run.pk)
    run.refresh_from_db()
    assert run.status == "failed" and run.error == "RuntimeError: the disk is full"
    assert "RuntimeError: the disk is full" in run.log


# --- GPU readings the run refreshes itself -------------------------------------------------------

READING = {
    "index": 0,
    "uuid": None,  # filled per test
    "name": "NVIDIA H100 80GB HBM3",
    "memory_total_bytes": 80 * 2**30,
    "memory_used_bytes": 61 * 2**30,
    "utilization_gpu_pct": 73,
    "power_w": 512.5,
    "sm_clock_mhz": 1755,
    "processes": [],
}


class FakeTransport:
    """Answers telemetry (and inventory) as a host agent would; counts the polls."""

    def __init__(self, gpus):
        self.gpus = gpus
        self.polls = 0

    def telemetry(self):
        self.polls += 1
        return {"gpus": [dict(g) for g in self.gpus], "host": {}, "engines": {}}

    def inventory(self):
        keys = ("index", "uuid", "name", "memory_total_bytes")
        return {"gpus": [{k: g[k] for k in keys} for g in self.gpus]}

    def close(self):
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def stale_gpu(host, **kw):
    gpu = make_gpu(host, **kw)
    gpu.last_sample = {"utilization_gpu_pct": 5, "memory_used_bytes": 2**30, "power_w": 90}
    gpu.last_sample_at = timezone.now() - timedelta(seconds=STALE_READING_S + 30)
    gpu.save()
    return gpu


@pytest.fixture
def agent(monkeypatch):
    def use(gpus):
        transport = FakeTransport(gpus)
        monkeypatch.setattr(
            "hosts.services.telemetry.poll_transport", lambda host: nullcontext(transport)
        )
        monkeypatch.setattr("hosts.services.telemetry.transport_for", lambda host: transport)
        return transport

    return use


@pytest.mark.django_db
def test_a_stale_gpu_reading_is_refreshed_by_the_run_and_stored_with_the_point(agent):
    host = make_host()
    gpu = stale_gpu(host)
    transport = agent([dict(READING, uuid=gpu.uuid)])
    run = make_run(make_deployment(host), status="running", started_at=timezone.now())
    sink = PointSink(run)

    sink._store({"t": 1.0, "completed": 3, "failed": 0, "ttfts": []})

    assert transport.polls == 1
    gpus = RunPoint.objects.get(run=run, t=1.0).data["gpus"]
    assert gpus == [
        {
            "index": 0,
            "utilization_pct": 73,
            "memory_used_gib": 61.0,
            "power_w": 512.5,
            "sm_clock_mhz": 1755,
        }
    ]
    gpu.refresh_from_db()
    assert gpu.last_sample["utilization_gpu_pct"] == 73
    # The next second finds the reading fresh: no second poll, the same values.
    sink._store({"t": 2.0, "completed": 5, "failed": 0, "ttfts": []})
    assert transport.polls == 1
    assert RunPoint.objects.get(run=run, t=2.0).data["gpus"] == gpus


@pytest.mark.django_db
def test_a_stale_reading_the_host_cannot_refresh_is_left_out(agent):
    host = make_host()
    old = stale_gpu(host)
    old.last_sample_at = timezone.now() - timedelta(seconds=60)  # past the 10 s it may be shown
    old.save()
    transport = agent([])  # the host answers, but with no GPU readings
    run = make_run(make_deployment(host), status="running", started_at=timezone.now())
    PointSink(run)._store({"t": 1.0, "completed": 0, "failed": 0, "ttfts": []})
    assert transport.polls == 1
    assert RunPoint.objects.get(run=run).data["gpus"] == []  # never an old reading as new


@pytest.mark.django_db
def test_the_deployments_own_gpus_are_the_ones_read(agent):
    host = make_host()
    other = stale_gpu(host, index=0)
    mine = stale_gpu(host, index=1)
    agent(
        [
            dict(READING, index=0, uuid=other.uuid, utilization_gpu_pct=1),
            dict(READING, index=1, uuid=mine.uuid, utilization_gpu_pct=99),
        ]
    )
    deployment = make_deployment(host)
    deployment.gpus.set([mine])
    run = make_run(deployment, status="running", started_at=timezone.now())
    PointSink(run)._store({"t": 1.0, "completed": 0, "failed": 0, "ttfts": []})
    gpus = RunPoint.objects.get(run=run).data["gpus"]
    assert [(g["index"], g["utilization_pct"]) for g in gpus] == [(1, 99)]


@pytest.mark.django_db
def test_a_host_whose_gpus_are_not_known_yet_gets_them_on_the_first_point(agent):
    host = make_host()
    assert not Gpu.objects.filter(host=host).exists()
    agent([dict(READING, uuid="GPU-learned-0")])
    run = make_run(make_deployment(host), status="running", started_at=timezone.now())
    PointSink(run)._store({"t": 1.0, "completed": 0, "failed": 0, "ttfts": []})
    assert Gpu.objects.filter(host=host, uuid="GPU-learned-0").exists()  # inventory learned
    gpus = RunPoint.objects.get(run=run).data["gpus"]
    assert [(g["index"], g["utilization_pct"]) for g in gpus] == [(0, 73)]


# --- a replay profile end to end -----------------------------------------------------------------

ROWS = [
    [0.0, 96, 16, None],
    [0.2, 128, 24, None],
    [0.4, 64, 8, None],
    [0.6, 200, 20, None],
    [0.8, 128, 12, None],
    [1.0, 96, 16, None],
    [1.4, 160, 10, None],
]


@pytest.mark.django_db(transaction=True)
def test_a_replay_profile_runs_every_row_against_the_simulator(sim_server):  # noqa: F811
    server = sim_server("vllm", "--gpu", "h100-sxm", "--time-scale", "0.2")
    deployment = engine(server)
    spec = {
        "replay": {"rows": ROWS, "time_scale": 0.5},
        "warmup_requests": 3,
        "slo": {"ttft": 5000},
    }
    run = start(deployment, make_profile(spec=spec))
    assert run.planned_requests == len(ROWS)
    assert run.planned_duration_s == pytest.approx(1.4 * 0.5)

    services.execute_run(BenchmarkRun.objects.get(pk=run.pk))

    run.refresh_from_db()
    assert run.status == "succeeded", (run.error, run.log)
    # The warm-up requests come on top of the trace (made from the dataset, not from its
    # rows) and are left out of the results: every row is measured once.
    assert (run.completed, run.failed) == (len(ROWS), 0)
    assert run.summary["warmup_requests"] == 3
    assert run.output_tokens_total == sum(row[2] for row in ROWS)  # ignore_eos
    assert set(run.stages) == {"trace"}
    assert run.progress == 1.0
    assert run.environment["spec"]["trace"]["time_scale"] == 0.5
    log = RunRequestLog.objects.get(run=run)
    assert log.count == len(ROWS) and len(records.decode(bytes(log.data))) == len(ROWS)
    points = list(RunPoint.objects.filter(run=run).order_by("t"))
    assert points and points[-1].data["completed"] == len(ROWS)
