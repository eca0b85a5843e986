"""The "systemd" and "docker" launch styles over a real sshd, with stand-in ``systemctl``,
``journalctl`` and ``docker`` programs.

What is real here: the SSH connection, every command line exactly as the transport sends it
(the stand-ins record their argv), the unit file and env file written over SFTP (content and
modes), the readiness probe over direct-tcpip, and the apply/rollback decisions taken from what
the service manager reports. What is NOT exercised: systemd and docker themselves. The test
machine has no systemd as PID 1 and no docker engine, so no unit is really started and no
container really runs; where a test needs an engine answering on the port, it starts the
simulator itself and the stand-in reports the service as running.
"""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from hosts.engines.launch import LaunchConfig, render_docker, render_systemd
from hosts.transport.base import TransportError
from tests.conftest import free_port

pytestmark = pytest.mark.integration

LLAMA = "meta-llama/Llama-3.1-8B-Instruct"
JOURNAL = [
    "INFO 12-02 18:21:50 [api_server.py:1896] vLLM API server version 0.11.0",
    "ERROR 12-02 18:21:52 [core.py:708] EngineCore failed to start.",
    "ValueError: No available memory for the cache blocks. Try increasing "
    "`gpu_memory_utilization` when initializing the engine.",
]


class StandIn:
    """An executable that appends its argv (JSON) to ``calls`` and answers from ``answers``:
    a JSON map of the first argument to {"out": text, "rc": n} the test can change."""

    def __init__(self, root: Path, name: str):
        self.path = root / "bin" / name
        self.calls = root / f"{name}-calls.jsonl"
        self.answers = root / f"{name}-answers.json"
        self.answers.write_text("{}")
        self.path.parent.mkdir(parents=True, exist_ok=True)
        program = f"""import json, sys
args = sys.argv[1:]
with open({str(self.calls)!r}, "a") as f:
    f.write(json.dumps(args) + "\\n")
answer = json.load(open({str(self.answers)!r})).get(args[0] if args else "", {{}})
sys.stdout.write(answer.get("out", ""))
sys.exit(answer.get("rc", 0))
"""
        self.path.write_text(
            f'#!/bin/sh\nexec {shlex.quote(sys.executable)} -c {shlex.quote(program)} "$@"\n'
        )
        self.path.chmod(0o755)

    def answer(self, command: str, out: str = "", rc: int = 0) -> None:
        answers = json.loads(self.answers.read_text())
        answers[command] = {"out": out, "rc": rc}
        self.answers.write_text(json.dumps(answers))

    def argvs(self) -> list[list[str]]:
        if not self.calls.exists():
            return []
        return [json.loads(line) for line in self.calls.read_text().splitlines()]


