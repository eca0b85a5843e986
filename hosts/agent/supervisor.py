"""The engine supervisor: the named engines of this host, each one process started from a
LaunchConfig, and the requests the agent's API makes of them.

Applies and restarts run in a background thread each, one at a time per engine, and are
followed through an ``Operation``; how they replace a process (readiness, roll-back) is
``lifecycle.py``, the processes themselves ``process.py``, an engine's state ``engine.py``.

Each engine is persisted as JSON in the state directory (owner-only): its config, the
process it runs (pid, start time, command line, the digest of what was launched, the config
it runs) and the apply or restart under way. An agent that dies without stopping its engines
(killed, crashed, upgraded) leaves them running, and the next agent *recovers* each one
(``_recover``) instead of stopping what it cannot see:

- the recorded process is alive (same pid, start time and command line) and runs what the
  agent would launch now for its config: adopted — supervised again (readiness checked,
  output followed, stop and restart work);
- it is alive but runs something the agent would not launch now, or the engine's port is held
  by another process: ``conflict``, with the reason; nothing is killed;
- it is gone: ``stopped``, with the reason. Not started again: what runs on the GPUs is the
  panel's decision, and an engine that died while nobody watched may die again.

An apply or restart the killed agent had not finished is resolved to the state before it
began: an apply's new config that was never confirmed ready is stopped and the last good
config started again if it ran before (a ``recover`` operation); a restart's process is
adopted when it is alive. What happened is kept as the engine's ``recovery`` and
``interrupted`` records, which the status and telemetry report.
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import os
import secrets
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

from hosts.agent.engine import (
    STATUS_LINES,
    AgentError,
    BadRequest,
    Conflict,
    Engine,
    NotFound,
    Operation,
    engine_url,
    gpu_count,
    visible_devices,
)
from hosts.agent.lifecycle import ADOPT_READY_TIMEOUT_S, Lifecycle
from hosts.agent.policy import ENGINE_NAME, ExecPolicy, ExecRefused, check_config_env
from hosts.agent.process import (
    STOP_GRACE_S,
    Prepared,
    Run,
    holder_text,
    identify,
    port_listeners,
    process_tree,
)
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
        self.lifecycle = Lifecycle(
            self._persist, self.prepare, stop_grace_s, output_dir=self.engines_dir
        )
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
        """Called with ``engine.lock`` held (or before anyone else can see the engine)."""
        run = engine.run
        data = {
            "name": engine.name,
            "config": engine.config.to_dict() if engine.config is not None else None,
            "state": engine.state,
            "run": _run_record(engine, run) if run is not None and run.alive() else None,
            "pending": engine.pending,
            "interrupted": engine.interrupted,
        }
        path = self._path(engine.name)
        tmp = path.with_suffix(".tmp")
        # 0600: configs can carry an HF token or an engine API key.
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as fh:
            json.dump(data, fh, indent=2)
            fh.flush()
            # On disk before the call returns: a record lost with a crash is an engine
            # that the next agent cannot find.
            os.fsync(fh.fileno())
        os.replace(tmp, path)

    def _load(self) -> None:
        recoveries = []
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
            engine.interrupted = data.get("interrupted")
            self.engines[name] = engine
            try:
                work = self._recover(engine, data)
            except Exception as exc:  # noqa: BLE001 - one bad record must not stop the agent
                log.exception("engine %s: recovery failed", name)
                engine.state, engine.error = "failed", f"the agent could not recover it: {exc}"
                work = None
            with engine.lock:
                self._persist(engine)
            if work is not None:
                recoveries.append((engine, *work))
            log.info("engine %s: stored state loaded (%s)", name, engine.state)
        # Started once every engine is known (a recovery checks ports against the others).
        for engine, kind, job, prepared, timeout in recoveries:
            with self.lock:
                op = self._begin(engine, kind)
            self._spawn(engine, op, job, prepared, timeout)

    # -- recovery after a restart of the agent ---------------------------------------------

    def _recover(self, engine: Engine, data: dict):
        """Decide what the engine is now from what a previous agent recorded and what runs;
        returns the operation that finishes the job — (kind, work, prepared, timeout) — or
        None when the state is settled already. See the module docstring for the rules."""
        record = data.get("run") or None
        pending = data.get("pending") or None
        proc, gone_why = identify(record)
        recorded_config = _config(record.get("config")) if record else None
        if pending:
            timeout = float(pending.get("ready_timeout_s") or DEFAULT_READY_TIMEOUT_S)
            engine.interrupted = {
                "operation": pending.get("operation"),
                "kind": pending.get("kind"),
                "started_at": pending.get("started_at"),
                "found_at": time.time(),
                "outcome": "",
            }
            what = f"{pending.get('kind')} {pending.get('operation')}"
            previous = _config(pending.get("previous"))
            if pending.get("kind") == "apply":
                # The last good config: the new one was never confirmed ready.
                engine.config = previous or engine.config
            unconfirmed = (
                pending.get("kind") == "apply"
                and record is not None
                and record.get("config") == pending.get("config")
            )
            if proc is not None and unconfirmed:
                self._adopt(engine, proc, record, recorded_config, quiet=True)
                start = previous if pending.get("previous_running") else None
                engine.recovered(
                    f"the agent was restarted during {what}: its new config (pid {proc.pid}) "
                    "was never confirmed ready; going back to "
                    + ("the previous config" if start else "the state before it (stopped)")
                )
                return self._recovery_work(engine, start, timeout)
            if proc is None:
                holder = self._port_conflict(engine)
                if holder:
                    engine.recovered(
                        f"the agent was restarted during {what}; {holder}, not the engine's "
                        "process: nothing started"
                    )
                    engine.state, engine.error = "conflict", holder
                    engine.interrupted["outcome"] = f"conflict: {holder}"
                    return None
                start = (previous or engine.config) if pending.get("previous_running") else None
                if start is None:
                    engine.recovered(
                        f"the agent was restarted during {what}; the engine did not run "
                        "before it: left stopped"
                    )
                    engine.interrupted["outcome"] = "stopped, as before the operation"
                    return None
                engine.recovered(
                    f"the agent was restarted during {what} and nothing runs now; starting "
                    "the config that ran before it again"
                )
                return self._recovery_work(engine, start, timeout)
            # A live process of ours for the last good config: the state before the
            # operation, or the restart's own process. Adopted below.
            engine.recovered(
                f"the agent was restarted during {what}; pid {proc.pid} runs the "
                "last good config: adopting it"
            )
        if proc is not None:
            timeout = float((pending or {}).get("ready_timeout_s") or ADOPT_READY_TIMEOUT_S)
            return self._adopt(engine, proc, record, recorded_config, timeout=timeout)
        holder = self._port_conflict(engine)
        if holder:
            engine.state, engine.error = "conflict", holder
            engine.recovered(f"{holder}, not the recorded engine: left alone")
            return None
        engine.state = "stopped"
        if record is not None:
            engine.recovered(
                f"the engine recorded as running is gone ({gone_why}): it exited while no "
                "agent watched it, or the host restarted; not started again"
            )
        return None

    def _adopt(
        self,
        engine: Engine,
        proc,
        record: dict,
        config: LaunchConfig | None,
        *,
        quiet: bool = False,
        timeout: float = ADOPT_READY_TIMEOUT_S,
    ):
        """Supervise a process a previous agent started: ready once it answers (an adopt
        operation), or a conflict when it runs what this agent would not launch now."""
        prepared, mismatch = None, ""
        if config is None:
            mismatch = "its recorded config cannot be read"
        else:
            try:
                prepared = self.prepare(engine.name, config.to_dict())
            except AgentError as exc:
                mismatch = f"this agent would not launch its config now: {exc}"
            else:
                if prepared.digest != record.get("digest"):
                    mismatch = "it was launched with another command or environment than "
                    mismatch += "this agent would use for its config now"
        if prepared is None:
            argv = list(record.get("cmdline") or [])
            prepared = Prepared(config or engine.config, argv, {})
        engine.run = Run.adopt(
            engine.name,
            prepared,
            proc,
            engine.log,
            self.lifecycle._on_exit(engine),
            self.lifecycle.output(engine.name),
            started_at=record.get("started_at"),
            digest=record.get("digest"),
        )
        engine.started_at = engine.run.started_at
        engine.ready_at = record.get("ready_at")
        if quiet:
            return None
        if mismatch:
            engine.state = "conflict"
            engine.error = (
                f"pid {proc.pid}, left running by a previous agent, is not adopted: {mismatch}; "
                "stop or restart the engine"
            )
            engine.recovered(engine.error)
            if engine.interrupted is not None and not engine.interrupted.get("outcome"):
                engine.interrupted["outcome"] = f"conflict: {engine.error}"
            return None
        engine.config = config
        engine.state = "starting"
        if engine.recovery is None:
            engine.recovered(f"adopting pid {proc.pid}, left running by a previous agent")
        return ("adopt", self._adopt_work, prepared, timeout)

    def _adopt_work(self, engine: Engine, op: Operation, prepared: Prepared, timeout: float):
        self.lifecycle.adopt(engine, op, timeout)

    def _recovery_work(self, engine: Engine, start: LaunchConfig | None, timeout: float):
        prepared, refused = None, ""
        if start is not None:
            try:
                prepared = self.prepare(engine.name, start.to_dict())
            except AgentError as exc:
                refused = f"the config to go back to cannot run any more: {exc}"
                engine.recovered(refused)
        if prepared is not None:
            engine.state = "starting"  # on its way back from the moment the agent is up
        work = functools.partial(_recover_work, self.lifecycle, refused=refused)
        return ("recover", work, prepared, timeout)

    def _port_conflict(self, engine: Engine) -> str:
        """ "port P is held by pid N (…)" when a process listens on the engine's port."""
        if engine.config is None:
            return ""
        holders = port_listeners(engine.config.port)
        return holder_text(engine.config.port, holders) if holders else ""

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
                engine.pending = _pending(op, engine, prepared.config, previous, timeout)
        work = functools.partial(self.lifecycle.apply, previous=previous)
        self._spawn(engine, op, work, prepared, timeout)
        return op

    def restart(self, name: str, body: dict) -> Operation:
        timeout = self.ready_timeout(body)
        engine = self.get(name)
        prepared = self.prepare(name, engine.config.to_dict())
        with self.lock:
            op = self._begin(engine, "restart")
            with engine.lock:
                engine.pending = _pending(op, engine, engine.config, engine.config, timeout)
                self._persist(engine)
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
        if kind in ("apply", "restart"):
            # A new operation: whatever a previous agent left unfinished is history now.
            engine.interrupted = None
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
            with engine.lock:
                engine.pending = None
                with contextlib.suppress(OSError):
                    self._persist(engine)
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

    def detach(self) -> None:
        """Leave every engine running for the next agent (which adopts what it recorded): no
        new operation starts, and nothing is stopped. An apply or restart under way stays
        recorded as pending; the next agent resolves it to the last good config, as after a
        crash."""
        with self.lock:
            self.closing = True
            running = [e.name for e in self.engines.values() if e.pid]
        if running:
            log.info("leaving %d engine(s) running for the next agent: %s", len(running), running)

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
                "error": engine.error,
                "operation": engine.operation.id if engine.operation else None,
                "recovery": dict(engine.recovery) if engine.recovery else None,
                "interrupted": dict(engine.interrupted) if engine.interrupted else None,
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


def _config(data) -> LaunchConfig | None:
    try:
        return LaunchConfig.from_dict(data) if data else None
    except (ValueError, KeyError, TypeError):
        return None


def _run_record(engine: Engine, run: Run) -> dict:
    """What identifies the process later: pid, start time (a reused pid has another) and
    command line; and what it runs: its config and the digest of its argv and environment."""
    return {
        "pid": run.pid,
        "create_time": run.create_time,
        "cmdline": list(run.cmdline),
        "digest": run.digest,
        "config": run.prepared.config.to_dict(),
        "port": run.prepared.config.port,
        "started_at": run.started_at,
        "ready_at": engine.ready_at,
    }


def _pending(op: Operation, engine: Engine, config, previous, timeout: float) -> dict:
    return {
        "operation": op.id,
        "kind": op.kind,
        "started_at": op.started_at,
        "ready_timeout_s": timeout,
        "config": config.to_dict() if config is not None else None,
        "previous": previous.to_dict() if previous is not None else None,
        "previous_running": engine.running(),
    }


def _recover_work(lifecycle: Lifecycle, engine, op, prepared, timeout, refused="") -> None:
    lifecycle.recover(engine, op, prepared, timeout, refused=refused)
