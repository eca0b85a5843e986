"""Issue 14 item 13: an agent that restarts (killed, crashed, upgraded) finds the engines its
predecessor left running and adopts the ones that are what it recorded, reports the ones that
are not as conflicts without killing them, and resolves an apply it was killed in the middle of
to the last good config. Real agent and simulator processes; the agents are killed with
SIGKILL (no chance to stop their engines)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time

import httpx
import psutil
import pytest

from tests.conftest import free_port
from tests.hosts.agent.conftest import wait_operation
from tests.hosts.agent.test_engines import apply, apply_and_wait, gone, sim_config, wait_for

pytestmark = pytest.mark.integration


@pytest.fixture
def engines_left():
    """Pids of engines no agent will stop (adopted ones are not the new agent's children)."""
    pids: list[int] = []
    yield pids
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signal.SIGKILL)


def kill_agent(agent) -> None:
    agent.proc.kill()
    agent.proc.wait(10)


def again(start_agent, first, *args: str):
    """A new agent on the first one's state directory (and its address, as after a restart)."""
    return start_agent(
        "--simulate",
        "h100-sxm:2",
        "--state-dir",
        str(first.state_dir),
        "--listen",
        f"127.0.0.1:{first.port}",
        *args,
    )


def status_of(client: httpx.Client, name: str) -> dict:
    return client.get(f"/v1/engines/{name}").json()


def settled(client: httpx.Client, name: str, timeout: float = 60) -> dict:
    """The engine's status once no operation (adopt, recover) runs on it any more."""
    wait_for(lambda: status_of(client, name)["operation"] is None, timeout, what="a settled engine")
    return status_of(client, name)


