"""The SSH transport's launch styles on their own, against a recording stand-in for the host:
what each one renders, the exact command lines it sends, how it reads its service manager's
answers. (The same styles over a real sshd: test_ssh_engines.py and test_ssh_styles.py.)"""

from __future__ import annotations

import shlex
import sys

import pytest

from hosts.engines.launch import LaunchConfig, render_docker, render_process, render_systemd
from hosts.transport.base import TransportError, check_engine_name
from hosts.transport.ssh import LAUNCH_STYLES, SshTransport
from hosts.transport.ssh.parsing import EngineFiles
from hosts.transport.ssh.scripts import START_SCRIPT, STOP_SCRIPT, TAIL_SCRIPT, sh
from hosts.transport.ssh.session import CommandFailed, Result
from hosts.transport.ssh.styles import (
    STYLES,
    DockerStyle,
    LaunchStyle,
    ProcessStyle,
    ServiceStatus,
    StyleOptions,
    SystemdStyle,
)

LLAMA = "meta-llama/Llama-3.1-8B-Instruct"
REMOTE = "/srv/llm"


class Host:
    """Records what a style asks of the host (``commands`` with their time limits, files
    ``written``); ``answers`` maps a whole command line, or its second or third word (the
    subcommand after ``systemctl --user`` or ``docker``), to the Result it gets."""

    command_timeout = 30.0

    def __init__(self, answers: dict[str, Result] | None = None):
        self.commands: list[tuple[str, float | None]] = []
        self.written: dict[str, tuple[str, int]] = {}
        self.answers = answers or {}
        self.engine_files: dict[str, EngineFiles] = {}

    def run(self, command, *, timeout=None, what="a command") -> Result:
        self.commands.append((command, timeout))
        words = shlex.split(command)
        for key in (command, *words[1:2], *words[2:3]):
            if key in self.answers:
                return self.answers[key]
        return Result(0, "", "")

    def check(self, command, what, *, timeout=None) -> Result:
        result = self.run(command, timeout=timeout, what=what)
        if result.rc != 0:
            raise CommandFailed(f"{what} failed")
        return result

    def write_file(self, path, data, mode) -> None:
        self.written[path] = (data, mode)

    def engine_dir(self, name) -> str:
        return f"{REMOTE}/{check_engine_name(name)}"

    def files(self, name) -> EngineFiles:
        return self.engine_files.get(name) or EngineFiles(name)


def config(**overrides) -> LaunchConfig:
    values = dict(
        engine="vllm",
        model=LLAMA,
        settings={"max_num_seqs": 64},
        port=8001,
        host="127.0.0.1",
        env={"HF_TOKEN": "hf_not_a_real_token"},
    )
    values.update(overrides)
    return LaunchConfig(**values)


OPTIONS = StyleOptions(
    python="/opt/venv/bin/python",
    systemctl=("systemctl", "--user"),
    journalctl=("journalctl", "--user"),
    docker=("/usr/bin/docker",),
    docker_image="vllm/vllm-openai:v0.11.0",
    unit_dir="/etc/systemd/system",
    systemd_user="llm",
    stop_grace_s=5.0,
)


def test_one_class_per_style_and_the_transport_picks_it_once():
    assert LAUNCH_STYLES == ("process", "systemd", "docker")
    assert all(issubclass(cls, LaunchStyle) for cls in STYLES.values())
    for name in LAUNCH_STYLES:
        transport = SshTransport(
            "gpu-07", private_key="unused", host_key_fingerprint=None, launch_style=name
        )
        assert type(transport.style) is STYLES[name] and transport.style.name == name
        assert transport.launch_style == name


# ----------------------------------------------------------------------------- process


def test_process_renders_the_agents_argv_and_env():
    style = ProcessStyle(Host(), OPTIONS)
    rendered = style.render("llama", config())
    expected = render_process(config().validated(), python=OPTIONS.python)
    assert rendered.argv == expected.argv and dict(rendered.env) == expected.env
    assert rendered.unit is None


