"""The guided host setup (/hosts/<pk>/onboard/): a new host lands there, the agent token is
generated once and masked after, replacing it is audited, each step's state comes from the
newest HostCheck (a refused connection or token is a failure, never a pass), certificates
are pinned on an explicit accept, SSH keys are generated, and the install command's flags are
the agent's own."""

from __future__ import annotations

import datetime
import io
import ipaddress
import re
import shlex
import zipfile

import paramiko
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from controlpanel.models import AuditEntry
from hosts.agent.server import build_parser
from hosts.models import Host, HostCheck
from hosts.services.agent_install import TOKEN_FILE, agent_install, download_key
from hosts.services.onboarding import OnboardingRefused, pin_agent_certificate
from hosts.services.onboarding_steps import steps_for
from tests.factories import make_gpu, make_host

pytestmark = pytest.mark.django_db


def agent_host(**kw) -> Host:
    data = dict(address="127.0.0.1", port=9100, agent_token="", agent_tls=True)
    data.update(kw)
    return make_host(**data)


def finished_check(host, outcome, detail, *, reachable=True, latency=1.5) -> HostCheck:
    return HostCheck.objects.create(
        host=host,
        status="succeeded",
        outcome=outcome,
        detail=detail,
        reachable=reachable,
        latency_ms=latency if reachable else None,
        finished_at=timezone.now(),
    )


