"""Running a benchmark: start → worker → load generator against a real simulated engine →
results, timeline, request log and environment on the run; cancel; refusals; the run page,
its timeline backfill and its socket."""

from __future__ import annotations

import asyncio
import threading
import time
from datetime import timedelta
from decimal import Decimal

import pytest
from channels.routing import URLRouter
from channels.testing import WebsocketCommunicator
from django.contrib.auth.models import AnonymousUser
from django.urls import reverse
from django.utils import timezone

from benchmarks import records, tasks
from benchmarks.evidence import usable_as_evidence
from benchmarks.loadgen.profile import build_spec
from benchmarks.models import BenchmarkRun, RunPoint, RunRequestLog
from benchmarks.services import runs as services
from benchmarks.services.environment import environment
from controlpanel.models import AuditEntry
from controlpanel.realtime import group_name, publish
from home.routing import websocket_urlpatterns
from hosts.models import EngineOperation
from tests.factories import (
    make_config,
    make_deployment,
    make_gpu,
    make_host,
    make_profile,
    make_run,
)
from tests.hosts.simulator.conftest import sim_server  # noqa: F401 - shared fixture

SMALL = {
    "stages": [
        {"name": "low", "concurrency": 2, "num_requests": 10},
        {"name": "high", "concurrency": 8, "num_requests": 30},
    ],
    "input_len": {"kind": "fixed", "mean": 128},
    "output_len": {"kind": "fixed", "mean": 24},
    "warmup_requests": 3,
    "slo": {"ttft": 5000},
}


def engine(server, **host_kw):
    """Host + deployment pointing at a running simulator, with a fresh GPU reading."""
    host = make_host(hourly_price=Decimal("3.60"), **host_kw)
    gpu = make_gpu(host)
    gpu.last_sample = {"utilization_gpu_pct": 87, "memory_used_bytes": 70 * 2**30, "power_w": 650}
    gpu.last_sample_at = timezone.now() + timedelta(minutes=5)  # stays fresh for the test
    gpu.save()
    deployment = make_deployment(host, port=server.port, engine_version="0.11.0")
    config = make_config(deployment, {"max_num_seqs": 64})
    deployment.active_config = config
    deployment.save()
    return deployment


def start(deployment, profile, user=None):
    return services.start_benchmark(user, deployment, profile, label="t")


@pytest.mark.django_db(transaction=True)
# ITL p50 > 0 needs a client quick enough to see the tokens apart: a starved loop reads them
# coalesced (ITL 0.0).
@pytest.mark.timing
def test_a_run_against_the_simulator_records_everything(sim_server, operator):  # noqa: F811
    server = sim_server("vllm", "--gpu", "h100-sxm", "--time-scale", "0.2")
    deployment = engine(server)
    run = start(deployment, make_profile(spec=SMALL), operator)
    assert run.status == "queued" and run.planned_requests == 40

    services.execute_run(BenchmarkRun.objects.get(pk=run.pk))

    run.refresh_from_db()
    assert run.status == "succeeded", (run.error, run.log)
    assert (run.completed, run.failed) == (40, 0)  # warm-up left out
    assert run.ttft_p50_ms <= run.ttft_p95_ms <= run.ttft_p99_ms
    assert run.output_tokens_per_s > 0
    # Never ITL 0.0 accepted: a starved client's coalesced chunks make the run client-limited
    # (benchmarks.evidence), a client that kept up measures the gaps.
    evidence = usable_as_evidence(run)
    assert run.itl_p50_ms > 0 or evidence.limited, (run.itl_p50_ms, run.client_health)
    assert run.client_health["loop_lag_ms"]["samples"] > 0
    assert run.client_health["engine"]["ttft_mean_ms"] > 0  # the engine's own view
    assert run.output_tokens_total == 40 * 24  # ignore_eos: every answer is full length
    assert run.goodput_share == 1.0 and run.goodput_rps == pytest.approx(run.request_throughput)
    assert run.progress == 1.0
    assert set(run.stages) == {"low", "high"}
    assert run.server["available"] is True and "timeline" not in run.server
    # Reproducibility: what ran, on what, measured by what.
    env = run.environment
    assert env["config"]["version"] == 1 and env["config"]["settings"] == {"max_num_seqs": 64}
    assert env["engine"]["reported"]["version"]  # the simulator's /version
    assert env["profile"]["version"] == 1 and env["spec"]["base_url"] == deployment.engine_url
    assert run.engine_config == deployment.active_config and run.loadgen_version
    assert run.gpu_model == "NVIDIA H100 80GB HBM3" and run.gpu_count == 1
    # Cost at the measured throughput: 3.60/h over tokens per hour.
    expected = 3.60 / (run.output_tokens_per_s * 3600) * 1e6
    assert run.cost_per_million_output == pytest.approx(expected)
    assert run.hourly_price == Decimal("3.60")
    # The timeline: one point a second with GPU readings and progress; the request log.
    points = list(RunPoint.objects.filter(run=run).order_by("t"))
    assert points and points[-1].data["completed"] == 40
    assert all(p.data["gpus"][0]["utilization_pct"] == 87 for p in points)
    assert [p.t for p in points] == sorted(p.t for p in points)
    assert sum(len(p.data["ttfts"]) for p in points) == 40
    log = RunRequestLog.objects.get(run=run)
    assert log.count == 40 and len(records.decode(bytes(log.data))) == 40
    assert run.distributions["ttft_ms"] and len(run.distributions["q"]) == len(records.QUANTILES)
    assert AuditEntry.objects.filter(action="benchmark.start", object_id=str(run.pk)).exists()


