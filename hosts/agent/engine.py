"""An engine as the agent keeps it: its stored config, current process, state and output (a
bounded log across its runs, plus the agent's own notes in it), the operations that change it,
and the errors the agent answers requests with.

States: ``stopped``, ``starting``, ``ready``, ``failed``, and ``conflict``: the engine cannot be
trusted to be what the agent recorded (its port is held by another process, or the process it
left running now runs a command the agent would not launch) — reported, never killed blindly.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections import deque
from dataclasses import dataclass, field

from hosts.agent.process import Run
from hosts.engines.launch import LaunchConfig

log = logging.getLogger("hosts.agent.supervisor")

LOG_LINES = 2000  # per engine, across its runs
STATUS_LINES = 50
AGENT_NOTE = "--- agent:"
# The line of an engine's output that names its failure: Python's "ValueError: …", argparse's
# "vllm serve: error: …", a traceback's last line.
ERROR_LINE = re.compile(r"\b\w*(Error|Exception)\b|: error: |\bFATAL\b|\bfailed\b", re.IGNORECASE)


class AgentError(Exception):
    """A request the supervisor refuses; ``status`` is the HTTP status to answer with."""

    status = 400

    def __init__(self, message: str, errors: dict | None = None):
        super().__init__(message)
        self.errors = errors


class BadRequest(AgentError):
    status = 400


class NotFound(AgentError):
    status = 404


class Conflict(AgentError):
    status = 409


def error_line(lines: list[str]) -> str:
    """The line that says what went wrong, else the last non-empty one."""
    for line in reversed(lines):
        if ERROR_LINE.search(line) and not line.startswith(AGENT_NOTE):
            return line.strip()
    for line in reversed(lines):
        if line.strip() and not line.startswith(AGENT_NOTE):
            return line.strip()
    return ""


@dataclass
class Operation:
    """One apply or restart, as ``GET /v1/operations/<id>`` reports it."""

    id: str
    engine: str
    kind: str
    state: str = "running"
    error: str = ""
    log_lines: list[str] = field(default_factory=list)
    started_at: float = field(default_factory=time.time)
    finished_at: float | None = None
    steps: list[str] = field(default_factory=list)
    # Frees the engine for the next operation; runs before the final state is visible so a
    # client that saw "ready" can apply again at once without a 409.
    release: object = field(default=None, repr=False, compare=False)

    def step(self, message: str) -> None:
        self.steps.append(f"{time.strftime('%H:%M:%S')} {message}")
        log.info("operation %s (%s %s): %s", self.id, self.kind, self.engine, message)

    def finish(self, state: str, error: str = "", log_lines: list[str] | None = None) -> None:
        self.error = error
        if log_lines is not None:
            self.log_lines = list(log_lines)
        self.finished_at = time.time()
        self.step(f"finished: {state}" + (f" ({error})" if error else ""))
        if callable(self.release):
            self.release()
        self.state = state  # last: a poller that sees the final state sees everything else too

    def to_dict(self) -> dict:
        return {
            "id": self.id,
            "engine": self.engine,
            "kind": self.kind,
            "state": self.state,
            "error": self.error,
            "log_lines": list(self.log_lines),
            "started_at": self.started_at,
            "finished_at": self.finished_at,
            "steps": list(self.steps),
        }


class Engine:
    """One named engine: its stored config, current process, state and output."""

    def __init__(self, name: str, config: LaunchConfig | None = None):
        self.name = name
        self.config = config
        self.run: Run | None = None
        self.state = "stopped"
        self.error = ""
        self.exit_code: int | None = None
        self.started_at: float | None = None
        self.ready_at: float | None = None
        self.last_lines: list[str] = []
        self.log: deque[str] = deque(maxlen=LOG_LINES)
        self.lock = threading.RLock()
        self.operation: Operation | None = None
        self.worker: threading.Thread | None = None
        self.cancel = threading.Event()
        # The apply or restart under way, as persisted: a killed agent leaves it behind and
        # the next one resolves it (``Supervisor._recover``).
        self.pending: dict | None = None
        # What the agent found at start-up and did about it: {"at", "message"}.
        self.recovery: dict | None = None
        # An operation that died with a previous agent: {"operation", "kind", "started_at",
        # "found_at", "outcome"}; kept until the next operation on the engine begins, so the
        # panel can close its own record of it.
        self.interrupted: dict | None = None

    @property
    def pid(self) -> int | None:
        run = self.run
        return run.pid if run is not None and run.alive() else None

    def running(self) -> bool:
        return self.run is not None and self.run.alive()

    def recovered(self, message: str) -> None:
        """Record what the agent found at start-up and did about it (status and log)."""
        self.recovery = {"at": time.time(), "message": message}
        self.note(message)
        log.warning("engine %s: %s", self.name, message)

    def note(self, message: str) -> None:
        """A line of the agent's own in the engine's log, told apart by its prefix."""
        self.log.append(f"{AGENT_NOTE} {message} ---")

    def mark_failed(self, error: str, lines: list[str]) -> None:
        with self.lock:
            self.state = "failed"
            self.error = error
            self.last_lines = list(lines)[-STATUS_LINES:]

    def status(self) -> dict:
        with self.lock:
            lines = self.last_lines if self.state == "failed" else list(self.log)[-STATUS_LINES:]
            return {
                "name": self.name,
                "state": self.state,
                "pid": self.pid,
                "exit_code": self.exit_code,
                "started_at": self.started_at,
                "ready_at": self.ready_at,
                "error": self.error,
                "last_lines": list(lines),
                "config": self.config.to_dict() if self.config is not None else None,
                "operation": self.operation.id if self.operation else None,
                "recovery": dict(self.recovery) if self.recovery else None,
                "interrupted": dict(self.interrupted) if self.interrupted else None,
            }


def engine_url(cfg: LaunchConfig) -> str:
    """Where the agent reaches the engine: its own loopback for a wildcard bind."""
    host = cfg.host or "127.0.0.1"
    if host in ("0.0.0.0", "*"):  # noqa: S104 - a wildcard bind is reached on loopback
        host = "127.0.0.1"
    elif host == "::":
        host = "::1"
    if ":" in host:
        host = f"[{host}]"
    return f"http://{host}:{cfg.port}"


def engine_api_key(cfg: LaunchConfig) -> str | None:
    return cfg.settings.get("api_key") or cfg.env.get("VLLM_API_KEY") or None


def gpu_count(cfg: LaunchConfig) -> int:
    s = cfg.settings
    return int(s.get("tensor_parallel_size") or s.get("tp_size") or 1)


def visible_devices(env: dict[str, str]) -> list[int] | None:
    value = env.get("CUDA_VISIBLE_DEVICES")
    if value is None:
        return None
    try:
        return [int(v) for v in value.split(",") if v.strip()]
    except ValueError:
        return None  # UUIDs or MIG ids: no index mapping to offer
