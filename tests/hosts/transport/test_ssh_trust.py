"""Trust and reachability over SSH, against a real OpenSSH server on localhost: host keys
checked against the fingerprint ``ssh-keygen -lf`` prints, before any authentication or
command; key-only authentication; timeouts; names refused before anything is sent."""

from __future__ import annotations

import logging
import os
import socket
import time

import pytest

from hosts.transport.base import AuthError, HostKeyMismatch, HostKeyUnknown, TransportError
from hosts.transport.ssh import SshTransport, fetch_host_key
from tests.conftest import free_port
from tests.hosts.transport.conftest import PASSPHRASE
from tests.hosts.transport.sshd import fingerprint

pytestmark = pytest.mark.integration


def pub(path):
    return path.with_name(path.name + ".pub")


def accepted(log_text: str) -> int:
    return log_text.count("Accepted publickey")


def test_fetch_host_key_reports_what_ssh_keygen_prints(sshd, ssh_keys):
    before = sshd.log()
    fp, key_type = fetch_host_key("127.0.0.1", sshd.port, timeout=5)
    assert fp == fingerprint(pub(ssh_keys.host))  # the real `ssh-keygen -lf` output
    assert fp.startswith("SHA256:") and not fp.endswith("=")
    assert key_type == "ssh-ed25519"
    assert accepted(sshd.log()) == accepted(before)  # looked at the key, never logged in


def test_an_unknown_host_key_is_refused_before_authenticating_or_running(
    make_ssh, sshd, ssh_keys, tmp_path
):
    transport = make_ssh(host_key_fingerprint=None)
    marker = tmp_path / "marker"
    before = sshd.log()
    with pytest.raises(HostKeyUnknown) as caught:
        transport._exec(f"touch {marker}")
    assert caught.value.fingerprint == fingerprint(pub(ssh_keys.host))
    assert caught.value.key_type == "ssh-ed25519"
    assert "an admin must accept it" in str(caught.value)
    with pytest.raises(HostKeyUnknown):
        transport.info()
    time.sleep(0.2)  # sshd logs asynchronously
    assert not marker.exists()
    assert accepted(sshd.log()) == accepted(before)


def test_the_accepted_key_lets_commands_run(make_ssh, ssh_keys, tmp_path):
    # Pasting the whole `ssh-keygen -lf` line is accepted as well as the bare fingerprint.
    line = f"256 {fingerprint(pub(ssh_keys.host))} root@gpu-07 (ED25519)"
    transport = make_ssh(host_key_fingerprint=line)
    info = transport.info()
    assert info["kind"] == "ssh" and info["agent_version"] is None
    assert info["hostname"] == socket.gethostname()
    assert info["telemetry_source"] == "none"  # no nvidia-smi and no simulators here
    assert "ssh-ed25519" in info["detail"] and "OpenSSH" in info["detail"]
    marker = tmp_path / "ran"
    assert transport._exec(f"touch {marker}").rc == 0
    assert marker.exists()


def test_a_changed_host_key_is_refused_loudly(fresh_sshd, make_ssh, ssh_keys, caplog):
    server = fresh_sshd()
    transport = make_ssh(server=server)
    assert transport.info()["kind"] == "ssh"
    old = fingerprint(pub(ssh_keys.host))
    transport.close()
    server.restart(host_key=ssh_keys.other_host)  # reinstalled server, or an impostor
    before = server.log()
    with caplog.at_level(logging.ERROR, logger="hosts.transport.ssh"):
        with pytest.raises(HostKeyMismatch) as caught:
            transport.info()  # the same transport reconnecting
    assert caught.value.expected == old
    assert caught.value.presented == fingerprint(pub(ssh_keys.other_host))
    assert "HOST KEY CHANGED" in str(caught.value)
    assert any("HOST KEY CHANGED" in r.getMessage() for r in caplog.records)
    with pytest.raises(HostKeyMismatch):
        make_ssh(server=server, host_key_fingerprint=old).telemetry()
    time.sleep(0.2)
    assert accepted(server.log()) == accepted(before)  # our key was never offered


def test_a_key_the_server_does_not_know_is_an_auth_error(make_ssh, ssh_keys):
    with pytest.raises(AuthError, match="refused the SSH key"):
        make_ssh(key=ssh_keys.stranger).info()


