"""Engine processes: starting one without a shell in a session of its own, reading its output,
noticing it exit, and stopping its whole process group (vLLM and SGLang fork workers per GPU):
SIGTERM, a grace period, SIGKILL.

An engine's output goes to a file of its own in the agent's state directory (owner-only), not
to a pipe: an engine must outlive an agent that is killed or upgraded (a pipe whose reader
died fails the engine's next write), and the next agent reads the same file. That agent
*adopts* the process (``Run.adopt``): it is not its child, so it is watched through psutil
(its exit code is unknown) and stopped by its process group like any other.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
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
# The output file is cut back to nothing past this size (after it was read): an engine that
# logs every request must not fill the agent's disk. The lines live on in the agent's memory.
MAX_OUTPUT_BYTES = 32 * 2**20
READ_INTERVAL_S = 0.1  # how often the output file is read for new lines
WATCH_INTERVAL_S = 0.2  # how often an adopted process (not our child) is checked
# A process whose start time differs from the recorded one by more is another process that
# got the same pid (psutil reads it in clock ticks since boot: equal to 10 ms on one boot).
CREATE_TIME_TOLERANCE_S = 0.5


@dataclass
class Prepared:
    """A config that passed every check, with the command to run it."""

    config: LaunchConfig
    argv: list[str]
    env: dict[str, str]

    @property
    def digest(self) -> str:
        """What the agent launches, in one value: a recorded process runs "the config the
        agent would launch now" only when its digest is this one."""
        data = json.dumps({"argv": self.argv, "env": self.env}, sort_keys=True)
        return hashlib.sha256(data.encode()).hexdigest()


class Run:
    """One engine process: the reader of its output file and the watcher that notices it
    exit. Output lines go to ``tail`` (this run's) and to ``engine_log`` (the engine's, across
    runs); ``on_exit(run)`` is called once the process has ended and its last lines are read.
    ``Run(...)`` starts the process; ``Run.adopt(...)`` takes over one a previous agent
    started."""

    def __init__(
        self,
        name: str,
        prepared: Prepared,
        engine_log: deque[str],
        on_exit: Callable[[Run], None],
        output: Path,
    ):
        # Truncated: this run's lines start the file (the previous run was stopped first).
        fd = os.open(output, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND, 0o600)
        try:
            os.fchmod(fd, 0o600)
            self.child: subprocess.Popen | None = subprocess.Popen(  # noqa: S603 - argv checked against the allow-list
                prepared.argv,
                env=self._env(prepared),
                stdin=subprocess.DEVNULL,
                stdout=fd,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                close_fds=True,
            )
        finally:
            os.close(fd)
        self._setup(name, prepared, self.child.pid, output, time.time())
        self.digest = prepared.digest
        try:
            self.create_time: float | None = self._ps.create_time()
        except psutil.Error:
            self.create_time = None
        # Popen returns once the program was exec'd: this is its command line (a script's
        # interpreter included), what a later agent compares to tell it from a reused pid.
        self.refresh_cmdline()
        self._start(name, engine_log, on_exit)

    @classmethod
    def adopt(
        cls,
        name: str,
        prepared: Prepared,
        process: psutil.Process,
        engine_log: deque[str],
        on_exit: Callable[[Run], None],
        output: Path,
        started_at: float | None = None,
        digest: str | None = None,
    ) -> Run:
        """Supervise ``process``, started by a previous agent: its output is read from the
        file it still writes to (from the start: the lines of before the agent restarted
        come back too)."""
        run = cls.__new__(cls)
        run.child = None
        run._setup(name, prepared, process.pid, output, started_at or process.create_time())
        run._ps = process
        run.create_time = process.create_time()
        # What it was launched with, as recorded (not what this agent would launch now).
        run.digest = digest or prepared.digest
        run.refresh_cmdline()
        run._start(name, engine_log, on_exit)
        return run

    def _setup(self, name: str, prepared: Prepared, pid: int, output: Path, started_at: float):
        self.name = name
        self.prepared = prepared
        self.pid = pid
        self.output = output
        self.started_at = started_at
        self.tail: deque[str] = deque(maxlen=TAIL_LINES)
        self.exit_code: int | None = None
        self.stopping = False
        self.exited = threading.Event()
        self._ended = threading.Event()  # the process is gone; the reader drains and stops
        self.cmdline: list[str] = []
        try:
            self._ps = psutil.Process(pid)
        except psutil.Error:
            self._ps = None

    def _start(self, name: str, engine_log: deque, on_exit) -> None:
        self._reader = threading.Thread(
            target=self._read, args=(engine_log,), name=f"engine-{name}-out", daemon=True
        )
        self._reader.start()
        threading.Thread(
            target=self._watch, args=(on_exit,), name=f"engine-{name}-wait", daemon=True
        ).start()

    @property
    def adopted(self) -> bool:
        return self.child is None

    def refresh_cmdline(self) -> None:
        with contextlib.suppress(psutil.Error, AttributeError):
            self.cmdline = self._ps.cmdline()

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
        """Follow the output file until the process has ended and the file is drained."""
        try:
            fh = open(self.output, "rb")  # noqa: SIM115 - closed below, after the loop
        except OSError:
            return
        pending = b""
        with fh:
            while True:
                chunk = fh.read(65536)
                if chunk:
                    pending = self._lines(pending + chunk, engine_log)
                    continue
                if self._ended.is_set():
                    break
                self._keep_small(fh)
                self._ended.wait(READ_INTERVAL_S)
        if pending:
            self._emit(pending, engine_log)

    def _lines(self, data: bytes, engine_log: deque) -> bytes:
        """Emit the complete lines of ``data``; return the unfinished rest. Bounded: a line
        without a newline (a progress bar, binary junk) is cut every MAX_LINE_BYTES."""
        *lines, rest = data.split(b"\n")
        for raw in lines:
            self._emit(raw, engine_log)
        while len(rest) > MAX_LINE_BYTES:
            self._emit(rest[:MAX_LINE_BYTES], engine_log)
            rest = rest[MAX_LINE_BYTES:]
        return rest

    def _emit(self, raw: bytes, engine_log: deque) -> None:
        line = raw.decode("utf-8", errors="replace").rstrip("\r\n")
        self.tail.append(line)
        engine_log.append(line)

    def _keep_small(self, fh) -> None:
        """Cut the file back once it is large and read to its end (the engine writes with
        O_APPEND, so it carries on at the new end); follow a file cut by someone else."""
        try:
            size = os.fstat(fh.fileno()).st_size
        except OSError:
            return
        if size < fh.tell():
            fh.seek(0)
        elif size > MAX_OUTPUT_BYTES and size == fh.tell():
            with contextlib.suppress(OSError):
                os.truncate(self.output, 0)
                fh.seek(0)

    def _watch(self, on_exit) -> None:
        if self.child is not None:
            code = self.child.wait()
        else:
            # Not our child: it cannot be wait()ed and its exit code is lost.
            while self.alive():
                time.sleep(WATCH_INTERVAL_S)
            code = None
        self._ended.set()
        # Workers that inherited the file may write on after the leader died: don't wait
        # for them to give the last lines.
        self._reader.join(timeout=2)
        self.exit_code = code
        self.exited.set()
        on_exit(self)

    def alive(self) -> bool:
        if self.child is not None:
            return self.child.poll() is None
        try:
            # is_running() also compares the start time: a reused pid is not our process.
            return self._ps.is_running() and self._ps.status() != psutil.STATUS_ZOMBIE
        except (psutil.Error, AttributeError):
            return False

    @property
    def returncode(self) -> int | None:
        return self.child.returncode if self.child is not None else self.exit_code

    def stop(self, grace: float = STOP_GRACE_S) -> int | None:
        """SIGTERM the process group, SIGKILL what is left after ``grace`` seconds."""
        self.stopping = True
        if self.child is None and not self.alive():
            return None  # never signal a pid that may be someone else's by now
        stop_group(self.pid, grace, leader=self.child)
        self.exited.wait(5)
        return self.returncode


