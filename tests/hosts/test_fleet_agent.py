"""The panel operating a real host agent that supervises real simulator processes: test
connection (inventory), telemetry polling into samples, apply → ready, a failing apply →
rolled back with the engine's own error, restart, and the records each leaves."""

from __future__ import annotations

import pytest

from hosts.models import EngineConfig, EngineOperation, Gpu, GpuSample, HostCheck
from hosts.services import checks, operations, telemetry
from tests.factories import make_host, make_sim_deployment
from tests.hosts.agent.conftest import AgentProcess

pytestmark = [pytest.mark.django_db, pytest.mark.integration]


@pytest.fixture
def agent(tmp_path):
    process = AgentProcess(tmp_path, "--simulate", "h100-sxm:2").start()
    yield process
    process.stop()


@pytest.fixture
def fleet(agent):
    host = make_host(name="agent-host", port=agent.port, agent_token=agent.token)
    deployment = make_sim_deployment(
        host, simulator={"gpu": "h100-sxm", "num_gpus": 2, "startup_seconds": 0.3}
    )
    good = EngineConfig.objects.create_next(
        deployment, {"gpu_memory_utilization": 0.9, "max_model_len": 8192}
    )
    return host, deployment, good


def run(operation: EngineOperation) -> EngineOperation:
    """What the Celery task does with the row (the task itself is exercised elsewhere)."""
    operations.run_operation(
        EngineOperation.objects.select_related("deployment__host").get(pk=operation.pk)
    )
    operation.refresh_from_db()
    return operation


def test_test_connection_reads_the_inventory(fleet):
    host, _, _ = fleet
    check = HostCheck.objects.create(host=host)
    checks.run_host_check(check)
    check.refresh_from_db()
    host.refresh_from_db()
    assert check.reachable and "telemetry from simulator" in check.detail, check.detail
    assert host.status == "online" and host.agent_version
    assert host.gpus.count() == 2
    assert host.gpus.get(index=0).name.startswith("NVIDIA H100")


def test_wrong_token_is_reported_as_refused_credentials(fleet):
    host, _, _ = fleet
    host.agent_token = "not-the-token"
    host.save()
    check = HostCheck.objects.create(host=host)
    checks.run_host_check(check)
    host.refresh_from_db()
    assert host.status == "auth_failed" and "credentials refused" in check.detail
    assert check.outcome == "auth_failed" and check.status == "succeeded"


def test_apply_rollback_restart_and_telemetry(fleet, operator):
    host, deployment, good = fleet
    # Good config → ready, and it becomes the deployment's last good config.
    op = run(operations.request_operation(operator, deployment, "apply", good))
    assert op.status == "succeeded" and op.outcome == "ready", (op.error, op.engine_log)
    deployment.refresh_from_db()
    assert deployment.active_config == good and deployment.status == "running"

    # Telemetry: a sample per GPU, the engine's reserved memory visible on GPU0.
    assert telemetry.poll_telemetry() == 2
    gpu0 = Gpu.objects.get(host=host, index=0)
    assert GpuSample.objects.filter(gpu=gpu0).count() == 1
    assert gpu0.last_sample["memory_used_bytes"] > 60 * 2**30
    # The engine's processes hold GPU0 only: the deployment now knows its GPUs.
    assert list(deployment.gpus.all()) == [gpu0]

    # A config the engine cannot start with → rolled back, the error on the record.
    bad = EngineConfig.objects.create_next(deployment, {"gpu_memory_utilization": 0.1})
    op = run(operations.request_operation(operator, deployment, "apply", bad))
    assert op.status == "failed" and op.outcome == "rolled_back"
    assert "No available memory for the cache blocks" in op.engine_log, op.engine_log
    deployment.refresh_from_db()
    assert deployment.active_config == good and deployment.status == "running"
    assert f"v{bad.version} failed; back on v{good.version}" in deployment.status_detail

    # Restart runs the stored (good) config again.
    op = run(operations.request_operation(operator, deployment, "restart"))
    assert op.outcome == "ready" and op.config == good
    assert "restarting with v1" in op.log