@pytest.mark.django_db(transaction=True)
def test_cancelling_a_running_run_keeps_what_it_measured(sim_server, operator):  # noqa: F811
    server = sim_server("vllm", "--gpu", "h100-sxm", "--time-scale", "0.2")
    deployment = engine(server)
    long = dict(SMALL, stages=[{"name": "main", "concurrency": 4, "num_requests": 100000}])
    run = start(deployment, make_profile(spec=long), operator)
    worker = threading.Thread(
        target=services.execute_run, args=(BenchmarkRun.objects.get(pk=run.pk),)
    )
    worker.start()
    deadline = time.monotonic() + 30
    while not RunPoint.objects.filter(run=run, data__completed__gte=1).exists():
        assert time.monotonic() < deadline, "no progress point arrived"
        time.sleep(0.2)
    services.cancel_benchmark(operator, run)
    worker.join(timeout=30)
    assert not worker.is_alive()
    run.refresh_from_db()
    assert run.status == "cancelled" and run.error == "cancelled while running"
    assert run.completed >= 1 and run.completed < 100000
    assert 0 < run.progress < 1


@pytest.mark.django_db(transaction=True)
def test_an_unreachable_engine_fails_the_run_with_the_reason(settings, listener):
    settings.BENCHMARK_READY_TIMEOUT = 0.5
    host = make_host()
    deployment = make_deployment(host, port=1)  # nothing listens on port 1
    run = start(deployment, make_profile(spec=SMALL))
    services.execute_run(BenchmarkRun.objects.get(pk=run.pk))
    run.refresh_from_db()
    assert run.status == "failed"
    assert "cannot reach a ready server at http://127.0.0.1:1" in run.error
    assert run.completed is None


@pytest.mark.django_db
def test_one_run_per_deployment_and_none_during_an_operation(django_capture_on_commit_callbacks):
    deployment = make_deployment()
    profile = make_profile(spec=SMALL)
    with django_capture_on_commit_callbacks() as callbacks:
        first = start(deployment, profile)
    assert len(callbacks) == 1  # the task is sent once the row is committed
    with pytest.raises(services.RunRefused, match="one benchmark at a time"):
        start(deployment, profile)
    services.cancel_benchmark(None, first)
    config = make_config(deployment)
    EngineOperation.objects.create(deployment=deployment, kind="apply", config=config)
    with pytest.raises(services.RunRefused, match="once the engine has settled"):
        start(deployment, profile)


@pytest.mark.django_db
def test_a_queued_run_is_cancelled_at_once_and_its_task_does_nothing(operator):
    run = start(make_deployment(), make_profile(spec=SMALL))
    services.cancel_benchmark(operator, run)
    run.refresh_from_db()
    assert run.status == "cancelled" and run.started_at is None
    tasks.run_benchmark(run.pk)  # the message still arrives
    run.refresh_from_db()
    assert run.status == "cancelled" and run.log == ""
    with pytest.raises(services.RunRefused, match="nothing to cancel"):
        services.cancel_benchmark(operator, run)


