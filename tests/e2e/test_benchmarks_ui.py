"""Benchmarks in a real browser on `make run`: launch a run on a demo engine, watch its live
charts grow over the WebSocket, run it again, compare the two runs, price them."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.e2e.test_embedded_mode import browser, panel  # noqa: F401 - shared fixtures
from tests.integration.processes import ROOT

pytestmark = pytest.mark.e2e

SEED = """
import json
from benchmarks.models import LoadProfile
from hosts.models import Deployment
profile = LoadProfile.objects.create_next("e2e-small", {
    "stages": [{"name": "main", "concurrency": 4, "num_requests": 48}],
    "input_len": {"kind": "fixed", "mean": 256},
    "output_len": {"kind": "fixed", "mean": 96},
    "warmup_requests": 2,
    "slo": {"ttft": 1000},
})
deployment = Deployment.objects.get(name="llama-8b")
print(json.dumps({"profile": profile.pk, "deployment": deployment.pk}))
"""


def seed(tmp_path) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL")}
    env["VAR_DIR"] = str(tmp_path / "var")
    out = subprocess.run(
        [sys.executable, "manage.py", "shell", "-c", SEED],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    ).stdout
    return json.loads(out.strip().splitlines()[-1])


def login(page, base, user, password):
    page.goto(base + "/accounts/login/")
    page.fill("#id_username", user)
    page.fill("#id_password", password)
    page.click("button[type=submit]")
    page.wait_for_url(base + "/")


def run_once(page, base, ids, label, panel_process) -> int:
    page.goto(f"{base}/benchmarks/new/?profile={ids['profile']}&deployment={ids['deployment']}")
    page.fill("#id_label", label)
    page.get_by_test_id("start-run").click()
    page.wait_for_url(f"{base}/benchmarks/*/")
    run_pk = int(page.url.rstrip("/").rsplit("/", 1)[1])
    page.wait_for_selector("[data-live-connected=true]", timeout=15000)
    chart = page.get_by_test_id("chart-ttft")
    chart.locator(".main-svg").first.wait_for(timeout=20000)
    try:
        # Live: the charts grow in place while the run goes (one point a second).
        page.wait_for_function(
            "el => Number(el.dataset.points) >= 3", arg=chart.element_handle(), timeout=60000
        )
        page.wait_for_selector("[data-run-status=succeeded]", timeout=120000)
    except Exception:
        raise AssertionError(
            "the run did not stream and succeed:\n"
            + page.inner_text("main")[:3000]
            + "\n--- panel log ---\n"
            + panel_process.output()[-4000:]
        ) from None
    # The results fragment is refreshed by htmx when the status event arrives.
    page.get_by_test_id("run-results").wait_for(timeout=15000)
    progress = page.get_by_test_id("run-progress").get_attribute("aria-valuenow")
    assert progress == "100"
    return run_pk


def test_launch_watch_compare_and_price_runs(panel, browser, tmp_path):  # noqa: F811
    base = panel["url"]
    ids = seed(tmp_path)
    page = browser.new_page()
    failures = []
    page.on("pageerror", lambda error: failures.append(str(error)))
    requested = []
    page.on("request", lambda request: requested.append(request.url))
    login(page, base, "operator", panel["password"])

    page.goto(f"{base}/hosts/")
    page.locator("tr[data-host=sim-h100-01] >> text=Online").wait_for(timeout=90000)
    page.click("text=sim-h100-01")
    status = page.locator("tr[data-deployment=llama-8b] [data-testid=deployment-status]")
    page.wait_for_function(
        "el => el.textContent.trim() === 'Running'", arg=status.element_handle(), timeout=90000
    )

    first = run_once(page, base, ids, "e2e-baseline", panel["process"])
    # Several numbers on screen come from the stored results, not from the live stream.
    tiles = page.get_by_test_id("run-results").inner_text()
    assert "TTFT p50 / p95 / p99" in tiles and "output tokens/s" in tiles
    second = run_once(page, base, ids, "e2e-again", panel["process"])
    page.screenshot(path=str(tmp_path / "run.png"), full_page=True)

    page.goto(f"{base}/benchmarks/compare/?runs={first}&runs={second}")
    page.wait_for_selector("[data-chart][data-rendered=true] .main-svg", timeout=20000)
    text = page.inner_text("main")
    assert "e2e-baseline" in text and "e2e-again" in text
    page.screenshot(path=str(tmp_path / "compare.png"), full_page=True)

    page.goto(f"{base}/cost/?runs={first}&runs={second}")
    page.wait_for_selector("[data-chart][data-rendered=true] .main-svg", timeout=20000)
    text = page.inner_text("main")
    assert "e2e-baseline" in text and "e2e-again" in text
    page.screenshot(path=str(tmp_path / "cost.png"), full_page=True)

    assert not failures, failures
    assert all(url.startswith((base, "ws://127.0.0.1")) for url in requested)
