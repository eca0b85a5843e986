"""Environment and CPU placement proposed in a real browser on `make run` (issue 21): the
operator adds a variable and a secret, pins the demo engine to a NUMA node of the demo host
from the select, the live preview shows them as diff rows (the secret masked) with the note
that the prediction does not model them, and the submitted change's page shows the same."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.e2e

SEED = """
import json
from hosts.models import Deployment
deployment = Deployment.objects.select_related("host").get(name="llama-8b")
nodes = [n["node"] for n in deployment.host.numa_nodes or []]
print(json.dumps({"deployment": deployment.pk, "nodes": nodes,
                  "placement": deployment.active_config.placement}))
"""
SECRET = "hf_e2e_secret_typed_in_browser"


def test_propose_env_and_placement_with_the_preview(panel, browser):
    base = panel.url
    page = panel.new_session(browser, "operator")
    panel.wait_for_demo_host(page)
    ids = panel.seed(SEED)
    assert ids["nodes"], "the demo host reports its NUMA nodes"
    errors = []
    page.on("pageerror", lambda error: errors.append(str(error)))

    page.goto(f"{base}/changes/new/?deployment={ids['deployment']}")
    options = page.locator("#id_numa_node option")
    values = [options.nth(i).get_attribute("value") for i in range(options.count())]
    assert values[0] == "" and [int(v) for v in values[1:]] == ids["nodes"], values
    page.fill("#id_title", "Pin and tune NCCL logging")
    page.fill("#id_rationale", "The GPUs hang off this node; NCCL logs help the next incident.")
    env = page.locator("#id_env")
    env.fill((env.input_value() + f"\nNCCL_DEBUG=INFO\nHF_TOKEN={SECRET}").strip())
    node = str(ids["nodes"][0])
    running = (ids["placement"] or {}).get("numa_node")
    # Another node than the running one, else no node at all: either way a change.
    choice = node if running is None or str(running) != node else ""
    page.select_option("#id_numa_node", choice)
    preview = page.get_by_test_id("preview")
    try:
        preview.locator('[data-flag="env.NCCL_DEBUG"]').wait_for(timeout=20000)
        preview.locator('[data-flag="placement.numa_node"]').wait_for(timeout=20000)
        preview.get_by_test_id("diff-unmodelled").wait_for(timeout=20000)
    except Exception:
        raise panel.failure(page, "the preview did not show env and placement", html=True) from None
    assert SECRET not in preview.inner_html()
    assert "•••" in preview.locator('[data-flag="env.HF_TOKEN"]').inner_text()

    page.get_by_test_id("submit-proposal").click()
    page.wait_for_url(f"{base}/changes/*/")
    assert page.get_by_test_id("change-state").get_attribute("data-change-state") == "pending"
    for key in ("env.NCCL_DEBUG", "env.HF_TOKEN", "placement.numa_node"):
        assert page.locator(f'[data-flag="{key}"]').count() == 1, key
    assert SECRET not in page.content()
    assert errors == []
