"""The demo panel as a newcomer starts it (`make run` = `manage.py serve --demo`: embedded,
SQLite, in-process worker, the demo fleet's agents and simulated engines), on free ports with
its own var/, for the end-to-end tests (tests/integration, tests/e2e)."""

from __future__ import annotations

import os
import random
import socket
import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path

from tests.conftest import free_port
from tests.integration.processes import ROOT, Process

# What a developer's shell may carry that must not reach an embedded demo panel.
NOT_PASSED = ("DATABASE_URL", "REDIS_URL", "SECRET_KEY", "DEMO_PASSWORD", "STATIC_ROOT")


def free_fleet_ports() -> int:
    """A base port for the demo fleet: its agents use base, base+1, engines base+100, +101."""
    for _ in range(50):
        base = random.randint(20000, 40000)
        try:
            for port in (base, base + 1, base + 100, base + 101):
                with socket.socket() as sock:
                    sock.bind(("127.0.0.1", port))
        except OSError:
            continue
        return base
    raise AssertionError("no free ports for the demo fleet")


def demo_env(var_dir: Path) -> dict:
    """The environment of a demo panel with its own var/ and fleet ports."""
    env = {k: v for k, v in os.environ.items() if k not in NOT_PASSED}
    env.update(
        {
            "VAR_DIR": str(var_dir),
            "HOST_CHECK_INTERVAL_SECONDS": "0",
            "DEMO_FLEET_PORT": str(free_fleet_ports()),
        }
    )
    return env


@contextmanager
def demo_panel(tmp_path: Path, cmd_for=None):
    """Start a demo panel; yields (url, env, process) and stops it after. ``cmd_for(port)``
    is its command (default `manage.py serve --demo`)."""
    port = free_port()
    env = demo_env(tmp_path / "var")
    cmd = (cmd_for or _serve)(port)
    process = Process("panel", cmd, env, tmp_path)
    try:
        process.wait_for_output("Uvicorn running on", timeout=180)
        yield f"http://127.0.0.1:{port}", env, process
    finally:
        process.stop()


def _serve(port: int) -> list[str]:
    return [sys.executable, "manage.py", "serve", "--demo", "--port", str(port)]


def manage(env: dict, *args: str) -> str:
    """``manage.py ARGS`` against the demo panel's database; its standard output."""
    return subprocess.run(
        [sys.executable, "manage.py", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    ).stdout