def test_process_start_writes_the_env_file_and_runs_the_start_script():
    host = Host()
    style = ProcessStyle(host, OPTIONS)
    rendered = style.render("llama", config())
    command = sh(START_SCRIPT, f"{REMOTE}/llama", f"{REMOTE}/llama", *rendered.argv)
    stat = "4242 (python) S 1 4242 4242 0 -1 " + "0 " * 13 + "987654 0 0"  # field 22: start
    host.answers = {command: Result(0, f"4242\n{stat}\n", "")}
    assert style.start("llama", rendered) == {"pid": 4242, "starttime": 987654}
    assert host.written[f"{REMOTE}/llama/env"] == ("HF_TOKEN=hf_not_a_real_token\n", 0o600)
    assert host.commands == [(command, None)]
    assert "hf_not" not in command  # the secret stays in the 0600 file
    host.answers = {command: Result(0, "4243\n", "")}  # it already exited: no stat line
    assert style.start("llama", rendered) == {"pid": 4243, "starttime": None}


def test_process_start_runs_in_the_configured_workdir():
    style = ProcessStyle(Host(), StyleOptions(workdir="/opt/panel"))
    assert style.start_command("/srv/llm/x", ("vllm", "serve")) == sh(
        START_SCRIPT, "/srv/llm/x", "/opt/panel", "vllm", "serve"
    )


def test_process_refuses_an_env_name_the_start_script_cannot_export():
    style = ProcessStyle(Host(), OPTIONS)
    with pytest.raises(TransportError, match="refused"):
        style.render("llama", config(env={"BAD-NAME": "1"}))


def test_process_status_comes_from_the_pid_file_and_proc():
    style = ProcessStyle(Host(), OPTIONS)
    running = EngineFiles("llama", pid=42, stat=("S", 42, 1000), state={"starttime": 1000})
    assert style.status("llama", running) == ServiceStatus(True, 42, None, "running")
    reused = EngineFiles("llama", pid=42, stat=("S", 42, 2000), state={"starttime": 1000})
    assert style.status("llama", reused) == ServiceStatus(False, state="failed")
    assert style.status("llama", EngineFiles("llama")) == ServiceStatus(False, state="stopped")
    assert style.may_be_up(running) and not style.may_be_up(reused)


def test_process_stop_signals_its_own_group_and_leaves_a_reused_pid_alone():
    host = Host()
    style = ProcessStyle(host, OPTIONS)
    style.stop("llama", EngineFiles("llama", pid=42, stat=("S", 42, 1000)))
    assert host.commands == [
        (sh(STOP_SCRIPT, 42, 50), 35.0),
        (shlex.join(["rm", "-f", f"{REMOTE}/llama/engine.pid"]), None),
    ]
    host.commands.clear()
    reused = EngineFiles("llama", pid=42, stat=("S", 42, 2000), state={"starttime": 1000})
    style.stop("llama", reused)
    assert host.commands == [(shlex.join(["rm", "-f", f"{REMOTE}/llama/engine.pid"]), None)]
    host.commands.clear()
    style.stop("llama", EngineFiles("llama"))  # never started: nothing to do
    assert host.commands == []


def test_process_live_status_reads_the_engine_directory_again():
    host = Host()
    host.engine_files["llama"] = EngineFiles("llama", pid=42, stat=("S", 42, 1000))
    style = ProcessStyle(host, OPTIONS)
    assert style.live_status("llama").alive
    host.engine_files["llama"] = EngineFiles("llama", pid=42, stat=("Z", 42, 1000))
    assert style.live_status("llama") == ServiceStatus(False, state="failed")


def test_process_logs_tail_the_engine_log_and_cpus_come_with_the_files():
    host = Host()
    style = ProcessStyle(host, OPTIONS)
    assert style.logs_command("llama", 20) == sh(TAIL_SCRIPT, 20, f"{REMOTE}/llama/engine.log")
    assert style.cpus(EngineFiles("llama", cpus="0-7"), 42) == "0-7"
    assert host.commands == []


# ----------------------------------------------------------------------------- systemd


