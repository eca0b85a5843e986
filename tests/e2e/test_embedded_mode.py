"""`make run` (the quick start), end to end in a real browser: log in, dashboard, a background
task through the embedded Celery worker, its progress pushed over the WebSocket."""

from __future__ import annotations

import re
import time

import httpx
import pytest

pytestmark = pytest.mark.e2e
# `make run` on a new machine: var/ starts empty (migrations, static files, demo data).
FIRST_RUN = True


def test_make_run_gives_a_working_panel(panel, browser, tmp_path):
    base = panel.url
    assert httpx.get(base + "/healthz").json() == {"status": "ok"}
    page = browser.new_page()
    requested = []
    page.on("request", lambda request: requested.append(request.url))
    failures = []
    page.on("pageerror", lambda error: failures.append(str(error)))

    page.goto(base + "/")
    assert page.url == base + "/accounts/login/?next=/"
    panel.log_in(page, "admin")
    assert page.locator("h1").inner_text() == "Dashboard"
    assert page.get_by_test_id("host-count").inner_text() == "2"
    # plotly.js from our own static files drew the chart.
    page.wait_for_selector("#gpu-memory-chart[data-rendered=true] .main-svg", timeout=20000)

    # The demo fleet: local agents, their simulated GPUs read into the panel, engines started
    # through the agents by apply operations on the embedded worker.
    page.click("nav >> text=Hosts")
    panel.wait_for_demo_host(page)
    page.locator("tr[data-host=sim-h100-01] >> text=NVIDIA H100 80GB HBM3").first.wait_for(
        timeout=30000
    )
    page.click("text=sim-h100-01")
    # It connects (how soon is the machine's: a busy one took over 10 s).
    page.wait_for_selector("[data-live-connected=true]", timeout=30000)
    panel.wait_for_running(page)

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
        raise panel.failure(page, "the check never showed as succeeded", "#checks", True) from None
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
    log = panel.process.output()
    assert re.search(r"Task hosts\.tasks\.check_host\[[0-9a-f-]+\] received", log), log[-3000:]
    assert re.search(r"Task hosts\.tasks\.apply_config\[[0-9a-f-]+\] received", log)
