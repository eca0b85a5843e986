"""The README's run command, end to end in a real browser: log in, dashboard, a background
task through the embedded Celery worker, its progress pushed over the WebSocket."""

from __future__ import annotations

import os
import random
import re
import shutil
import socket
import sys
import time
from pathlib import Path

import httpx
import pytest

from tests.conftest import free_port
from tests.integration.processes import Process

pytestmark = pytest.mark.e2e

CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


@pytest.fixture
def panel(tmp_path):
    """`make run` on a free port with its own var/ (SQLite, no Redis, no PostgreSQL)."""
    port = free_port()
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("DATABASE_URL", "REDIS_URL", "SECRET_KEY", "DEMO_PASSWORD", "STATIC_ROOT")
    }
    env.update(
        {
            "VAR_DIR": str(tmp_path / "var"),
            "HOST_CHECK_INTERVAL_SECONDS": "0",
            "DEMO_FLEET_PORT": str(free_fleet_ports()),
        }
    )
    venv = Path(sys.executable).parent.parent
    if shutil.which("make") and (venv / ".installed").exists():
        cmd = ["make", "--no-print-directory", "run", f"PORT={port}", f"VENV={venv}"]
    else:  # a virtualenv not made by the Makefile: the command `make run` would run
        cmd = [sys.executable, "manage.py", "serve", "--demo", "--port", str(port)]
    process = Process("panel", cmd, env, tmp_path)
    try:
        process.wait_for_output("Uvicorn running on", timeout=180)
        password = re.search(r"password: (\S+)", process.output()).group(1)
        yield {"url": f"http://127.0.0.1:{port}", "password": password, "process": process}
    finally:
        process.stop()
    assert (tmp_path / "var" / "db.sqlite3").exists()


def free_fleet_ports() -> int:
    """A base port for the demo fleet: its agents use base, base+1, engines base+100, +101."""
    for _ in range(50):
        base = random.randint(20000, 40000)
        ports = (base, base + 1, base + 100, base + 101)
        try:
            for p in ports:
                with socket.socket() as sock:
                    sock.bind(("127.0.0.1", p))
        except OSError:
            continue
        return base
    raise AssertionError("no free ports for the demo fleet")


@pytest.fixture
def browser(chromium_path):
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=chromium_path, headless=True, args=CHROMIUM_ARGS
        )
        yield browser
        browser.close()


def test_make_run_gives_a_working_panel(panel, browser, tmp_path):
    base = panel["url"]
    assert httpx.get(base + "/healthz").json() == {"status": "ok"}
    page = browser.new_page()
    requested = []
    page.on("request", lambda request: requested.append(request.url))
    failures = []
    page.on("pageerror", lambda error: failures.append(str(error)))

    page.goto(base + "/")
    assert page.url == base + "/accounts/login/?next=/"
    page.fill("#id_username", "admin")
    page.fill("#id_password", panel["password"])
    page.click("button[type=submit]")
    page.wait_for_url(base + "/")
    assert page.locator("h1").inner_text() == "Dashboard"
    assert page.get_by_test_id("host-count").inner_text() == "2"
    # plotly.js from our own static files drew the chart.
    page.wait_for_selector("#gpu-memory-chart[data-rendered=true] .main-svg", timeout=20000)

    # The demo fleet: local agents, their simulated GPUs read into the panel, engines started
    # through the agents by apply operations on the embedded worker.
    page.click("nav >> text=Hosts")
    h100 = page.locator("tr[data-host=sim-h100-01]")
    try:
        h100.locator("text=Online").wait_for(timeout=60000)
        h100.locator("text=NVIDIA H100 80GB HBM3").first.wait_for(timeout=30000)
    except Exception:
        raise AssertionError(
            "the demo host never came online:\n"
            + page.inner_html("[data-testid=host-list]")
            + "\n--- panel log ---\n"
            + panel["process"].output()[-4000:]
        ) from None
    page.click("text=sim-h100-01")
    page.wait_for_selector("[data-live-connected=true]", timeout=10000)
    # Looked up on every poll: htmx swaps the deployments fragment on live events (and once
    # the socket opens), so a handle to the first badge would go stale.
    page.wait_for_function(
        """() => {
            const el = document.querySelector(
                "tr[data-deployment=llama-8b] [data-testid=deployment-status]");
            return el !== null && el.textContent.trim() === "Running";
        }""",
        timeout=60000,
    )

    # Live telemetry: the GPU chart grows in place as samples arrive over the socket.
    chart = page.get_by_test_id("gpu-chart-0")
    chart.locator(".main-svg").first.wait_for(timeout=20000)
    before = int(chart.get_attribute("data-points") or 0)
    page.wait_for_function(
        "([el, n]) => Number(el.dataset.points) >= n + 3",
        arg=[chart.element_handle(), before],
        timeout=20000,
    )

    # "Test connection" runs on the embedded worker; its result arrives over the socket.
    started = time.monotonic()
    page.get_by_test_id("check-host").click()
    row = page.locator("#checks tr[data-check-status=succeeded]").first
    try:
        page.wait_for_function(
            "() => [...document.querySelectorAll('#checks tr[data-check-status=succeeded]')]"
            ".some(r => r.innerText.includes('admin'))",
            timeout=20000,
        )
    except Exception:
        raise AssertionError(
            "the check never showed as succeeded:\n"
            + page.inner_html("#checks")
            + "\n--- panel log ---\n"
            + panel["process"].output()[-4000:]
        ) from None
    elapsed = time.monotonic() - started
    assert "telemetry from simulator" in row.inner_text()
    page.screenshot(path=str(tmp_path / "host.png"), full_page=True)
    print(f"check queued → succeeded on screen in {elapsed:.2f} s")

    # Everything the browser loaded came from the panel itself (no CDN, no network).
    assert requested and all(url.startswith((base, "ws://127.0.0.1")) for url in requested), [
        url for url in requested if not url.startswith(base)
    ]
    assert not failures
    # The embedded Celery worker (not an eager call) received and ran the tasks.
    log = panel["process"].output()
    assert re.search(r"Task hosts\.tasks\.check_host\[[0-9a-f-]+\] received", log), log[-3000:]
    assert re.search(r"Task hosts\.tasks\.apply_config\[[0-9a-f-]+\] received", log)
