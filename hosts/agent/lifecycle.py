"""How an engine's process is replaced: start and wait for readiness, and the apply policy.

An apply stops the old process, starts the new config and waits until the engine is ready
(``hosts.engines.readiness``: ``/health`` then a non-empty ``/v1/models``). When the new config
does not come up in time (or its process exits), it is stopped, the previous config is started
again and the operation ends ``rolled_back`` with the new engine's own last lines, which carry
the engine's error (vLLM's "No available memory for the cache blocks", an argument error, …).
A stop request (``engine.cancel``) ends whatever is starting.

An apply or restart is persisted as the engine's ``pending`` operation until it ends, and the
end is persisted before the operation reports it: an agent killed in between leaves the
pending record, and the next agent resolves it (``Supervisor._recover``) with ``recover``
(back to the last good config) or ``adopt`` (the process it finds is the right one).
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable
from pathlib import Path

import httpx

from hosts.agent.engine import (
    STATUS_LINES,
    AgentError,
    Engine,
    Operation,
    engine_api_key,
    engine_url,
    error_line,
)
from hosts.agent.policy import mask_argv
from hosts.agent.process import (
    STOP_GRACE_S,
    Prepared,
    Run,
    holder_text,
    port_listeners,
    process_tree,
)
from hosts.engines import readiness
from hosts.engines.launch import LaunchConfig

log = logging.getLogger("hosts.agent.supervisor")

ROLLBACK_MIN_TIMEOUT_S = 60.0
PROBE_INTERVAL_S = 0.1
ADOPT_READY_TIMEOUT_S = 60.0  # an adopted engine that was ready answers at once


class _NotComing(Exception):
    """The engine will not become ready: it exited, or a stop was asked for."""

    def __init__(self, error: str, lines: list[str]):
        super().__init__(error)
        self.error, self.lines = error, lines


class _Conflict(Exception):
    """Another process answers on the engine's port."""


