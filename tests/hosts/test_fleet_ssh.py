"""The panel reaching a host over SSH, against a real OpenSSH server on localhost: first
contact shows the host key for an admin to accept, a changed key is refused loudly, and an
accepted host reads its inventory, starts an engine (the simulator, detached) and rolls back a
config that cannot start."""

from __future__ import annotations

import getpass
import sys

import pytest

from controlpanel.models import AuditEntry
from hosts.models import EngineConfig, EngineOperation, HostCheck
from hosts.services import checks, operations, telemetry, transports
from hosts.services.hosts import OfferedKeyChanged, accept_host_key
from tests.factories import make_host, make_sim_deployment
from tests.hosts.transport import sshd as sshd_mod
from tests.hosts.transport.conftest import fresh_sshd, ssh_keys  # noqa: F401 - fixtures

pytestmark = [pytest.mark.django_db, pytest.mark.integration]


@pytest.fixture
def ssh_host(ssh_keys, fresh_sshd, settings, tmp_path):  # noqa: F811
    settings.SSH_REMOTE_DIR = str(tmp_path / "remote")
    server = fresh_sshd()
    host = make_host(
        name="ssh-box",
        transport="ssh",
        port=server.port,
        agent_token="",
        ssh_username=getpass.getuser(),
        ssh_private_key=ssh_keys.client.read_text(),
        ssh_python=sys.executable,
    )
    yield host, server
    # Engines the test left running on the "remote" side. The row again: the test accepted
    # the host key on its own copy, and without it the transport refuses to connect.
    host.refresh_from_db()
    for deployment in host.deployments.all():
        try:
            with transports.transport_for(host) as transport:
                transport.stop_engine(deployment.name)
        except Exception:  # noqa: BLE001 - best effort in teardown
            pass


def check(host) -> HostCheck:
    c = HostCheck.objects.create(host=host)
    checks.run_host_check(c)
    c.refresh_from_db()
    host.refresh_from_db()
    return c


def test_first_contact_accept_then_a_changed_key_is_refused(ssh_host, ssh_keys, admin):  # noqa: F811
    host, server = ssh_host
    first = check(host)
    expected = sshd_mod.fingerprint(ssh_keys.host.with_name("host.pub"))
    assert host.status == "host_key" and host.ssh_offered_fingerprint == expected
    assert "an admin must accept it" in first.detail
    assert "Accepted publickey" not in server.log()  # nothing authenticated before acceptance

    with pytest.raises(OfferedKeyChanged):  # not the key the admin was shown
        accept_host_key(admin, host, "SHA256:" + "A" * 43)
    host = accept_host_key(admin, host, expected)
    check(host)
    assert host.status == "online", host.last_error
    assert host.ssh_host_key_fingerprint == expected and host.cpu_count
    assert host.telemetry_source == "none" and "nvidia-smi not found" in host.telemetry_note

    # The server comes back with another key: refused, shown, audited; polling stops asking.
    server.restart(host_key=ssh_keys.other_host)
    changed = check(host)
    assert host.status == "host_key_changed" and "HOST KEY CHANGED" in changed.detail
    assert host.ssh_offered_fingerprint == sshd_mod.fingerprint(
        ssh_keys.other_host.with_name("other-host.pub")
    )
    assert host.ssh_host_key_fingerprint == expected  # the stored key is not replaced
    assert AuditEntry.objects.filter(action="host.host_key_changed").exists()
    assert telemetry.poll_telemetry() == 0


def test_apply_and_rollback_over_ssh(ssh_host, admin, operator):
    host, server = ssh_host
    check(host)
    host = accept_host_key(admin, host, host.ssh_offered_fingerprint)
    deployment = make_sim_deployment(host, name="llama-ssh")
    good = EngineConfig.objects.create_next(deployment, {"max_model_len": 8192})
    op = operations.request_operation(operator, deployment, "apply", good)
    operations.run_operation(EngineOperation.objects.get(pk=op.pk))
    op.refresh_from_db()
    assert op.outcome == "ready", (op.error, op.engine_log)

    bad = EngineConfig.objects.create_next(deployment, {"gpu_memory_utilization": 0.1})
    op = operations.request_operation(operator, deployment, "apply", bad)
    operations.run_operation(EngineOperation.objects.get(pk=op.pk))
    op.refresh_from_db()
    deployment.refresh_from_db()
    assert op.outcome == "rolled_back"
    assert "No available memory for the cache blocks" in op.engine_log
    assert deployment.active_config == good and deployment.status == "running"

    # Telemetry over SSH: no nvidia-smi here, so the simulator engine's readings, said so.
    host.status = "online"
    host.save()
    assert telemetry.poll_telemetry() == 1
    host.refresh_from_db()
    assert host.telemetry_source == "simulator"
