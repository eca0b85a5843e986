"""A fixed-latency server process per test (the load generator's ruler)."""

import subprocess
import sys

import httpx
import pytest

from tests.hosts.simulator.conftest import sim_server  # noqa: F401 - shared fixture
from tests.integration.processes import ROOT


class FixedServer:
    def __init__(self, *args: str):
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "benchmarks.loadgen.testserver", *args],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        line = self.proc.stdout.readline()
        assert line.startswith("listening on"), line
        self.port = int(line.rsplit(":", 1)[1])
        self.url = f"http://127.0.0.1:{self.port}"

    def stats(self) -> dict:
        """The server's /stats (see benchmarks/loadgen/testserver.py)."""
        return httpx.get(self.url + "/stats", timeout=30).json()

    def stop(self):
        self.proc.terminate()
        self.proc.wait(10)


@pytest.fixture
def fixed_server():
    servers = []

    def start(
        ttft_ms=20.0, itl_ms=5.0, mode="ok", error_every=0, record_tokens=False, exit_after=0
    ):
        server = FixedServer(
            "--ttft-ms",
            str(ttft_ms),
            "--itl-ms",
            str(itl_ms),
            "--mode",
            mode,
            "--error-every",
            str(error_every),
            "--exit-after",
            str(exit_after),
            *(["--record-tokens"] if record_tokens else []),
        )
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.stop()
