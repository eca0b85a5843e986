"""AgentTransport against the real host agent (``python -m hosts.agent --simulate``) started as
a process: shapes, tokens, TLS, unreachable and non-agent servers, apply → ready, an
infeasible config → rolled back with the engine's error lines."""

from __future__ import annotations

import http.server
import re
import secrets
import sys
import threading
import time

import httpx
import pytest

from hosts.engines.launch import LaunchConfig
from hosts.transport.agent import AgentTransport
from hosts.transport.base import AuthError, TransportError
from tests.conftest import free_port
from tests.hosts.agent.conftest import self_signed
from tests.integration.processes import Process

pytestmark = pytest.mark.integration

LLAMA = "meta-llama/Llama-3.1-8B-Instruct"
NO_KV_MEMORY = "No available memory for the cache blocks"


def start_agent(tmp_path, *extra: str) -> tuple[Process, int, str]:
    token = secrets.token_urlsafe(24)
    token_file = tmp_path / "token"
    token_file.write_text(token + "\n")
    token_file.chmod(0o600)
    cmd = [sys.executable, "-m", "hosts.agent", "--listen", "127.0.0.1:0"]
    cmd += ["--token-file", str(token_file), "--simulate", "h100-sxm:1"]
    cmd += ["--state-dir", str(tmp_path / "state"), *extra]
    proc = Process("agent", cmd, env=None, logdir=tmp_path)
    proc.wait_for_output("agent listening on", timeout=30)
    port = int(re.search(r"agent listening on 127\.0\.0\.1:(\d+)", proc.output()).group(1))
    return proc, port, token


@pytest.fixture
def agent(tmp_path):
    proc, port, token = start_agent(tmp_path)
    yield port, token
    proc.stop()  # SIGTERM: the agent stops its engines before it exits


@pytest.fixture
def client(agent):
    port, token = agent
    transport = AgentTransport("127.0.0.1", port, token, timeout=10)
    yield transport
    transport.close()


def simulated(port: int, **overrides) -> LaunchConfig:
    values = dict(
        engine="vllm",
        model=LLAMA,
        settings={},
        port=port,
        host="127.0.0.1",
        runner="simulator",
        simulator={"gpu": "h100-sxm", "startup_seconds": 0.5},
    )
    values.update(overrides)
    return LaunchConfig(**values)


def test_info_inventory_and_telemetry_shapes(client):
    info = client.info()
    assert info["kind"] == "agent" and info["agent_version"]
    assert info["telemetry_source"] == "simulator" and "simulated GPUs" in info["detail"]
    inventory = client.inventory()
    for key in ("hostname", "driver_version", "cuda_version", "cpu_count", "cpu_model"):
        assert key in inventory
    assert inventory["source"] == "simulator" and len(inventory["gpus"]) == 1
    assert set(inventory["gpus"][0]) >= {"index", "uuid", "name", "memory_total_bytes"}
    sample = client.telemetry()
    assert sample["source"] == "simulator" and sample["time"] == pytest.approx(time.time(), abs=30)
    gpu = sample["gpus"][0]
    assert gpu["name"] == "NVIDIA H100 80GB HBM3" and isinstance(gpu["missing"], list)
    assert set(sample["host"]) >= {"cpu_percent", "load_avg", "memory_total_bytes"}
    assert sample["engines"] == {}


def test_a_wrong_token_is_an_auth_error(agent):
    port, _ = agent
    with AgentTransport("127.0.0.1", port, "not-the-token") as transport:
        with pytest.raises(AuthError, match="refused the token"):
            transport.info()


def test_nothing_listening_is_a_transport_error_with_the_address():
    port = free_port()
    with AgentTransport("127.0.0.1", port, "t", timeout=2) as transport:
        with pytest.raises(TransportError, match=f"127.0.0.1:{port}.*Connection refused"):
            transport.info()


def test_a_silent_server_times_out(listener):
    with AgentTransport("127.0.0.1", listener, "t", timeout=0.5) as transport:
        started = time.monotonic()
        with pytest.raises(TransportError, match="did not answer within 0.5 s"):
            transport.telemetry()
        assert time.monotonic() - started < 5


