"""Issue 14 item 10: a run whose error rate passes its limit is not a measurement of a working
engine. It stops early, ends failed with the engine's state as its reason, and is never used
for a verdict (``benchmarks.services.results.error_threshold_problem``)."""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest
from django.urls import reverse
from django.utils import timezone

from benchmarks.evidence import usable_as_evidence
from benchmarks.models import BenchmarkRun
from benchmarks.services import runs
from benchmarks.services.points import PointSink
from benchmarks.services.results import (
    error_rate_limit,
    error_rate_problem,
    error_threshold_problem,
)
from tests.benchmarks.loadgen.conftest import FixedServer
from tests.factories import (
    make_config,
    make_deployment,
    make_finished_run,
    make_gpu,
    make_host,
    make_profile,
)
from tests.hosts.simulator.conftest import sim_server  # noqa: F401 - shared fixture

pytestmark = pytest.mark.django_db
PLANNED = 100_000


@pytest.fixture
def test_server():
    """The load generator's test server (benchmarks/loadgen/testserver.py) as an engine."""
    servers = []

    def start(*args: str) -> FixedServer:
        servers.append(FixedServer("--ttft-ms", "2", "--itl-ms", "1", *args))
        return servers[-1]

    yield start
    for server in servers:
        server.stop()


def deployment_at(port: int, model: str):
    """A deployment whose engine listens on ``port``, with a GPU reading that stays fresh
    (the run polls no agent)."""
    host = make_host()
    gpu = make_gpu(host)
    gpu.last_sample, gpu.last_sample_at = (
        {"utilization_gpu_pct": 50},
        timezone.now() + timedelta(minutes=5),
    )
    gpu.save()
    deployment = make_deployment(host, port=port, model=model)
    deployment.active_config = make_config(deployment)
    deployment.save()
    return deployment


def profile(requests: int, **extra):
    return make_profile(
        spec={
            "stages": [{"name": "main", "concurrency": 4, "num_requests": requests}],
            "input_len": {"kind": "fixed", "mean": 16},
            "output_len": {"kind": "fixed", "mean": 8},
            "warmup_requests": 0,
            **extra,
        }
    )


def execute(run: BenchmarkRun) -> BenchmarkRun:
    runs.execute_run(BenchmarkRun.objects.get(pk=run.pk))
    run.refresh_from_db()
    return run


@pytest.fixture
def window(settings):
    settings.BENCHMARK_MAX_ERROR_RATE = 0.5
    settings.BENCHMARK_ERROR_WINDOW = 20
    settings.BENCHMARK_NO_SUCCESS_REQUESTS = 10
    return settings


@pytest.mark.django_db(transaction=True)
def test_a_run_whose_engine_is_killed_stops_early_and_fails_naming_it_unreachable(
    sim_server,  # noqa: F811
    window,
    operator,
    client,
):
    server = sim_server("vllm", "--gpu", "h100-sxm", "--time-scale", "0.05")
    deployment = deployment_at(server.port, server.model)
    run = runs.start_benchmark(operator, deployment, profile(PLANNED), label="killed")
    assert run.error_rate_limit == 0.5
    killed = threading.Event()
    put = PointSink.put

    def kill_once_it_measures(sink, point):
        # The engine dies once the run has measured it working: mid-run on any machine.
        if point["completed"] >= 3 and not killed.is_set():
            server.proc.kill()
            killed.set()
        put(sink, point)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(PointSink, "put", kill_once_it_measures)
        run = execute(run)

    assert killed.is_set()
    assert run.status == "failed", (run.status, run.error)
    # It measured the engine working, then stopped within a window of failures: not the
    # 212,429 failures of the issue, nor the 100,000 requests it planned.
    assert run.completed >= 3 and run.failed < 50
    assert run.completed + run.failed < PLANNED // 10
    reason = run.error
    assert reason.startswith("stopped early: error rate "), reason
    assert "above the limit of 50%" in reason
    assert f"engine unreachable at {deployment.engine_url}/v1/completions" in reason
    assert run.stopped_early and run.stopped_early in reason
    assert error_threshold_problem(run) == f"#{run.pk} killed is failed: {reason}"
    client.force_login(operator)
    page = client.get(reverse("benchmarks:detail", args=[run.pk])).content.decode()
    assert "engine unreachable at" in page and "Failed" in page


@pytest.mark.django_db(transaction=True)
def test_an_engine_answering_only_errors_fails_the_run_after_the_first_requests(
    test_server, window, operator
):
    server = test_server("--mode", "error_500")
    deployment = deployment_at(server.port, "fixed-latency")
    run = execute(runs.start_benchmark(operator, deployment, profile(PLANNED)))
    assert run.status == "failed" and run.completed == 0 and 10 <= run.failed < 20
    assert run.error.startswith("stopped early: none of the first 10 requests succeeded; ")
    assert "engine answered HTTP 500 for 100% of 10 requests" in run.error
    assert "failures" not in run.summary and "stopped_on_errors" not in run.summary


