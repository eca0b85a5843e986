"""Secrets at rest: agent tokens and SSH keys are encrypted in the database and never shown."""

import pytest
from cryptography.fernet import Fernet
from django.db import connection
from django.urls import reverse

from controlpanel import crypto
from hosts.models import Host
from hosts.services import transports
from hosts.transport.base import TransportError
from tests.factories import make_host, ssh_private_key

pytestmark = [pytest.mark.django_db, pytest.mark.sqlite]


def stored(host, column):
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT {column} FROM hosts_host WHERE id = %s", [host.pk])  # noqa: S608
        return cursor.fetchone()[0]


def test_secrets_are_stored_encrypted_and_read_back_plain():
    key = ssh_private_key()
    host = make_host(agent_token="tok-123-abc", ssh_private_key=key, ssh_key_passphrase="pp")
    raw = stored(host, "agent_token")
    assert raw.startswith("enc:v1:") and "tok-123-abc" not in raw
    assert "PRIVATE KEY" not in stored(host, "ssh_private_key")
    again = Host.objects.get(pk=host.pk)
    assert again.agent_token == "tok-123-abc" and again.ssh_private_key == key
    assert again.ssh_key_passphrase == "pp"
    # Each encryption is fresh (random IV): equal secrets do not look equal on disk.
    other = make_host(agent_token="tok-123-abc")
    assert stored(other, "agent_token") != raw


def test_configured_keys_rotate(settings):
    old, new = Fernet.generate_key().decode(), Fernet.generate_key().decode()
    settings.PANEL_ENCRYPTION_KEYS = [old]
    host = make_host(agent_token="rotate-me")
    settings.PANEL_ENCRYPTION_KEYS = [new, old]  # new key first: still reads the old
    host = Host.objects.get(pk=host.pk)
    assert host.agent_token == "rotate-me"
    host.save()  # re-encrypted with the new key
    settings.PANEL_ENCRYPTION_KEYS = [new]
    assert Host.objects.get(pk=host.pk).agent_token == "rotate-me"


def test_an_unreadable_secret_is_kept_and_refused_as_a_credential(settings):
    settings.PANEL_ENCRYPTION_KEYS = [Fernet.generate_key().decode()]
    host = make_host(agent_token="lost")
    before = stored(host, "agent_token")
    settings.PANEL_ENCRYPTION_KEYS = [Fernet.generate_key().decode()]  # the old key is gone
    host = Host.objects.get(pk=host.pk)
    assert host.agent_token and host.has_credentials  # set, but unreadable
    host.save()
    assert stored(host, "agent_token") == before  # saving did not destroy it
    with pytest.raises(TransportError, match="cannot be decrypted"):
        transports.transport_for(host)
    with pytest.raises(crypto.DecryptionError):
        crypto.reveal(host.agent_token)


def test_forms_never_send_secrets_back(client, operator):
    host = make_host(agent_token="never-shown-token")
    client.force_login(operator)
    page = client.get(reverse("hosts:edit", args=[host.pk])).content.decode()
    assert "never-shown-token" not in page
    assert "enc:v1:" not in page


def test_ssh_form_validates_the_key(client, operator):
    client.force_login(operator)
    data = {
        "name": "ssh-box",
        "address": "10.0.0.7",
        "transport": "ssh",
        "ssh_username": "ops",
        "ssh_private_key": "-----BEGIN OPENSSH PRIVATE KEY-----\nnot a key\n",
        "hourly_price": "1",
    }
    page = client.post(reverse("hosts:create"), data).content.decode()
    assert "Not a private key paramiko can read" in page
    assert not Host.objects.filter(name="ssh-box").exists()
    data["ssh_username"] = "root; rm -rf /"
    data["ssh_private_key"] = ssh_private_key()
    page = client.post(reverse("hosts:create"), data).content.decode()
    assert "is not a POSIX user name" in page
    data["ssh_username"] = "ops"
    response = client.post(reverse("hosts:create"), data)
    host = Host.objects.get(name="ssh-box")
    assert response.status_code == 302 and host.port == 22
    assert host.ssh_private_key == data["ssh_private_key"]
    assert host.ssh_host_key_fingerprint == ""  # accepted only by an admin, after first contact


def test_moving_an_ssh_host_forgets_its_accepted_key(client, operator):
    host = make_host(
        transport="ssh",
        port=22,
        ssh_username="ops",
        ssh_private_key=ssh_private_key(),
        ssh_host_key_fingerprint="SHA256:" + "A" * 43,
    )
    client.force_login(operator)
    client.post(
        reverse("hosts:edit", args=[host.pk]),
        {
            "name": host.name,
            "address": "10.9.9.9",
            "transport": "ssh",
            "port": "22",
            "ssh_username": "ops",
            "ssh_private_key": ssh_private_key(),  # a new destination: entered again
            "hourly_price": "1",
        },
    )
    host.refresh_from_db()
    assert host.address == "10.9.9.9" and host.ssh_host_key_fingerprint == ""


def test_accepting_a_host_key_needs_the_fingerprint_that_was_shown(client, admin, operator):
    host = make_host(
        transport="ssh",
        port=22,
        ssh_username="ops",
        ssh_private_key=ssh_private_key(),
        ssh_offered_fingerprint="SHA256:" + "B" * 43,
    )
    url = reverse("hosts:accept_key", args=[host.pk])
    client.force_login(operator)
    assert client.post(url, {"fingerprint": "SHA256:" + "B" * 43}).status_code == 403
    client.force_login(admin)
    client.post(url, {"fingerprint": "SHA256:" + "C" * 43})  # not what the host offered
    host.refresh_from_db()
    assert host.ssh_host_key_fingerprint == ""
    client.post(url, {"fingerprint": "SHA256:" + "B" * 43})
    host.refresh_from_db()
    assert host.ssh_host_key_fingerprint == "SHA256:" + "B" * 43
    assert host.ssh_offered_fingerprint == ""


def test_an_operation_uses_its_deployments_launch_style():
    """Over SSH the transport launches the way the deployment says, not the host's mix."""
    from tests.factories import make_deployment

    host = make_host(
        transport="ssh", port=22, ssh_username="ops", ssh_private_key=ssh_private_key()
    )
    docker = make_deployment(host, launch_style="docker", docker_image="vllm/vllm-openai:v0.11.0")
    make_deployment(host, launch_style="systemd")
    with transports.transport_for(host, docker) as transport:
        assert transport.launch_style == "docker"
        assert transport.docker_image == "vllm/vllm-openai:v0.11.0"
    with transports.transport_for(host) as transport:
        assert transport.launch_style == "process"  # mixed styles: reading needs no style