class _NotAnAgent(http.server.BaseHTTPRequestHandler):
    def do_GET(self):  # noqa: N802 - the base class's name
        body = b"<html><body>It works!</body></html>"
        self.send_response(200)
        self.send_header("Content-Type", "text/html")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


def test_a_server_that_is_not_the_agent_is_named_as_such():
    server = http.server.HTTPServer(("127.0.0.1", 0), _NotAnAgent)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        with AgentTransport("127.0.0.1", server.server_port, "t") as transport:
            with pytest.raises(TransportError, match="without a JSON object.*It works"):
                transport.info()
    finally:
        server.shutdown()
        server.server_close()


def test_ipv6_addresses_get_brackets():
    transport = AgentTransport("fd00::7", 9100, "t")
    assert transport.where == "[fd00::7]:9100"
    assert str(transport._client.base_url) == "http://[fd00::7]:9100"
    transport.close()


def test_apply_good_then_infeasible_rolls_back_with_the_engines_error(client):
    port = free_port()
    good = simulated(port)
    outcome = client.apply_config("llama", good, previous=None, ready_timeout_s=30)
    assert outcome.state == "ready", outcome
    assert httpx.get(f"http://127.0.0.1:{port}/v1/models").status_code == 200
    status = client.engine_status("llama")
    assert status["state"] == "ready" and status["config"]["model"] == LLAMA
    assert client.telemetry()["engines"]["llama"]["state"] == "ready"

    bad = simulated(port, settings={"gpu_memory_utilization": 0.1})
    outcome = client.apply_config("llama", bad, previous=good, ready_timeout_s=30)
    assert outcome.state == "rolled_back", outcome
    assert any(NO_KV_MEMORY in line for line in outcome.log_lines), outcome.log_lines
    assert outcome.detail["operation"] and outcome.detail["kind"] == "apply"
    assert httpx.get(f"http://127.0.0.1:{port}/v1/models").status_code == 200

    assert client.restart_engine("llama", ready_timeout_s=30).state == "ready"
    assert client.logs("llama", 5)
    client.stop_engine("llama")
    assert client.engine_status("llama")["state"] == "stopped"


def test_engines_that_were_never_deployed(client):
    assert client.engine_status("ghost")["state"] == "stopped"
    assert client.logs("ghost") == []
    client.stop_engine("ghost")  # nothing to stop is not an error
    with pytest.raises(TransportError, match="invalid engine name"):
        client.engine_status("../v1/info")


def test_tls_is_verified_against_the_given_ca(tmp_path):
    cert, key = self_signed(tmp_path)
    proc, port, token = start_agent(tmp_path, "--tls-cert", str(cert), "--tls-key", str(key))
    try:
        with AgentTransport("127.0.0.1", port, token, tls=True, ca_cert=str(cert)) as transport:
            assert transport.info()["kind"] == "agent"
        with AgentTransport("127.0.0.1", port, token, tls=True) as transport:
            with pytest.raises(TransportError, match="CERTIFICATE_VERIFY_FAILED|certificate"):
                transport.info()  # not signed by a CA this machine trusts
        with AgentTransport("127.0.0.1", port, token) as transport:
            with pytest.raises(TransportError):
                transport.info()  # plain HTTP to a TLS port
    finally:
        proc.stop()


def test_transports_without_a_ca_of_their_own_share_one_trust_context(monkeypatch):
    # Loading the CA bundle costs ~18 ms of CPU: once a process, not once a host (500 hosts
    # stalled a worker's first polls for seconds), and never for a host's own CA.
    import ssl

    from hosts.transport import agent

    loads = []
    real = ssl.SSLContext.load_verify_locations

    def counting(self, *args, **kwargs):
        loads.append(args or kwargs)
        return real(self, *args, **kwargs)

    monkeypatch.setattr(ssl.SSLContext, "load_verify_locations", counting)
    agent.system_trust.cache_clear()
    for port in range(9100, 9110):
        AgentTransport("127.0.0.1", port, "t").close()
        AgentTransport("127.0.0.1", port, "t", tls=True).close()
    assert len(loads) == 1
    assert agent.system_trust() is agent.system_trust()