@pytest.mark.django_db(transaction=True)
def test_a_profiles_own_limit_stops_a_run_the_default_would_let_finish(
    test_server, window, operator
):
    # Every fourth request fails (25 %): under the default 50 %, over this profile's 10 %.
    server = test_server("--error-every", "4")
    deployment = deployment_at(server.port, "fixed-latency")
    strict = profile(PLANNED, max_error_rate=0.1)
    run = execute(runs.start_benchmark(operator, deployment, strict))
    assert run.error_rate_limit == 0.1
    assert run.status == "failed" and run.completed + run.failed < 200
    assert "above the limit of 10%" in run.error and "HTTP 500" in run.error


@pytest.mark.django_db(transaction=True)
def test_a_run_that_ends_above_its_limit_without_being_stopped_is_not_succeeded(
    test_server, window, operator
):
    # 30 requests, every third failing: 33 %, fewer than the window, so nothing stops it;
    # at its end it is judged against the profile's 20 %.
    window.BENCHMARK_ERROR_WINDOW = 50
    server = test_server("--error-every", "3")
    deployment = deployment_at(server.port, "fixed-latency")
    run = execute(runs.start_benchmark(operator, deployment, profile(30, max_error_rate=0.2)))
    assert (run.completed, run.failed) == (20, 10) and not run.stopped_early
    assert run.status == "failed"
    assert run.error == (
        f"#{run.pk} failed 33.3% of its requests (10 of 30), above its limit of 20%; "
        'engine answered HTTP 500 for 33% of 30 requests: {"error": {"message": "injected"}}'
    )


@pytest.mark.django_db(transaction=True)
def test_a_run_within_its_limit_succeeds(test_server, window, operator):
    server = test_server("--error-every", "5")
    deployment = deployment_at(server.port, "fixed-latency")
    run = execute(runs.start_benchmark(operator, deployment, profile(40)))
    assert (run.completed, run.failed) == (32, 8) and run.status == "succeeded"
    assert error_rate_problem(run) is None
    # Whether it is evidence also asks whether its client kept up with the server's 1 ms token
    # gaps (benchmarks.evidence), which a busy machine may not: then it says client-limited.
    if not usable_as_evidence(run).limited:
        assert error_threshold_problem(run) is None


def test_a_succeeded_run_within_its_limit_is_usable_for_a_verdict():
    run = make_finished_run(completed=90, failed=10, error_rate=0.1, error_rate_limit=0.5)
    assert error_threshold_problem(run) is None


def test_a_failed_run_is_never_used_for_a_verdict_and_the_reason_says_why():
    run = make_finished_run(
        status="failed", error="engine unreachable: connection refused at http://x:1"
    )
    problem = error_threshold_problem(run)
    assert problem and "failed" in problem and "connection refused" in problem


@pytest.mark.parametrize("status", ["cancelled", "running", "queued"])
def test_a_run_that_did_not_succeed_is_never_used_for_a_verdict(status):
    assert error_threshold_problem(make_finished_run(status=status)) is not None


def test_a_succeeded_run_above_its_recorded_limit_is_refused_naming_the_numbers():
    # A run recorded before the rule (or imported) can say "succeeded" with most requests
    # failed: the 3,157 of 3,589 of the issue.
    run = make_finished_run(
        completed=432, failed=3157, error_rate=3157 / 3589, error_rate_limit=0.5
    )
    problem = error_threshold_problem(run)
    assert (
        problem == f"#{run.pk} failed 88.0% of its requests (3157 of 3589), above its limit of 50%"
    )


def test_an_imported_run_is_judged_by_its_profiles_limit_else_the_panels_default(settings):
    settings.BENCHMARK_MAX_ERROR_RATE = 0.5
    strict = make_profile(spec={"max_error_rate": 0.05})
    run = make_finished_run(load_profile=strict, completed=90, failed=10, error_rate=0.1)
    assert error_rate_limit(run) == 0.05
    assert "above its limit of 5%" in error_threshold_problem(run)
    default = make_finished_run(completed=90, failed=10, error_rate=0.1)
    assert error_rate_limit(default) == 0.5 and error_threshold_problem(default) is None


def test_a_run_that_measured_no_request_is_not_usable():
    run = make_finished_run(completed=0, failed=0, error_rate=0.0)
    assert "measured no request" in error_threshold_problem(run)
    assert error_threshold_problem(None) == "there is no run"


def test_the_run_page_shows_the_limit_and_why_the_run_failed_once(client, operator):
    reason = "stopped early: none of the first 10 requests succeeded; engine answered HTTP 503"
    run = make_finished_run(
        status="failed", error=reason, stopped_early=reason[15:], error_rate_limit=0.25
    )
    client.force_login(operator)
    page = client.get(reverse("benchmarks:detail", args=[run.pk])).content.decode()
    assert "stops and fails above 25 % failed requests" in page
    assert page.count("engine answered HTTP 503") == 1