def identify(record: dict | None) -> tuple[psutil.Process | None, str]:
    """The live process a record names, when it is that very process (same pid, start time
    and command line), else (None, why not)."""
    if not record or not record.get("pid"):
        return None, "no process was recorded"
    pid = record["pid"]
    try:
        proc = psutil.Process(int(pid))
        created = proc.create_time()
        cmdline = proc.cmdline()
        if proc.status() == psutil.STATUS_ZOMBIE:
            return None, f"pid {pid} has exited"
    except psutil.NoSuchProcess:
        return None, f"pid {pid} has exited"
    except (psutil.Error, ValueError, TypeError) as exc:
        return None, f"pid {pid} cannot be inspected ({exc})"
    recorded = record.get("create_time")
    if recorded is None or abs(created - float(recorded)) > CREATE_TIME_TOLERANCE_S:
        return None, f"pid {pid} is another process now ({describe(cmdline)})"
    if record.get("cmdline") and cmdline != record["cmdline"]:
        return None, f"pid {pid} runs another command now ({describe(cmdline)})"
    return proc, ""


def describe(cmdline: list[str], limit: int = 120) -> str:
    text = " ".join(cmdline) or "a process without a command line"
    return text if len(text) <= limit else text[: limit - 1] + "…"


def port_listeners(port: int) -> set[int | None]:
    """Pids listening on TCP ``port`` (None for a socket whose owner this user cannot see);
    empty when nothing listens."""
    try:
        connections = psutil.net_connections(kind="inet")
    except (psutil.Error, OSError):
        return set()
    return {
        c.pid
        for c in connections
        if c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == port
    }


def holder_text(port: int, pids: set[int | None]) -> str:
    """ "port 9201 is held by pid N (python -m http.server …)" for a conflict report."""
    for pid in sorted(p for p in pids if p is not None):
        try:
            command = describe(psutil.Process(pid).cmdline())
        except psutil.Error:
            command = "a process that has exited since"
        return f"port {port} is held by pid {pid} ({command})"
    return f"port {port} is held by a process of another user"


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
