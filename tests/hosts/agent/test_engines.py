"""The engine supervisor through the agent's API, with real simulator engine processes:
apply, roll back, refuse, stop, and the processes gone afterwards."""

from __future__ import annotations

import os
import signal
import time

import httpx
import psutil
import pytest

from hosts.engines.launch import LaunchConfig
from tests.conftest import free_port
from tests.hosts.agent.conftest import LLAMA, wait_operation

pytestmark = pytest.mark.integration

NO_CACHE_MEMORY = "ValueError: No available memory for the cache blocks"


def sim_config(port: int, startup: float = 0.3, **settings) -> dict:
    settings = {"max_model_len": 8192, **settings}
    return LaunchConfig(
        engine="vllm",
        model=LLAMA,
        settings=settings,
        port=port,
        host="127.0.0.1",
        runner="simulator",
        simulator={"gpu": "h100-sxm", "num_gpus": 1, "startup_seconds": startup},
    ).to_dict()


def apply(client: httpx.Client, name: str, config: dict, timeout: float = 20) -> httpx.Response:
    return client.post(
        f"/v1/engines/{name}/apply", json={"config": config, "ready_timeout_s": timeout}
    )


def apply_and_wait(client, name, config, timeout: float = 20) -> dict:
    response = apply(client, name, config, timeout)
    assert response.status_code == 202, response.text
    return wait_operation(client, response.json()["operation"], timeout + 15)


def gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def wait_for(predicate, timeout: float = 10, what: str = "condition"):
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


@pytest.fixture
def sim_agent(start_agent):
    return start_agent("--simulate", "h100-sxm:2")


def test_apply_then_an_infeasible_config_rolls_back(sim_agent):
    port = free_port()
    with sim_agent.client() as client:
        op = apply_and_wait(client, "llama", sim_config(port, gpu_memory_utilization=0.9))
        assert op["state"] == "ready", op
        assert op["kind"] == "apply" and op["engine"] == "llama"
        assert op["finished_at"] >= op["started_at"]
        status = client.get("/v1/engines/llama").json()
        assert status["state"] == "ready" and status["pid"] and status["ready_at"]
        assert status["config"]["settings"]["gpu_memory_utilization"] == 0.9
        first_pid = status["pid"]

        models = httpx.get(f"http://127.0.0.1:{port}/v1/models", timeout=5).json()
        assert models["data"][0]["id"] == LLAMA

        telemetry = client.get("/v1/telemetry").json()
        assert telemetry["source"] == "simulator" and "simulated" in telemetry["note"]
        held, idle = telemetry["gpus"]
        # vLLM reserves gpu_memory_utilization of the GPU, plus what lies outside its budget.
        assert held["memory_used_bytes"] > 0.9 * held["memory_total_bytes"]
        assert held["processes"] == [
            {"pid": first_pid, "used_memory_bytes": held["memory_used_bytes"]}
        ]
        assert idle["memory_used_bytes"] < 2**30 and idle["processes"] == []
        engine = telemetry["engines"]["llama"]
        assert engine["state"] == "ready" and engine["pid"] == first_pid
        assert engine["cpu_affinity"] == sorted(psutil.Process(first_pid).cpu_affinity())

        # Not enough memory left for a single KV block: the simulator exits like vLLM does.
        op = apply_and_wait(client, "llama", sim_config(port, gpu_memory_utilization=0.1))
        assert op["state"] == "rolled_back", op
        assert any(NO_CACHE_MEMORY in line for line in op["log_lines"]), op["log_lines"]
        assert NO_CACHE_MEMORY in op["error"]
        status = client.get("/v1/engines/llama").json()
        assert status["state"] == "ready"
        assert status["config"]["settings"]["gpu_memory_utilization"] == 0.9
        assert status["pid"] != first_pid and gone(first_pid)
        # The previous engine answers on its port again.
        models = httpx.get(f"http://127.0.0.1:{port}/v1/models", timeout=5)
        assert models.status_code == 200

        logs = client.get("/v1/engines/llama/logs", params={"lines": 500}).json()["lines"]
        assert any(NO_CACHE_MEMORY in line for line in logs)
        assert any("Starting the API server" in line for line in logs)
        assert len(client.get("/v1/engines/llama/logs", params={"lines": 3}).json()["lines"]) == 3
        assert client.get("/v1/engines").json()["engines"]["llama"]["state"] == "ready"


