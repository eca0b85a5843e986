"""Start the real agent as a subprocess and talk to it over HTTP, as the panel does."""

from __future__ import annotations

import datetime
import ipaddress
import os
import secrets
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import psutil
import pytest

ROOT = Path(__file__).resolve().parents[3]
LLAMA = "meta-llama/Llama-3.1-8B-Instruct"


class AgentProcess:
    """``python -m hosts.agent`` on a free port; stderr (its log) goes to a file. A test's agent
    owns its engines' lifetime, as the demo fleet's does (``--stop-engines-on-exit``: an engine
    it was starting as the test ended is stopped with it, never left behind), unless
    ``keep_engines`` (the production default, for the tests of a restart that keeps them)."""

    def __init__(
        self,
        tmp: Path,
        *args: str,
        token: str | None = None,
        scheme: str = "http",
        keep_engines: bool = False,
    ):
        self.token = token or secrets.token_urlsafe(32)
        self.token_file = tmp / "token"
        self.token_file.write_text(self.token + "\n")
        self.token_file.chmod(0o600)
        self.state_dir = tmp / "state"
        self.log_path = tmp / "agent.log"
        self.args = [
            "--listen",
            "127.0.0.1:0",
            "--token-file",
            str(self.token_file),
            "--state-dir",
            str(self.state_dir),
            *args,
        ]
        if not keep_engines and "--stop-engines-on-exit" not in args:
            self.args.append("--stop-engines-on-exit")
        self.scheme = scheme
        self.proc: subprocess.Popen | None = None
        self.url = ""

    def start(self, timeout: float = 20) -> AgentProcess:
        self._log = open(self.log_path, "wb")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "hosts.agent", *self.args],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=self._log,
            text=True,
        )
        line: list[str] = []
        reader = threading.Thread(target=lambda: line.append(self.proc.stdout.readline()))
        reader.daemon = True
        reader.start()
        reader.join(timeout)
        if not line or not line[0].startswith("agent listening on "):
            self.stop()
            raise AssertionError(f"the agent did not start: {line!r}\n{self.log()}")
        address = line[0].split()[-1]
        self.port = int(address.rsplit(":", 1)[1])
        self.url = f"{self.scheme}://127.0.0.1:{self.port}"
        return self

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def client(self, token: str | None = None, **kwargs) -> httpx.Client:
        token = self.token if token is None else token
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        return httpx.Client(base_url=self.url, headers=headers, timeout=15, **kwargs)

    def descendants(self) -> list[psutil.Process]:
        """The agent's engine processes (and their children), as the OS sees them."""
        try:
            return psutil.Process(self.proc.pid).children(recursive=True)
        except psutil.Error:
            return []

    def terminate(self, timeout: float = 30) -> int:
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout)

    def stop(self) -> None:
        """Stop the agent and anything it started, whatever state the test left them in."""
        if self.proc is None:
            return
        children = self.descendants()
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        for child in children:
            try:
                os.killpg(child.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            try:
                child.kill()
            except psutil.Error:
                pass
        self._log.close()


@pytest.fixture
def start_agent(tmp_path_factory):
    """``start_agent(*args)`` → a running AgentProcess, stopped (with its engines) afterwards."""
    agents: list[AgentProcess] = []

    def start(*args: str, **kwargs) -> AgentProcess:
        agent = AgentProcess(tmp_path_factory.mktemp("agent"), *args, **kwargs)
        agents.append(agent)
        return agent.start()

    yield start
    for agent in agents:
        agent.stop()


def wait_operation(client: httpx.Client, op_id: str, timeout: float = 30) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        op = client.get(f"/v1/operations/{op_id}").json()
        if op["state"] != "running":
            return op
        assert time.monotonic() < deadline, f"operation still running: {op}"
        time.sleep(0.05)


def self_signed(tmp_path):
    """A self-signed certificate for 127.0.0.1 and its key (PEM files), to serve TLS."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "agent.test")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = tmp_path / "cert.pem", tmp_path / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    key_path.chmod(0o600)
    return cert_path, key_path
