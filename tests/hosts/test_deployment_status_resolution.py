"""Issue 14 item 13, the panel's side: "unknown" is never a resting state. A successful poll
sets a deployment to what its host reports (a conflict included, with its reason), an engine
the host does not know is stopped, and an operation the host agent reports as interrupted by
its own restart is closed by that poll with an explanation. Readings as the agent sends them;
runs on SQLite and PostgreSQL."""

from datetime import timedelta

import pytest
from django.utils import timezone

from controlpanel.choices import OperationStatus
from hosts.choices import DeploymentStatus
from hosts.models import Deployment, EngineOperation
from hosts.services import inventory, operations, telemetry
from tests.factories import make_config, make_deployment, make_host
from tests.hosts.test_telemetry_store import INVENTORY, reading

pytestmark = pytest.mark.django_db


@pytest.fixture
def deployment():
    host = make_host()
    inventory.refresh_inventory(host, INVENTORY)
    deployment = make_deployment(host, name="chat")
    Deployment.objects.filter(pk=deployment.pk).update(
        active_config=make_config(deployment),
        status=DeploymentStatus.UNKNOWN,
        status_detail="host unreachable mid-operation",
    )
    return Deployment.objects.get(pk=deployment.pk)


def poll(deployment, **engines) -> Deployment:
    telemetry.record_telemetry(deployment.host, reading(engines=engines))
    return Deployment.objects.get(pk=deployment.pk)


def running_operation(deployment, started_at) -> EngineOperation:
    op = operations.request_operation(None, deployment, "restart", enqueue=False)
    op.transition_to(OperationStatus.RUNNING)
    EngineOperation.objects.filter(pk=op.pk).update(started_at=started_at)
    Deployment.objects.filter(pk=deployment.pk).update(status=DeploymentStatus.STARTING)
    return EngineOperation.objects.get(pk=op.pk)


def test_an_unknown_deployment_takes_the_state_and_reason_the_agent_reports(deployment):
    adopted = {"at": 1.0, "message": "adopting pid 4242, left running by a previous agent"}
    after = poll(deployment, chat={"state": "ready", "pid": 4242, "recovery": adopted})
    assert after.status == DeploymentStatus.RUNNING
    # Not the stale "host unreachable mid-operation": what the agent did.
    assert "adopting pid 4242" in after.status_detail


def test_a_conflict_on_the_host_is_failed_with_the_holder_named(deployment):
    holder = "port 9201 is held by pid 77 (python3 -m http.server 9201), not the recorded engine"
    after = poll(deployment, chat={"state": "conflict", "pid": None, "error": holder})
    assert after.status == DeploymentStatus.FAILED
    assert after.status_detail == f"conflict: {holder}"


def test_an_engine_the_host_does_not_know_is_stopped_not_left_unknown(deployment):
    after = poll(deployment)  # the agent's engines: none of this name
    assert after.status == DeploymentStatus.STOPPED
    assert after.status_detail == telemetry.UNKNOWN_ENGINE


def test_an_operation_left_running_by_a_restarted_agent_is_closed_by_the_next_poll(deployment):
    op = running_operation(deployment, timezone.now() - timedelta(seconds=30))
    interrupted = {
        "operation": "0123abcd",
        "kind": "restart",
        "started_at": (timezone.now() - timedelta(seconds=29)).timestamp(),
        "found_at": timezone.now().timestamp(),
        "outcome": "pid 99 adopted: ready",
    }
    after = poll(deployment, chat={"state": "ready", "pid": 99, "interrupted": interrupted})
    op.refresh_from_db()
    assert op.status == OperationStatus.FAILED and op.outcome == "failed"
    assert "host agent was restarted during this operation" in op.error
    assert "restart 0123abcd was interrupted" in op.error and "pid 99 adopted" in op.error
    assert after.status == DeploymentStatus.RUNNING


def test_an_older_interruption_does_not_close_a_newer_operation(deployment):
    op = running_operation(deployment, timezone.now())
    interrupted = {
        "operation": "0123abcd",
        "kind": "apply",
        "started_at": (timezone.now() - timedelta(minutes=5)).timestamp(),
        "outcome": "the previous config runs again (pid 99)",
    }
    after = poll(deployment, chat={"state": "ready", "pid": 99, "interrupted": interrupted})
    op.refresh_from_db()
    assert op.status == OperationStatus.RUNNING
    assert after.status == DeploymentStatus.STARTING  # the operation still owns the status
