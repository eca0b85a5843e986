"""The launch styles of the SSH transport: one class per way an engine runs on a host, behind
one small interface, so the transport picks a class once and never asks which style it has.

* ``process``: a detached process group (``setsid``) started from ``<remote_dir>/<name>/``,
  which holds ``config.json`` (the LaunchConfig), ``env``, ``engine.pid``, ``engine.log``
  (the previous run's in ``engine.log.1``) and ``state.json`` (timestamps);
* ``systemd``: a unit ``llm-<name>.service`` rendered by ``render_systemd``;
* ``docker``: a container ``llm-<name>`` started by ``render_docker``'s ``docker run``.

Each style renders a validated LaunchConfig into what it starts, starts it, reads its status as
the service manager sees it, stops it and reads its log. The common steps around them (the
engine directory, config.json and state.json, the port check, the readiness wait) are the
transport's. Secrets in the engine's environment go to a 0600 file (sourced by the start
script, or handed to systemd/docker), never onto a command line.
"""

from __future__ import annotations

import re
import shlex
from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import ClassVar, Protocol

from hosts.engines.launch import (
    LaunchConfig,
    LaunchError,
    SystemdUnit,
    render_docker,
    render_process,
    render_systemd,
)
from hosts.transport import procfs
from hosts.transport.base import TransportError, check_engine_name
from hosts.transport.ssh.parsing import EngineFiles, int_or_none
from hosts.transport.ssh.scripts import CPUS_SCRIPT, START_SCRIPT, STOP_SCRIPT, TAIL_SCRIPT, sh
from hosts.transport.ssh.session import Result

_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# What each service manager reports while the engine's process exists.
_SYSTEMD_UP = ("active", "activating", "reloading")
_DOCKER_UP = ("running", "restarting", "created")


class Remote(Protocol):
    """What a style needs of the host: ``SshSession``'s public primitives."""

    command_timeout: float

    def run(self, command: str, *, timeout: float | None = None, what: str = ...) -> Result: ...

    def check(self, command: str, what: str, *, timeout: float | None = None) -> Result: ...

    def write_file(self, path: str, data: str, mode: int) -> None: ...

    def engine_dir(self, name: str) -> str: ...

    def files(self, name: str) -> EngineFiles: ...


@dataclass(frozen=True)
class StyleOptions:
    """The host's programs and paths the styles use (checked by the transport)."""

    python: str = "python3"
    workdir: str | None = None
    unit_dir: str = "/etc/systemd/system"
    systemd_user: str | None = None
    systemctl: tuple[str, ...] = ("systemctl",)
    journalctl: tuple[str, ...] = ("journalctl",)
    docker: tuple[str, ...] = ("docker",)
    docker_image: str | None = None
    stop_grace_s: float = 10.0


@dataclass(frozen=True)
class Rendered:
    """A validated config and what its style starts: an argv (+ env), or a systemd unit."""

    launch: LaunchConfig
    argv: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    unit: SystemdUnit | None = None


@dataclass(frozen=True)
class ServiceStatus:
    """The engine as its service manager sees it; ``state`` is running, stopped or failed."""

    alive: bool
    pid: int | None = None
    exit_code: int | None = None
    state: str = "stopped"


def _refused(exc: LaunchError) -> TransportError:
    return TransportError(f"the launch config was refused: {exc}")


class LaunchStyle(ABC):
    """One way of running an engine on an SSH host."""

    name: ClassVar[str]

    def __init__(self, remote: Remote, options: StyleOptions):
        self.remote = remote
        self.options = options

    @abstractmethod
    def render(self, name: str, launch: LaunchConfig) -> Rendered:
        """Everything ``start`` needs, rendered (and so validated) before anything changes;
        TransportError when the config is refused."""

    @abstractmethod
    def start(self, name: str, rendered: Rendered) -> dict:
        """Start the engine (its directory exists, nothing runs under the name); what to add to
        its state.json."""

    @abstractmethod
    def status(self, name: str, files: EngineFiles) -> ServiceStatus:
        """The engine's service as the style sees it; ``files`` is its engine directory."""

    @abstractmethod
    def stop(self, name: str, files: EngineFiles | None = None) -> None:
        """Stop the engine (TERM, then KILL after the grace period); nothing running is fine."""

    @abstractmethod
    def logs_command(self, name: str, lines: int) -> str:
        """The command line printing the engine's last ``lines`` lines of output."""

    def live_status(self, name: str) -> ServiceStatus:
        """The status during a readiness wait: only what the style needs is read again."""
        return self.status(name, EngineFiles(name))

    def logs(self, name: str, lines: int) -> list[str]:
        result = self.remote.run(self.logs_command(name, lines), what="reading the engine's log")
        return result.out.splitlines()[-lines:]

    def may_be_up(self, files: EngineFiles) -> bool:
        """Whether the engine may be running, from its directory alone (without asking)."""
        return True

    def cpus(self, files: EngineFiles, pid: int | None) -> str | None:
        """The CPU list the engine's process may run on (``Cpus_allowed_list``)."""
        if not pid:
            return None
        result = self.remote.run(sh(CPUS_SCRIPT, int(pid)), what="reading CPU affinity")
        return result.out.strip() or None

    @property
    def _stop_timeout(self) -> float:
        return self.options.stop_grace_s + self.remote.command_timeout