def listening(port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(1)
        return sock.connect_ex(("127.0.0.1", port)) == 0


def test_a_restarted_agent_adopts_the_healthy_engine_a_killed_agent_left_running(
    start_agent, engines_left
):
    first = start_agent("--simulate", "h100-sxm:2")
    port = free_port()
    with first.client() as client:
        assert apply_and_wait(client, "llama", sim_config(port))["state"] == "ready"
        pid = status_of(client, "llama")["pid"]
    engines_left.append(pid)
    record = json.loads((first.state_dir / "engines" / "llama.json").read_text())
    assert record["run"]["pid"] == pid and record["run"]["create_time"]
    assert record["run"]["cmdline"] == psutil.Process(pid).cmdline()
    assert record["pending"] is None
    for path in (first.state_dir / "engines").iterdir():
        assert path.stat().st_mode & 0o077 == 0, path  # owner-only: configs carry API keys

    kill_agent(first)
    assert not gone(pid)
    second = again(start_agent, first)
    with second.client() as client:
        status = settled(client, "llama")
        # The very same process, supervised again: not stopped, not restarted.
        assert status["state"] == "ready", status
        assert status["pid"] == pid and not gone(pid)
        assert f"adopting pid {pid}" in status["recovery"]["message"]
        assert status["config"]["port"] == port
        assert httpx.get(f"http://127.0.0.1:{port}/v1/models", timeout=5).status_code == 200
        engine = client.get("/v1/telemetry").json()["engines"]["llama"]
        assert engine["state"] == "ready" and engine["pid"] == pid
        # Its output from before the restart is read back from the file it writes to.
        logs = client.get("/v1/engines/llama/logs", params={"lines": 500}).json()["lines"]
        assert any("Starting the API server" in line for line in logs), logs

        # The adopted engine can be restarted through the new agent (stopped by process
        # group: it is not the new agent's child).
        response = client.post("/v1/engines/llama/restart", json={"ready_timeout_s": 20})
        assert response.status_code == 202, response.text
        assert wait_operation(client, response.json()["operation"])["state"] == "ready"
        status = status_of(client, "llama")
        assert status["state"] == "ready" and status["pid"] != pid
        assert gone(pid)
        # ... and stopped.
        new_pid = status["pid"]
        assert client.post("/v1/engines/llama/stop").json()["state"] == "stopped"
        assert gone(new_pid)


def test_systemctl_restart_leaves_the_engines_running_and_the_new_agent_adopts_them(
    start_agent, engines_left
):
    """The installed unit's restart (``KillMode=process``): SIGTERM to the agent's own pid
    only, then the unit starts it again. The agent used to stop its engines on SIGTERM; now
    they keep serving through the restart and only an explicit stop ends them."""
    first = start_agent("--simulate", "h100-sxm:2", keep_engines=True)  # as installed
    port = free_port()
    with first.client() as client:
        assert apply_and_wait(client, "llama", sim_config(port))["state"] == "ready"
        pid = status_of(client, "llama")["pid"]
    engines_left.append(pid)

    assert first.terminate() == 0  # SIGTERM: exits cleanly, at once
    assert not gone(pid) and listening(port)
    assert "keep running" in first.log() and "leaving 1 engine(s) running" in first.log()
    assert httpx.get(f"http://127.0.0.1:{port}/v1/models", timeout=5).status_code == 200

    second = again(start_agent, first)
    with second.client() as client:
        status = settled(client, "llama")
        assert status["state"] == "ready" and status["pid"] == pid, status
        assert f"adopting pid {pid}" in status["recovery"]["message"]
        # Stopped only when asked.
        assert client.post("/v1/engines/llama/stop").json()["state"] == "stopped"
        assert gone(pid)


@pytest.mark.django_db
def test_the_installed_unit_restarts_the_agent_alone():
    """What the test above relies on: the unit signals the agent's pid only and the agent
    runs without --stop-engines-on-exit."""
    from hosts.services.agent_install import agent_install
    from tests.factories import make_host

    unit = agent_install(make_host(), "https://panel.example/agent.pyz", "t" * 40).unit
    assert "KillMode=process" in unit.splitlines()
    assert "--stop-engines-on-exit" not in unit


def test_an_engine_that_died_while_no_agent_watched_is_reported_stopped(start_agent):
    first = start_agent("--simulate", "h100-sxm:2")
    port = free_port()
    with first.client() as client:
        assert apply_and_wait(client, "eng", sim_config(port))["state"] == "ready"
        pid = status_of(client, "eng")["pid"]
    kill_agent(first)
    os.killpg(pid, signal.SIGKILL)
    wait_for(lambda: gone(pid), what="the engine gone")
    second = again(start_agent, first)
    with second.client() as client:
        status = settled(client, "eng")
        assert status["state"] == "stopped" and status["pid"] is None
        assert f"pid {pid} has exited" in status["recovery"]["message"]
        assert "not started again" in status["recovery"]["message"]


def test_a_recorded_pid_that_runs_something_else_is_not_adopted_nor_killed(
    start_agent, engines_left, tmp_path
):
    first = start_agent("--simulate", "h100-sxm:2")
    port = free_port()
    with first.client() as client:
        assert apply_and_wait(client, "eng", sim_config(port))["state"] == "ready"
        pid = status_of(client, "eng")["pid"]
    kill_agent(first)
    os.killpg(pid, signal.SIGKILL)
    wait_for(lambda: gone(pid), what="the engine gone")
    # Another program took the engine's port, and the recorded pid is now that program's
    # (pid reuse, written into the record since it cannot be forced).
    impostor = subprocess.Popen(
        [sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1"],
        cwd=tmp_path,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    engines_left.append(impostor.pid)
    wait_for(lambda: listening(port), 20, what="the impostor listening")
    path = first.state_dir / "engines" / "eng.json"
    record = json.loads(path.read_text())
    record["run"]["pid"] = impostor.pid
    path.write_text(json.dumps(record))

    second = again(start_agent, first)
    with second.client() as client:
        status = settled(client, "eng")
        assert status["state"] == "conflict", status
        assert f"port {port} is held by pid {impostor.pid}" in status["error"]
        assert "http.server" in status["error"]
        assert status["pid"] is None
        assert client.get("/v1/telemetry").json()["engines"]["eng"]["state"] == "conflict"
    assert impostor.poll() is None and listening(port)  # left alone
    impostor.kill()
    impostor.wait(10)


def test_a_live_engine_this_agent_would_not_launch_now_is_a_conflict_not_killed(
    start_agent, engines_left
):
    first = start_agent("--simulate", "h100-sxm:2")
    port = free_port()
    with first.client() as client:
        assert apply_and_wait(client, "eng", sim_config(port))["state"] == "ready"
        pid = status_of(client, "eng")["pid"]
    engines_left.append(pid)
    kill_agent(first)
    # The new agent's allow-list no longer has the simulator.
    second = again(start_agent, first, "--allow-exec", "/usr/bin/true")
    with second.client() as client:
        status = settled(client, "eng")
        assert status["state"] == "conflict", status
        assert f"pid {pid}" in status["error"] and "would not launch" in status["error"]
        assert not gone(pid)
        # It is the recorded process (pid, start time, command line): an explicit stop
        # may end it.
        assert client.post("/v1/engines/eng/stop").json()["state"] == "stopped"
        assert gone(pid)


def test_an_agent_killed_during_an_apply_comes_back_on_the_last_good_config(
    start_agent, engines_left
):
    first = start_agent("--simulate", "h100-sxm:2")
    port = free_port()
    with first.client() as client:
        assert apply_and_wait(client, "eng", sim_config(port))["state"] == "ready"
        old_pid = status_of(client, "eng")["pid"]
        # A new config that takes long to start; the agent dies while it is starting.
        response = apply(client, "eng", sim_config(port, startup=120), timeout=300)
        op_id = response.json()["operation"]
        wait_for(
            lambda: status_of(client, "eng")["pid"] not in (None, old_pid),
            30,
            what="the new engine starting",
        )
        new_pid = status_of(client, "eng")["pid"]
    engines_left.append(new_pid)
    kill_agent(first)
    record = json.loads((first.state_dir / "engines" / "eng.json").read_text())
    assert record["pending"]["operation"] == op_id and record["run"]["pid"] == new_pid

    second = again(start_agent, first)
    with second.client() as client:
        status = settled(client, "eng")
        # Definite, and the last good config: the unconfirmed one is stopped.
        assert status["state"] == "ready", status
        assert status["config"]["simulator"]["startup_seconds"] == 0.3
        assert status["pid"] not in (None, new_pid) and gone(new_pid)
        assert status["interrupted"]["operation"] == op_id
        assert status["interrupted"]["kind"] == "apply"
        assert "previous config runs again" in status["interrupted"]["outcome"]
        assert "never confirmed ready" in status["recovery"]["message"]
        engines_left.append(status["pid"])
        # The next operation clears the record of the interrupted one.
        assert apply_and_wait(client, "eng", sim_config(port))["state"] == "ready"
        assert status_of(client, "eng")["interrupted"] is None
    record = json.loads((first.state_dir / "engines" / "eng.json").read_text())
    assert record["pending"] is None and record["interrupted"] is None


def test_the_output_file_of_an_engine_is_bounded_and_owner_only(tmp_path, monkeypatch):
    """Engine output goes to a file (it survives the agent), cut back once it grows large
    and has been read."""
    from collections import deque

    from hosts.agent import process
    from hosts.agent.process import Prepared, Run
    from hosts.engines.launch import LaunchConfig

    monkeypatch.setattr(process, "MAX_OUTPUT_BYTES", 100_000)
    go = tmp_path / "go"
    script = (
        "import os, sys, time\n"
        "for i in range(300): print('x' * 1000, i, flush=True)\n"
        f"while not os.path.exists({str(go)!r}): time.sleep(0.05)\n"
        "print('last line', flush=True)\n"
    )
    config = LaunchConfig.from_dict(sim_config(free_port()))
    prepared = Prepared(config, [sys.executable, "-c", script], {})
    out = tmp_path / "eng.out"
    log: deque[str] = deque(maxlen=10_000)
    run = Run("eng", prepared, log, lambda run: None, out)
    try:
        assert out.stat().st_mode & 0o777 == 0o600
        wait_for(lambda: len(log) == 300, 30, what="300 lines read")
        wait_for(lambda: out.stat().st_size == 0, 30, what="the file cut back")
    finally:
        go.touch()
    assert run.exited.wait(30) and run.exit_code == 0
    lines = list(log)
    assert lines[-1] == "last line" and len(lines) == 301
    assert all(line == "x" * 1000 + f" {i}" for i, line in enumerate(lines[:-1]))
    assert out.read_text() == "last line\n"  # written at the new end, not after a hole


def test_killed_before_the_old_engine_was_stopped_the_old_one_is_adopted(start_agent, engines_left):
    first = start_agent("--simulate", "h100-sxm:2")
    port = free_port()
    with first.client() as client:
        assert apply_and_wait(client, "eng", sim_config(port))["state"] == "ready"
        pid = status_of(client, "eng")["pid"]
    engines_left.append(pid)
    kill_agent(first)
    # What an agent killed right after accepting an apply leaves: the new config stored and
    # pending, the old process still running.
    path = first.state_dir / "engines" / "eng.json"
    record = json.loads(path.read_text())
    new = sim_config(port, max_model_len=4096)
    record["pending"] = {
        "operation": "feedc0de",
        "kind": "apply",
        "started_at": time.time(),
        "ready_timeout_s": 60,
        "config": new,
        "previous": record["config"],
        "previous_running": True,
    }
    record["config"] = new
    path.write_text(json.dumps(record))

    second = again(start_agent, first)
    with second.client() as client:
        status = settled(client, "eng")
        assert status["state"] == "ready" and status["pid"] == pid
        assert status["config"]["settings"]["max_model_len"] == 8192  # the last good one
        assert status["interrupted"]["operation"] == "feedc0de"
        assert status["interrupted"]["outcome"] == f"pid {pid} adopted: ready"


def test_killed_with_nothing_running_the_last_good_config_is_started_again(tmp_path):
    """In process: the record of an agent killed between stopping the old engine and
    starting the new one (nothing runs); and of one whose engine did not run before."""
    from hosts.agent.supervisor import Supervisor

    port, idle_port = free_port(), free_port()
    engines = tmp_path / "engines"
    engines.mkdir(mode=0o700)
    for name, was_running, p in (("eng", True, port), ("idle", False, idle_port)):
        good, new = sim_config(p), sim_config(p, max_model_len=4096)
        pending = {
            "operation": f"op-{name}",
            "kind": "apply",
            "started_at": time.time(),
            "ready_timeout_s": 30,
            "config": new,
            "previous": good,
            "previous_running": was_running,
        }
        record = {"name": name, "config": new, "state": "stopped", "run": None}
        (engines / f"{name}.json").write_text(json.dumps({**record, "pending": pending}))
    supervisor = Supervisor(tmp_path)
    try:
        wait_for(lambda: supervisor.get("eng").operation is None, 60, what="the recovery")
        eng = supervisor.get("eng").status()
        assert eng["state"] == "ready" and eng["pid"], eng
        assert eng["config"]["settings"]["max_model_len"] == 8192
        assert "previous config runs again" in eng["interrupted"]["outcome"]
        wait_for(lambda: supervisor.get("idle").operation is None, 60, what="the recovery")
        idle = supervisor.get("idle").status()
        assert idle["state"] == "stopped" and idle["pid"] is None
        assert idle["config"]["settings"]["max_model_len"] == 8192
        assert idle["interrupted"]["outcome"] == "stopped, as before the operation"
        stored = json.loads((engines / "eng.json").read_text())
        assert stored["pending"] is None and stored["run"]["pid"] == eng["pid"]
    finally:
        supervisor.shutdown()
