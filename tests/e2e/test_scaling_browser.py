"""The scaling page in a real browser on `make run`: from the demo host's page an operator
opens "Scaling" for llama-8b, sees the live signal charts drawn and a new point arrive over
the host's WebSocket (the panel's signal poller reads the simulated engine's /metrics every
second), and downloads the KEDA ScaledObject for the deployment."""

from __future__ import annotations

import pytest
import yaml

pytestmark = pytest.mark.e2e

SEED = """
import json
from hosts.models import Deployment
deployment = Deployment.objects.get(name="llama-8b")
print(json.dumps({"deployment": deployment.pk, "host": deployment.host_id}))
"""
ROOT = "[data-testid=scaling-page]"
POINTS = f"() => Number(document.querySelector('{ROOT}').dataset.points || 0)"
EVENTS = f"() => Number(document.querySelector('{ROOT}').dataset.liveEvents || 0)"
# The poller runs once a second; the first samples wait for the engine to be Running.
LIVE_TIMEOUT_MS = 60000


def test_live_signals_and_the_keda_download(panel, browser):
    base = panel.url
    page = panel.new_session(browser, "operator")
    errors = []
    page.on("pageerror", lambda error: errors.append(str(error)))
    panel.wait_for_demo_host(page)
    ids = panel.seed(SEED)

    # --- from the host page ------------------------------------------------------------------
    page.goto(f"{base}/hosts/{ids['host']}/")
    panel.wait_for_running(page)
    page.get_by_test_id("scaling-llama-8b").click()
    page.wait_for_url(f"{base}/scaling/deployments/{ids['deployment']}/")
    try:
        page.wait_for_selector(f"{ROOT}[data-live-connected=true]", timeout=15000)
        page.wait_for_selector("[data-testid=chart-queue][data-rendered=true]", timeout=15000)
        page.wait_for_selector("[data-testid=chart-ttft][data-rendered=true]", timeout=15000)
    except Exception:
        raise panel.failure(page, "the scaling page's charts or socket never came up") from None

    # --- a new point arrives live, without a reload -------------------------------------------
    # Counted after the socket's open (and its backfill) so the new point is a live event's.
    before = page.evaluate(POINTS)
    try:
        page.wait_for_function(
            f"() => ({EVENTS})() >= 1 && ({POINTS})() > {before}", timeout=LIVE_TIMEOUT_MS
        )
    except Exception:
        raise panel.failure(page, "no live signal point arrived", ROOT, html=True) from None
    after = page.evaluate(POINTS)
    x = page.evaluate("() => document.querySelector('[data-testid=chart-queue]').data[0].x.length")
    assert x >= after >= before + 1
    age = page.locator("[data-signal-age]").inner_text()
    assert "s ago" in age, panel.failure(page, "the signals' age is not shown")
    waiting = page.locator("[data-signal=requests_waiting]").inner_text()
    assert waiting != "", panel.failure(page, "the waiting tile is empty")

    # --- the KEDA download -------------------------------------------------------------------
    page.fill("#export-namespace", "inference")
    with page.expect_download() as info:
        page.get_by_test_id("export-keda.yaml").click()
    download = info.value
    assert "llama-8b" in download.suggested_filename
    text = open(download.path(), encoding="utf-8").read()
    doc = yaml.safe_load(text)
    assert doc["kind"] == "ScaledObject" and doc["apiVersion"].startswith("keda.sh/")
    assert doc["metadata"]["namespace"] == "inference"
    assert doc["spec"]["scaleTargetRef"]["name"] == "llama-8b"
    assert text.startswith("#") and "llama-8b" in text.splitlines()[1]
    assert not errors, errors
