"""Fixtures for the transports: a real sshd on localhost with throwaway keys, SSH transports
pointed at it, and cleanup of every engine process the tests start (even when a test fails)."""

from __future__ import annotations

import contextlib
import getpass
import os
import signal
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conftest import need
from tests.hosts.transport import sshd as sshd_mod

PASSPHRASE = "correct horse battery staple"


@dataclass
class Keys:
    client: Path  # authorized
    stranger: Path  # a valid key the server does not know
    encrypted: Path  # authorized, protected by PASSPHRASE
    rsa_pem: Path  # authorized, RSA in the old PEM format
    host: Path  # the server's host key
    other_host: Path  # a different host key (a reinstalled server, or an impostor)


@pytest.fixture(scope="session")
def ssh_keys(tmp_path_factory) -> Keys:
    problem = sshd_mod.available()
    need(problem is None, f"OpenSSH for the SSH transport tests ({problem})")
    root = tmp_path_factory.mktemp("ssh-keys")
    return Keys(
        client=sshd_mod.keygen(root / "client"),
        stranger=sshd_mod.keygen(root / "stranger"),
        encrypted=sshd_mod.keygen(root / "encrypted", "ed25519", PASSPHRASE),
        rsa_pem=sshd_mod.keygen(root / "rsa", "rsa", "", "-b", "2048", "-m", "PEM"),
        host=sshd_mod.keygen(root / "host"),
        other_host=sshd_mod.keygen(root / "other-host"),
    )


def _pub(key: Path) -> Path:
    return key.with_name(key.name + ".pub")


def start_sshd(root: Path, keys: Keys, extra=()) -> sshd_mod.Sshd:
    authorized = [_pub(keys.client), _pub(keys.encrypted), _pub(keys.rsa_pem)]
    root.mkdir(parents=True, exist_ok=True)
    return sshd_mod.Sshd(root, authorized, keys.host, extra).start()


@pytest.fixture(scope="session")
def sshd(tmp_path_factory, ssh_keys):
    server = start_sshd(tmp_path_factory.mktemp("sshd"), ssh_keys)
    yield server
    server.stop()


@pytest.fixture
def fresh_sshd(tmp_path, ssh_keys):
    """An sshd of the test's own (to restart, or to configure differently)."""
    servers = []

    def start(extra=()):
        server = start_sshd(tmp_path / f"sshd-{len(servers)}", ssh_keys, extra)
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.stop()


def _kill_leftovers(remote_dir: Path) -> None:
    """Engines a failed test left running: their process groups, by the ids in our pid files."""
    for pid_file in remote_dir.glob("*/engine.pid"):
        with contextlib.suppress(ValueError, OSError):
            os.killpg(int(pid_file.read_text().strip()), signal.SIGKILL)


@pytest.fixture
def make_ssh(tmp_path, sshd, ssh_keys):
    """``make_ssh(**overrides)`` → an SshTransport on the session's sshd with the accepted host
    key and this venv's python as the remote interpreter (the panel is installed into it, so
    ``python -m hosts.simulator`` imports from any working directory)."""
    from hosts.transport.ssh import SshTransport

    made: list[tuple[SshTransport, Path]] = []

    def make(server=None, key: Path | None = None, **overrides) -> SshTransport:
        server = server or sshd
        remote_dir = Path(overrides.pop("remote_dir", tmp_path / f"remote-{len(made)}"))
        options = dict(
            address="127.0.0.1",
            port=server.port,
            username=getpass.getuser(),
            private_key=(key or ssh_keys.client).read_text(),
            host_key_fingerprint=sshd_mod.fingerprint(_pub(server.host_key)),
            remote_dir=str(remote_dir),
            python=sys.executable,
            connect_timeout=5.0,
            command_timeout=20.0,
            stop_grace_s=5.0,
        )
        options.update(overrides)
        transport = SshTransport(**options)
        made.append((transport, remote_dir))
        return transport

    yield make
    for transport, remote_dir in made:
        with contextlib.suppress(Exception):
            if transport.launch_style == "process" and remote_dir.exists():
                for engine in remote_dir.iterdir():
                    if (engine / "engine.pid").exists():
                        transport.stop_engine(engine.name)
        transport.close()
        _kill_leftovers(remote_dir)
