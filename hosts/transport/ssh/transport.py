"""``SshTransport``: the Transport interface over SSH, for a host that runs no agent of ours.

Engines run in the transport's launch style (``styles.py``), picked once at construction.
Readiness is ``hosts.engines.readiness``'s rule, judged on ``GET /health`` and ``GET /v1/models``
sent to the engine's port over the SSH connection (``SshSession.http_get``). Telemetry comes
from ``nvidia-smi`` CSV queries plus ``/proc``; hosts without ``nvidia-smi`` report ``source:
"none"``, or ``"simulator"`` when simulated engines of ours run there (their
``/simulator/gpus`` readings).
"""

from __future__ import annotations

import re
import secrets
import time
from collections.abc import Sequence

from hosts.agent.host import LIBRARIES
from hosts.engines import readiness
from hosts.engines.launch import LaunchConfig, LaunchError
from hosts.transport.base import ApplyOutcome, Transport, TransportError, check_engine_name
from hosts.transport.ssh import parsing
from hosts.transport.ssh.parsing import probe_host
from hosts.transport.ssh.scripts import INFO_SCRIPT, LIBRARIES_PY, MKDIR_SCRIPT, sh
from hosts.transport.ssh.session import CommandFailed, SshSession
from hosts.transport.ssh.styles import LAUNCH_STYLES, STYLES, Rendered, StyleOptions
from hosts.transport.ssh.telemetry import HostReader

LOG_LINES_ON_FAILURE = 50
STATUS_LAST_LINES = 20
MAX_LOG_LINES = 10000
POLL_INTERVAL = 0.25

# Options that reach a command line (paths, program names): plain characters only, so nothing
# an admin types can read as a second flag or a shell construct even before quoting.
_SAFE_WORD = re.compile(r"^[A-Za-z0-9_.,:/@+=~-]+$")


class PortTaken(CommandFailed):
    """The engine's port answers before the engine is started."""


class _EngineExited(Exception):
    """The engine died during the readiness wait (the message says how)."""


def _check_options(launch_style: str, words: dict, prefixes: dict[str, Sequence[str]]) -> None:
    """Refuse options that could read as a flag or a shell construct on a command line."""
    if launch_style not in LAUNCH_STYLES:
        raise TransportError(
            f"unknown launch style {launch_style!r} (choose from {', '.join(LAUNCH_STYLES)})"
        )
    checked = [(what, value, False) for what, value in words.items()]
    for program, prefix in prefixes.items():
        # Options of a prefix (systemctl --user) may start with "-"; the program may not.
        checked += [(f"{program}[{i}]", v, i > 0) for i, v in enumerate(prefix)]
    for what, value, flag_ok in checked:
        if value is not None and (
            not _SAFE_WORD.match(value) or (value.startswith("-") and not flag_ok)
        ):
            raise TransportError(f"SSH transport option {what}={value!r} is not allowed")
    if not all(prefixes.values()):
        raise TransportError("systemctl, journalctl and docker need a program name")
    if not (words["remote_dir"].startswith("/") or words["remote_dir"].startswith("~/")):
        raise TransportError("remote_dir must be absolute or start with ~/")