def test_an_encrypted_key_needs_its_passphrase(make_ssh, ssh_keys):
    with pytest.raises(AuthError, match="passphrase"):
        make_ssh(key=ssh_keys.encrypted).info()
    with pytest.raises(AuthError):
        make_ssh(key=ssh_keys.encrypted, passphrase="wrong").info()
    assert make_ssh(key=ssh_keys.encrypted, passphrase=PASSPHRASE).info()["kind"] == "ssh"


def test_rsa_keys_in_pem_format_work(make_ssh, ssh_keys):
    assert make_ssh(key=ssh_keys.rsa_pem).info()["kind"] == "ssh"


def test_text_that_is_no_key_is_an_auth_error(make_ssh):
    with pytest.raises(AuthError, match="no SSH private key"):
        make_ssh(private_key="hunter2").info()


def test_one_connection_serves_many_calls(make_ssh, sshd):
    transport = make_ssh()
    before = accepted(sshd.log())
    for _ in range(3):
        transport.info()
        transport.logs("some-engine")
    time.sleep(0.2)
    assert accepted(sshd.log()) == before + 1
    transport.close()
    transport.info()  # closed → a new connection on the next call
    time.sleep(0.2)
    assert accepted(sshd.log()) == before + 2


def test_nothing_listening_is_a_transport_error_naming_the_address(make_ssh, sshd):
    port = free_port()
    transport = make_ssh(port=port)
    with pytest.raises(TransportError, match=f"cannot reach 127.0.0.1:{port}: Connection refused"):
        transport.info()


def test_a_server_that_never_speaks_ssh_times_out(make_ssh, listener):
    transport = make_ssh(port=listener, connect_timeout=1.0)
    started = time.monotonic()
    with pytest.raises(TransportError, match="SSH handshake with 127.0.0.1"):
        transport.info()
    assert time.monotonic() - started < 5


def test_each_command_has_a_time_limit(make_ssh):
    transport = make_ssh()
    started = time.monotonic()
    with pytest.raises(TransportError, match="did not finish within 0.5 s"):
        transport._exec("sleep 5", timeout=0.5, what="sleeping")
    assert time.monotonic() - started < 3
    assert transport._exec("echo still here").out == "still here\n"


def test_quoting_survives_paths_with_spaces_and_quotes(make_ssh, tmp_path):
    odd = tmp_path / "it's a dir"
    transport = make_ssh(remote_dir=str(tmp_path / "remote"))
    from hosts.transport.ssh import MKDIR_SCRIPT, sh

    assert transport._exec(sh(MKDIR_SCRIPT, odd)).rc == 0
    assert odd.is_dir() and oct(odd.stat().st_mode & 0o777) == "0o700"


BAD_NAMES = ["", "Engine", "-rf", "a;touch x", "a b", "$(reboot)", "a/../b", "x" * 64, "é"]


@pytest.mark.parametrize("name", BAD_NAMES)
def test_bad_engine_names_are_refused_before_anything_is_sent(name, ssh_keys):
    # Nothing listens on this port: any attempt to connect would say "cannot reach".
    transport = SshTransport(
        "127.0.0.1",
        free_port(),
        "root",
        private_key=ssh_keys.client.read_text(),
        host_key_fingerprint=None,
    )
    for call in (
        lambda: transport.engine_status(name),
        lambda: transport.logs(name),
        lambda: transport.stop_engine(name),
        lambda: transport.restart_engine(name, ready_timeout_s=1),
    ):
        with pytest.raises(TransportError, match="invalid engine name"):
            call()


@pytest.mark.parametrize(
    "option",
    [
        {"remote_dir": "/tmp/x; rm -rf /"},
        {"remote_dir": "relative/dir"},
        {"python": "python3 -c 'import os'"},
        {"workdir": "$(id)"},
        {"nvidia_smi": "-nvidia-smi"},
        {"systemctl": ["sudo", "systemctl && reboot"]},
        {"launch_style": "ansible"},
    ],
)
def test_options_that_could_reach_a_shell_are_refused(option, ssh_keys):
    with pytest.raises(TransportError):
        SshTransport(
            "127.0.0.1",
            22,
            "root",
            private_key=ssh_keys.client.read_text(),
            host_key_fingerprint=None,
            **option,
        )


def test_a_remote_dir_under_home_resolves_on_the_host(make_ssh):
    transport = make_ssh(remote_dir="~/.llm-panel")
    assert transport.remote_dir() == os.path.expanduser("~") + "/.llm-panel"
