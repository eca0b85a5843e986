"""The engine supervisor: named engines, each one process started from a LaunchConfig.

An apply stores the new config, stops the old process, starts the new one and waits until
``/health`` and then ``/v1/models`` answer 200. When the new config does not come up in time
(or its process exits), the agent stops it, starts the previous config again and reports
``rolled_back`` with the new engine's own last lines, which carry the engine's error (vLLM's
"No available memory for the cache blocks", an argument error, …). Applies and restarts run in
a background thread each, one at a time per engine, and are followed through ``Operation``.

Processes are started without a shell, in a session of their own so that stopping reaches the
whole process group (vLLM and SGLang fork workers per GPU): SIGTERM, a grace period, SIGKILL.
Their merged stdout/stderr is kept in a bounded ring buffer per engine.

Configs are persisted as JSON in the state directory so a restarted agent still knows its
engines (they stay stopped until the panel restarts them). The pid of a running engine is
persisted too: if the agent died without stopping it, the next agent stops that orphan before
it could hold the port or GPU memory against a new start.
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import os
import re
import secrets
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import psutil

from hosts.agent.policy import (
    ENGINE_NAME,
    ExecPolicy,
    ExecRefused,
    check_config_env,
    child_env,
    mask_argv,
)
from hosts.engines.launch import LaunchConfig, LaunchError, render_process

log = logging.getLogger("hosts.agent.supervisor")

LOG_LINES = 2000  # per engine, across its runs
MAX_LINE_BYTES = 16384
TAIL_LINES = 200  # per run: enough for a traceback and the engine's error
STATUS_LINES = 50
STOP_GRACE_S = 10.0
MAX_READY_TIMEOUT_S = 3 * 3600  # a 405B model on slow storage takes long, but not this long
DEFAULT_READY_TIMEOUT_S = 600.0
ROLLBACK_MIN_TIMEOUT_S = 60.0
KEPT_OPERATIONS = 500
# The line of an engine's output that names its failure: Python's "ValueError: …", argparse's
# "vllm serve: error: …", a traceback's last line.
ERROR_LINE = re.compile(r"\b\w*(Error|Exception)\b|: error: |\bFATAL\b|\bfailed\b", re.IGNORECASE)
PROJECT_ROOT = Path(__file__).resolve().parents[2]


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
        if ERROR_LINE.search(line) and not line.startswith("--- agent:"):
            return line.strip()
    for line in reversed(lines):
        if line.strip() and not line.startswith("--- agent:"):
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


@dataclass
class Prepared:
    """A config that passed every check, with the command to run it."""

    config: LaunchConfig
    argv: list[str]
    env: dict[str, str]


class Run:
    """One engine process: its output reader and the watcher that notices it exit."""

    def __init__(self, engine: Engine, prepared: Prepared, on_exit):
        self.prepared = prepared
        self.tail: deque[str] = deque(maxlen=TAIL_LINES)
        self.exit_code: int | None = None
        self.stopping = False
        self.exited = threading.Event()
        self.started_at = time.time()
        env = child_env(prepared.env)
        if prepared.config.runner == "simulator":
            # The simulator must import this very ``hosts`` package, wherever the agent's
            # working directory is.
            env["PYTHONPATH"] = os.pathsep.join(
                p for p in (str(PROJECT_ROOT), env.get("PYTHONPATH", "")) if p
            )
        self.proc = subprocess.Popen(  # noqa: S603 - argv checked against the allow-list
            prepared.argv,
            env=env,
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
            target=self._read, args=(engine.log,), name=f"engine-{engine.name}-out", daemon=True
        )
        self._reader.start()
        threading.Thread(
            target=self._watch, args=(on_exit,), name=f"engine-{engine.name}-wait", daemon=True
        ).start()

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

    @property
    def pid(self) -> int | None:
        run = self.run
        return run.pid if run is not None and run.alive() else None

    def note(self, message: str) -> None:
        """A line of the agent's own in the engine's log, told apart by its prefix."""
        self.log.append(f"--- agent: {message} ---")

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
            }


def engine_url(cfg: LaunchConfig) -> str:
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


class Supervisor:
    """All engines of this host."""

    def __init__(
        self,
        state_dir: Path,
        policy: ExecPolicy | None = None,
        *,
        python: str = sys.executable,
        reserved_ports: tuple[int, ...] = (),
        stop_grace_s: float = STOP_GRACE_S,
    ):
        self.state_dir = Path(state_dir)
        self.engines_dir = self.state_dir / "engines"
        self.engines_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        self.policy = policy or ExecPolicy()
        self.python = python
        self.reserved_ports = set(reserved_ports)
        self.stop_grace_s = stop_grace_s
        # GPUs of this host, for the tensor-parallel checks of real engines (the simulator
        # runner checks against its own simulator["num_gpus"]); None when unknown.
        self.gpu_count: Callable[[], int | None] = lambda: None
        self.lock = threading.Lock()
        self.engines: dict[str, Engine] = {}
        self.operations: dict[str, Operation] = {}
        self.closing = False
        self._load()

    # -- persistence ----------------------------------------------------------------------

    def _path(self, name: str) -> Path:
        return self.engines_dir / f"{name}.json"

    def _persist(self, engine: Engine) -> None:
        run = engine.run
        alive = run is not None and run.alive()
        data = {
            "name": engine.name,
            "config": engine.config.to_dict() if engine.config is not None else None,
            "pid": run.pid if alive else None,
            "pid_create_time": run.create_time if alive else None,
        }
        path = self._path(engine.name)
        tmp = path.with_suffix(".tmp")
        # 0600: configs can carry an HF token or an engine API key.
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as fh:
            json.dump(data, fh, indent=2)
        os.replace(tmp, path)

    def _load(self) -> None:
        for path in sorted(self.engines_dir.glob("*.json")):
            name = path.stem
            if not ENGINE_NAME.fullmatch(name):
                continue
            try:
                data = json.loads(path.read_text())
                config = LaunchConfig.from_dict(data["config"]) if data.get("config") else None
            except (OSError, ValueError, KeyError, TypeError) as exc:
                log.warning("ignoring the stored state of engine %s: %s", name, exc)
                continue
            engine = Engine(name, config)
            self.engines[name] = engine
            self._stop_orphan(engine, data.get("pid"), data.get("pid_create_time"))
            log.info("engine %s: stored config loaded (stopped)", name)

    def _stop_orphan(self, engine: Engine, pid, create_time) -> None:
        if not pid or create_time is None:
            return
        try:
            proc = psutil.Process(int(pid))
            same = abs(proc.create_time() - float(create_time)) < 1.0
        except (psutil.Error, ValueError, TypeError):
            return
        if not same:
            return  # the pid was reused by an unrelated process
        log.warning("engine %s: stopping pid %s left running by a previous agent", engine.name, pid)
        engine.note(f"stopping pid {pid} left running by a previous agent")
        stop_group(int(pid), self.stop_grace_s)
        self._persist(engine)

    # -- checks ---------------------------------------------------------------------------

    def prepare(self, name: str, config_data) -> Prepared:
        """Validate a config the way the panel did, render it, and check the command."""
        if not isinstance(config_data, dict):
            raise BadRequest('the body needs "config": a LaunchConfig as a JSON object')
        try:
            config = LaunchConfig.from_dict(config_data)
            gpus = self.gpu_count() if config.runner == "engine" else None
            config = config.validated(gpu_count=gpus or None)
            command = render_process(config, python=self.python)
        except LaunchError as exc:
            raise BadRequest(f"invalid launch config: {exc}", errors=exc.errors) from None
        except (ValueError, KeyError, TypeError) as exc:
            raise BadRequest(f"invalid launch config: {exc}") from None
        try:
            check_config_env(command.env)
            argv = self.policy.check(command.argv)
        except ExecRefused as exc:
            raise BadRequest(str(exc)) from None
        if config.port in self.reserved_ports:
            raise BadRequest(f"port {config.port} is the agent's own port")
        with self.lock:
            for other in self.engines.values():
                if other.name != name and other.config is not None:
                    if other.config.port == config.port:
                        raise BadRequest(
                            f"port {config.port} is already used by engine {other.name!r}"
                        )
        return Prepared(config, argv, dict(command.env))

    @staticmethod
    def ready_timeout(body: dict) -> float:
        value = body.get("ready_timeout_s", DEFAULT_READY_TIMEOUT_S)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise BadRequest("ready_timeout_s must be a number of seconds")
        if not 0 < value <= MAX_READY_TIMEOUT_S:
            raise BadRequest(f"ready_timeout_s must be in (0, {MAX_READY_TIMEOUT_S}]")
        return float(value)

    # -- lookups --------------------------------------------------------------------------

    def get(self, name: str) -> Engine:
        with self.lock:
            engine = self.engines.get(name)
        if engine is None or engine.config is None:
            raise NotFound(f"no engine named {name!r} on this host")
        return engine

    def operation(self, op_id: str) -> Operation:
        op = self.operations.get(op_id)
        if op is None:
            raise NotFound(f"no operation {op_id!r}")
        return op

    def statuses(self) -> dict:
        with self.lock:
            engines = list(self.engines.values())
        return {e.name: e.status() for e in engines if e.config is not None}

    # -- operations -----------------------------------------------------------------------

    def apply(self, name: str, body: dict) -> Operation:
        if not ENGINE_NAME.fullmatch(name):
            raise BadRequest("engine names are [a-z0-9][a-z0-9-]{0,62}")
        timeout = self.ready_timeout(body)
        prepared = self.prepare(name, body.get("config"))
        with self.lock:
            engine = self.engines.setdefault(name, Engine(name))
            op = self._begin(engine, "apply")
            # Stored at once (a status read right after the 202 shows the new config); the
            # previous one goes to the worker for the roll-back.
            with engine.lock:
                previous, engine.config = engine.config, prepared.config
        self._spawn(
            engine, op, functools.partial(self._apply, previous=previous), prepared, timeout
        )
        return op

    def restart(self, name: str, body: dict) -> Operation:
        timeout = self.ready_timeout(body)
        engine = self.get(name)
        prepared = self.prepare(name, engine.config.to_dict())
        with self.lock:
            op = self._begin(engine, "restart")
        self._spawn(engine, op, self._restart, prepared, timeout)
        return op

    def _spawn(self, engine: Engine, op: Operation, work, prepared: Prepared, timeout: float):
        engine.worker = threading.Thread(
            target=self._guard,
            args=(engine, op, work, prepared, timeout),
            name=f"{op.kind}-{engine.name}",
            daemon=True,
        )
        engine.worker.start()

    def _begin(self, engine: Engine, kind: str) -> Operation:
        """Called under ``self.lock``: one operation per engine at a time."""
        if self.closing:
            raise Conflict("the agent is shutting down")
        running = engine.operation
        if running is not None:
            raise Conflict(
                f"operation {running.id} ({running.kind}) is already running on engine "
                f"{engine.name!r}; wait for it to finish"
            )
        op = Operation(id=secrets.token_hex(8), engine=engine.name, kind=kind)
        op.release = lambda: self._release(engine, op)
        engine.operation = op
        engine.cancel.clear()
        self.operations[op.id] = op
        if len(self.operations) > KEPT_OPERATIONS:
            for old_id in [k for k, o in self.operations.items() if o.finished_at][
                : len(self.operations) - KEPT_OPERATIONS
            ]:
                del self.operations[old_id]
        return op

    def _guard(self, engine: Engine, op: Operation, work, prepared: Prepared, timeout: float):
        try:
            work(engine, op, prepared, timeout)
        except Exception as exc:  # noqa: BLE001 - the operation must end with a state, always
            log.exception("operation %s crashed", op.id)
            op.finish("failed", f"the agent failed: {exc}", list(engine.log)[-STATUS_LINES:])
        finally:
            self._release(engine, op)

    def _release(self, engine: Engine, op: Operation) -> None:
        with self.lock:
            if engine.operation is op:
                engine.operation = None

    def _apply(
        self,
        engine: Engine,
        op: Operation,
        new: Prepared,
        timeout: float,
        previous: LaunchConfig | None,
    ) -> None:
        with engine.lock:
            self._persist(engine)
        if engine.run is not None and engine.run.alive():
            op.step("stopping the running engine")
            self._stop_run(engine)
        ok, error, lines = self._start_and_wait(engine, new, timeout, op)
        if ok:
            op.finish("ready", log_lines=lines[-STATUS_LINES:])
            return
        op.log_lines = lines
        self._stop_run(engine, final_state=None)
        if engine.cancel.is_set():
            op.finish("failed", "stopped by request while the new config was starting")
            return
        if previous is None:
            self._mark_failed(engine, error, lines)
            op.finish("failed", f"{error}; there is no previous config to roll back to")
            return
        op.step("rolling back to the previous config")
        with engine.lock:
            engine.config = previous
            self._persist(engine)
        try:
            old = self.prepare(engine.name, previous.to_dict())
        except AgentError as exc:
            self._mark_failed(engine, error, lines)
            op.finish("failed", f"{error}; the previous config cannot run any more: {exc}")
            return
        # The previous config is known to start; giving up on it early leaves nothing
        # running, so it gets at least a minute even when the new one was given less.
        rollback_timeout = max(timeout, ROLLBACK_MIN_TIMEOUT_S)
        ok, old_error, old_lines = self._start_and_wait(engine, old, rollback_timeout, op)
        if ok:
            op.finish("rolled_back", f"{error}; the previous config runs again")
        elif engine.cancel.is_set():
            op.finish("failed", f"{error}; stopped by request during the roll-back")
        else:
            self._stop_run(engine, final_state=None)
            self._mark_failed(engine, old_error, old_lines)
            op.finish("failed", f"{error}; the previous config did not come back: {old_error}")

    def _restart(self, engine: Engine, op: Operation, prepared: Prepared, timeout: float) -> None:
        if engine.run is not None and engine.run.alive():
            op.step("stopping the running engine")
            self._stop_run(engine)
        ok, error, lines = self._start_and_wait(engine, prepared, timeout, op)
        if ok:
            op.finish("ready", log_lines=lines[-STATUS_LINES:])
            return
        self._stop_run(engine, final_state=None)
        if engine.cancel.is_set():
            op.finish("failed", "stopped by request while the engine was starting", lines)
            return
        self._mark_failed(engine, error, lines)
        op.finish("failed", error, lines)

    def _mark_failed(self, engine: Engine, error: str, lines: list[str]) -> None:
        with engine.lock:
            engine.state = "failed"
            engine.error = error
            engine.last_lines = list(lines)[-STATUS_LINES:]

    def _start_and_wait(
        self, engine: Engine, prepared: Prepared, timeout: float, op: Operation
    ) -> tuple[bool, str, list[str]]:
        """Start the process and wait for /health then /v1/models: (ready, error, lines)."""
        cfg = prepared.config
        with engine.lock:
            if engine.cancel.is_set():
                return False, "stopped by request", []
            op.step(f"starting: {' '.join(mask_argv(prepared.argv))}")
            try:
                run = Run(engine, prepared, self._on_exit(engine))
            except OSError as exc:
                error = f"could not start {prepared.argv[0]}: {exc}"
                engine.note(error)
                return False, error, []
            engine.run = run
            engine.state = "starting"
            engine.error = ""
            engine.exit_code = None
            engine.started_at = run.started_at
            engine.ready_at = None
            engine.note(f"pid {run.pid} started: {' '.join(mask_argv(prepared.argv))}")
            self._persist(engine)
        base = engine_url(cfg)
        key = engine_api_key(cfg)
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        deadline = time.monotonic() + timeout
        path = "/health"
        with httpx.Client(timeout=2.0, headers=headers) as client:
            while True:
                if engine.cancel.is_set():
                    return False, "stopped by request", list(run.tail)
                if not run.alive():
                    run.exited.wait(3)
                    lines = list(run.tail)
                    why = error_line(lines)
                    error = f"the engine exited with code {run.proc.returncode} before it was ready"
                    return False, error + (f": {why}" if why else ""), lines
                if time.monotonic() >= deadline:
                    lines = list(run.tail)
                    return False, f"not ready within {timeout:g} s (waiting for {path})", lines
                try:
                    response = client.get(base + path)
                except httpx.HTTPError:
                    response = None
                if response is not None and response.status_code == 200:
                    if path == "/health":
                        op.step("/health answers 200; waiting for /v1/models")
                        path = "/v1/models"
                        continue
                    break
                time.sleep(min(0.1, max(0.0, deadline - time.monotonic())))
        with engine.lock:
            if engine.run is run and run.alive():
                engine.state = "ready"
                engine.ready_at = time.time()
                engine.note(f"pid {run.pid} ready")
        op.step("/v1/models answers 200: ready")
        return True, "", list(run.tail)

    def _on_exit(self, engine: Engine):
        def exited(run: Run) -> None:
            with engine.lock:
                engine.note(f"pid {run.pid} exited with code {run.exit_code}")
                if engine.run is not run:
                    return
                engine.exit_code = run.exit_code
                if run.stopping:
                    return  # the stopper sets the state
                # An engine that dies on its own — while ready or still starting — is failed;
                # the monitor is what turns a crash after hours of service into a state.
                lines = list(run.tail)
                why = error_line(lines)
                engine.state = "failed"
                engine.error = f"the engine exited with code {run.exit_code}" + (
                    f": {why}" if why else ""
                )
                engine.last_lines = lines[-STATUS_LINES:]
                with contextlib.suppress(OSError):
                    self._persist(engine)
            log.warning(
                "engine %s: pid %s exited with code %s", engine.name, run.pid, run.exit_code
            )

        return exited

    def _stop_run(self, engine: Engine, final_state: str | None = "stopped") -> None:
        run = engine.run
        if run is not None and run.alive():
            engine.note(f"stopping pid {run.pid}")
            code = run.stop(self.stop_grace_s)
            with engine.lock:
                engine.exit_code = code
        with engine.lock:
            if final_state is not None:
                engine.state = final_state
                engine.error = ""
                engine.last_lines = []
            elif engine.state != "failed":
                engine.state = "stopped"
            with contextlib.suppress(OSError):
                self._persist(engine)

    def stop(self, name: str) -> dict:
        """Stop the engine; a running operation on it ends as failed ("stopped by request")."""
        engine = self.get(name)
        with engine.lock:
            if engine.operation is not None:
                engine.cancel.set()
            run = engine.run
            if run is not None:
                run.stopping = True  # before the signal, so the exit is not taken for a crash
        self._stop_run(engine)
        return engine.status()

    def logs(self, name: str, lines: int) -> list[str]:
        engine = self.get(name)
        return list(engine.log)[-lines:] if lines > 0 else []

    def shutdown(self) -> None:
        """Stop every engine (in parallel: each may take the whole grace period)."""
        with self.lock:
            self.closing = True
            engines = list(self.engines.values())
        threads = []
        for engine in engines:
            engine.cancel.set()
            t = threading.Thread(target=self._stop_run, args=(engine,), daemon=True)
            t.start()
            threads.append(t)
        for t in threads:
            t.join(self.stop_grace_s + 10)
        # A cancelled operation may still be stopping the process it had just started.
        for engine in engines:
            worker = engine.worker
            if worker is not None:
                worker.join(self.stop_grace_s + 10)

    # -- telemetry ------------------------------------------------------------------------

    def engine_readings(self, affinity) -> dict:
        with self.lock:
            engines = list(self.engines.values())
        out = {}
        for engine in engines:
            if engine.config is None:
                continue
            pid = engine.pid
            out[engine.name] = {
                "state": engine.state,
                "pid": pid,
                # The engine's workers hold the GPUs (vLLM's EngineCore, TP workers): the
                # panel matches these against each GPU's processes to see which GPUs it uses.
                "pids": _process_tree(pid),
                "cpu_affinity": affinity(pid),
            }
        return out

    def simulator_engines(self) -> list[dict]:
        """Running simulator engines and the host GPU indices each one holds."""
        with self.lock:
            engines = list(self.engines.values())
        found = []
        for engine in engines:
            run = engine.run
            if run is None or not run.alive() or engine.state not in ("starting", "ready"):
                continue
            cfg = run.prepared.config
            if cfg.runner != "simulator":
                continue
            count = gpu_count(cfg)
            visible = visible_devices(run.prepared.env)
            indices = visible[:count] if visible else list(range(count))
            found.append(
                {
                    "name": engine.name,
                    "pid": run.pid,
                    "url": engine_url(cfg),
                    "gpu_indices": indices,
                }
            )
        return found


def _process_tree(pid: int | None) -> list[int]:
    if pid is None:
        return []
    try:
        return [pid, *(child.pid for child in psutil.Process(pid).children(recursive=True))]
    except psutil.Error:
        return [pid]