class ProcessStyle(LaunchStyle):
    """A detached process group started by START_SCRIPT, followed through its pid file."""

    name = "process"

    def render(self, name: str, launch: LaunchConfig) -> Rendered:
        try:
            launch = launch.validated()
            command = render_process(launch, python=self.options.python)
            for key in command.env:
                if not _ENV_NAME.fullmatch(key):
                    raise LaunchError({"env": f"{key!r} is not an environment variable name"})
        except LaunchError as exc:
            raise _refused(exc) from exc
        return Rendered(launch, tuple(command.argv), dict(command.env))

    def start_command(self, directory: str, argv: tuple[str, ...]) -> str:
        return sh(START_SCRIPT, directory, self.options.workdir or directory, *argv)

    def start(self, name: str, rendered: Rendered) -> dict:
        directory = self.remote.engine_dir(name)
        env_text = "".join(f"{k}={shlex.quote(v)}\n" for k, v in rendered.env.items())
        self.remote.write_file(f"{directory}/env", env_text, 0o600)
        result = self.remote.check(
            self.start_command(directory, rendered.argv), "starting the engine"
        )
        lines = result.out.splitlines()
        stat = procfs.parse_proc_stat(lines[1]) if len(lines) > 1 else None
        return {"pid": int(lines[0]), "starttime": stat[2] if stat else None}

    def status(self, name: str, files: EngineFiles) -> ServiceStatus:
        if files.process_alive():
            return ServiceStatus(True, files.pid, None, "running")
        # A pid file we did not remove means the engine ended without being stopped.
        return ServiceStatus(False, state="failed" if files.pid is not None else "stopped")

    def live_status(self, name: str) -> ServiceStatus:
        return self.status(name, self.remote.files(name))

    def stop_command(self, pid: int) -> str:
        return sh(STOP_SCRIPT, pid, max(1, round(self.options.stop_grace_s * 10)))

    def stop(self, name: str, files: EngineFiles | None = None) -> None:
        directory = self.remote.engine_dir(name)
        files = files or self.remote.files(name)
        if files.pid is None:
            return
        # A live pid with another start time is someone else's process: leave it.
        if not (files.stat is not None and not files.process_alive()):
            self.remote.run(self.stop_command(files.pid), timeout=self._stop_timeout, what="stop")
        self.remote.run(shlex.join(["rm", "-f", f"{directory}/engine.pid"]), what="stop")

    def logs_command(self, name: str, lines: int) -> str:
        return sh(TAIL_SCRIPT, lines, f"{self.remote.engine_dir(name)}/engine.log")

    def may_be_up(self, files: EngineFiles) -> bool:
        return files.process_alive()

    def cpus(self, files: EngineFiles, pid: int | None) -> str | None:
        return files.cpus  # read with the engine directory, no extra command