def test_systemd_renders_the_unit_with_our_env_file():
    style = SystemdStyle(Host(), OPTIONS)
    rendered = style.render("llama", config())
    assert rendered.unit == render_systemd(
        config().validated(),
        unit_name="llm-llama.service",
        env_file=f"{REMOTE}/llama/env",
        user="llm",
        python=OPTIONS.python,
    )


def test_systemd_start_writes_unit_and_env_then_restarts_the_unit():
    host = Host()
    style = SystemdStyle(host, OPTIONS)
    rendered = style.render("llama", config())
    assert style.start("llama", rendered) == {}
    assert host.written["/etc/systemd/system/llm-llama.service"] == (
        rendered.unit.unit_text,
        0o644,
    )
    assert host.written[f"{REMOTE}/llama/env"] == (rendered.unit.env_text, 0o600)
    assert host.commands == [
        (
            "systemctl --user daemon-reload && systemctl --user restart llm-llama.service",
            None,
        )
    ]


@pytest.mark.parametrize(
    ("show", "has_state", "expected"),
    [
        ("ActiveState=active\nMainPID=77\nExecMainStatus=0\n", True, (True, 77, None, "running")),
        ("ActiveState=activating\nMainPID=0\n", False, (True, None, None, "running")),
        ("ActiveState=failed\nMainPID=0\nExecMainStatus=1\n", False, (False, None, 1, "failed")),
        ("ActiveState=inactive\nMainPID=0\nExecMainStatus=1\n", True, (False, None, 1, "failed")),
        ("ActiveState=inactive\nMainPID=0\nExecMainStatus=1\n", False, (False, None, 1, "stopped")),
        ("", False, (False, None, None, "stopped")),
    ],
)
def test_systemd_status_reads_systemctl_show(show, has_state, expected):
    host = Host({"show": Result(0, show, "")})
    style = SystemdStyle(host, OPTIONS)
    files = EngineFiles("llama", state={"started_at": 1.0} if has_state else {})
    assert style.status("llama", files) == ServiceStatus(*expected)
    assert host.commands[0][0] == (
        "systemctl --user show -p ActiveState -p MainPID -p ExecMainStatus -p Result "
        "llm-llama.service"
    )


def test_systemd_stop_logs_and_cpus():
    host = Host({"--user": Result(0, "0-3\n", "")})
    style = SystemdStyle(host, OPTIONS)
    style.stop("llama")
    assert host.commands[-1] == ("systemctl --user stop llm-llama.service", 35.0)
    assert style.logs_command("llama", 50) == (
        "journalctl --user -u llm-llama.service -n 50 --no-pager -o cat"
    )
    assert style.may_be_up(EngineFiles("llama"))  # only systemctl knows
    assert style.cpus(EngineFiles("llama"), None) is None


# ----------------------------------------------------------------------------- docker


def test_docker_renders_docker_run_with_our_docker_program():
    style = DockerStyle(Host(), OPTIONS)
    engine = config(host="0.0.0.0")
    rendered = style.render("llama", engine)
    expected = render_docker(engine.validated(), name="llm-llama", image=OPTIONS.docker_image)
    assert rendered.argv == ("/usr/bin/docker", *expected[1:])
    assert rendered.argv[1:3] == ("run", "-d")


def test_docker_refuses_the_simulator():
    style = DockerStyle(Host(), OPTIONS)
    with pytest.raises(TransportError, match="refused"):
        style.render("llama", config(runner="simulator", simulator={"gpu": "h100-sxm"}))


def test_docker_start_removes_a_leftover_container_first():
    host = Host()
    style = DockerStyle(host, OPTIONS)
    rendered = style.render("llama", config())
    assert style.start("llama", rendered) == {}
    assert host.commands == [
        ("/usr/bin/docker rm -f llm-llama >/dev/null 2>&1; " + shlex.join(rendered.argv), None)
    ]