@pytest.mark.django_db
def test_a_redelivered_run_whose_worker_died_is_closed_as_failed():
    run = make_run(status="running", started_at=timezone.now())
    tasks.run_benchmark(run.pk)
    run.refresh_from_db()
    assert run.status == "failed" and "worker stopped during the run" in run.error


def test_time_limit_follows_the_profile(settings):
    settings.BENCHMARK_MAX_SECONDS = 3600
    profile = type("P", (), {})()
    profile.spec = {"stages": [{"name": "m", "request_rate": 2, "num_requests": 100}]}
    assert services.time_limit_for(profile) == 50 * 3 + 300
    profile.spec = {"stages": [{"name": "m", "concurrency": 4, "num_requests": 100}]}
    assert services.time_limit_for(profile) == 3600  # unknown length: the cap


@pytest.mark.django_db
def test_run_page_embeds_points_and_backfill_returns_the_missed_ones(client, viewer):
    run = make_run(status="running", started_at=timezone.now())
    for t in (1.0, 2.0, 3.0):
        RunPoint.objects.create(run=run, t=t, data={"t": t, "completed": int(t), "ttfts": []})
    client.force_login(viewer)
    page = client.get(run.get_absolute_url())
    assert page.status_code == 200
    assert len(page.context["points"]) == 3
    assert f'data-live-socket="/ws/benchmarks/{run.pk}/"' in page.content.decode()
    missed = client.get(reverse("benchmarks:timeline", args=[run.pk]), {"since": "1.0"}).json()
    assert [p["t"] for p in missed["points"]] == [2.0, 3.0]
    assert (
        client.get(reverse("benchmarks:timeline", args=[run.pk]), {"since": "x"}).status_code == 400
    )
    assert client.get(reverse("benchmarks:part", args=[run.pk, "results"])).status_code == 200
    assert client.get(reverse("benchmarks:part", args=[run.pk, "nope"])).status_code == 404


@pytest.mark.django_db
def test_launch_form_starts_a_run_and_cancel_needs_the_operator_role(client, viewer, operator):
    deployment = make_deployment()
    profile = make_profile(spec=SMALL)
    client.force_login(viewer)
    assert client.get(reverse("benchmarks:new")).status_code == 403
    client.force_login(operator)
    page = client.get(reverse("benchmarks:new"), {"profile": profile.pk})
    assert page.status_code == 200 and page.context["form"].initial["load_profile"] == profile
    response = client.post(
        reverse("benchmarks:new"),
        {"deployment": deployment.pk, "load_profile": profile.pk, "label": "baseline"},
    )
    run = BenchmarkRun.objects.get(label="baseline")
    assert response.status_code == 302 and response.url == run.get_absolute_url()
    assert run.requested_by == operator and run.load_profile == profile
    again = client.post(
        reverse("benchmarks:new"), {"deployment": deployment.pk, "load_profile": profile.pk}
    )
    assert "one benchmark at a time" in again.content.decode()
    client.force_login(viewer)
    assert client.post(reverse("benchmarks:cancel", args=[run.pk])).status_code == 403
    client.force_login(operator)
    client.post(reverse("benchmarks:cancel", args=[run.pk]))
    run.refresh_from_db()
    assert run.status == "cancelled"


@pytest.mark.django_db(transaction=True)
def test_the_run_socket_streams_points_to_viewers_only(viewer, nobody):
    run = make_run()
    other = make_run()
    app = URLRouter(websocket_urlpatterns)

    async def connect(user, pk):
        communicator = WebsocketCommunicator(app, f"/ws/benchmarks/{pk}/")
        communicator.scope["user"] = user
        connected, code = await communicator.connect()
        return communicator, connected, code

    async def scenario():
        for user in (AnonymousUser(), nobody):
            communicator, connected, code = await connect(user, run.pk)
            assert not connected and code == 4403
            await communicator.disconnect()
        watchers = [await connect(viewer, run.pk) for _ in range(2)]  # two browsers, one run
        elsewhere, _, _ = await connect(viewer, other.pk)
        assert all(connected for _, connected, _ in watchers)
        worker = threading.Thread(
            target=publish, args=(group_name("run", run.pk), "run.point", {"t": 1.0})
        )
        await asyncio.get_running_loop().run_in_executor(
            None, lambda: (worker.start(), worker.join())
        )
        for communicator, _, _ in watchers:
            message = await communicator.receive_json_from(timeout=5)
            assert message == {"event": "run.point", "data": {"t": 1.0}}
            await communicator.disconnect()
        assert await elsewhere.receive_nothing(timeout=0.3)
        await elsewhere.disconnect()

    asyncio.run(scenario())


