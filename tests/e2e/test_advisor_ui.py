"""The advisor in a real browser on `make run`: an operator finds a finding (with its evidence)
in the demo deployment's Advisor section on the host page, clicks "Propose this change" and
gets the proposal form pre-filled with the suggested flag over the running config and the live
preview's predicted impact; back on the host page, a finding is dismissed with a reason and is
gone. A viewer sees the findings but no button."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.e2e

SEED = """
import json
from django.utils import timezone
from changes.models import Finding
from hosts.models import Deployment
deployment = Deployment.objects.select_related("host").get(name="llama-8b")
seqs = (deployment.active_config.settings.get("max_num_seqs") or 256) * 2
now = timezone.now()
common = dict(deployment=deployment, first_seen_at=now, last_seen_at=now, source="live")
config = Finding.objects.create(
    rule="queue-bound", severity="warning", title="Requests wait for a sequence slot",
    seen="9 requests waiting on average over the last 60 s while every sequence ran.",
    why="Queue time adds to every request's TTFT while the KV cache has room.",
    evidence={"waiting_mean": 9.0, "kv_usage_mean": 0.31},
    suggestion={"settings": {"max_num_seqs": seqs}, "action": ""}, **common)
action = Finding.objects.create(
    rule="gpu-throttled", severity="critical", title="GPU 0 is power-capped",
    seen="SM clock 1100 of 1980 MHz with the power-cap clock event for 60 s.",
    why="A capped GPU is slower than its benchmark numbers.",
    suggestion={"settings": {}, "action": "Raise the power limit or fix the cooling."}, **common)
print(json.dumps({"host": deployment.host_id, "deployment": deployment.pk, "seqs": seqs,
                  "config": config.pk, "action": action.pk}))
"""


@pytest.fixture(autouse=True)
def _no_advisor_sweep(monkeypatch):
    """The findings here are seeded: the panel's own sweep would clear those its rules do not
    see (autouse, so set before the panel fixture reads the environment)."""
    monkeypatch.setenv("ADVISOR_INTERVAL_SECONDS", "0")


def _advisor(page, panel, ids):
    page.goto(f"{panel.url}/hosts/{ids['host']}/")
    section = page.locator(f"#advisor-{ids['deployment']}")
    try:
        # The section is fetched on load and again when its socket opens (live.js refreshes
        # what it may have missed): interact only after that second swap, or an open
        # "Dismiss…" form is replaced under the test's hands.
        page.wait_for_selector(
            f"#advisor-{ids['deployment']}[data-live-connected=true]", timeout=20000
        )
        page.wait_for_load_state("networkidle")
        section.locator(f"[data-finding='{ids['config']}']").wait_for(timeout=20000)
    except Exception:
        raise panel.failure(page, "the Advisor section did not show the finding") from None
    return section


def test_propose_from_a_finding_and_dismiss_another(panel, browser):
    operator = panel.new_session(browser, "operator")
    panel.wait_for_demo_host(operator)
    ids = panel.seed(SEED)
    errors = []
    operator.on("pageerror", lambda error: errors.append(str(error)))

    section = _advisor(operator, panel, ids)
    # Worst first: the critical finding above the warning.
    rules = section.locator("[data-finding]").evaluate_all("els => els.map(el => el.dataset.rule)")
    assert rules == ["gpu-throttled", "queue-bound"]
    assert section.get_by_test_id(f"propose-finding-{ids['action']}").count() == 0
    section.locator("[data-finding] details.evidence summary").first.click()
    assert section.get_by_test_id("evidence").first.is_visible()

    # --- propose this change --------------------------------------------------------------------
    section.get_by_test_id(f"propose-finding-{ids['config']}").click()
    operator.wait_for_url(f"{panel.url}/changes/new/*")
    assert operator.locator("#id_flag_max_num_seqs").input_value() == str(ids["seqs"])
    assert operator.locator("#id_title").input_value() == "Requests wait for a sequence slot"
    rationale = operator.locator("#id_rationale").input_value()
    assert f"From advisor finding #{ids['config']} (queue-bound)." in rationale
    preview = operator.get_by_test_id("preview")
    try:
        preview.get_by_text("max_num_seqs").first.wait_for(timeout=20000)
        preview.get_by_test_id("prediction").wait_for(timeout=20000)
    except Exception:
        raise panel.failure(operator, "the preview showed no predicted impact") from None

    # --- dismiss the other one with a reason -------------------------------------------------
    section = _advisor(operator, panel, ids)
    section.get_by_test_id(f"dismiss-finding-{ids['action']}").click()
    section.get_by_test_id(f"dismiss-reason-{ids['action']}").fill("The cap is deliberate.")
    section.get_by_test_id(f"dismiss-submit-{ids['action']}").click()
    operator.wait_for_load_state()
    section = _advisor(operator, panel, ids)
    assert section.locator(f"[data-finding='{ids['action']}']").count() == 0
    assert not errors, errors

    # --- a viewer reads, with no buttons -------------------------------------------------------
    viewer = panel.new_session(browser, "viewer")
    section = _advisor(viewer, panel, ids)
    assert section.get_by_test_id(f"propose-finding-{ids['config']}").count() == 0
    assert section.get_by_test_id(f"dismiss-finding-{ids['config']}").count() == 0
