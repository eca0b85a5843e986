"""Trusting a host: credentials go only where they were entered for (issue 14 item 1), host
protection needs an Admin (item 4), SSH key files stay in their directory (item 8a) and agent
traffic is encrypted off this machine (item 8b)."""

from __future__ import annotations

import os
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from django.core.checks import run_checks
from django.urls import reverse

from changes.services.facts import required_approvals
from controlpanel.models import AuditEntry
from hosts.agent import server as agent_server
from hosts.forms import HostForm
from hosts.models import Host, HostCheck
from hosts.services import checks, transports
from hosts.services.hosts import HostChangeRefused, update_host
from tests.conftest import free_port
from tests.factories import make_deployment, make_host, ssh_private_key

pytestmark = pytest.mark.django_db

TOKEN = "the-stored-agent-token"


class Recorder(BaseHTTPRequestHandler):
    """Answers every request 401 and keeps its Authorization header (the attacker's listener)."""

    def do_GET(self):  # noqa: N802 - http.server's naming
        self.server.seen.append(self.headers.get("Authorization"))
        body = b'{"error": "who are you"}'
        self.send_response(401)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_POST = do_GET

    def log_message(self, *args):
        pass


@pytest.fixture
def thief():
    """A real HTTP listener on another port that records the credentials sent to it."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), Recorder)
    server.seen = []
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05})
    thread.start()
    yield server
    server.shutdown()
    server.server_close()
    thread.join()


def form_data(host: Host, **changes) -> dict:
    """What the edit page posts back for ``host`` untouched (secrets empty: "keep")."""
    data = {
        "name": host.name,
        "address": host.address,
        "transport": host.transport,
        "port": str(host.port),
        "agent_tls": "on" if host.agent_tls else "",
        "agent_ca_cert": host.agent_ca_cert,
        "ssh_username": host.ssh_username,
        "ssh_python": host.ssh_python,
        "labels": host.label_text,
        "hourly_price": str(host.hourly_price),
        "description": host.description,
    }
    data.update(changes)
    return {k: v for k, v in data.items() if v != ""}


def test_check(host: Host) -> HostCheck:
    """Press "Test connection" and let the worker run the check."""
    check = HostCheck.objects.create(host=host)
    checks.run_host_check(check)
    check.refresh_from_db()
    return check


test_check.__test__ = False  # a helper, not a test


# --- item 1: an agent token is only ever sent to where it was entered for ------------------


def test_changing_address_or_port_requires_the_token_again(client, operator, thief):
    host = make_host(port=free_port(), agent_token=TOKEN)
    client.force_login(operator)
    url = reverse("hosts:edit", args=[host.pk])
    response = client.post(url, form_data(host, port=str(thief.server_port)))
    assert response.status_code == 200
    page = response.content.decode()
    assert "enter the agent token again" in page
    assert f'value="{thief.server_port}"' in page  # what the operator typed is kept
    host.refresh_from_db()
    assert host.port != thief.server_port and host.agent_token == TOKEN
    assert not AuditEntry.objects.filter(action="host.update").exists()
    # "Test connection" now tests the stored host, which still points at the old port.
    client.post(reverse("hosts:check", args=[host.pk]))
    test_check(HostCheck.objects.get(host=host).host)
    assert thief.seen == []


@pytest.mark.parametrize(
    "move",
    [
        "address",  # another machine
        "port",  # another listener on the same machine
        "queryset",  # a bulk update that skips save()
    ],
)
def test_changing_the_destination_by_any_path_never_sends_the_stored_token(thief, move):
    """Whatever changed the row (the admin's form, code, a bulk update), the token stays bound
    to the destination it was entered for: Test connection, the poller and operations all go
    through transport_for, which refuses before a byte is sent."""
    if move == "address":
        host = make_host(address="127.0.0.2", port=thief.server_port, agent_token=TOKEN)
        host.address = "127.0.0.1"  # the thief listens here
        host.save()
    elif move == "port":
        host = make_host(port=free_port(), agent_token=TOKEN)
        host.port = thief.server_port
        host.save(update_fields=["port"])
    else:
        host = make_host(port=free_port(), agent_token=TOKEN)
        Host.objects.filter(pk=host.pk).update(port=thief.server_port)
        host.refresh_from_db()
    check = test_check(host)
    assert check.reachable  # the TCP probe reached the thief's port...
    assert "credentials not sent" in check.detail, check.detail
    assert thief.seen == []  # ...but no request, and no token, was sent
    host.refresh_from_db()
    assert host.status == "auth_failed" and "enter it again" in host.last_error
    with pytest.raises(transports.CredentialsNotBound):
        transports.poll_transport(host)
    with pytest.raises(transports.CredentialsNotBound):
        transports.transport_for(host, make_deployment(host))
    assert thief.seen == []


def test_a_token_entered_again_for_the_new_destination_is_sent_there(client, operator, thief):
    """The positive control of the tests above: the listener does record a token it is given."""
    host = make_host(port=free_port(), agent_token=TOKEN)
    client.force_login(operator)
    response = client.post(
        reverse("hosts:edit", args=[host.pk]),
        form_data(host, port=str(thief.server_port), agent_token="typed-again"),
    )
    assert response.status_code == 302
    host.refresh_from_db()
    assert host.credential_bindings["agent_token"] == f"agent http://127.0.0.1:{thief.server_port}"
    check = test_check(host)
    assert "credentials refused" in check.detail
    assert thief.seen == ["Bearer typed-again"]
    entry = AuditEntry.objects.get(action="host.update")
    assert entry.before["destination"] != entry.after["destination"]
    assert entry.after["secrets_changed"] == ["agent_token"]
    assert "typed-again" not in str(entry.after)


def test_the_same_token_typed_again_is_bound_to_the_new_destination(client, operator):
    """An agent moved to a new address keeps its token: typing it again vouches for it."""
    host = make_host(address="127.0.0.1", agent_token=TOKEN)
    client.force_login(operator)
    client.post(
        reverse("hosts:edit", args=[host.pk]),
        form_data(host, address="127.0.0.3", agent_token=TOKEN),
    )
    host.refresh_from_db()
    assert host.address == "127.0.0.3" and host.credential_problem() == ""


@pytest.mark.parametrize("changes", [{"agent_tls": "on"}, {"address": "127.0.0.4"}])
def test_changing_tls_or_address_requires_the_token_again(client, operator, changes):
    host = make_host(agent_token=TOKEN)
    client.force_login(operator)
    response = client.post(reverse("hosts:edit", args=[host.pk]), form_data(host, **changes))
    assert response.status_code == 200
    page = response.content.decode()
    assert "again" in page and "only ever sent to the destination it was entered for" in page
    host.refresh_from_db()
    assert host.agent_tls is False and host.address == "127.0.0.1"


def test_changing_the_pinned_ca_certificate_requires_the_token_again(client, operator):
    pem = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"
    host = make_host(agent_token=TOKEN, agent_tls=True, agent_ca_cert=pem)
    client.force_login(operator)
    other = pem.replace("MIIB", "MIIC")
    response = client.post(
        reverse("hosts:edit", args=[host.pk]), form_data(host, agent_ca_cert=other)
    )
    assert "enter the agent token again" in response.content.decode()
    host.refresh_from_db()
    assert host.agent_ca_cert == pem


def test_switching_transport_drops_the_other_transports_secrets_and_audits_it(client, operator):
    host = make_host(agent_token=TOKEN)
    client.force_login(operator)
    key = ssh_private_key()
    response = client.post(
        reverse("hosts:edit", args=[host.pk]),
        form_data(host, transport="ssh", port="22", ssh_username="ops", ssh_private_key=key),
    )
    assert response.status_code == 302
    host.refresh_from_db()
    assert host.transport == "ssh" and host.agent_token == "" and host.ssh_private_key == key
    assert set(host.credential_bindings) == {"ssh_private_key"}
    entry = AuditEntry.objects.get(action="host.update")
    assert entry.after["secrets_changed"] == ["agent_token", "ssh_private_key"]


def test_moving_an_ssh_host_requires_its_key_again_and_forgets_the_host_key(client, operator):
    host = make_host(
        transport="ssh",
        port=22,
        ssh_username="ops",
        ssh_private_key=ssh_private_key(),
        ssh_host_key_fingerprint="SHA256:" + "A" * 43,
    )
    client.force_login(operator)
    url = reverse("hosts:edit", args=[host.pk])
    response = client.post(url, form_data(host, address="10.9.9.9"))
    assert "enter the ssh private key again" in response.content.decode().lower()
    host.refresh_from_db()
    assert host.address == "127.0.0.1"
    client.post(url, form_data(host, address="10.9.9.9", ssh_private_key=ssh_private_key()))
    host.refresh_from_db()
    assert host.address == "10.9.9.9" and host.ssh_host_key_fingerprint == ""
    entry = AuditEntry.objects.get(action="host.update")
    assert "ssh_host_key_fingerprint" in entry.after["credentials_cleared"]


class KeptTokenForm:
    """A caller other than the host form (an API, a script) that moves a host and keeps its
    token: the service must refuse on its own."""

    def __init__(self, host: Host, **changes):
        self.host, self.changes = host, changes

    def save(self, commit=True):
        for name, value in self.changes.items():
            setattr(self.host, name, value)
        return self.host

    def save_m2m(self):
        pass


def test_the_service_refuses_to_keep_a_credential_for_a_new_destination(admin):
    host = make_host(port=9100, agent_token=TOKEN)
    with pytest.raises(HostChangeRefused, match="enter the agent token again") as err:
        update_host(admin, host, KeptTokenForm(host, port=9999))
    assert err.value.field == "agent_token"
    host = Host.objects.get(pk=host.pk)
    assert host.port == 9100 and host.agent_token == TOKEN
    assert not AuditEntry.objects.filter(action="host.update").exists()


# --- item 4: a host's protection (its approval rules) needs an Admin -----------------------


@pytest.fixture
def production_host():
    return make_host(labels={"env": "production", "zone": "a"})


@pytest.mark.parametrize("labels", ["zone=a", "env=staging, zone=a"])
def test_operator_cannot_change_protection_and_loses_nothing_typed(
    client, operator, production_host, labels
):
    client.force_login(operator)
    response = client.post(
        reverse("hosts:edit", args=[production_host.pk]),
        form_data(production_host, labels=labels, description="moved to rack 9"),
    )
    assert response.status_code == 200
    page = response.content.decode()
    assert "Only an Admin may change env" in page
    assert "moved to rack 9" in page and labels in page  # nothing the operator typed is lost
    production_host.refresh_from_db()
    assert production_host.labels["env"] == "production" and production_host.description == ""
    assert required_approvals(make_deployment(production_host)) == 2


def test_operator_still_edits_the_other_fields_of_a_protected_host(
    client, operator, production_host
):
    client.force_login(operator)
    response = client.post(
        reverse("hosts:edit", args=[production_host.pk]),
        form_data(production_host, labels="env=production, zone=b", description="rack 9"),
    )
    assert response.status_code == 302
    production_host.refresh_from_db()
    assert production_host.labels == {"env": "production", "zone": "b"}
    assert not AuditEntry.objects.filter(action="host.protection_change").exists()


def test_admin_changes_protection_and_it_is_audited(client, admin, production_host):
    client.force_login(admin)
    response = client.post(
        reverse("hosts:edit", args=[production_host.pk]),
        form_data(production_host, labels="zone=a"),
    )
    assert response.status_code == 302
    entry = AuditEntry.objects.get(action="host.protection_change")
    assert entry.actor == admin
    assert entry.before == {"protection": {"env": "production"}}
    assert entry.after == {"protection": {"env": None}}
    production_host.refresh_from_db()
    assert required_approvals(make_deployment(production_host)) == 1


def test_the_service_refuses_a_protection_change_by_an_operator(operator, production_host):
    form = HostForm(form_data(production_host, labels="zone=a"), instance=production_host)
    assert form.is_valid(), form.errors  # a form that was not told who edits
    with pytest.raises(HostChangeRefused, match="Only an Admin"):
        update_host(operator, production_host, form)
    assert Host.objects.get(pk=production_host.pk).labels["env"] == "production"


# --- item 8a: file: SSH keys come from SSH_KEY_DIR only ------------------------------------


@pytest.fixture
def key_dir(settings, tmp_path):
    keys = tmp_path / "ssh-keys"
    keys.mkdir()
    settings.SSH_KEY_DIR = str(keys)
    return keys


def ssh_host(reference: str) -> Host:
    return make_host(
        transport="ssh",
        port=22,
        ssh_username="ops",
        ssh_private_key=reference,
        ssh_host_key_fingerprint="SHA256:" + "A" * 43,
    )


def test_a_key_file_outside_the_key_dir_is_refused_without_saying_whether_it_exists(
    key_dir, tmp_path
):
    outside = tmp_path / "not-a-key"
    outside.write_text("secret of the worker")
    (key_dir / "link").symlink_to(outside)
    messages = set()
    for reference in (
        f"file:{outside}",  # exists
        f"file:{tmp_path / 'missing'}",  # does not
        "file:../not-a-key",  # climbs out
        "file:link",  # a symlink inside pointing out
        "file:/etc/passwd",
    ):
        with pytest.raises(transports.KeyFileRefused) as err:
            transports.transport_for(ssh_host(reference))
        messages.add(str(err.value))
    assert messages == {f"SSH key files must be inside SSH_KEY_DIR ({key_dir})"}


def test_a_key_file_inside_the_key_dir_is_read(key_dir):
    key = ssh_private_key()
    (key_dir / "fleet").write_text(key)
    with transports.transport_for(ssh_host("file:fleet")) as transport:
        assert transport._private_key == key  # read from the file, nothing else
    with pytest.raises(transports.KeyFileRefused, match="cannot read the SSH key file"):
        transports.transport_for(ssh_host("file:absent"))


def test_key_files_are_off_when_the_key_dir_is_empty(settings):
    settings.SSH_KEY_DIR = ""
    with pytest.raises(transports.KeyFileRefused, match="disabled"):
        transports.transport_for(ssh_host("file:fleet"))


def test_the_form_refuses_a_key_file_outside_the_key_dir(client, operator, key_dir):
    client.force_login(operator)
    data = {
        "name": "ssh-box",
        "address": "10.0.0.7",
        "transport": "ssh",
        "ssh_username": "ops",
        "ssh_private_key": "file:/etc/passwd",
        "hourly_price": "1",
    }
    page = client.post(reverse("hosts:create"), data).content.decode()
    assert "must be inside SSH_KEY_DIR" in page
    assert not Host.objects.filter(name="ssh-box").exists()
    data["ssh_private_key"] = "file:fleet"
    assert client.post(reverse("hosts:create"), data).status_code == 302


# --- item 8b: agent traffic is encrypted unless it stays on this machine -------------------


def agent_data(address: str, **extra) -> dict:
    return {
        "name": "agent-box",
        "address": address,
        "transport": "agent",
        "agent_token": "t0ken",
        "hourly_price": "1",
        **extra,
    }


def test_the_form_refuses_a_cleartext_agent_on_another_machine(client, operator, settings):
    client.force_login(operator)
    page = client.post(reverse("hosts:create"), agent_data("10.0.0.5")).content.decode()
    assert "reached over TLS" in page and "AGENT_ALLOW_CLEARTEXT" in page
    assert not Host.objects.exists()
    response = client.post(reverse("hosts:create"), agent_data("10.0.0.5", agent_tls="on"))
    assert response.status_code == 302


@pytest.mark.parametrize("address", ["127.0.0.1", "localhost", "::1"])
def test_a_loopback_demo_agent_may_use_plain_http(client, operator, address):
    client.force_login(operator)
    assert client.post(reverse("hosts:create"), agent_data(address)).status_code == 302


def test_the_cleartext_opt_in_allows_it(client, operator, settings):
    settings.AGENT_ALLOW_CLEARTEXT = True
    client.force_login(operator)
    assert client.post(reverse("hosts:create"), agent_data("10.0.0.5")).status_code == 302


def hosts_warnings(databases=("default",)) -> dict[str, str]:
    # `check --deploy --database default`: stored hosts are read only when a database is named.
    found = run_checks(include_deployment_checks=True, databases=list(databases))
    return {w.id: w.msg for w in found if w.id.startswith("hosts.")}


def test_check_deploy_warns_about_cleartext_agents_on_the_network(settings):
    make_host(name="demo", address="127.0.0.1")
    make_host(name="pinned", address="10.0.0.6", agent_tls=True)
    assert hosts_warnings() == {}
    make_host(name="clear", address="10.0.0.5")
    warnings = hosts_warnings()
    assert set(warnings) == {"hosts.W002"} and "clear" in warnings["hosts.W002"]
    assert "demo" not in warnings["hosts.W002"] and "pinned" not in warnings["hosts.W002"]
    # Without --database the check contacts nothing (CI, image builds) and stays silent.
    assert hosts_warnings(databases=()) == {}
    settings.AGENT_ALLOW_CLEARTEXT = True
    assert "hosts.W001" in hosts_warnings()
    assert set(hosts_warnings(databases=())) == {"hosts.W001"}


@pytest.fixture
def token_file(tmp_path):
    path = tmp_path / "token"
    path.write_text("agent-token-0123456789")
    os.chmod(path, 0o600)
    return path


def test_the_agent_refuses_plain_http_on_a_network_address(token_file, capsys):
    with pytest.raises(SystemExit) as err:
        agent_server.main(["--listen", "0.0.0.0:0", "--token-file", str(token_file)])
    assert err.value.code == 2
    assert "--insecure-http" in capsys.readouterr().err
    assert agent_server.cleartext_refusal("0.0.0.0", tls=False, insecure_http=False)  # noqa: S104
    assert agent_server.cleartext_refusal("10.0.0.5", tls=True, insecure_http=False) is None
    assert agent_server.cleartext_refusal("10.0.0.5", tls=False, insecure_http=True) is None
    assert agent_server.cleartext_refusal("127.0.0.1", tls=False, insecure_http=False) is None
    assert agent_server.cleartext_refusal("::1", tls=False, insecure_http=False) is None


# --- item 8 (labels): a NUL in a label is a form error, not a database error ---------------


@pytest.mark.parametrize("labels", ["zone=a\x00b", "zone=a\x07"])
def test_a_control_character_in_a_label_is_a_form_error(client, operator, labels):
    client.force_login(operator)
    data = agent_data("127.0.0.1", labels=labels)
    response = client.post(reverse("hosts:create"), data)
    assert response.status_code == 200
    assert "must not contain control characters" in response.content.decode()
    assert not Host.objects.exists()