def test_a_failing_first_config_has_nothing_to_roll_back_to(sim_agent):
    with sim_agent.client() as client:
        op = apply_and_wait(client, "new", sim_config(free_port(), gpu_memory_utilization=0.1))
        assert op["state"] == "failed"
        assert "no previous config" in op["error"] and NO_CACHE_MEMORY in op["error"]
        status = client.get("/v1/engines/new").json()
        assert status["state"] == "failed" and status["pid"] is None
        assert status["exit_code"] == 1
        assert any(NO_CACHE_MEMORY in line for line in status["last_lines"])


def test_not_ready_in_time_rolls_back(sim_agent):
    port = free_port()
    with sim_agent.client() as client:
        assert apply_and_wait(client, "slow", sim_config(port))["state"] == "ready"
        op = apply_and_wait(client, "slow", sim_config(port, startup=30), timeout=1.5)
        assert op["state"] == "rolled_back", op
        assert "not ready within 1.5 s" in op["error"]
        status = client.get("/v1/engines/slow").json()
        assert status["state"] == "ready"
        assert status["config"]["simulator"]["startup_seconds"] == 0.3


def test_refusals(sim_agent, start_agent):
    port = free_port()
    with sim_agent.client() as client:
        # An engine program this host does not have.
        real = LaunchConfig(engine="vllm", model=LLAMA, settings={}, port=port).to_dict()
        response = apply(client, "real", real)
        assert response.status_code == 400 and "'vllm' was not found" in response.json()["error"]

        # A config the launch validator refuses: the field is named.
        response = apply(client, "bad", sim_config(port, gpu_memory_utilization=1.5))
        assert response.status_code == 400
        assert "gpu_memory_utilization" in response.json()["error"]
        response = apply(client, "bad", {**sim_config(port), "port": 70000})
        assert response.status_code == 400 and "port" in response.json()["error"]

        response = apply(client, "Bad_Name", sim_config(port))
        assert response.status_code == 400 and "engine names" in response.json()["error"]
        response = client.post("/v1/engines/x/apply", json={"ready_timeout_s": 5})
        assert response.status_code == 400 and "config" in response.json()["error"]
        response = apply(client, "x", sim_config(port), timeout=-1)
        assert response.status_code == 400 and "ready_timeout_s" in response.json()["error"]
        response = apply(client, "x", {**sim_config(port), "env": {"LD_PRELOAD": "/tmp/x.so"}})
        assert response.status_code == 400 and "LD_PRELOAD" in response.json()["error"]
        response = apply(client, "x", sim_config(sim_agent.port))
        assert response.status_code == 400 and "agent's own port" in response.json()["error"]
        # Nothing was created by the refused requests.
        assert client.get("/v1/engines").json() == {"engines": {}}

        assert apply_and_wait(client, "one", sim_config(port))["state"] == "ready"
        response = apply(client, "two", sim_config(port))
        assert response.status_code == 400 and "used by engine 'one'" in response.json()["error"]

    # An agent whose allow-list does not have the simulator refuses to run it.
    strict = start_agent("--allow-exec", "/usr/bin/true")
    with strict.client() as client:
        response = apply(client, "sim", sim_config(free_port()))
        assert response.status_code == 400
        assert "not on this agent's allow-list (/usr/bin/true)" in response.json()["error"]