@pytest.mark.parametrize(
    ("inspect", "expected"),
    [
        (Result(0, "running 4242 0\n", ""), (True, 4242, None, "running")),
        (Result(0, "created 0 0\n", ""), (True, None, None, "running")),
        (Result(0, "exited 0 1\n", ""), (False, None, 1, "failed")),
        (Result(0, "exited 0 0\n", ""), (False, None, 0, "stopped")),
        (Result(0, "dead 0 0\n", ""), (False, None, 0, "failed")),
        (Result(1, "", "Error: No such object: llm-llama"), (False, None, None, "stopped")),
    ],
)
def test_docker_status_reads_docker_inspect(inspect, expected):
    host = Host({"inspect": inspect})
    style = DockerStyle(host, OPTIONS)
    assert style.status("llama", EngineFiles("llama")) == ServiceStatus(*expected)
    template = "{{.State.Status}} {{.State.Pid}} {{.State.ExitCode}}"
    assert host.commands[0][0] == shlex.join(
        ["/usr/bin/docker", "inspect", "-f", template, "llm-llama"]
    )


def test_docker_stop_and_logs():
    host = Host({"logs": Result(1, "Error: No such container: llm-llama\n", "")})
    style = DockerStyle(host, OPTIONS)
    style.stop("llama")
    assert host.commands[-1] == ("/usr/bin/docker stop -t 5 llm-llama", 35.0)
    assert style.logs_command("llama", 50) == "/usr/bin/docker logs --tail 50 llm-llama 2>&1"
    assert style.logs("llama", 50) == []  # no container: no log, not docker's complaint
    host.answers["logs"] = Result(0, "one\ntwo\nthree\n", "")
    assert style.logs("llama", 2) == ["two", "three"]


@pytest.mark.parametrize("style_class", [ProcessStyle, SystemdStyle, DockerStyle])
def test_bad_engine_names_never_reach_a_command(style_class):
    host = Host()
    style = style_class(host, OPTIONS)
    for call in (style.logs_command, style.stop):
        with pytest.raises(TransportError):
            call("a;reboot", 10) if call == style.logs_command else call("a;reboot")
    assert host.commands == []


def test_options_that_could_read_as_flags_are_refused():
    with pytest.raises(TransportError, match="docker_image"):
        SshTransport("h", private_key="x", host_key_fingerprint=None, docker_image="-v/:/x")
    with pytest.raises(TransportError, match="unknown launch style"):
        SshTransport("h", private_key="x", host_key_fingerprint=None, launch_style="ansible")
    ok = SshTransport(
        "h", private_key="x", host_key_fingerprint=None, systemctl=[sys.executable, "--user"]
    )
    assert ok.style.options.systemctl == (sys.executable, "--user")


# ----------------------------------------------------------------------------- readiness wait


class Exits(ProcessStyle):
    """A style whose engine is up for ``up`` status reads, then gone with ``code``."""

    def __init__(self, up: int, code: int | None = None):
        super().__init__(Host(), OPTIONS)
        self.up, self.code = up, code

    def live_status(self, name):
        self.up -= 1
        return ServiceStatus(self.up >= 0, exit_code=None if self.up >= 0 else self.code)


def waiting_transport(style, problems) -> SshTransport:
    transport = SshTransport("h", private_key="x", host_key_fingerprint=None)
    transport.style = style
    answers = iter(problems)
    transport._ready = lambda launch: next(answers)
    return transport


def test_the_wait_ends_ready_when_the_rule_says_so():
    transport = waiting_transport(Exits(up=5), ["/health answered 503", None])
    assert transport._wait_ready("llama", config(), 5) == (True, "")


def test_the_wait_reports_an_engine_that_exits():
    transport = waiting_transport(Exits(up=1, code=3), ["/health: no answer"] * 5)
    ready, error = transport._wait_ready("llama", config(), 5)
    assert not ready and error == "the engine exited before it was ready (exit status 3)"


def test_the_wait_gives_up_at_the_deadline_with_the_rules_reason():
    transport = waiting_transport(Exits(up=1000), ["/v1/models lists no model"] * 1000)
    ready, error = transport._wait_ready("llama", config(), 0.3)
    assert not ready
    assert error == "the engine was not ready within 0.3 s (/v1/models lists no model)"
