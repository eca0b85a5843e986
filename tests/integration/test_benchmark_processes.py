"""A benchmark on the production processes: the compose worker (Redis broker, PostgreSQL)
runs the load generator against an engine a real host agent supervises, streams every second
to the run's group on the Redis channel layer, and stores the results in PostgreSQL."""

from __future__ import annotations

import asyncio

import pytest
from celery import Celery

from benchmarks.models import RunPoint, RunRequestLog
from benchmarks.services import runs as services
from hosts.models import EngineConfig, EngineOperation
from tests.factories import make_host, make_profile, make_sim_deployment
from tests.hosts.agent.conftest import AgentProcess
from tests.integration.processes import (
    compose_command,
    run_events,
    use_redis_channel_layer,
    wait_until,
)

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]

PROFILE = {
    "stages": [{"name": "main", "concurrency": 8, "num_requests": 60}],
    "input_len": {"kind": "fixed", "mean": 256},
    "output_len": {"kind": "fixed", "mean": 32},
    "warmup_requests": 4,
    "slo": {"ttft": 2000},
}


def test_worker_runs_a_benchmark_and_streams_it_over_redis(
    production_env,  # noqa: F811
    start,  # noqa: F811
    shared_key,  # noqa: F811
    tmp_path,
    settings,
    postgres,
):
    use_redis_channel_layer(settings, production_env["REDIS_URL"])
    (tmp_path / "agent-home").mkdir()
    agent = AgentProcess(tmp_path / "agent-home", "--simulate", "h100-sxm:1")
    agent.start()
    try:
        host = make_host(name="bench-agent", port=agent.port, agent_token=agent.token)
        deployment = make_sim_deployment(host)
        config = EngineConfig.objects.create_next(deployment, {"max_model_len": 8192})
        apply = EngineOperation.objects.create(deployment=deployment, kind="apply", config=config)
        worker = start("worker", compose_command("worker"), production_env)
        worker.wait_for_output("ready.", timeout=60)
        # Not the current app: the panel's own (in-memory here) stays the one its services
        # enqueue on, so the worker gets exactly the messages this test sends.
        broker = Celery(broker=production_env["REDIS_URL"], set_as_current=False)
        broker.send_task("hosts.tasks.apply_config", args=[apply.pk])
        wait_until(
            lambda: EngineOperation.objects.get(pk=apply.pk).is_finished,
            60,
            lambda: worker.output()[-3000:],
        )
        deployment.refresh_from_db()
        assert deployment.active_config == config

        run = services.start_benchmark(None, deployment, make_profile(spec=PROFILE))
        events = asyncio.run(run_events(broker, run, [worker]))
    finally:
        agent.stop()

    run.refresh_from_db()
    assert run.status == "succeeded", (run.error, run.log, worker.output()[-3000:])
    assert (run.completed, run.failed) == (60, 0)
    assert run.engine_config == config and run.environment["config"]["version"] == 1
    assert run.environment["engine"]["reported"], "the simulator answers /version"
    assert run.ttft_p50_ms > 0 and run.output_tokens_total == 60 * 32
    assert RunRequestLog.objects.get(run=run).count == 60
    stored = RunPoint.objects.filter(run=run).count()
    points = [e for e in events if e["type"] == "run.point"]
    statuses = [e["data"]["status"] for e in events if e["type"] == "run.status"]
    assert points and len(points) == stored  # every stored second was streamed live
    assert points[-1]["data"]["completed"] == 60
    # Each second carries the readings of the agent's simulated H100, which the run fetched
    # itself (no beat polls here): GPU 0, busy with the engine's memory reservation (an
    # idle simulated GPU shows 0.25 GiB) and a utilisation the load drove above zero.
    gpus = points[-1]["data"]["gpus"]
    assert len(gpus) == 1 and gpus[0]["index"] == 0, gpus
    assert isinstance(gpus[0]["utilization_pct"], int) and 0 <= gpus[0]["utilization_pct"] <= 100
    assert gpus[0]["memory_used_gib"] > 1 and gpus[0]["power_w"] > 0, gpus
    assert any(g["utilization_pct"] > 0 for p in points for g in p["data"]["gpus"]), points
    assert statuses[0] == "running" and statuses[-1] == "succeeded"