def test_one_operation_per_engine_at_a_time(sim_agent):
    port = free_port()
    with sim_agent.client() as client:
        first = apply(client, "busy", sim_config(port, startup=1.5)).json()["operation"]
        second = apply(client, "busy", sim_config(port))
        assert second.status_code == 409
        assert first in second.json()["error"] and "apply" in second.json()["error"]
        restart = client.post("/v1/engines/busy/restart", json={"ready_timeout_s": 10})
        assert restart.status_code == 409
        # Another engine is not blocked.
        other = apply(client, "other", sim_config(free_port()))
        assert other.status_code == 202
        status = client.get("/v1/engines/busy").json()
        assert status["operation"] == first and status["state"] in ("stopped", "starting")
        assert wait_operation(client, first)["state"] == "ready"
        assert wait_operation(client, other.json()["operation"])["state"] == "ready"
        # Finished: the next one is accepted at once.
        assert apply(client, "busy", sim_config(port)).status_code == 202


def test_stop_restart_crash_and_agent_shutdown(start_agent):
    # An agent that owns its engines' lifetime (the demo fleet's); by default they outlive it
    # (test_adoption.py: the systemd unit's restart).
    sim_agent = start_agent("--simulate", "h100-sxm:2", "--stop-engines-on-exit")
    port = free_port()
    with sim_agent.client() as client:
        assert apply_and_wait(client, "eng", sim_config(port))["state"] == "ready"
        pid = client.get("/v1/engines/eng").json()["pid"]

        stopped = client.post("/v1/engines/eng/stop")
        assert stopped.status_code == 200
        assert stopped.json()["state"] == "stopped" and stopped.json()["pid"] is None
        assert gone(pid)
        with pytest.raises(httpx.TransportError):
            httpx.get(f"http://127.0.0.1:{port}/health", timeout=2)
        assert client.post("/v1/engines/eng/stop").json()["state"] == "stopped"  # idempotent

        restart = client.post("/v1/engines/eng/restart", json={"ready_timeout_s": 20})
        assert restart.status_code == 202
        op = wait_operation(client, restart.json()["operation"])
        assert op["state"] == "ready" and op["kind"] == "restart"
        pid = client.get("/v1/engines/eng").json()["pid"]

        # An engine that dies on its own is noticed and reported failed with its exit code.
        os.kill(pid, signal.SIGKILL)
        wait_for(lambda: client.get("/v1/engines/eng").json()["state"] == "failed", what="failed")
        status = client.get("/v1/engines/eng").json()
        assert status["exit_code"] == -signal.SIGKILL and "exited with code -9" in status["error"]

        op = wait_operation(
            client, client.post("/v1/engines/eng/restart", json={}).json()["operation"]
        )
        assert op["state"] == "ready"
        pid = client.get("/v1/engines/eng").json()["pid"]

    # SIGTERM to that agent stops its engines before it exits.
    assert sim_agent.terminate() == 0
    assert gone(pid)
    assert sim_agent.token not in sim_agent.log()

    # A new agent on the same state directory knows the engine and its config (stopped).
    again = start_agent("--simulate", "h100-sxm:2", "--state-dir", str(sim_agent.state_dir))
    with again.client() as client:
        status = client.get("/v1/engines/eng").json()
        assert status["state"] == "stopped" and status["config"]["port"] == port


def test_stop_during_an_apply_cancels_it(sim_agent):
    port = free_port()
    with sim_agent.client() as client:
        op_id = apply(client, "eng", sim_config(port, startup=30), timeout=60).json()["operation"]
        wait_for(lambda: client.get("/v1/engines/eng").json()["pid"], what="a process")
        pid = client.get("/v1/engines/eng").json()["pid"]
        status = client.post("/v1/engines/eng/stop").json()
        assert status["state"] == "stopped"
        op = wait_operation(client, op_id)
        assert op["state"] == "failed" and "stopped by request" in op["error"]
        assert gone(pid)
        assert client.get("/v1/engines/eng").json()["state"] == "stopped"


# What a new agent does with the engines a killed agent left running (adopts them, no longer
# stops them): tests/hosts/agent/test_adoption.py.
