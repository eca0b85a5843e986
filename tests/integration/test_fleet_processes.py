"""Production processes operating a real host agent: the worker (from docker-compose.yml)
applies a config through the agent, beat's once-a-second poll fills GPU samples in
PostgreSQL, and the retention sweep folds and forgets them there."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest
from celery import Celery
from django.utils import timezone

from hosts.models import EngineConfig, EngineOperation, GpuSample, GpuSampleMinute
from hosts.services import telemetry
from tests.factories import make_host, make_sim_deployment
from tests.hosts.agent.conftest import AgentProcess
from tests.integration.processes import compose_command, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]


def host_state(host) -> str:
    host.refresh_from_db()
    return f"host {host.status} {host.last_error!r} polled {host.last_poll_at}"


def test_worker_applies_through_the_agent_and_beat_polls_into_postgres(
    production_env,  # noqa: F811
    start,  # noqa: F811
    shared_key,
    tmp_path,
    postgres,
):
    (tmp_path / "agent-home").mkdir()
    agent = AgentProcess(tmp_path / "agent-home", "--simulate", "h100-sxm:1")
    agent.start()
    try:
        host = make_host(name="pg-agent", port=agent.port, agent_token=agent.token)
        deployment = make_sim_deployment(host)
        config = EngineConfig.objects.create_next(deployment, {"max_model_len": 8192})
        operation = EngineOperation.objects.create(
            deployment=deployment, kind="apply", config=config
        )
        worker = start("worker", compose_command("worker"), production_env)
        worker.wait_for_output("ready.", timeout=60)
        Celery(broker=production_env["REDIS_URL"], set_as_current=False).send_task(
            "hosts.tasks.apply_config", args=[operation.pk]
        )

        def finished():
            operation.refresh_from_db()
            return operation.is_finished

        wait_until(finished, 60, lambda: worker.output()[-3000:])
        assert operation.outcome == "ready", (operation.error, operation.engine_log)
        deployment.refresh_from_db()
        assert deployment.active_config == config and deployment.status == "running"

        var = production_env["VAR_DIR"]
        Path(var).mkdir(parents=True, exist_ok=True)
        cmd = [part.replace("/var/lib/controlpanel", var) for part in compose_command("beat")]
        beat = start("beat", cmd, production_env)
        wait_until(
            lambda: GpuSample.objects.filter(gpu__host=host).count() >= 3,
            40,
            lambda: f"{host_state(host)}\n" + beat.output()[-2000:] + worker.output()[-2000:],
        )
        host.refresh_from_db()
        assert host.status == "online" and host.telemetry_source == "simulator"
        sample = GpuSample.objects.filter(gpu__host=host).latest("time")
        assert sample.memory_used_bytes > 60 * 2**30  # the engine's reservation
    finally:
        agent.stop()

    # Retention on PostgreSQL: samples older than the raw window fold into minutes.
    gpu = host.gpus.get()
    old = timezone.now() - timedelta(hours=2)
    GpuSample.objects.bulk_create(
        [
            GpuSample(gpu=gpu, time=old + timedelta(seconds=s), utilization_pct=s, power_w=100)
            for s in range(0, 60, 5)
        ]
    )
    telemetry.downsample_telemetry()
    minute = GpuSampleMinute.objects.get(gpu=gpu, minute=old.replace(second=0, microsecond=0))
    assert minute.samples == sum(1 for s in range(0, 60, 5) if (old.second + s) < 60)
    assert not GpuSample.objects.filter(time__lt=timezone.now() - timedelta(hours=1)).exists()