class SshTransport(SshSession, Transport):
    """One host over SSH. ``private_key`` is the key's OpenSSH/PEM text (decrypted secrets from
    the database, never a path); ``host_key_fingerprint`` the accepted ``SHA256:…`` or None.

    ``remote_dir`` holds one directory per engine (a leading ``~/`` is the login's home).
    ``python`` is the interpreter launch configs are rendered with: for simulated engines, one
    the panel is installed into, so ``python -m hosts.simulator`` imports from anywhere.
    ``workdir`` is the working directory of "process" engines (default: their own
    directory), for hosts where the panel is a plain checkout instead (``-m`` imports from the
    working directory; PYTHONPATH is not an allowed engine variable).
    ``nvidia_smi``, ``systemctl``, ``journalctl`` and ``docker`` are the host's programs
    (absolute paths where PATH differs; stand-ins in tests), the last three as argv prefixes
    (``["systemctl", "--user"]``); ``unit_dir`` is where systemd units are written (over SFTP,
    so the login must be allowed to write there: root, or a user unit directory).
    """

    kind = "ssh"

    def __init__(
        self,
        address: str,
        port: int = 22,
        username: str = "root",
        *,
        private_key: str,
        passphrase: str | None = None,
        host_key_fingerprint: str | None,
        launch_style: str = "process",
        remote_dir: str = "~/.llm-panel",
        workdir: str | None = None,
        connect_timeout: float = 10.0,
        command_timeout: float = 30.0,
        python: str = "python3",
        stop_grace_s: float = 10.0,
        nvidia_smi: str = "nvidia-smi",
        unit_dir: str = "/etc/systemd/system",
        systemd_user: str | None = None,
        systemctl: Sequence[str] = ("systemctl",),
        journalctl: Sequence[str] = ("journalctl",),
        docker: Sequence[str] = ("docker",),
        docker_image: str | None = None,
    ):
        words = {
            "remote_dir": remote_dir,
            "workdir": workdir,
            "python": python,
            "nvidia_smi": nvidia_smi,
            "unit_dir": unit_dir,
            "systemd_user": systemd_user,
            "docker_image": docker_image,
            "username": username,
        }
        programs = {"systemctl": systemctl, "journalctl": journalctl, "docker": docker}
        _check_options(launch_style, words, programs)
        super().__init__(
            address,
            port,
            username,
            private_key=private_key,
            passphrase=passphrase,
            host_key_fingerprint=host_key_fingerprint,
            remote_dir=remote_dir,
            python=python,
            connect_timeout=connect_timeout,
            command_timeout=command_timeout,
        )
        self.launch_style, self.workdir, self.stop_grace_s = launch_style, workdir, stop_grace_s
        self.nvidia_smi = nvidia_smi
        self.unit_dir, self.systemd_user = unit_dir.rstrip("/"), systemd_user
        self.systemctl, self.journalctl = list(systemctl), list(journalctl)
        self.docker, self.docker_image = list(docker), docker_image
        options = StyleOptions(
            python=python,
            workdir=workdir,
            unit_dir=self.unit_dir,
            systemd_user=systemd_user,
            systemctl=tuple(systemctl),
            journalctl=tuple(journalctl),
            docker=tuple(docker),
            docker_image=docker_image,
            stop_grace_s=stop_grace_s,
        )
        self.style = STYLES[launch_style](self, options)
        self._reader = HostReader(self, self.style, nvidia_smi)

    # ------------------------------------------------------------------ readiness

    def _ready(self, launch: LaunchConfig) -> str | None:
        """None when the engine is ready (``hosts.engines.readiness``), else why not."""
        host = probe_host(launch.host)

        def get(path: str) -> readiness.Answer:
            answer = self.http_get(launch.port, path, host=host)
            return readiness.Answer(*answer) if answer else readiness.Answer(None)

        return readiness.ask(get, engine=launch.engine).problem

    def _wait_ready(self, name: str, launch: LaunchConfig, timeout: float) -> tuple[bool, str]:
        """Poll until ready, the engine dies, or ``timeout``: (ready, why not)."""

        def check() -> str | None:
            status = self.style.live_status(name)
            if not status.alive:
                code = status.exit_code
                raise _EngineExited(
                    "the engine exited before it was ready"
                    + (f" (exit status {code})" if code is not None else "")
                )
            return self._ready(launch)

        try:
            problem = readiness.wait_ready(check, timeout, interval_s=POLL_INTERVAL)
        except _EngineExited as exc:
            return False, str(exc)
        if problem is None:
            return True, ""
        return False, f"the engine was not ready within {timeout:g} s ({problem})"

    # ------------------------------------------------------------------ start, run, stop

    def _render(self, name: str, launch: LaunchConfig) -> Rendered:
        return self.style.render(name, launch)

    def _start(self, name: str, rendered: Rendered) -> dict:
        """Start the engine (whatever ran under that name is stopped first); its state.json."""
        launch = rendered.launch
        directory = self.engine_dir(name)
        self.check(sh(MKDIR_SCRIPT, directory), "creating the engine directory")
        self.style.stop(name)
        if self.http_get(launch.port, "/health", host=probe_host(launch.host)) is not None:
            # Something else answers HTTP there: the new engine could not bind, and that other
            # server's /health would pass for ours.
            raise PortTaken(
                f"port {launch.port} on {self.address} is in use by another program "
                "(something answers HTTP there after our engine was stopped)"
            )
        self.write_json(f"{directory}/config.json", launch.to_dict())
        state: dict = {"style": self.style.name, "started_at": time.time(), "ready_at": None}
        state.update(self.style.start(name, rendered))
        self.write_json(f"{directory}/state.json", state)
        return state

    def _run(self, name: str, rendered: Rendered, timeout: float) -> tuple[bool, str, list[str]]:
        """Start and wait: (ready, error, the engine's last lines when it failed). A failed
        engine is stopped again so a half-started one never keeps the port or the GPU."""
        started = time.monotonic()
        try:
            state = self._start(name, rendered)
        except CommandFailed as exc:
            # Not started (the port is taken, a start command failed): the caller may still
            # roll back. A broken connection is raised instead: nothing can be done over it.
            return False, str(exc), []
        ready, error = self._wait_ready(name, rendered.launch, timeout)
        directory = self.engine_dir(name)
        if ready:
            state["seconds_to_ready"] = round(time.monotonic() - started, 2)
            self.write_json(f"{directory}/state.json", {**state, "ready_at": time.time()})
            return True, "", []
        # The log first: "docker rm" and a restart both lose it.
        log_lines = self._logs(name, LOG_LINES_ON_FAILURE)
        self.style.stop(name)
        # Remembered so the status says "failed" (and why) rather than "stopped".
        self.write_json(f"{directory}/state.json", {**state, "error": error})
        return False, error, log_lines

    def _logs(self, name: str, lines: int) -> list[str]:
        return self.style.logs(name, max(1, min(int(lines), MAX_LOG_LINES)))

    @staticmethod
    def _validated(launch: LaunchConfig) -> LaunchConfig:
        try:
            return launch.validated()
        except LaunchError as exc:
            raise TransportError(f"the launch config was refused: {exc}") from exc

    def _stored(self, name: str) -> LaunchConfig:
        files = self.files(name)
        if not files.config:
            raise TransportError(f"engine {name} has no stored config on {self.where}")
        try:
            return LaunchConfig.from_dict(files.config)
        except (LaunchError, TypeError, ValueError, KeyError) as exc:
            raise TransportError(f"the stored config of {name} cannot be read: {exc}") from None

    # ------------------------------------------------------------------ Transport API

    def info(self) -> dict:
        ssh = self._connection()
        marker = "@@" + secrets.token_hex(8)
        command = sh(
            INFO_SCRIPT,
            marker,
            self.nvidia_smi,
            self.remote_dir(),
            self.python,
            LIBRARIES_PY,
            *LIBRARIES,
        )
        result = self._exec(command, what="info")
        sections = parsing.sections(result.out, marker)
        values = dict(sections)
        smi = values.get("smi", "").strip()
        if smi:
            source = "nvidia-smi"
        elif self._reader.simulators(parsing.engine_files(sections)):
            source = "simulator"
        else:
            source = "none"
        fingerprint, key_type = self.presented_key or ("", "")
        return {
            "kind": "ssh",
            "hostname": values.get("hostname", "").strip(),
            "agent_version": None,
            "libraries": parsing.libraries(values.get("libraries", "")),
            "telemetry_source": source,
            "detail": (
                f"{ssh.remote_version} as {self.username}, host key {key_type} {fingerprint}, "
                f"launch style {self.style.name}, "
                + (f"nvidia-smi at {smi}" if smi else "no nvidia-smi")
            ),
        }

    def telemetry(self) -> dict:
        return self._reader.telemetry()

    def inventory(self) -> dict:
        return self._reader.inventory()

    def engine_status(self, name: str) -> dict:
        files = self.files(name)
        status = self.style.status(name, files)
        launch = None
        try:
            launch = files.launch()
        except (LaunchError, TypeError, ValueError, KeyError):
            pass  # a config.json we cannot read is reported as absent, not as a crash
        state, error = status.state, ""
        if status.alive:
            if launch is not None and self._ready(launch) is None:
                state = "ready"
            elif files.state.get("ready_at"):
                state, error = "failed", "the engine runs but no longer answers /health"
            else:
                state = "starting"
        elif files.state.get("error"):
            state, error = "failed", files.state["error"]
        elif state == "failed":
            code = status.exit_code
            error = "the engine exited" + (f" with status {code}" if code is not None else "")
        return {
            "name": name,
            "state": state,
            "pid": status.pid,
            "exit_code": status.exit_code,
            "started_at": files.state.get("started_at"),
            "ready_at": files.state.get("ready_at") if state == "ready" else None,
            "error": error,
            "last_lines": self._logs(name, STATUS_LAST_LINES) if files.state else [],
            "config": files.config,
        }

    def apply_config(
        self,
        name: str,
        launch: LaunchConfig,
        *,
        previous: LaunchConfig | None,
        ready_timeout_s: float,
    ) -> ApplyOutcome:
        check_engine_name(name)
        # Both configs are validated, then rendered, before anything changes: a rollback must
        # not be the first time the previous config meets the renderer.
        checked = [self._validated(c) for c in (launch, previous) if c is not None]
        new = self._render(name, checked[0])
        old = self._render(name, checked[1]) if previous is not None else None
        ready, error, log_lines = self._run(name, new, ready_timeout_s)
        detail = {"launch_style": self.style.name}
        if ready:
            return ApplyOutcome("ready", detail=detail)
        if old is None:
            return ApplyOutcome("failed", error, log_lines, detail)
        back, back_error, back_lines = self._run(name, old, ready_timeout_s)
        if back:
            return ApplyOutcome("rolled_back", error, log_lines, detail)
        detail.update(rollback_error=back_error, rollback_log_lines=back_lines)
        return ApplyOutcome(
            "failed",
            f"{error}; the previous config did not come back either: {back_error}",
            log_lines,
            detail,
        )

    def restart_engine(self, name: str, *, ready_timeout_s: float) -> ApplyOutcome:
        stored = self._stored(name)
        ready, error, log_lines = self._run(name, self._render(name, stored), ready_timeout_s)
        detail = {"launch_style": self.style.name}
        return ApplyOutcome("ready" if ready else "failed", error, log_lines, detail)

    def stop_engine(self, name: str) -> None:
        files = self.files(name)
        self.style.stop(name, files)
        if files.state:
            state = {**files.state, "stopped_at": time.time(), "ready_at": None, "error": None}
            self.write_json(f"{self.engine_dir(name)}/state.json", state)

    def logs(self, name: str, lines: int = 200) -> list[str]:
        check_engine_name(name)
        return self._logs(name, lines)