def certificate_pem(*names: str) -> str:
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "agent")])
    sans = [
        x509.IPAddress(ipaddress.ip_address(n)) if n[0].isdigit() else x509.DNSName(n)
        for n in names
    ]
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=30))
        .add_extension(x509.SubjectAlternativeName(sans), critical=False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    return cert.public_bytes(serialization.Encoding.PEM).decode()


def shown_token(page: str) -> str:
    match = re.search(r"printf &#x27;%s\\n&#x27; (\S+) &gt; " + re.escape(TOKEN_FILE), page)
    assert match, "the install script writes no token"
    return match.group(1)


# ---------------------------------------------------------------------------- creating


def test_a_new_agent_host_needs_no_token_and_lands_on_its_setup(client, operator):
    client.force_login(operator)
    response = client.post(
        reverse("hosts:create"),
        {
            "name": "gpu-new",
            "address": "10.0.0.9",
            "transport": "agent",
            "agent_tls": "on",
            "port": "",
            "labels": "",
            "hourly_price": "1",
            "description": "",
        },
    )
    host = Host.objects.get(name="gpu-new")
    assert response.status_code == 302
    assert response["Location"] == reverse("hosts:onboard", args=[host.pk])
    assert host.agent_token == ""
    page = client.get(response["Location"]).content.decode()
    assert 'data-testid="generate-token"' in page
    assert "printf" not in page  # no command before there is a token


# ---------------------------------------------------------------------------- the token


def test_the_token_is_shown_once_and_masked_afterwards(client, operator):
    host = agent_host()
    client.force_login(operator)
    response = client.post(reverse("hosts:onboard_token", args=[host.pk]))
    assert response.status_code == 200
    page = response.content.decode()
    token = shown_token(page)
    host.refresh_from_db()
    assert host.agent_token == token and len(token) >= 40
    assert host.credential_problem() == ""  # bound to where the host points
    assert "no-store" in response["Cache-Control"]
    entry = AuditEntry.objects.get(action="host.agent_token_generated")
    assert entry.actor == operator and entry.after["replaced"] is False
    assert token not in str(entry.after) and token not in str(entry.before)

    later = client.get(reverse("hosts:onboard", args=[host.pk])).content.decode()
    assert token not in later
    assert 'data-testid="token-masked"' in later and 'data-testid="regenerate-token"' in later
    assert "test -s " + TOKEN_FILE in later  # the command keeps the token already written


def test_generating_a_new_token_replaces_the_stored_one_and_is_audited(client, operator):
    host = agent_host(agent_token="old-token-value")
    client.force_login(operator)
    page = client.post(reverse("hosts:onboard_token", args=[host.pk])).content.decode()
    token = shown_token(page)
    host.refresh_from_db()
    assert host.agent_token == token != "old-token-value"
    entry = AuditEntry.objects.get(action="host.agent_token_generated")
    assert entry.after == {"secrets_changed": ["agent_token"], "replaced": True}


def test_an_ssh_host_has_no_token_to_generate(client, operator):
    host = make_host(transport="ssh", port=22, agent_token="", ssh_username="ops")
    client.force_login(operator)
    response = client.post(reverse("hosts:onboard_token", args=[host.pk]), follow=True)
    assert "Only an agent host has a token." in response.content.decode()
    assert not AuditEntry.objects.filter(action="host.agent_token_generated").exists()


# ---------------------------------------------------------------------------- access


@pytest.mark.parametrize(
    "name,method",
    [
        ("hosts:onboard", "get"),
        ("hosts:onboard_status", "get"),
        ("hosts:onboard_token", "post"),
        ("hosts:onboard_pin", "post"),
        ("hosts:onboard_ssh_key", "post"),
    ],
)
def test_viewers_are_refused(client, viewer, name, method):
    host = agent_host(agent_token="keep-me")
    client.force_login(viewer)
    response = getattr(client, method)(reverse(name, args=[host.pk]))
    assert response.status_code == 403
    host.refresh_from_db()
    assert host.agent_token == "keep-me"


def test_anonymous_goes_to_the_login(client):
    host = agent_host()
    response = client.get(reverse("hosts:onboard", args=[host.pk]))
    assert response.status_code == 302 and "/login" in response["Location"]


def test_a_post_without_the_csrf_token_changes_nothing(operator):
    host = agent_host(agent_token="keep-me")
    client = Client(enforce_csrf_checks=True)
    client.force_login(operator)
    response = client.post(reverse("hosts:onboard_token", args=[host.pk]))
    assert response.status_code == 403
    host.refresh_from_db()
    assert host.agent_token == "keep-me"
    assert not AuditEntry.objects.exists()


def test_only_admins_accept_a_host_key_and_only_the_one_they_saw(client, operator, admin):
    host = make_host(
        transport="ssh",
        port=22,
        agent_token="",
        ssh_username="ops",
        ssh_offered_fingerprint="SHA256:" + "A" * 43,
        ssh_offered_key_type="ssh-ed25519",
    )
    url = reverse("hosts:onboard_accept_key", args=[host.pk])
    client.force_login(operator)
    assert client.post(url, {"fingerprint": host.ssh_offered_fingerprint}).status_code == 403
    client.force_login(admin)
    client.post(url, {"fingerprint": "SHA256:" + "B" * 43})
    host.refresh_from_db()
    assert host.ssh_host_key_fingerprint == ""
    response = client.post(url, {"fingerprint": host.ssh_offered_fingerprint})
    assert response["Location"] == reverse("hosts:onboard", args=[host.pk])
    host.refresh_from_db()
    assert host.ssh_host_key_fingerprint == "SHA256:" + "A" * 43
    assert AuditEntry.objects.filter(action="host.accept_host_key", actor=admin).exists()


# ---------------------------------------------------------------------------- step states


def states(host) -> dict:
    host.refresh_from_db()
    check = host.checks.order_by("-created_at", "-pk").first()
    return {step.key: step for step in steps_for(host, check)}


def results(step) -> dict:
    return {r.name: r for r in step.results}


def test_a_refused_connection_is_a_failure_with_what_to_do(client, operator):
    host = agent_host(agent_token="tok", agent_ca_cert=certificate_pem("127.0.0.1"))
    finished_check(
        host, "unreachable", "127.0.0.1:9100: Connection refused", reachable=False, latency=None
    )
    steps = states(host)
    assert steps["install"].state == "failed"
    assert "Connection refused" in steps["install"].text
    assert "systemctl status" in steps["install"].hint
    assert steps["check"].state == "failed"
    reach = results(steps["check"])["Reachable"]
    assert reach.state == "fail" and "Connection refused" in reach.text
    client.force_login(operator)
    page = client.get(reverse("hosts:onboard", args=[host.pk])).content.decode()
    assert 'data-result="Reachable" data-result-state="fail"' in page
    assert "Connection refused" in page


def test_a_refused_token_is_a_failure_not_a_success(client, operator):
    host = agent_host(agent_token="tok", agent_ca_cert=certificate_pem("127.0.0.1"))
    finished_check(
        host,
        "auth_failed",
        "agent port 9100 answered in 1.2 ms; credentials refused: the agent at "
        "127.0.0.1:9100 refused the token",
    )
    steps = states(host)
    check = results(steps["check"])
    assert check["Reachable"].state == "pass"
    assert check["TLS certificate"].state == "pass"  # the handshake got as far as a 401
    assert check["Token"].state == "fail" and "refused the token" in check["Token"].text
    assert "generate a new token" in check["Token"].hint
    assert steps["check"].state == "failed"
    assert "GPUs" not in check  # nothing read is claimed


def test_a_certificate_that_is_not_the_pinned_one_fails_the_pin_step():
    host = agent_host(agent_token="tok", agent_ca_cert=certificate_pem("127.0.0.1"))
    finished_check(
        host,
        "failed",
        "agent port 9100 answered; connection failed: cannot reach the agent at "
        "127.0.0.1:9100: [SSL: CERTIFICATE_VERIFY_FAILED] certificate verify failed",
    )
    steps = states(host)
    assert steps["pin"].state == "failed"
    assert "CERTIFICATE_VERIFY_FAILED" in steps["pin"].text
    assert results(steps["check"])["TLS certificate"].state == "fail"
    assert steps["check"].state == "failed"


def test_a_connected_check_lists_what_the_host_has():
    host = agent_host(
        agent_token="tok",
        agent_ca_cert=certificate_pem("127.0.0.1"),
        driver_version="550.54.15",
        cuda_version="12.4",
        telemetry_source="nvml",
        libraries={"vllm": "0.11.0", "torch": "2.8.0"},
    )
    make_gpu(host, index=0)
    make_gpu(host, index=1)
    finished_check(host, "connected", "agent on gpu-1: 2 GPU(s), telemetry from nvml")
    steps = states(host)
    assert [s.state for s in steps.values()] == ["done", "done", "done"]
    found = results(steps["check"])
    assert found["Token"].state == "pass"
    assert found["GPUs"].state == "pass" and "2 found" in found["GPUs"].text
    assert "NVIDIA H100 80GB HBM3 (80 GiB)" in found["GPUs"].text
    assert "driver 550.54.15, CUDA 12.4" in found["Driver / CUDA"].text
    assert found["Telemetry"].state == "pass"
    assert found["Engines"].state == "pass" and "vllm 0.11.0" in found["Engines"].text


def test_connected_without_nvml_says_why():
    host = agent_host(
        agent_token="tok",
        agent_tls=False,
        telemetry_source="none",
        telemetry_note="NVML unavailable: libnvidia-ml.so.1 not found",
    )
    finished_check(host, "connected", "agent on gpu-1: 0 GPU(s), telemetry from none")
    steps = states(host)
    found = results(steps["check"])
    assert found["GPUs"].state == "fail"
    assert found["Telemetry"].state == "fail" and "libnvidia-ml" in found["Telemetry"].text
    assert steps["check"].state == "failed"
    assert steps["pin"].state == "skipped"


def test_a_running_check_is_polled_and_a_finished_one_is_not(client, operator):
    host = agent_host(agent_token="tok")
    check = HostCheck.objects.create(host=host, status="running")
    client.force_login(operator)
    url = reverse("hosts:onboard_status", args=[host.pk])
    part = client.get(url).content.decode()
    assert 'data-running="true"' in part and "every 1s" in part
    assert 'id="step-state-check"' in part and 'hx-swap-oob="true"' in part
    check.status = "succeeded"
    check.outcome = "unreachable"
    check.reachable = False
    check.detail = "no answer from 127.0.0.1:9100 within 3 s"
    check.save()
    part = client.get(url).content.decode()
    assert 'data-running="false"' in part and "every 1s" not in part
    assert "no answer from 127.0.0.1:9100" in part


def test_the_host_page_links_to_the_setup_until_the_host_was_reached(client, operator, viewer):
    host = agent_host(agent_token="tok")
    client.force_login(operator)
    page = client.get(host.get_absolute_url()).content.decode()
    assert reverse("hosts:onboard", args=[host.pk]) in page
    client.force_login(viewer)
    assert 'data-testid="onboard-link"' not in client.get(host.get_absolute_url()).content.decode()
    Host.objects.filter(pk=host.pk).update(last_seen_at=timezone.now())
    client.force_login(operator)
    assert 'data-testid="onboard-link"' not in client.get(host.get_absolute_url()).content.decode()


# ---------------------------------------------------------------------------- the command


def test_the_install_command_uses_the_agents_own_flags():
    host = agent_host(address="10.0.0.5", port=9200)
    install = agent_install(host, "https://panel.example/hosts/1/agent.pyz?key=k", "tok-123")
    args = build_parser().parse_args(install.argv[2:])
    assert args.listen == ("0.0.0.0", 9200)
    assert str(args.token_file) == TOKEN_FILE
    assert args.tls_cert and args.tls_key
    # The unit runs the same command line.
    exec_start = next(x for x in install.unit.splitlines() if x.startswith("ExecStart="))
    argv = shlex.split(exec_start.removeprefix("ExecStart="))
    assert argv[1:] == install.argv
    build_parser().parse_args(argv[3:])
    assert "subjectAltName=IP:10.0.0.5" in install.script
    assert f"printf '%s\\n' tok-123 > {TOKEN_FILE}" in install.script
    assert "umask 077" in install.script.split("printf")[0]


def test_a_loopback_agent_without_tls_listens_on_loopback_only():
    host = agent_host(address="127.0.0.1", agent_tls=False)
    install = agent_install(host, "http://x/agent.pyz?key=k", None)
    args = build_parser().parse_args(install.argv[2:])
    assert args.listen == ("127.0.0.1", 9100) and args.tls_cert is None
    assert "openssl" not in install.script and "printf" not in install.script


def test_the_agent_download_needs_a_key_for_that_host(client):
    host = agent_host()
    other = agent_host()
    url = reverse("hosts:agent_download", args=[host.pk])
    assert client.get(url).status_code == 404
    assert client.get(url, {"key": download_key(other.pk)}).status_code == 404
    response = client.get(url, {"key": download_key(host.pk)})  # no login
    assert response.status_code == 200
    archive = zipfile.ZipFile(io.BytesIO(response.content))
    names = set(archive.namelist())
    assert {"__main__.py", "hosts/agent/server.py", "hosts/engines/launch.py"} <= names
    assert not any(n.startswith(("hosts/models", "hosts/views", "controlpanel")) for n in names)


# ---------------------------------------------------------------------------- pinning


def test_pasting_the_certificate_pins_it_and_keeps_the_fresh_token(client, operator):
    host = agent_host()
    client.force_login(operator)
    client.post(reverse("hosts:onboard_token", args=[host.pk]))
    pem = certificate_pem("127.0.0.1")
    response = client.post(reverse("hosts:onboard_pin", args=[host.pk]), {"pem": pem})
    assert response.status_code == 302
    host.refresh_from_db()
    assert "BEGIN CERTIFICATE" in host.agent_ca_cert
    assert host.credential_problem() == ""  # a first pin narrows trust: the token stays
    entry = AuditEntry.objects.get(action="host.pin_certificate")
    assert entry.actor == operator and entry.after["token_kept"] is True
    page = client.get(reverse("hosts:onboard", args=[host.pk])).content.decode()
    assert entry.after["agent_ca_cert_sha256"] in page


def test_replacing_a_pin_does_not_carry_the_token_over():
    host = agent_host(agent_token="tok", agent_ca_cert=certificate_pem("127.0.0.1"))
    pin_agent_certificate(None, host, certificate_pem("127.0.0.1"))
    host.refresh_from_db()
    assert host.credential_problem()  # the token must be generated again
    assert states(host)["install"].state == "failed"


def test_a_certificate_for_another_name_is_refused(client, operator):
    host = agent_host(agent_token="tok")
    with pytest.raises(OnboardingRefused, match="not 127.0.0.1"):
        pin_agent_certificate(operator, host, certificate_pem("gpu-9.example.com"))
    client.force_login(operator)
    response = client.post(
        reverse("hosts:onboard_pin", args=[host.pk]), {"pem": "not a cert"}, follow=True
    )
    assert "Not a PEM certificate" in response.content.decode()
    host.refresh_from_db()
    assert host.agent_ca_cert == "" and not AuditEntry.objects.exists()


def test_fetching_from_a_closed_port_says_what_to_do(client, operator):
    from tests.conftest import free_port

    host = agent_host(agent_token="tok", port=free_port())
    client.force_login(operator)
    response = client.post(reverse("hosts:onboard_fetch_certificate", args=[host.pk]), follow=True)
    assert "Is the agent running" in response.content.decode()


# ---------------------------------------------------------------------------- SSH


def test_a_generated_ssh_key_pair_shows_its_public_line(client, operator):
    host = make_host(transport="ssh", port=22, agent_token="", ssh_username="ops")
    client.force_login(operator)
    client.post(reverse("hosts:onboard_ssh_key", args=[host.pk]))
    host.refresh_from_db()
    key = paramiko.Ed25519Key.from_private_key(io.StringIO(host.ssh_private_key))
    line = f"ssh-ed25519 {key.get_base64()} "
    entry = AuditEntry.objects.get(action="host.ssh_key_generated")
    assert entry.after["public_key"].startswith(line)
    assert "PRIVATE" not in str(entry.after)
    page = client.get(reverse("hosts:onboard", args=[host.pk])).content.decode()
    assert line in page and "PRIVATE KEY" not in page
    assert host.credential_problem() == ""


def test_ssh_steps_follow_the_check():
    host = make_host(
        transport="ssh",
        port=22,
        agent_token="",
        ssh_username="ops",
        ssh_private_key="file:id_ed25519",
        ssh_offered_fingerprint="SHA256:" + "C" * 43,
        ssh_offered_key_type="ssh-ed25519",
    )
    finished_check(host, "host_key", "first contact: the host key is ssh-ed25519 SHA256:CCC")
    steps = states(host)
    assert steps["key"].state == "done" and steps["host_key"].state == "waiting"
    assert results(steps["check"])["Host key"].state == "warn"
    assert steps["check"].state == "failed"
    Host.objects.filter(pk=host.pk).update(
        ssh_host_key_fingerprint="SHA256:" + "C" * 43, ssh_offered_fingerprint=""
    )
    finished_check(host, "auth_failed", "credentials refused: ops@127.0.0.1:22 refused the key")
    steps = states(host)
    assert steps["host_key"].state == "done"
    login = results(steps["check"])["Login"]
    assert login.state == "fail" and "authorized_keys" in login.hint
