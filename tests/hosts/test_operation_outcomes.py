"""What the worker records for each way an engine operation can end (ready, rolled back,
failed, host unreachable, worker died mid-operation), with a scripted transport instead of a
host; and the SSH key file a host's settings may point to."""

import pytest

from controlpanel.choices import OperationStatus
from controlpanel.models import AuditEntry
from hosts.choices import DeploymentStatus, OperationOutcome
from hosts.models import Deployment, EngineConfig
from hosts.services import operations, transports
from hosts.transport.base import ApplyOutcome, TransportError
from tests.factories import make_config, make_deployment, make_host, ssh_private_key

pytestmark = pytest.mark.django_db


class ScriptedTransport:
    """Answers apply/restart/status with what the test scripted, and remembers the calls."""

    def __init__(self, outcome=None, error=None, status=None):
        self.outcome, self.error, self.status = outcome, error, status
        self.calls = []

    def __enter__(self):
        if self.error:
            raise self.error
        return self

    def __exit__(self, *exc):
        return False

    def apply_config(self, name, launch, *, previous, ready_timeout_s):
        self.calls.append(("apply", name, launch, previous))
        return self.outcome

    def restart_engine(self, name, *, ready_timeout_s):
        self.calls.append(("restart", name))
        return self.outcome

    def engine_status(self, name):
        self.calls.append(("status", name))
        return self.status


@pytest.fixture
def deployment():
    deployment = make_deployment()
    v1 = make_config(deployment, {"max_num_seqs": 128})
    Deployment.objects.filter(pk=deployment.pk).update(active_config=v1)
    return Deployment.objects.get(pk=deployment.pk)


def run_with(monkeypatch, transport, operation):
    monkeypatch.setattr(operations, "transport_for", lambda host, deployment=None: transport)
    return operations.run_operation(operation)


def test_a_ready_apply_makes_the_config_active_and_audits_it(deployment, operator, monkeypatch):
    v1 = deployment.active_config
    v2 = make_config(deployment, {"max_num_seqs": 256})
    operation = operations.request_operation(operator, deployment, "apply", v2)
    transport = ScriptedTransport(ApplyOutcome("ready", log_lines=["ready"]))

    run_with(monkeypatch, transport, operation)

    operation.refresh_from_db()
    assert operation.status == OperationStatus.SUCCEEDED
    assert operation.outcome == OperationOutcome.READY and operation.engine_log == "ready"
    # The previous version travels along so the transport can fall back to it.
    (kind, name, launch, previous) = transport.calls[0]
    assert kind == "apply" and name == deployment.name
    assert launch.settings["max_num_seqs"] == 256 and previous.settings["max_num_seqs"] == 128
    deployment.refresh_from_db()
    assert deployment.active_config == v2 and deployment.status == DeploymentStatus.RUNNING
    assert deployment.status_detail == "v2 ready"
    entry = AuditEntry.objects.get(action="deployment.config_active")
    assert entry.before == {"config_version": v1.version}
    assert entry.after == {"config_version": 2}


def test_a_rolled_back_apply_keeps_the_previous_config(deployment, operator, monkeypatch):
    v2 = make_config(deployment, {"max_num_seqs": 256})
    operation = operations.request_operation(operator, deployment, "apply", v2)
    outcome = ApplyOutcome("rolled_back", error="CUDA out of memory", log_lines=["OOM"])

    run_with(monkeypatch, ScriptedTransport(outcome), operation)

    operation.refresh_from_db()
    assert operation.status == OperationStatus.FAILED
    assert operation.outcome == OperationOutcome.ROLLED_BACK
    assert operation.error == "CUDA out of memory" and operation.engine_log == "OOM"
    deployment.refresh_from_db()
    assert deployment.active_config.version == 1
    assert deployment.status == DeploymentStatus.RUNNING
    assert deployment.status_detail == "v2 failed; back on v1"
    assert not AuditEntry.objects.filter(action="deployment.config_active").exists()


