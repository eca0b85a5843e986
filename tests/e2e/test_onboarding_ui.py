"""Onboarding in a real browser: add an agent host, land on its setup, generate the token
(shown once in the install script, masked after a reload), test the connection to a port where
nothing listens: htmx polls the running check and the steps turn red with the error and what
to do, never green."""

from __future__ import annotations

import pytest

from tests.conftest import free_port

pytestmark = pytest.mark.e2e


def test_add_a_host_and_follow_its_setup(panel, browser):
    page = browser.new_page()
    failures = []
    page.on("pageerror", lambda error: failures.append(str(error)))
    panel.log_in(page, "operator")
    page.goto(panel.url + "/hosts/new/")
    port = free_port()  # nothing listens there: the agent is "not started yet"
    page.fill("#id_name", "gpu-onboard")
    page.fill("#id_address", "127.0.0.1")
    page.select_option("#id_transport", "agent")
    page.fill("#id_port", str(port))
    page.fill("#id_hourly_price", "1")
    page.click("button[type=submit]")
    page.wait_for_url("**/onboard/")
    assert "Follow the steps" in page.inner_text("main")

    page.get_by_test_id("generate-token").click()
    page.get_by_test_id("token-once").wait_for()
    script = page.get_by_test_id("install-script").inner_text()
    assert "printf '%s\\n' " in script and f"--listen 127.0.0.1:{port}" in script
    token = script.split("printf '%s\\n' ", 1)[1].split()[0]
    page.reload()  # a GET after the POST: the token is gone for good
    assert token not in page.content()
    page.get_by_test_id("token-masked").wait_for()

    page.get_by_test_id("onboard-check").click()
    try:
        page.wait_for_selector(
            '[data-step="check"][data-step-state="failed"] '
            '[data-result="Reachable"][data-result-state="fail"]',
            timeout=60000,
        )
    except Exception:
        raise panel.failure(page, "the check's failure never showed", html=True) from None
    check = page.locator('[data-step="check"]').inner_text()
    assert "refused" in check.lower() and "What to do" in check, check
    assert page.locator('[data-step="install"]').get_attribute("data-step-state") == "failed"
    # Polling stops once the check has finished.
    page.wait_for_selector('#onboard-poller[data-running="false"]', state="attached")
    assert not failures, failures
