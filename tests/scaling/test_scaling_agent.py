"""Issue 20's "done means", end to end against a real host agent supervising a real simulator
process: under a rising staged load the panel's own /metrics shows requests waiting and p95
TTFT climbing and desired replicas rising above one; the KEDA ScaledObject downloaded for the
deployment names those series, with thresholds taken from a benchmark run.

The simulated H100 serves few sequences at once (max_num_seqs 4) so that a rate it cannot
carry is reached in seconds; the first run of the profile is the capacity evidence, the
second the rising load watched through the panel's poller, the same path beat runs every
second."""

from __future__ import annotations

import ipaddress
import threading
import time

import pytest
import yaml
from django.db import close_old_connections
from prometheus_client.parser import text_string_to_metric_families

from benchmarks.models import BenchmarkRun
from benchmarks.services import runs as benchmark_runs
from hosts.models import EngineConfig, EngineOperation
from hosts.services import operations as host_operations
from hosts.services import telemetry
from scaling.models import ScalingPolicy
from scaling.planning.series import name
from scaling.services import signals, state
from tests.factories import make_host, make_profile, make_sim_deployment
from tests.hosts.agent.conftest import AgentProcess

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]

# Light, then twice what four sequences can serve, then far past it: a queue must build.
RISING = {
    "stages": [
        {"name": "light", "request_rate": 1.0, "num_requests": 8},
        {"name": "busy", "request_rate": 4.0, "num_requests": 24},
        {"name": "overload", "request_rate": 16.0, "num_requests": 64},
    ],
    "input_len": {"kind": "fixed", "mean": 256},
    "output_len": {"kind": "fixed", "mean": 96},
    "warmup_requests": 2,
}


@pytest.fixture
def agent(tmp_path):
    process = AgentProcess(tmp_path, "--simulate", "h100-sxm:1").start()
    yield process
    process.stop()


@pytest.fixture
def deployment(agent, settings):
    host = make_host(name="scaling-host", port=agent.port, agent_token=agent.token)
    deployment = make_sim_deployment(
        host, simulator={"gpu": "h100-sxm", "startup_seconds": 0.3, "time_scale": 0.5}
    )
    config = EngineConfig.objects.create_next(
        deployment, {"gpu_memory_utilization": 0.9, "max_model_len": 8192, "max_num_seqs": 4}
    )
    op = EngineOperation.objects.create(deployment=deployment, kind="apply", config=config)
    host_operations.run_operation(EngineOperation.objects.get(pk=op.pk))
    telemetry.poll_host(host)  # the host answers: online, and its engine running
    deployment.refresh_from_db()
    assert deployment.active_config == config, EngineOperation.objects.get(pk=op.pk).error
    return deployment


def _run(operator, deployment, profile) -> BenchmarkRun:
    run = benchmark_runs.start_benchmark(operator, deployment, profile, enqueue=False)
    benchmark_runs.execute_run(BenchmarkRun.objects.get(pk=run.pk))
    run.refresh_from_db()
    assert run.status == "succeeded", run.error
    return run


def _scrape(client) -> dict[str, list]:
    response = client.get("/metrics")
    assert response.status_code == 200, response.content[:200]
    return {
        f.name: f.samples
        for f in text_string_to_metric_families(response.content.decode())
        if f.name.startswith("llmpanel_deployment_")
    }


def _value(families, key, deployment, **labels):
    for sample in families.get(name(key), []):
        if sample.labels.get("deployment") == deployment.name and all(
            sample.labels.get(k) == v for k, v in labels.items()
        ):
            return sample.value
    return None


def test_a_rising_load_shows_on_metrics_and_the_keda_export_carries_its_thresholds(
    operator, deployment, client, settings
):
    # Prometheus scrapes from an allowed address (the test client's 127.0.0.1).
    settings.METRICS_ALLOWED_ADDRESSES = [ipaddress.ip_network("127.0.0.0/8")]
    profile = make_profile(spec=RISING)
    ScalingPolicy.objects.create(
        deployment=deployment, slo_ttft_p95_ms=300, load_profile=profile, max_replicas=6
    )
    evidence = _run(operator, deployment, profile)
    capacity = state.scaling_state(deployment).capacity
    assert capacity.status in ("measured", "above_tested"), capacity.explanation
    assert capacity.best is not None and capacity.best.run_id == evidence.pk

    # The rising load, watched through the poller and the panel's /metrics.
    watched: list[dict] = []
    done = threading.Event()

    def load():
        try:
            run = benchmark_runs.start_benchmark(operator, deployment, profile, enqueue=False)
            benchmark_runs.execute_run(BenchmarkRun.objects.get(pk=run.pk))
        finally:
            close_old_connections()
            done.set()

    worker = threading.Thread(target=load)
    worker.start()
    try:
        while not done.is_set():
            signals.poll_signals()
            families = _scrape(client)
            watched.append(
                {
                    "waiting": _value(families, "requests_waiting", deployment),
                    "ttft": _value(families, "ttft_p95_seconds", deployment, window="1m"),
                    "desired": _value(families, "desired_replicas", deployment),
                }
            )
            time.sleep(0.5)
    finally:
        worker.join(timeout=300)
    assert watched, "the poller never ran during the load"
    waiting = [w["waiting"] for w in watched if w["waiting"] is not None]
    ttft = [w["ttft"] for w in watched if w["ttft"] is not None]
    desired = [w["desired"] for w in watched if w["desired"] is not None]
    # Climbing: the queue and the 1-minute p95 reach well above where they started.
    assert waiting and max(waiting) >= 4 > waiting[0], waiting
    assert ttft and max(ttft) > 0.3 and max(ttft) > 2 * ttft[0], ttft
    assert desired and max(desired) > 1, watched

    # The KEDA file names those series, with the thresholds of the evidence run.
    client.force_login(operator)
    response = client.get(f"/scaling/deployments/{deployment.pk}/export/keda.yaml")
    assert response.status_code == 200
    assert "attachment" in response["Content-Disposition"]
    text = response.content.decode()
    document = yaml.safe_load(text)
    assert document["kind"] == "ScaledObject"
    now = state.scaling_state(deployment)
    thresholds = now.decision.thresholds
    queries = {t["metadata"]["query"]: t["metadata"] for t in document["spec"]["triggers"]}
    queue = [m for q, m in queries.items() if name("requests_waiting") in q]
    assert queue, queries
    assert float(queue[0]["threshold"]) == pytest.approx(thresholds.requests_waiting, rel=1e-3)
    assert any(name("ttft_p95_seconds") in q for q in queries), queries
    # The run the thresholds came from is named: the first run, or the rising one where it
    # measured the capacity better (both ran the profile; which wins depends on the machine).
    assert now.capacity.best.run_id in (evidence.pk, BenchmarkRun.objects.latest("pk").pk)
    assert f"#{now.capacity.best.run_id}" in text