def test_an_engine_that_failed_outright_fails_the_deployment(deployment, operator, monkeypatch):
    operation = operations.request_operation(operator, deployment, "restart")
    transport = ScriptedTransport(ApplyOutcome("failed", error="exited 1"))

    run_with(monkeypatch, transport, operation)

    assert transport.calls == [("restart", deployment.name)]
    operation.refresh_from_db()
    assert operation.outcome == OperationOutcome.FAILED and operation.error == "exited 1"
    deployment.refresh_from_db()
    assert deployment.status == DeploymentStatus.FAILED and deployment.status_detail == "exited 1"


def test_a_ready_restart_is_not_audited_as_a_config_change(deployment, operator, monkeypatch):
    operation = operations.request_operation(operator, deployment, "restart")

    run_with(monkeypatch, ScriptedTransport(ApplyOutcome("ready")), operation)

    operation.refresh_from_db()
    assert operation.status == OperationStatus.SUCCEEDED
    assert not AuditEntry.objects.filter(action="deployment.config_active").exists()


def test_an_unreachable_host_leaves_the_deployment_unknown(deployment, operator, monkeypatch):
    operation = operations.request_operation(operator, deployment, "restart")
    transport = ScriptedTransport(error=TransportError("connection refused"))

    run_with(monkeypatch, transport, operation)

    operation.refresh_from_db()
    assert operation.outcome == OperationOutcome.FAILED
    assert operation.error == "TransportError: connection refused"
    assert "transport error: connection refused" in operation.log
    deployment.refresh_from_db()
    assert deployment.status == DeploymentStatus.UNKNOWN
    assert deployment.status_detail == "host unreachable mid-operation: connection refused"


def test_a_previous_config_the_rules_now_refuse_is_not_offered_as_rollback(
    deployment, operator, monkeypatch
):
    EngineConfig.objects.filter(pk=deployment.active_config_id).update(settings={"no_such_flag": 1})
    v2 = make_config(deployment, {"max_num_seqs": 256})
    operation = operations.request_operation(operator, deployment, "apply", v2)
    transport = ScriptedTransport(ApplyOutcome("ready"))

    run_with(monkeypatch, transport, operation)

    assert transport.calls[0][3] is None
    operation.refresh_from_db()
    assert operation.status == OperationStatus.SUCCEEDED


def test_reapplying_the_running_version_offers_no_rollback(deployment, operator, monkeypatch):
    operation = operations.request_operation(
        operator, deployment, "apply", deployment.active_config
    )
    transport = ScriptedTransport(ApplyOutcome("ready"))

    run_with(monkeypatch, transport, operation)

    assert transport.calls[0][3] is None


def test_a_redelivered_running_operation_is_closed_with_what_the_host_runs(
    deployment, operator, monkeypatch
):
    operation = operations.request_operation(operator, deployment, "restart")
    operation.transition_to(OperationStatus.RUNNING)  # the first worker died here
    status = {"state": "ready", "last_lines": ["serving"]}
    transport = ScriptedTransport(status=status)

    run_with(monkeypatch, transport, operation)

    assert transport.calls == [("status", deployment.name)]
    operation.refresh_from_db()
    assert operation.status == OperationStatus.FAILED
    assert operation.error == "the worker stopped during the operation; the engine was found ready"
    assert operation.engine_log == "serving"
    deployment.refresh_from_db()
    assert deployment.status == DeploymentStatus.RUNNING


def test_an_ssh_key_can_live_in_a_file_on_the_panel(tmp_path, monkeypatch, settings):
    settings.SSH_KEY_DIR = str(tmp_path)  # key files are read from SSH_KEY_DIR only
    built = []
    monkeypatch.setattr(transports, "SshTransport", lambda *a, **kw: built.append(kw) or kw)
    text = ssh_private_key()
    (tmp_path / "id_ed25519").write_text(text)
    host = make_host(
        transport="ssh",
        port=22,
        ssh_username="ops",
        ssh_private_key=f"file:{tmp_path / 'id_ed25519'}",
    )

    transports.transport_for(host)

    assert built[0]["private_key"] == text
    host.ssh_private_key = f"file:{tmp_path / 'missing'}"
    host.save()  # saved, so bound to the host's destination like any entered key
    with pytest.raises(TransportError, match="cannot read the SSH key file .*missing"):
        transports.transport_for(host)