@pytest.mark.django_db(transaction=True)
def test_a_run_past_its_time_limit_stops_early_and_keeps_its_results(
    sim_server,  # noqa: F811
    settings,
):
    settings.BENCHMARK_MAX_SECONDS = 2  # the profile cannot say how long it runs: the cap
    server = sim_server("vllm", "--gpu", "h100-sxm", "--time-scale", "0.2")
    deployment = engine(server)
    endless = dict(SMALL, stages=[{"name": "main", "concurrency": 2, "num_requests": 100000}])
    run = start(deployment, make_profile(spec=endless))
    started = time.monotonic()
    services.execute_run(BenchmarkRun.objects.get(pk=run.pk))
    assert time.monotonic() - started < 20
    run.refresh_from_db()
    assert run.status == "succeeded" and run.stopped_early == "stopped at the run's time limit"
    assert run.completed >= 1


@pytest.mark.django_db
def test_the_run_record_keeps_no_api_key():
    host = make_host()
    gpu = make_gpu(host)
    deployment = make_deployment(host)
    config = make_config(
        deployment, {"max_num_seqs": 8, "api_key": "sk-live"}, env={"VLLM_API_KEY": "sk-env"}
    )
    deployment.active_config = config
    deployment.save()
    run = start(deployment, make_profile(spec=SMALL))
    spec = build_spec(run.load_profile.spec, deployment.engine_url, deployment.model, api_key="k")
    env = environment(run, spec)
    assert env["config"]["settings"] == {"max_num_seqs": 8, "api_key": "•••"}
    assert env["config"]["env"] == {"VLLM_API_KEY": "•••"}
    assert "sk-" not in str(env) and "api_key" not in env["spec"]
    assert env["gpus"][0]["uuid"] == gpu.uuid


@pytest.mark.django_db
def test_a_profile_that_cannot_run_is_refused_with_the_reason():
    broken = make_profile(spec=SMALL)
    type(broken).objects.filter(pk=broken.pk).update(spec={"stages": [{"concurency": 4}]})
    broken.refresh_from_db()
    with pytest.raises(services.RunRefused, match="unknown field"):
        start(make_deployment(), broken)
    assert not BenchmarkRun.objects.exists()


# --- runs whose worker is gone ------------------------------------------------------------------


@pytest.fixture
def published(monkeypatch):
    sent = []
    monkeypatch.setattr(
        services, "publish", lambda group, event, data: sent.append((group, event, data))
    )
    return sent


@pytest.mark.django_db
def test_a_running_run_that_stopped_writing_points_is_failed(settings, published):
    settings.BENCHMARK_STALE_SECONDS = 300
    settings.BENCHMARK_READY_TIMEOUT = 60
    now = timezone.now()
    # Grace 300 s + readiness 60 s + setup 60 s = 420 s after started_at + t of the last point.
    gone = make_run(status="running", started_at=now - timedelta(hours=1))
    RunPoint.objects.create(run=gone, t=3000.0, data={"t": 3000.0})  # 600 s ago
    alive = make_run(status="running", started_at=now - timedelta(hours=1))
    RunPoint.objects.create(run=alive, t=3300.0, data={"t": 3300.0})  # 300 s ago: within
    never = make_run(status="running", started_at=now - timedelta(seconds=421))
    waiting = make_run(status="running", started_at=now - timedelta(seconds=419))

    failed = services.fail_stale_runs(now=now)

    assert {run.pk for run in failed} == {gone.pk, never.pk}
    for run in (gone, never, alive, waiting):
        run.refresh_from_db()
    assert gone.status == "failed" and "no word from its worker for over 300 s" in gone.error
    assert "its last point was at 3000 s" in gone.error and gone.error in gone.log
    assert never.status == "failed" and "it wrote no point" in never.error
    assert alive.status == "running" and waiting.status == "running"
    statuses = [data for group, event, data in published if event == "run.status"]
    assert {d["colour"] for d in statuses} == {"red"}
    assert {(d["id"], d["status"], d["finished"]) for d in statuses} == {
        (gone.pk, "failed", True),
        (never.pk, "failed", True),
    }
    assert all(d["error"] for d in statuses)


