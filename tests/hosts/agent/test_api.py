"""The agent's HTTP API as a client sees it: authentication, telemetry sources, TLS."""

from __future__ import annotations

import ssl
import subprocess
import sys

import httpx
import pytest

from tests.hosts.agent.conftest import ROOT, self_signed

pytestmark = pytest.mark.integration


def test_token_auth(start_agent):
    agent = start_agent()
    with agent.client(token="") as anonymous:
        response = anonymous.get("/v1/info")
        assert response.status_code == 401
        assert "error" in response.json()
        assert response.headers["www-authenticate"].startswith("Bearer")
        # Nothing is routed before authentication: unknown paths and engines look the same.
        assert anonymous.get("/v1/engines/nope").status_code == 401
        assert anonymous.post("/v1/engines/x/apply", json={"config": {}}).status_code == 401
    with agent.client(token="wrong-" + agent.token) as wrong:
        assert wrong.get("/v1/info").status_code == 401
    with httpx.Client(base_url=agent.url) as other_scheme:
        response = other_scheme.get("/v1/info", headers={"Authorization": "Basic " + agent.token})
        assert response.status_code == 401
    with agent.client() as client:
        info = client.get("/v1/info")
        assert info.status_code == 200
        assert set(info.json()) == {
            "agent_version",
            "hostname",
            "telemetry_source",
            "detail",
            "libraries",
        }
        assert client.get("/v1/nothing").status_code == 404
        assert client.post("/v1/info").status_code == 405
        assert client.get("/v1/engines/unknown").status_code == 404
        assert client.get("/v1/engines/unknown/logs").status_code == 404
        assert client.post("/v1/engines/unknown/stop").status_code == 404
        assert client.post("/v1/engines/unknown/restart", json={}).status_code == 404
        assert client.get("/v1/operations/abcdef").status_code == 404
        assert client.get("/v1/engines").json() == {"engines": {}}
        bad = client.post(
            "/v1/engines/x/apply", content=b"{nope", headers={"Content-Type": "application/json"}
        )
        assert bad.status_code == 400 and "JSON" in bad.json()["error"]
    agent.terminate()
    assert agent.token not in agent.log()
    assert "GET /v1/info" in agent.log()  # requests are logged, without their headers


def test_no_nvml_and_no_simulation_reports_source_none(start_agent):
    agent = start_agent()
    with agent.client() as client:
        info = client.get("/v1/info").json()
        telemetry = client.get("/v1/telemetry").json()
        inventory = client.get("/v1/inventory").json()
    if info["telemetry_source"] == "nvml":
        pytest.skip("this machine has an NVIDIA driver")
    assert info["telemetry_source"] == "none"
    assert info["detail"].startswith("NVML is not available: NVMLError_")
    assert telemetry["source"] == "none" and telemetry["gpus"] == []
    assert telemetry["note"].startswith("NVML is not available")
    host = telemetry["host"]
    assert host["memory_total_bytes"] > host["memory_used_bytes"] > 0
    assert len(host["load_avg"]) == 3 and 0 <= host["cpu_percent"] <= 100
    assert telemetry["engines"] == {}
    assert inventory["source"] == "none" and inventory["gpus"] == []
    assert inventory["driver_version"] is None and inventory["cuda_version"] is None
    assert inventory["cpu_count"] >= 1 and inventory["memory_total_bytes"] > 0
    for node in inventory["numa_nodes"]:
        assert set(node) == {"node", "cpus"}


def test_simulated_gpus_when_idle(start_agent):
    agent = start_agent("--simulate", "h100-sxm:2")
    with agent.client() as client:
        info = client.get("/v1/info").json()
        inventory = client.get("/v1/inventory").json()
        telemetry = client.get("/v1/telemetry").json()
    assert info["telemetry_source"] == "simulator"
    assert "simulated" in inventory["note"] and inventory["source"] == "simulator"
    assert [g["index"] for g in inventory["gpus"]] == [0, 1]
    assert {g["name"] for g in inventory["gpus"]} == {"NVIDIA H100 80GB HBM3"}
    assert len({g["uuid"] for g in inventory["gpus"]}) == 2
    for gpu in telemetry["gpus"]:
        assert gpu["missing"] == []
        assert gpu["utilization_gpu_pct"] == 0 and gpu["throttle_reasons"] == ["Idle"]
        assert gpu["memory_used_bytes"] < 2**30 and gpu["processes"] == []
    # The same UUIDs in both views.
    assert [g["uuid"] for g in telemetry["gpus"]] == [g["uuid"] for g in inventory["gpus"]]


def run_agent(tmp_path, *args, timeout=20):
    return subprocess.run(
        [sys.executable, "-m", "hosts.agent", "--listen", "127.0.0.1:0", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_refuses_to_start_without_a_usable_token(tmp_path):
    missing = run_agent(tmp_path, "--token-file", str(tmp_path / "absent"))
    assert missing.returncode == 2 and "cannot read the token file" in missing.stderr

    empty = tmp_path / "empty"
    empty.write_text("  \n")
    empty.chmod(0o600)
    result = run_agent(tmp_path, "--token-file", str(empty))
    assert result.returncode == 2 and "is empty" in result.stderr

    public = tmp_path / "public"
    public.write_text("s3cret-token\n")
    public.chmod(0o644)
    result = run_agent(tmp_path, "--token-file", str(public))
    assert result.returncode == 2 and "chmod 600" in result.stderr
    assert "s3cret-token" not in result.stderr

    bad_sim = tmp_path / "tok"
    bad_sim.write_text("t\n")
    bad_sim.chmod(0o600)
    result = run_agent(tmp_path, "--token-file", str(bad_sim), "--simulate", "b200:2")
    assert result.returncode == 2 and "unknown GPU 'b200'" in result.stderr


def test_group_readable_token_only_warns(start_agent):
    agent = start_agent()
    agent.terminate()
    agent.token_file.chmod(0o640)
    again = start_agent("--token-file", str(agent.token_file))
    with again.client(token=agent.token) as client:
        assert client.get("/v1/info").status_code == 200
    again.terminate()
    assert "group-accessible" in again.log()


def test_tls(start_agent, tmp_path):
    cert, key = self_signed(tmp_path)
    agent = start_agent("--tls-cert", str(cert), "--tls-key", str(key), scheme="https")
    trust = ssl.create_default_context(cafile=str(cert))
    with agent.client(verify=trust) as client:
        assert client.get("/v1/info").status_code == 200
        assert client.get("/v1/info", headers={"Authorization": "Bearer x"}).status_code == 401
    # Plain HTTP and an unverified certificate are both refused.
    with pytest.raises(httpx.TransportError):
        httpx.get(agent.url.replace("https", "http") + "/v1/info", timeout=5)
    with pytest.raises(httpx.ConnectError):
        httpx.get(agent.url + "/v1/info", timeout=5)
    # One failed handshake does not take the server down.
    with agent.client(verify=trust) as client:
        assert client.get("/v1/info").status_code == 200
