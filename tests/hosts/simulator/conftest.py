"""Start simulated engines as real processes, the way the panel will start them."""

from __future__ import annotations

import subprocess
import sys
import time

import httpx
import pytest

from tests.conftest import free_port
from tests.integration.processes import ROOT

LLAMA = "meta-llama/Llama-3.1-8B-Instruct"
QWEN = "Qwen/Qwen2.5-7B-Instruct"


def run_cli(*args: str, timeout: float = 30) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "hosts.simulator", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


class SimServer:
    def __init__(self, engine: str, args: list[str]):
        self.port = free_port()
        self.engine = engine
        model_args = [LLAMA] if engine == "vllm" else ["--model-path", QWEN]
        self.model = LLAMA if engine == "vllm" else QWEN
        cmd = [
            sys.executable,
            "-m",
            "hosts.simulator",
            engine,
            *model_args,
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            *args,
        ]
        self.proc = subprocess.Popen(
            cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        self.url = f"http://127.0.0.1:{self.port}"

    def wait_listening(self, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"simulator exited: {self.proc.stdout.read()}")
            try:
                httpx.get(self.url + "/health", timeout=1)
                return
            except httpx.TransportError:
                time.sleep(0.05)
        raise AssertionError("simulator never listened")

    def wait_ready(self, timeout: float = 30) -> None:
        self.wait_listening(timeout)
        deadline = time.monotonic() + timeout
        while httpx.get(self.url + "/health").status_code != 200:
            assert time.monotonic() < deadline, "never became healthy"
            time.sleep(0.05)

    def stop(self) -> str:
        self.proc.terminate()
        try:
            out, _ = self.proc.communicate(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            out, _ = self.proc.communicate()
        return out


def _servers():
    """``start(engine, *args, ready=True)``, and every server it started stopped after."""
    started: list[SimServer] = []

    def start(engine: str = "vllm", *args: str, ready: bool = True) -> SimServer:
        server = SimServer(engine, list(args))
        started.append(server)
        if ready:
            server.wait_ready()
        return server

    yield start
    for server in started:
        server.stop()


@pytest.fixture
def sim_server():
    """Simulators of the test's own: to stop, restart, or read counters from zero."""
    yield from _servers()


@pytest.fixture(scope="module")
def module_sim_server():
    """Simulators a module's tests share: for tests that only send requests and read what
    comes back (each starts in ~1 s of CPU; a module of such tests starts one per engine)."""
    yield from _servers()