@pytest.mark.django_db
def test_a_queued_run_no_worker_took_within_its_time_limit_is_failed(settings, published):
    settings.BENCHMARK_MAX_SECONDS = 3600
    now = timezone.now()
    # 100 requests at 2 req/s: 50 s planned, so a time limit of 50 × 3 + 300 = 450 s.
    bounded = make_profile(spec={"stages": [{"name": "m", "request_rate": 2, "num_requests": 100}]})
    lost = make_run(load_profile=bounded, created_at=now - timedelta(seconds=451))
    recent = make_run(load_profile=bounded, created_at=now - timedelta(seconds=449))
    unbounded = make_run(created_at=now - timedelta(seconds=3000))  # closed loop: the cap

    failed = services.fail_stale_runs(now=now)

    assert [run.pk for run in failed] == [lost.pk]
    lost.refresh_from_db()
    assert lost.status == "failed"
    assert lost.error == "no worker started it within its time limit (450 s); it was never run"
    assert published[-1][1] == "run.status" and published[-1][2]["status"] == "failed"
    for run in (recent, unbounded):
        run.refresh_from_db()
        assert run.status == "queued"
    tasks.run_benchmark(lost.pk)  # a late delivery finds it closed and does nothing
    lost.refresh_from_db()
    assert lost.status == "failed"


@pytest.mark.django_db
def test_the_sweep_is_a_task_beat_runs_every_minute(settings):
    from controlpanel.celery import app

    settings.BENCHMARK_STALE_SECONDS = 300
    make_run(status="running", started_at=timezone.now() - timedelta(hours=2))
    make_run(status="succeeded", started_at=timezone.now() - timedelta(hours=2))
    from controlpanel import tasks as project_tasks

    # The one lost-work sweep (controlpanel.lostwork) runs this pass with the others.
    assert project_tasks.sweep_lost_work()["benchmarks_failed"] == 1
    assert tasks.fail_stale_runs() == 0
    entry = app.conf.beat_schedule["sweep-lost-work"]
    assert entry["task"] == "controlpanel.tasks.sweep_lost_work" and entry["schedule"] == 60.0


@pytest.mark.django_db(transaction=True)
def test_a_worker_whose_run_was_swept_stops_and_keeps_the_verdict(sim_server):  # noqa: F811
    server = sim_server("vllm", "--gpu", "h100-sxm", "--time-scale", "0.2")
    deployment = engine(server)
    long = dict(SMALL, stages=[{"name": "main", "concurrency": 4, "num_requests": 100000}])
    run = start(deployment, make_profile(spec=long))
    outcome = []
    worker = threading.Thread(
        target=lambda: outcome.append(
            services.execute_run(BenchmarkRun.objects.get(pk=run.pk)).status
        )
    )
    worker.start()
    deadline = time.monotonic() + 30
    while not RunPoint.objects.filter(run=run, data__completed__gte=1).exists():
        assert time.monotonic() < deadline, "no progress point arrived"
        time.sleep(0.2)
    services.fail_run(run, "swept")  # what the sweep does to a run it believes lost
    worker.join(timeout=30)
    assert not worker.is_alive() and outcome == ["failed"]
    run.refresh_from_db()
    assert run.status == "failed" and run.error == "swept" and run.completed is None


@pytest.mark.django_db
def test_the_run_record_names_the_hosts_library_versions():
    libraries = {"vllm": "0.11.0", "torch": "2.8.0+cu128", "nvidia-nccl-cu12": "2.27.3"}
    host = make_host(libraries=libraries, driver_version="570.124.06", cuda_version="12.8")
    make_gpu(host)
    deployment = make_deployment(host)
    run = start(deployment, make_profile(spec=SMALL))
    spec = build_spec(run.load_profile.spec, deployment.engine_url, deployment.model)
    env = environment(run, spec)
    assert env["host"]["libraries"] == libraries
    assert (env["host"]["driver_version"], env["host"]["cuda_version"]) == ("570.124.06", "12.8")
    # A host that reported none (an SSH host without python, an older agent): recorded empty.
    bare = start(make_deployment(), make_profile(spec=SMALL))
    assert environment(bare, spec)["host"]["libraries"] == {}
