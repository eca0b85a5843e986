"""A real OpenSSH server on 127.0.0.1 for the SSH transport's tests: throwaway host and client
keys made by the real ``ssh-keygen``, its own config, pid file and log in a temp directory."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

from tests.conftest import free_port

SSHD = "/usr/sbin/sshd"  # sshd re-executes itself and insists on an absolute path
SSH_KEYGEN = shutil.which("ssh-keygen") or "/usr/bin/ssh-keygen"
SFTP_SERVERS = ("/usr/lib/openssh/sftp-server", "/usr/libexec/openssh/sftp-server")


def available() -> str | None:
    """None when sshd and ssh-keygen are here, else what is missing."""
    missing = [p for p in (SSHD, SSH_KEYGEN) if not os.access(p, os.X_OK)]
    return f"{' and '.join(missing)} (openssh-server / openssh-client)" if missing else None


def keygen(path: Path, kind: str = "ed25519", passphrase: str = "", *extra: str) -> Path:
    """A key pair at ``path`` / ``path.pub`` made by ``ssh-keygen``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    for stale in (path, path.with_name(path.name + ".pub")):
        stale.unlink(missing_ok=True)
    subprocess.run(
        [SSH_KEYGEN, "-q", "-t", kind, "-N", passphrase, "-C", f"test-{path.name}", "-f", path]
        + list(extra),
        check=True,
        capture_output=True,
    )
    return path


def fingerprint(public_key: Path) -> str:
    """What ``ssh-keygen -lf`` prints for the key: ``256 SHA256:… comment (ED25519)`` → the
    ``SHA256:…`` word, the value an admin compares by eye."""
    out = subprocess.run(
        [SSH_KEYGEN, "-lf", public_key], check=True, capture_output=True, text=True
    ).stdout
    return out.split()[1]


class Sshd:
    """``sshd -D -e`` with a config of its own. ``extra`` adds config lines (e.g.
    ``AllowTcpForwarding no``); ``restart(host_key=…)`` brings it back on the same port."""

    def __init__(self, root: Path, authorized_keys: list[Path], host_key: Path, extra=()):
        self.root = root
        self.port = free_port()
        self.host_key = host_key
        self.extra = list(extra)
        self.authorized = root / "authorized_keys"
        self.authorized.write_text("".join(k.read_text() for k in authorized_keys))
        self.log_path = root / "sshd.log"
        self.proc: subprocess.Popen | None = None

    def config(self) -> Path:
        sftp = next((p for p in SFTP_SERVERS if os.path.exists(p)), "internal-sftp")
        lines = [
            f"Port {self.port}",
            "ListenAddress 127.0.0.1",
            f"HostKey {self.host_key}",
            f"AuthorizedKeysFile {self.authorized}",
            "PubkeyAuthentication yes",
            "PasswordAuthentication no",
            "KbdInteractiveAuthentication no",
            "UsePAM no",
            "StrictModes no",  # the temp directory's owner and modes are the test runner's
            f"PidFile {self.root / 'sshd.pid'}",
            "PermitRootLogin prohibit-password",  # CI runs the tests as root
            f"Subsystem sftp {sftp}",
            "LogLevel VERBOSE",  # "Accepted publickey for …" shows who got in
            *self.extra,
        ]
        path = self.root / "sshd_config"
        path.write_text("\n".join(lines) + "\n")
        return path

    def start(self) -> Sshd:
        if os.geteuid() == 0:
            Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # privilege separation dir
        config = self.config()
        check = subprocess.run([SSHD, "-t", "-f", config], capture_output=True, text=True)
        if check.returncode != 0:
            raise RuntimeError(f"sshd rejects the test config: {check.stderr}")
        self._log = self.log_path.open("ab")
        self.proc = subprocess.Popen(
            [SSHD, "-D", "-e", "-f", config],
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"sshd exited {self.proc.returncode}: {self.log()}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1) as sock:
                    if sock.recv(64).startswith(b"SSH-2.0-"):
                        return self
            except OSError:
                time.sleep(0.05)
        raise RuntimeError(f"sshd never answered on port {self.port}: {self.log()}")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            # The listener's group: per-connection children have sessions of their own and
            # end when their client goes away.
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=5)
        if self.proc is not None:
            self._log.close()
        self.proc = None

    def restart(self, host_key: Path | None = None) -> Sshd:
        self.stop()
        if host_key is not None:
            self.host_key = host_key
        return self.start()

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""