class Lifecycle:
    """Starts, waits for, stops and replaces engine processes. ``persist(engine)`` stores an
    engine's config and pid; ``prepare(name, config_dict)`` checks a config (AgentError);
    engine output goes to ``<output_dir>/<name>.out``."""

    def __init__(
        self,
        persist: Callable[[Engine], None],
        prepare: Callable[[str, dict], Prepared],
        stop_grace_s: float = STOP_GRACE_S,
        output_dir: Path | None = None,
    ):
        self.persist = persist
        self.prepare = prepare
        self.stop_grace_s = stop_grace_s
        self.output_dir = Path(output_dir) if output_dir is not None else Path(".")

    def output(self, name: str) -> Path:
        return self.output_dir / f"{name}.out"

    def _finish(
        self,
        engine: Engine,
        op: Operation,
        state: str,
        error: str = "",
        log_lines: list[str] | None = None,
    ) -> None:
        """End the operation, after persisting that it ended: an agent killed after a client
        saw "ready" must not find the apply pending and roll a healthy config back."""
        with engine.lock:
            engine.pending = None
            with contextlib.suppress(OSError):
                self.persist(engine)
        op.finish(state, error, log_lines)

    # -- the operations -------------------------------------------------------------------

    def apply(
        self,
        engine: Engine,
        op: Operation,
        new: Prepared,
        timeout: float,
        previous: LaunchConfig | None,
    ) -> None:
        """Run ``new``; if it is not ready in time, go back to ``previous``."""
        with engine.lock:
            self.persist(engine)
        if engine.running():
            op.step("stopping the running engine")
            self.stop_run(engine)
        ok, error, lines = self.start_and_wait(engine, new, timeout, op)
        if ok:
            self._finish(engine, op, "ready", log_lines=lines[-STATUS_LINES:])
            return
        op.log_lines = lines
        self.stop_run(engine, final_state=None)
        if engine.cancel.is_set():
            self._finish(
                engine, op, "failed", "stopped by request while the new config was starting"
            )
            return
        if previous is None:
            engine.mark_failed(error, lines)
            self._finish(
                engine, op, "failed", f"{error}; there is no previous config to roll back to"
            )
            return
        self._roll_back(engine, op, previous, timeout, error, lines)

    def _roll_back(
        self,
        engine: Engine,
        op: Operation,
        previous: LaunchConfig,
        timeout: float,
        error: str,
        lines: list[str],
    ) -> None:
        op.step("rolling back to the previous config")
        with engine.lock:
            engine.config = previous
            self.persist(engine)
        try:
            old = self.prepare(engine.name, previous.to_dict())
        except AgentError as exc:
            engine.mark_failed(error, lines)
            self._finish(
                engine, op, "failed", f"{error}; the previous config cannot run any more: {exc}"
            )
            return
        # The previous config is known to start; giving up on it early leaves nothing
        # running, so it gets at least a minute even when the new one was given less.
        rollback_timeout = max(timeout, ROLLBACK_MIN_TIMEOUT_S)
        ok, old_error, old_lines = self.start_and_wait(engine, old, rollback_timeout, op)
        if ok:
            self._finish(engine, op, "rolled_back", f"{error}; the previous config runs again")
        elif engine.cancel.is_set():
            self._finish(engine, op, "failed", f"{error}; stopped by request during the roll-back")
        else:
            self.stop_run(engine, final_state=None)
            engine.mark_failed(old_error, old_lines)
            self._finish(
                engine, op, "failed", f"{error}; the previous config did not come back: {old_error}"
            )

    def restart(self, engine: Engine, op: Operation, prepared: Prepared, timeout: float) -> None:
        """Run the stored config again (no roll-back: there is nothing else to go back to)."""
        if engine.running():
            op.step("stopping the running engine")
            self.stop_run(engine)
        ok, error, lines = self.start_and_wait(engine, prepared, timeout, op)
        if ok:
            self._finish(engine, op, "ready", log_lines=lines[-STATUS_LINES:])
            return
        self.stop_run(engine, final_state=None)
        if engine.cancel.is_set():
            self._finish(
                engine, op, "failed", "stopped by request while the engine was starting", lines
            )
            return
        engine.mark_failed(error, lines)
        self._finish(engine, op, "failed", error, lines)

    def recover(
        self,
        engine: Engine,
        op: Operation,
        prepared: Prepared | None,
        timeout: float,
        refused: str = "",
    ) -> None:
        """Finish what a killed agent left half done: stop the process it started for a
        config that was never confirmed ready, and start ``prepared`` (the last good config)
        again when it ran before the operation; None leaves the engine stopped (failed, with
        ``refused`` as the reason, when the last good config cannot run any more)."""
        if engine.running():
            op.step(f"stopping pid {engine.pid}: its config was never confirmed ready")
            # "starting" when the last good config follows: the engine is on its way back,
            # not stopped for good (what a poll in between would otherwise report).
            self.stop_run(engine, final_state="starting" if prepared else "stopped")
        if prepared is None and refused:
            engine.mark_failed(refused, [])
            self._settle(engine, refused)
            self._finish(engine, op, "failed", refused)
            return
        if prepared is None:
            message = "the engine did not run before the operation: left stopped"
            self._settle(engine, message)
            self._finish(engine, op, "rolled_back", message)
            return
        ok, error, lines = self.start_and_wait(engine, prepared, timeout, op)
        if ok:
            message = f"the previous config runs again (pid {engine.pid})"
            self._settle(engine, message)
            self._finish(engine, op, "rolled_back", message, lines[-STATUS_LINES:])
            return
        self.stop_run(engine, final_state=None)
        if engine.cancel.is_set():
            self._settle(engine, "stopped by request during the recovery")
            self._finish(engine, op, "failed", "stopped by request during the recovery", lines)
            return
        engine.mark_failed(error, lines)
        self._settle(engine, f"the previous config did not come back: {error}")
        self._finish(engine, op, "failed", f"the previous config did not come back: {error}", lines)

    def adopt(self, engine: Engine, op: Operation, timeout: float) -> None:
        """Confirm that the adopted process serves: its process tree listens on the engine's
        port and ``/health`` then ``/v1/models`` answer. Ready, or failed (left running:
        it is the operator's to stop or restart), or a conflict when another process holds
        the port."""
        run = engine.run
        try:
            problem = self._wait_ready(engine, run, timeout, op, verify_port=True)
        except _NotComing as gone:
            self._settle(engine, gone.error)
            self._finish(engine, op, "failed", gone.error, gone.lines)
            return
        except _Conflict as exc:
            with engine.lock:
                engine.state, engine.error = "conflict", str(exc)
            self._settle(engine, str(exc))
            self._finish(engine, op, "failed", str(exc))
            return
        if problem is not None:
            error = f"adopted pid {run.pid} is not ready after {timeout:g} s ({problem})"
            with engine.lock:
                engine.mark_failed(error, list(run.tail))
            self._settle(engine, error)
            self._finish(engine, op, "failed", error, list(run.tail))
            return
        with engine.lock:
            if engine.run is run and run.alive():
                engine.state = "ready"
                engine.ready_at = engine.ready_at or time.time()
                engine.note(f"pid {run.pid} ready (adopted)")
        op.step("ready: /health and /v1/models answer")
        self._settle(engine, f"pid {run.pid} adopted: ready")
        self._finish(engine, op, "ready", "", list(run.tail)[-STATUS_LINES:])

    @staticmethod
    def _settle(engine: Engine, outcome: str) -> None:
        # What the panel reads about an operation a previous agent did not finish.
        with engine.lock:
            if engine.interrupted is not None and not engine.interrupted.get("outcome"):
                engine.interrupted["outcome"] = outcome

    # -- one process ----------------------------------------------------------------------

    def start_and_wait(
        self, engine: Engine, prepared: Prepared, timeout: float, op: Operation
    ) -> tuple[bool, str, list[str]]:
        """Start the process and wait until the engine is ready: (ready, error, lines)."""
        with engine.lock:
            if engine.cancel.is_set():
                return False, "stopped by request", []
            command = " ".join(mask_argv(prepared.argv))
            op.step(f"starting: {command}")
            try:
                run = Run(
                    engine.name,
                    prepared,
                    engine.log,
                    self._on_exit(engine),
                    self.output(engine.name),
                )
            except OSError as exc:
                error = f"could not start {prepared.argv[0]}: {exc}"
                engine.note(error)
                return False, error, []
            engine.run = run
            engine.state, engine.error, engine.exit_code = "starting", "", None
            engine.started_at, engine.ready_at = run.started_at, None
            engine.note(f"pid {run.pid} started: {command}")
            self.persist(engine)
        try:
            problem = self._wait_ready(engine, run, timeout, op)
        except _NotComing as gone:
            return False, gone.error, gone.lines
        if problem is not None:
            return False, f"not ready within {timeout:g} s ({problem})", list(run.tail)
        with engine.lock:
            if engine.run is run and run.alive():
                engine.state = "ready"
                engine.ready_at = time.time()
                engine.note(f"pid {run.pid} ready")
                # Its command line now, for the next agent to recognise it by (a wrapper such
                # as numactl has exec'd the engine by now).
                run.refresh_cmdline()
                with contextlib.suppress(OSError):
                    self.persist(engine)
        op.step("ready: /health and /v1/models answer")
        return True, "", list(run.tail)

    def _wait_ready(
        self, engine: Engine, run: Run, timeout: float, op: Operation, verify_port: bool = False
    ) -> str | None:
        """None once ready, else the last problem at the deadline; _NotComing on an exit or
        a stop request. Each new reason to wait is a step of the operation. ``verify_port``:
        an answer counts only when the engine's own processes hold the port (an adopted
        process was not started by us: whatever answers there may be something else)."""
        cfg = run.prepared.config
        key = engine_api_key(cfg)
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        seen: set[str] = set()
        with httpx.Client(timeout=2.0, headers=headers) as client:

            def check() -> str | None:
                if engine.cancel.is_set():
                    raise _NotComing("stopped by request", list(run.tail))
                if not run.alive():
                    run.exited.wait(3)
                    lines = list(run.tail)
                    why = error_line(lines)
                    error = f"the engine exited with code {run.returncode} before it was ready"
                    raise _NotComing(error + (f": {why}" if why else ""), lines)
                problem = readiness.probe(client, engine_url(cfg), engine=cfg.engine).problem
                if problem is None and verify_port:
                    holders = port_listeners(cfg.port)
                    if not holders & set(process_tree(run.pid)):
                        if holders:
                            raise _Conflict(
                                f"{holder_text(cfg.port, holders)}, not the engine's pid {run.pid}"
                            )
                        problem = f"pid {run.pid} does not listen on port {cfg.port}"
                if problem is not None and problem not in seen:
                    seen.add(problem)
                    op.step(f"waiting: {problem}")
                return problem

            return readiness.wait_ready(check, timeout, interval_s=PROBE_INTERVAL_S)

    def _on_exit(self, engine: Engine) -> Callable[[Run], None]:
        def exited(run: Run) -> None:
            # An adopted process is not our child: its exit code is lost with it.
            code = "unknown" if run.exit_code is None else run.exit_code
            with engine.lock:
                engine.note(f"pid {run.pid} exited with code {code}")
                if engine.run is not run:
                    return
                engine.exit_code = run.exit_code
                if run.stopping:
                    return  # the stopper sets the state
                # An engine that dies on its own — while ready or still starting — is failed;
                # the monitor is what turns a crash after hours of service into a state.
                lines = list(run.tail)
                why = error_line(lines)
                engine.mark_failed(
                    f"the engine exited with code {code}" + (f": {why}" if why else ""),
                    lines,
                )
                with contextlib.suppress(OSError):
                    self.persist(engine)
            log.warning(
                "engine %s: pid %s exited with code %s", engine.name, run.pid, run.exit_code
            )

        return exited

    def stop_run(self, engine: Engine, final_state: str | None = "stopped") -> None:
        """Stop the engine's process. ``final_state`` None keeps a "failed" state (and its
        error) for a process that failed to become ready; anything else is "stopped"."""
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
                self.persist(engine)
