"""The engine supervisor: the named engines of this host, each one process started from a
LaunchConfig, and the requests the agent's API makes of them.

Applies and restarts run in a background thread each, one at a time per engine, and are
followed through an ``Operation``; how they replace a process (readiness, roll-back) is
``lifecycle.py``, the processes themselves ``process.py``, an engine's state ``engine.py``.

Configs are persisted as JSON in the state directory so a restarted agent still knows its
engines (they stay stopped until the panel restarts them). The pid of a running engine is
persisted too: if the agent died without stopping it, the next agent stops that orphan before
it could hold the port or GPU memory against a new start.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import secrets
import sys
import threading
from collections.abc import Callable
from pathlib import Path

import psutil

from hosts.agent.engine import (
    STATUS_LINES,
    BadRequest,
    Conflict,
    Engine,
    NotFound,
    Operation,
    engine_url,
    gpu_count,
    visible_devices,
)
from hosts.agent.lifecycle import Lifecycle
from hosts.agent.policy import ENGINE_NAME, ExecPolicy, ExecRefused, check_config_env
from hosts.agent.process import STOP_GRACE_S, Prepared, process_tree, stop_group
from hosts.engines.launch import LaunchConfig, LaunchError, render_process

log = logging.getLogger("hosts.agent.supervisor")

MAX_READY_TIMEOUT_S = 3 * 3600  # a 405B model on slow storage takes long, but not this long
DEFAULT_READY_TIMEOUT_S = 600.0
KEPT_OPERATIONS = 500


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
        self.lifecycle = Lifecycle(self._persist, self.prepare, stop_grace_s)
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
        work = functools.partial(self.lifecycle.apply, previous=previous)
        self._spawn(engine, op, work, prepared, timeout)
        return op

    def restart(self, name: str, body: dict) -> Operation:
        timeout = self.ready_timeout(body)
        engine = self.get(name)
        prepared = self.prepare(name, engine.config.to_dict())
        with self.lock:
            op = self._begin(engine, "restart")
        self._spawn(engine, op, self.lifecycle.restart, prepared, timeout)
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

    def stop(self, name: str) -> dict:
        """Stop the engine; a running operation on it ends as failed ("stopped by request")."""
        engine = self.get(name)
        with engine.lock:
            if engine.operation is not None:
                engine.cancel.set()
            run = engine.run
            if run is not None:
                run.stopping = True  # before the signal, so the exit is not taken for a crash
        self.lifecycle.stop_run(engine)
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
            t = threading.Thread(target=self.lifecycle.stop_run, args=(engine,), daemon=True)
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
                "pids": process_tree(pid),
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
