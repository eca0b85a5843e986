"""Issue 14 item 13 end to end: the host agent is killed (SIGKILL) while an apply's new config
is starting and the worker that ran the apply is gone too; a new agent comes up on the same
state directory and address. It resolves the apply to the last good config, and the panel's
next successful poll closes the operation with the reason and takes the deployment out of the
state the dead operation left it in."""

from __future__ import annotations

import contextlib
import os
import signal
import time

import httpx
import pytest

from controlpanel.choices import OperationStatus
from hosts.choices import DeploymentStatus
from hosts.models import Deployment, EngineConfig, EngineOperation
from hosts.services import operations, telemetry
from tests.factories import make_host, make_sim_deployment
from tests.hosts.agent.conftest import AgentProcess
from tests.hosts.test_fleet_agent import run

pytestmark = [pytest.mark.django_db, pytest.mark.integration]


def wait_for(predicate, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while not (value := predicate()):
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)
    return value


def test_an_apply_cut_by_an_agent_kill_is_closed_and_resolved_by_the_next_poll(tmp_path, operator):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    first = AgentProcess(tmp_path / "a", "--simulate", "h100-sxm:2")
    second = None
    pids: list[int] = []
    try:
        first.start()
        host = make_host(name="agent-host", port=first.port, agent_token=first.token)
        deployment = make_sim_deployment(
            host, simulator={"gpu": "h100-sxm", "num_gpus": 1, "startup_seconds": 0.3}
        )
        good = EngineConfig.objects.create_next(deployment, {"max_model_len": 8192})
        assert run(operations.request_operation(operator, deployment, "apply", good)).status == (
            OperationStatus.SUCCEEDED
        )
        with first.client() as client:
            old_pid = client.get("/v1/engines/llama").json()["pid"]
        pids.append(old_pid)

        # The next version starts slowly; its worker sends it, then dies (never polls).
        Deployment.objects.filter(pk=deployment.pk).update(
            simulator={"gpu": "h100-sxm", "num_gpus": 1, "startup_seconds": 120}
        )
        deployment.refresh_from_db()
        slow = EngineConfig.objects.create_next(deployment, {"max_model_len": 4096})
        op = operations.request_operation(operator, deployment, "apply", slow, enqueue=False)
        op.transition_to(OperationStatus.RUNNING)
        Deployment.objects.filter(pk=deployment.pk).update(status=DeploymentStatus.STARTING)
        body = {"config": slow.launch_config().validated().to_dict(), "ready_timeout_s": 300}
        with first.client() as client:
            assert client.post("/v1/engines/llama/apply", json=body).status_code == 202
            new_pid = wait_for(
                lambda: (pid := client.get("/v1/engines/llama").json()["pid"]) != old_pid and pid,
                30,
                "the new config's process",
            )
        pids.append(new_pid)
        first.proc.kill()
        first.proc.wait(10)

        second = AgentProcess(
            tmp_path / "b",
            "--simulate",
            "h100-sxm:2",
            "--state-dir",
            str(first.state_dir),
            "--listen",
            f"127.0.0.1:{first.port}",
            token=first.token,
        ).start()
        # The first successful poll: the operation is closed, with the agent's words.
        wait_for(lambda: telemetry.poll_host(host) > 0, 30, "a successful poll")
        op.refresh_from_db()
        assert op.status == OperationStatus.FAILED, op.status
        assert "host agent was restarted during this operation" in op.error, op.error
        assert "apply" in op.error
        deployment.refresh_from_db()
        assert deployment.status in (DeploymentStatus.STARTING, DeploymentStatus.RUNNING)
        assert deployment.status_detail.startswith("engine ")

        # The agent goes back to the last good config; later polls follow it to running.
        def running():
            telemetry.poll_host(host)
            return Deployment.objects.get(pk=deployment.pk).status == DeploymentStatus.RUNNING

        wait_for(running, 60, "the deployment running again")
        deployment.refresh_from_db()
        assert deployment.active_config == good
        assert "never confirmed ready" in deployment.status_detail
        assert not EngineOperation.objects.filter(
            deployment=deployment, status__in=["queued", "running"]
        ).exists()
        with second.client() as client:
            status = client.get("/v1/engines/llama").json()
        pids.append(status["pid"])
        assert status["config"]["settings"]["max_model_len"] == 8192
        assert status["pid"] not in (old_pid, new_pid)
        assert httpx.get(f"http://127.0.0.1:{deployment.port}/health", timeout=5).is_success
    finally:
        for agent in (first, second):
            if agent is not None:
                agent.stop()
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError, TypeError):
                os.killpg(pid, signal.SIGKILL)
