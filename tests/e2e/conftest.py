"""What every e2e test shares: the panel as `make run` starts it, a headless Chromium, and the
steps each scenario repeats (log in, seed rows, wait for the demo fleet, explain a failure).

A test takes the ``panel`` and ``browser`` fixtures and calls the helpers on ``panel``; test
modules import nothing from each other. Waits are on conditions with generous deadlines: the
demo fleet starts real processes, which takes long on a busy machine.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import free_port
from tests.integration.demo import demo_env
from tests.integration.processes import ROOT, Process

CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
DEMO_HOST = "sim-h100-01"
DEMO_DEPLOYMENT = "llama-8b"
# The demo fleet's agents and engines are real processes: they come up in seconds when the
# machine is idle, a minute or more when it is not.
FLEET_TIMEOUT_MS = 90000


class Panel:
    """A running panel: its URL, the demo users' password, its process (and log)."""

    def __init__(self, url: str, password: str, process: Process, var_dir: Path):
        self.url, self.password, self.process, self.var_dir = url, password, process, var_dir

    def log_in(self, page, user: str) -> None:
        """Log ``page`` in as the demo user ``user`` (admin, operator, approver, viewer)."""
        page.goto(self.url + "/accounts/login/")
        page.fill("#id_username", user)
        page.fill("#id_password", self.password)
        page.click("button[type=submit]")
        page.wait_for_url(self.url + "/")

    def new_session(self, browser, user: str):
        """A page in a browser context of its own (another person), logged in as ``user``."""
        page = browser.new_context().new_page()
        self.log_in(page, user)
        return page

    def seed(self, script: str) -> dict:
        """Run ``script`` in `manage.py shell` against the panel's database; it prints one
        JSON line last, returned as a dict (the ids a scenario needs)."""
        env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL")}
        env["VAR_DIR"] = str(self.var_dir)
        out = subprocess.run(
            [sys.executable, "manage.py", "shell", "-c", script],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
            check=True,
        ).stdout
        return json.loads(out.strip().splitlines()[-1])

    def failure(self, page, what: str, selector: str = "main", html: bool = False):
        """An AssertionError saying ``what`` went wrong, with what the page showed in
        ``selector`` (its markup with ``html``: data attributes included) and the panel's
        log. Raise it ``from None`` in place of a Playwright time-out."""
        shown = page.inner_html(selector) if html else page.inner_text(selector)[:3000]
        return AssertionError(
            f"{what}:\n{shown}\n--- panel log ---\n{self.process.output()[-4000:]}"
        )

    def wait_for_demo_host(self, page, host: str = DEMO_HOST) -> None:
        """Open the host list and wait until the demo ``host`` is online."""
        page.goto(self.url + "/hosts/")
        try:
            page.locator(f"tr[data-host={host}] >> text=Online").wait_for(timeout=FLEET_TIMEOUT_MS)
        except Exception:
            selector = "[data-testid=host-list]"
            raise self.failure(page, "the demo host never came online", selector, True) from None

    def wait_for_running(self, page, deployment: str = DEMO_DEPLOYMENT) -> None:
        """On a host's page, wait until ``deployment``'s status badge says Running."""
        # Looked up afresh on every poll: htmx re-renders the deployments table as their status
        # changes (and once the socket opens), so a handle taken earlier may go stale.
        page.wait_for_function(
            """deployment => {
                const el = document.querySelector(
                    `tr[data-deployment=${deployment}] [data-testid=deployment-status]`);
                return el !== null && el.textContent.trim() === "Running";
            }""",
            arg=deployment,
            timeout=FLEET_TIMEOUT_MS,
        )


@pytest.fixture
def panel(request, tmp_path):
    """`make run` on a free port with its own var/ (SQLite, no Redis, no PostgreSQL). Its
    database comes with the migrations applied (as on a second `make run`), unless the module
    says ``FIRST_RUN = True``: then var/ starts empty, as on a new machine."""
    port = free_port()
    var_dir = tmp_path / "var"
    first_run = getattr(request.module, "FIRST_RUN", False)
    env = demo_env(var_dir, None if first_run else request.getfixturevalue("migrated_sqlite"))
    venv = Path(sys.executable).parent.parent
    if shutil.which("make") and (venv / ".installed").exists():
        cmd = ["make", "--no-print-directory", "run", f"PORT={port}", f"VENV={venv}"]
    else:  # a virtualenv not made by the Makefile: the command `make run` would run
        cmd = [sys.executable, "manage.py", "serve", "--demo", "--port", str(port)]
    process = Process("panel", cmd, env, tmp_path)
    try:
        process.wait_for_output("Uvicorn running on", timeout=180)
        password = re.search(r"password: (\S+)", process.output()).group(1)
        yield Panel(f"http://127.0.0.1:{port}", password, process, var_dir)
    finally:
        process.stop()
    assert (var_dir / "db.sqlite3").exists()


@pytest.fixture
def browser(chromium_path):
    """A headless Chromium (the system's: no download), closed after the test."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=chromium_path, headless=True, args=CHROMIUM_ARGS
        )
        yield browser
        browser.close()