@pytest.fixture
def sim_on_port():
    """Start the simulator on a given port, in place of the engine systemd or docker would run
    (the stand-ins cannot start anything)."""
    procs: list[subprocess.Popen] = []

    def start(port: int) -> None:
        proc = subprocess.Popen(
            [sys.executable, "-m", "hosts.simulator", "vllm", LLAMA, "--host", "127.0.0.1"]
            + ["--port", str(port), "--startup-seconds", "0"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        procs.append(proc)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            assert proc.poll() is None, "the simulator exited"
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.05)
        raise AssertionError("the simulator never answered")

    yield start
    for proc in procs:
        proc.kill()
        proc.wait()


def start_engine_after_transport_start(transport, start, port):
    """The stand-in cannot start the engine, so the test does, right after the transport's own
    start step (after its check that the port is free)."""
    original = transport._start

    def start_then_answer(name, rendered):
        state = original(name, rendered)
        start(port)
        return state

    transport._start = start_then_answer


def simulated(port: int, **overrides) -> LaunchConfig:
    values = dict(
        engine="vllm",
        model=LLAMA,
        settings={"max_num_seqs": 64},
        port=port,
        host="127.0.0.1",
        runner="simulator",
        simulator={"gpu": "h100-sxm", "startup_seconds": 0.5},
        env={"HF_TOKEN": "hf_not_a_real_token"},
    )
    values.update(overrides)
    return LaunchConfig(**values)


def show(active: str, pid: int = 0, status: int = 0) -> str:
    return f"ActiveState={active}\nMainPID={pid}\nExecMainStatus={status}\nResult=success\n"


@pytest.fixture
def systemd_host(make_ssh, tmp_path):
    systemctl, journalctl = StandIn(tmp_path, "systemctl"), StandIn(tmp_path, "journalctl")
    units, remote = tmp_path / "units", tmp_path / "remote"
    units.mkdir()
    transport = make_ssh(
        launch_style="systemd",
        remote_dir=str(remote),
        unit_dir=str(units),
        systemd_user="llm",
        systemctl=[str(systemctl.path)],
        journalctl=[str(journalctl.path)],
    )
    return transport, systemctl, journalctl, units, remote


def test_systemd_writes_the_rendered_unit_and_env_file_and_restarts_the_unit(systemd_host):
    transport, systemctl, journalctl, units, remote = systemd_host
    systemctl.answer("show", show("failed", status=1))
    journalctl.answer("-u", "\n".join(JOURNAL) + "\n")
    config = simulated(free_port())

    outcome = transport.apply_config("llama", config, previous=None, ready_timeout_s=5)

    expected = render_systemd(
        config.validated(),
        unit_name="llm-llama.service",
        env_file=f"{remote}/llama/env",
        user="llm",
        python=sys.executable,
    )
    unit = units / "llm-llama.service"
    assert unit.read_text() == expected.unit_text
    assert unit.stat().st_mode & 0o777 == 0o644
    env = remote / "llama" / "env"
    assert env.read_text() == expected.env_text and env.stat().st_mode & 0o777 == 0o600
    assert json.loads((remote / "llama" / "config.json").read_text()) == (
        config.validated().to_dict()
    )
    calls = systemctl.argvs()
    # Whatever ran under the name is stopped first, then the new unit is loaded and started.
    assert calls[:3] == [
        ["stop", "llm-llama.service"],
        ["daemon-reload"],
        ["restart", "llm-llama.service"],
    ]
    assert calls[3][0] == "show" and calls[3][-1] == "llm-llama.service"
    assert calls[-1] == ["stop", "llm-llama.service"]  # a failed unit is stopped again
    assert journalctl.argvs()[0] == [
        "-u",
        "llm-llama.service",
        "-n",
        "50",
        "--no-pager",
        "-o",
        "cat",
    ]
    assert outcome.state == "failed" and "exit status 1" in outcome.error
    assert outcome.log_lines == JOURNAL
    status = transport.engine_status("llama")
    assert status["state"] == "failed" and status["last_lines"] == JOURNAL[-20:]


def test_systemd_ready_when_the_unit_is_active_and_its_port_answers(systemd_host, sim_on_port):
    transport, systemctl, _, _, _ = systemd_host
    port = free_port()
    systemctl.answer("show", show("active", pid=4242))
    start_engine_after_transport_start(transport, sim_on_port, port)
    outcome = transport.apply_config("llama", simulated(port), previous=None, ready_timeout_s=30)
    assert outcome.state == "ready", outcome
    status = transport.engine_status("llama")
    assert status["state"] == "ready" and status["pid"] == 4242
    assert transport.telemetry()["engines"]["llama"]["state"] == "ready"
    transport.stop_engine("llama")
    assert systemctl.argvs()[-1] == ["stop", "llm-llama.service"]


def test_a_port_another_program_answers_on_is_not_taken_for_the_engine(systemd_host, sim_on_port):
    transport, systemctl, _, _, _ = systemd_host
    port = free_port()
    sim_on_port(port)  # someone else's server, there before the apply
    systemctl.answer("show", show("active", pid=4242))
    outcome = transport.apply_config("llama", simulated(port), previous=None, ready_timeout_s=5)
    assert outcome.state == "failed" and "in use by another program" in outcome.error
    assert ["restart", "llm-llama.service"] not in systemctl.argvs()


def test_systemd_rollback_restarts_the_previous_unit(systemd_host):
    transport, systemctl, journalctl, units, _ = systemd_host
    systemctl.answer("show", show("failed", status=1))
    journalctl.answer("-u", "\n".join(JOURNAL) + "\n")
    port = free_port()
    good, bad = simulated(port), simulated(port, settings={"gpu_memory_utilization": 0.1})
    outcome = transport.apply_config("llama", bad, previous=good, ready_timeout_s=3)
    # The stand-in reports every start as failed, so the previous one fails too: "failed",
    # with both attempts' reasons, after a second restart with the previous unit written.
    assert outcome.state == "failed" and "did not come back either" in outcome.error
    assert outcome.detail["rollback_log_lines"] == JOURNAL
    assert [c for c in systemctl.argvs() if c[0] == "restart"] == [
        ["restart", "llm-llama.service"]
    ] * 2
    assert "--gpu-memory-utilization" not in (units / "llm-llama.service").read_text()


@pytest.fixture
def docker_host(make_ssh, tmp_path):
    docker = StandIn(tmp_path, "docker")
    remote = tmp_path / "remote"
    transport = make_ssh(
        launch_style="docker",
        remote_dir=str(remote),
        docker=[str(docker.path)],
        docker_image="vllm/vllm-openai:v0.11.0",
    )
    return transport, docker, remote


def engine_config(port: int, **overrides) -> LaunchConfig:
    return simulated(port, runner="engine", simulator={}, engine_version="0.11.0", **overrides)


def test_docker_runs_the_rendered_command_and_reads_the_container_state(docker_host):
    transport, docker, remote = docker_host
    docker.answer("inspect", "exited 0 1\n")
    docker.answer("logs", "\n".join(JOURNAL) + "\n")
    config = engine_config(free_port())

    outcome = transport.apply_config("llama", config, previous=None, ready_timeout_s=5)

    expected = render_docker(config.validated(), name="llm-llama", image="vllm/vllm-openai:v0.11.0")
    calls = docker.argvs()
    assert calls[:2] == [["stop", "-t", "5", "llm-llama"], ["rm", "-f", "llm-llama"]]
    assert calls[2] == expected[1:]  # exactly render_docker's argv, after our docker program
    assert calls[2][:2] == ["run", "-d"]
    inspect = ["inspect", "-f", "{{.State.Status}} {{.State.Pid}} {{.State.ExitCode}}"]
    assert calls[3] == [*inspect, "llm-llama"]
    assert ["logs", "--tail", "50", "llm-llama"] in calls
    assert calls[-1] == ["stop", "-t", "5", "llm-llama"]
    assert outcome.state == "failed" and "exit status 1" in outcome.error
    assert outcome.log_lines == JOURNAL
    assert json.loads((remote / "llama" / "config.json").read_text())["runner"] == "engine"


def test_docker_ready_when_the_container_runs_and_answers(docker_host, sim_on_port):
    transport, docker, _ = docker_host
    port = free_port()
    docker.answer("inspect", "running 4242 0\n")
    start_engine_after_transport_start(transport, sim_on_port, port)
    outcome = transport.apply_config(
        "llama", engine_config(port), previous=None, ready_timeout_s=30
    )
    assert outcome.state == "ready", outcome
    status = transport.engine_status("llama")
    assert status["state"] == "ready" and status["pid"] == 4242


def test_docker_refuses_the_simulator_runner_before_anything_is_sent(docker_host):
    transport, docker, _ = docker_host
    with pytest.raises(TransportError, match="the simulator runs as a process"):
        transport.apply_config("llama", simulated(8000), previous=None, ready_timeout_s=5)
    assert docker.argvs() == []