class SystemdStyle(LaunchStyle):
    """A unit ``llm-<name>.service`` written over SFTP and run by systemd."""

    name = "systemd"

    @staticmethod
    def unit(name: str) -> str:
        return f"llm-{check_engine_name(name)}.service"

    def _systemctl(self, *args: str) -> str:
        return shlex.join([*self.options.systemctl, *args])

    def render(self, name: str, launch: LaunchConfig) -> Rendered:
        try:
            launch = launch.validated()
            unit = render_systemd(
                launch,
                unit_name=self.unit(name),
                env_file=f"{self.remote.engine_dir(name)}/env",
                user=self.options.systemd_user,
                python=self.options.python,
            )
        except LaunchError as exc:
            raise _refused(exc) from exc
        return Rendered(launch, unit=unit)

    def start_command(self, name: str) -> str:
        return (
            self._systemctl("daemon-reload") + " && " + self._systemctl("restart", self.unit(name))
        )

    def start(self, name: str, rendered: Rendered) -> dict:
        unit = rendered.unit
        self.remote.write_file(f"{self.remote.engine_dir(name)}/env", unit.env_text, 0o600)
        path = f"{self.options.unit_dir.rstrip('/')}/{self.unit(name)}"
        self.remote.write_file(path, unit.unit_text, 0o644)
        self.remote.check(self.start_command(name), f"starting {self.unit(name)}")
        return {}

    def status_command(self, name: str) -> str:
        props = ("ActiveState", "MainPID", "ExecMainStatus", "Result")
        return self._systemctl("show", *(w for p in props for w in ("-p", p)), self.unit(name))

    def status(self, name: str, files: EngineFiles) -> ServiceStatus:
        result = self.remote.run(
            self.status_command(name), what=f"systemctl show {self.unit(name)}"
        )
        props = dict(line.split("=", 1) for line in result.out.splitlines() if "=" in line)
        active = props.get("ActiveState", "inactive")
        pid = int_or_none(props.get("MainPID")) or None
        exit_code = int_or_none(props.get("ExecMainStatus"))
        if active in _SYSTEMD_UP:
            return ServiceStatus(True, pid, None, "running")
        failed = active == "failed" or (exit_code not in (None, 0) and bool(files.state))
        return ServiceStatus(False, None, exit_code, "failed" if failed else "stopped")

    def stop_command(self, name: str) -> str:
        return self._systemctl("stop", self.unit(name))

    def stop(self, name: str, files: EngineFiles | None = None) -> None:
        what = f"stopping {self.unit(name)}"
        self.remote.run(self.stop_command(name), timeout=self._stop_timeout, what=what)

    def logs_command(self, name: str, lines: int) -> str:
        return shlex.join(
            [
                *self.options.journalctl,
                *("-u", self.unit(name), "-n", str(lines), "--no-pager", "-o", "cat"),
            ]
        )


class DockerStyle(LaunchStyle):
    """A detached container ``llm-<name>`` from render_docker's ``docker run -d``."""

    name = "docker"

    @staticmethod
    def container(name: str) -> str:
        return f"llm-{check_engine_name(name)}"

    def _docker(self, *args: str) -> str:
        return shlex.join([*self.options.docker, *args])

    def render(self, name: str, launch: LaunchConfig) -> Rendered:
        try:
            launch = launch.validated()
            argv = render_docker(launch, name=self.container(name), image=self.options.docker_image)
        except LaunchError as exc:
            raise _refused(exc) from exc
        # Detached is part of the contract: the transport polls the container, it does not
        # stream it.
        if argv[:3] != ["docker", "run", "-d"]:
            raise TransportError(f"render_docker returned an unexpected command: {argv[:3]}")
        return Rendered(launch, (*self.options.docker, *argv[1:]))

    def start_command(self, name: str, argv: tuple[str, ...]) -> str:
        # A container of the same name (stopped, or from an earlier run) would block the name.
        return (
            self._docker("rm", "-f", self.container(name)) + " >/dev/null 2>&1; " + shlex.join(argv)
        )

    def start(self, name: str, rendered: Rendered) -> dict:
        command = self.start_command(name, rendered.argv)
        self.remote.check(command, f"starting container {self.container(name)}")
        return {}

    def status_command(self, name: str) -> str:
        template = "{{.State.Status}} {{.State.Pid}} {{.State.ExitCode}}"
        return self._docker("inspect", "-f", template, self.container(name))

    def status(self, name: str, files: EngineFiles) -> ServiceStatus:
        what = f"docker inspect {self.container(name)}"
        result = self.remote.run(self.status_command(name), what=what)
        parts = result.out.split()
        if result.rc != 0 or len(parts) != 3:
            return ServiceStatus(False)
        status, pid, code = parts[0], int_or_none(parts[1]) or None, int_or_none(parts[2])
        if status in _DOCKER_UP:
            return ServiceStatus(True, pid, None, "running")
        failed = status == "dead" or code != 0
        return ServiceStatus(False, None, code, "failed" if failed else "stopped")

    def stop_command(self, name: str) -> str:
        seconds = str(max(1, round(self.options.stop_grace_s)))
        return self._docker("stop", "-t", seconds, self.container(name))

    def stop(self, name: str, files: EngineFiles | None = None) -> None:
        what = f"stopping {self.container(name)}"
        self.remote.run(self.stop_command(name), timeout=self._stop_timeout, what=what)

    def logs_command(self, name: str, lines: int) -> str:
        return self._docker("logs", "--tail", str(lines), self.container(name)) + " 2>&1"

    def logs(self, name: str, lines: int) -> list[str]:
        result = self.remote.run(self.logs_command(name, lines), what="reading the engine's log")
        if result.rc != 0 and "No such" in result.out:
            return []  # never started, or removed: no log rather than docker's complaint
        return result.out.splitlines()[-lines:]


STYLES: dict[str, type[LaunchStyle]] = {
    style.name: style for style in (ProcessStyle, SystemdStyle, DockerStyle)
}
LAUNCH_STYLES = tuple(STYLES)
