"""Engine processes: starting one without a shell in a session of its own, reading its output
into bounded buffers, noticing it exit, and stopping its whole process group (vLLM and SGLang
fork workers per GPU): SIGTERM, a grace period, SIGKILL."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import psutil

from hosts.agent.policy import child_env
from hosts.engines.launch import LaunchConfig

MAX_LINE_BYTES = 16384
TAIL_LINES = 200  # per run: enough for a traceback and the engine's error
STOP_GRACE_S = 10.0
PROJECT_ROOT = Path(__file__).resolve().parents[2]


@dataclass
class Prepared:
    """A config that passed every check, with the command to run it."""

    config: LaunchConfig
    argv: list[str]
    env: dict[str, str]


class Run:
    """One engine process: its output reader and the watcher that notices it exit. Output
    lines go to ``tail`` (this run's) and to ``engine_log`` (the engine's, across runs);
    ``on_exit(run)`` is called once the process has ended and its last lines are read."""

    def __init__(
        self,
        name: str,
        prepared: Prepared,
        engine_log: deque[str],
        on_exit: Callable[[Run], None],
    ):
        self.prepared = prepared
        self.tail: deque[str] = deque(maxlen=TAIL_LINES)
        self.exit_code: int | None = None
        self.stopping = False
        self.exited = threading.Event()
        self.started_at = time.time()
        self.proc = subprocess.Popen(  # noqa: S603 - argv checked against the allow-list
            prepared.argv,
            env=self._env(prepared),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            close_fds=True,
        )
        self.pid = self.proc.pid
        try:
            self.create_time = psutil.Process(self.pid).create_time()
        except psutil.Error:
            self.create_time = None
        self._reader = threading.Thread(
            target=self._read, args=(engine_log,), name=f"engine-{name}-out", daemon=True
        )
        self._reader.start()
        threading.Thread(
            target=self._watch, args=(on_exit,), name=f"engine-{name}-wait", daemon=True
        ).start()

    @staticmethod
    def _env(prepared: Prepared) -> dict[str, str]:
        env = child_env(prepared.env)
        if prepared.config.runner == "simulator":
            # The simulator must import this very ``hosts`` package, wherever the agent's
            # working directory is.
            env["PYTHONPATH"] = os.pathsep.join(
                p for p in (str(PROJECT_ROOT), env.get("PYTHONPATH", "")) if p
            )
        return env

    def _read(self, engine_log: deque) -> None:
        # Bounded reads: an engine printing megabytes without a newline (a progress bar, binary
        # junk) must not grow one line without limit.
        for raw in iter(lambda: self.proc.stdout.readline(MAX_LINE_BYTES), b""):
            line = raw.decode("utf-8", errors="replace").rstrip("\r\n")
            self.tail.append(line)
            engine_log.append(line)
        self.proc.stdout.close()

    def _watch(self, on_exit) -> None:
        code = self.proc.wait()
        # Workers that inherited the pipe may keep it open after the leader died: don't wait
        # for them to give the last lines.
        self._reader.join(timeout=2)
        self.exit_code = code
        self.exited.set()
        on_exit(self)

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self, grace: float = STOP_GRACE_S) -> int | None:
        """SIGTERM the process group, SIGKILL what is left after ``grace`` seconds."""
        self.stopping = True
        stop_group(self.pid, grace, leader=self.proc)
        self.exited.wait(5)
        return self.proc.returncode


def stop_group(pgid: int, grace: float, leader: subprocess.Popen | None = None) -> None:
    """Stop a whole process group; the engines' workers go with their leader."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    if leader is not None:
        with contextlib.suppress(subprocess.TimeoutExpired):
            leader.wait(timeout=grace)
    while time.monotonic() < deadline and _group_exists(pgid):
        time.sleep(0.05)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)
    if leader is not None:
        with contextlib.suppress(subprocess.TimeoutExpired):
            leader.wait(timeout=5)


def _group_exists(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # killpg also reaches zombies nobody has reaped yet: only living members count.
    for proc in psutil.process_iter():
        try:
            if os.getpgid(proc.pid) == pgid and proc.status() != psutil.STATUS_ZOMBIE:
                return True
        except (psutil.Error, OSError):
            continue
    return False


def process_tree(pid: int | None) -> list[int]:
    """``pid`` and all its descendants (an engine's workers hold its GPUs)."""
    if pid is None:
        return []
    try:
        return [pid, *(child.pid for child in psutil.Process(pid).children(recursive=True))]
    except psutil.Error:
        return [pid]
