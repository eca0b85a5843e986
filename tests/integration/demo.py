"""The demo panel as a newcomer starts it (`make run` = `manage.py serve --demo`: embedded,
SQLite, in-process worker, the demo fleet's agents and simulated engines), on free ports with
its own var/, for the end-to-end tests (tests/integration, tests/e2e)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path

from controlpanel.static_collect import STAMP as STATIC_STAMP
from tests.conftest import free_port
from tests.integration.processes import ROOT, Process
from tests.workers import free_ports

# What a developer's shell may carry that must not reach an embedded demo panel.
NOT_PASSED = ("DATABASE_URL", "REDIS_URL", "SECRET_KEY", "DEMO_PASSWORD", "STATIC_ROOT")


def free_fleet_ports() -> int:
    """A base port for the demo fleet: its agents use base, base+1, engines base+100, +101
    (all from this test process's own range: tests/workers.py)."""
    return free_ports((0, 1, 100, 101))


def migrated_database(folder: Path) -> Path:
    """A demo var/ made ready once: a SQLite database with every migration applied and the
    static files collected (``serve --demo`` finds them current: controlpanel.static_collect),
    for ``demo_env`` to start panels from: each `serve --demo` then skips its migrations (as
    on a second `make run`, ~4.5 s of CPU for all of them) and its collection (4-6 s). The e2e
    test of the first `make run` starts from an empty var/. Returns the database's path."""
    env = demo_env(folder)
    manage(env, "migrate", "--no-input", "-v0")
    collect = "from controlpanel import static_collect; static_collect.collect_if_changed()"
    manage(env, "shell", "-v0", "-c", collect)
    return folder / "db.sqlite3"


def demo_env(var_dir: Path, database: Path | None = None) -> dict:
    """The environment of a demo panel with its own var/ and fleet ports (and a copy of
    ``database`` as its SQLite database)."""
    env = {k: v for k, v in os.environ.items() if k not in NOT_PASSED}
    if database is not None:
        var_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        shutil.copyfile(database, var_dir / "db.sqlite3")
        static = database.parent / "static"
        if (static / STATIC_STAMP).is_file():
            # Collected once (migrated_database), only read from here: every panel shares it.
            env["STATIC_ROOT"] = str(static)
    # The tests' fast password hasher (as in tests/conftest.py): the demo logins are hashed
    # at every start and checked at every sign-in, 0.23 s of CPU each with Django's default.
    env["DJANGO_SETTINGS_MODULE"] = "tests.demo_settings"
    env.update(
        {
            "VAR_DIR": str(var_dir),
            "HOST_CHECK_INTERVAL_SECONDS": "0",
            "DEMO_FLEET_PORT": str(free_fleet_ports()),
        }
    )
    return env


@contextmanager
def demo_panel(tmp_path: Path, cmd_for=None, database: Path | None = None):
    """Start a demo panel; yields (url, env, process) and stops it after. ``cmd_for(port)``
    is its command (default `manage.py serve --demo`); ``database``: see ``demo_env``."""
    port = free_port()
    env = demo_env(tmp_path / "var", database)
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
    """``manage.py ARGS`` in ``env`` (a demo panel's: against its database); its output."""
    return subprocess.run(
        [sys.executable, "manage.py", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    ).stdout
