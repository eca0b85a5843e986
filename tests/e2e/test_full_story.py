"""The whole story of issue 21 in a real Chromium at 1440 × 900 on `make run`, as its users
live it: an operator creates a deployment on the demo host (a small model on the GPU the demo
engine leaves free), measures a baseline on it, proposes one setting with that baseline and a
verification benchmark; an approver (another person, another browser) approves; the operator
applies, and the change page's progress block follows the pipeline to its verified outcome;
then the baseline and the verification are compared in the history, and the cost page prices
the new deployment at the share of the host's GPUs it uses.

Every step asserts what a person would read on the page, and a step that does not happen fails
with what the page showed, the panel's log and a screenshot in the panel's var directory.
"""

from __future__ import annotations

import os
import re
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.e2e.conftest import DEMO_DEPLOYMENT, DEMO_HOST

pytestmark = pytest.mark.e2e

VIEWPORT = {"width": 1440, "height": 900}
NEW_DEPLOYMENT = "qwen-small"
PROFILE = "story-short"
# The machine is shared and loaded: a pipeline (snapshot, apply, restart, health, two short
# benchmarks, compare) takes seconds when idle and minutes when not.
RUN_TIMEOUT_MS = 180000
PIPELINE_TIMEOUT_MS = 360000


@contextmanager
def step(panel, page, name: str):
    """Run one step of the story; when it does not happen, fail saying which step, with what
    the page showed, the panel's log and a full-page screenshot saved in the var directory."""
    try:
        yield
    except Exception as exc:
        slug = re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")
        shot = panel.var_dir / f"story-{slug}.png"
        try:
            page.screenshot(path=str(shot), full_page=True)
        except Exception:  # the page itself is gone: the message below still says why
            shot = "(no screenshot: the page could not be captured)"
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise panel.failure(
            page, f"story step '{name}' did not happen ({first}); screenshot: {shot}"
        ) from None


def wide_session(panel, browser, user: str):
    """A page 1440 px wide in a browser context of its own (another person), logged in."""
    page = browser.new_context(viewport=VIEWPORT).new_page()
    panel.log_in(page, user)
    return page


def fits_the_width(page) -> None:
    """At 1440 px the page does not scroll sideways (wide tables scroll inside their cards)."""
    widths = page.evaluate(
        "() => [document.documentElement.scrollWidth, document.documentElement.clientWidth]"
    )
    assert widths[0] <= widths[1], f"{page.url} scrolls sideways: {widths[0]} > {widths[1]} px"


def open_demo_host(panel, page) -> str:
    """From the host list to the demo host's page, once its agent is online; its URL."""
    panel.wait_for_demo_host(page)
    page.get_by_role("link", name=DEMO_HOST, exact=True).click()
    page.wait_for_url(re.compile(r"/hosts/\d+/$"))
    return page.url


def create_deployment(panel, page, host_url: str) -> str:
    """Step 1: "New deployment" on the host page, filled in as an operator would (the demo's
    engine and version, the catalogue's Qwen2.5-0.5B: it fits one H100 with room to spare, the
    GPU the demo engine leaves free), until the host page shows it running. Its name."""
    demo = page.locator(f"tr[data-deployment={DEMO_DEPLOYMENT}]")
    engine_version = re.search(r"\d+\.\d+\.\d+", demo.locator("td").nth(1).inner_text()).group()
    page.get_by_role("link", name="New deployment").click()
    page.wait_for_url(re.compile(r"/hosts/\d+/deployments/new/$"))
    page.get_by_label("Name", exact=True).fill(NEW_DEPLOYMENT)
    page.get_by_label("Engine", exact=True).select_option("vllm")
    page.get_by_label("Engine version", exact=True).fill(engine_version)
    model = page.get_by_label("Model", exact=True)
    offered = model.evaluate("el => el.list ? Array.from(el.list.options).map(o => o.value) : []")
    small = [name for name in offered if re.search(r"qwen-?2\.5-?0\.5b", name, re.I)]
    assert small, f"the Model field's catalogue offers no small model: {offered}"
    model.fill(small[0])
    # Two simulated H100s; the demo deployment holds one, so its box is disabled.
    gpus = page.get_by_label(re.compile(r"^GPU \d+ · NVIDIA H100"))
    assert gpus.count() == 2, f"{gpus.count()} GPU checkboxes, expected the host's 2"
    free = [i for i in range(2) if gpus.nth(i).is_enabled()]
    assert len(free) == 1, "exactly one GPU is free: the demo deployment's is disabled"
    gpus.nth(free[0]).check()
    fits_the_width(page)
    port = page.get_by_label("Port", exact=True).input_value()
    assert port.isdigit(), f"the port is prefilled with a free one, not {port!r}"
    page.get_by_role("button", name="Create deployment").click()
    page.wait_for_url(host_url)
    row = page.locator(f"tr[data-deployment={NEW_DEPLOYMENT}]")
    row.wait_for(timeout=15000)
    assert "Qwen2.5-0.5B" in row.inner_text() or "qwen2.5-0.5b" in row.inner_text()
    panel.wait_for_running(page, NEW_DEPLOYMENT)
    fits_the_width(page)
    return NEW_DEPLOYMENT


def create_short_profile(page, base: str) -> None:
    """A load profile that runs in seconds: one request at a time, short fixed lengths (one at
    a time so the run-to-run noise of a loaded machine stays small; see test_changes_ui)."""
    page.goto(f"{base}/benchmarks/profiles/new/")
    page.fill("#id_name", PROFILE)
    page.fill("#id_description", "The full story's baseline and verification load.")
    page.fill("#id_stage-0-name", "main")
    page.fill("#id_stage-0-concurrency", "1")
    page.fill("#id_stage-0-num_requests", "24")
    page.select_option("#id_input_kind", "fixed")
    page.fill("#id_input_mean", "256")
    page.select_option("#id_output_kind", "fixed")
    page.fill("#id_output_mean", "32")
    page.fill("#id_warmup_requests", "2")
    page.get_by_role("button", name="Save profile").click()
    page.wait_for_url(re.compile(r"/benchmarks/profiles/\d+/$"))
    assert f"Load profile {PROFILE}" in page.inner_text("body")


def run_baseline(page, host_url: str, deployment: str) -> int:
    """Step 2: "Benchmark" on the deployment's row, the short profile, until it succeeds."""
    page.goto(host_url)
    page.get_by_test_id(f"benchmark-{deployment}").click()
    page.wait_for_url(re.compile(r"/benchmarks/new/\?deployment=\d+"))
    chosen = page.locator("#id_deployment option:checked").inner_text()
    assert chosen.startswith(f"{DEMO_HOST}/{deployment}") or deployment in chosen, chosen
    option = page.locator("#id_load_profile option", has_text=PROFILE)
    page.select_option("#id_load_profile", option.first.get_attribute("value"))
    page.fill("#id_label", "story-baseline")
    page.get_by_test_id("start-run").click()
    page.wait_for_url(re.compile(r"/benchmarks/\d+/$"))
    run_pk = int(page.url.rstrip("/").rsplit("/", 1)[1])
    # The results fragment is re-fetched when the run ends. The heading's live badge is not
    # waited on: a short run can end while the page's first backfill is in flight, and that
    # older reply then puts the badge back to "Running" (reported with issue 21); the page
    # as the server renders it must say Succeeded.
    page.get_by_test_id("run-results").wait_for(timeout=RUN_TIMEOUT_MS)
    badge = page.get_by_test_id("run-status")
    for _ in range(30):
        page.reload()
        if badge.get_attribute("data-run-status") != "running":
            break
        page.wait_for_timeout(1000)
    assert badge.get_attribute("data-run-status") == "succeeded", badge.inner_text()
    assert badge.inner_text() == "Succeeded", badge.inner_text()
    assert "TTFT p50 / p95 / p99" in page.get_by_test_id("run-results").inner_text()
    fits_the_width(page)
    return run_pk


def propose(page, host_url: str, deployment: str, baseline: int) -> int:
    """Step 3a: "Propose change" on the row: max_num_seqs, the measured baseline, the short
    profile to verify with. Returns the change's pk."""
    page.goto(host_url)
    page.get_by_test_id(f"propose-change-{deployment}").click()
    page.wait_for_url(re.compile(r"/changes/new/\?deployment=\d+"))
    assert f"Propose a change to {DEMO_HOST}/{deployment}" in page.inner_text("h1")
    seqs = page.locator("#id_flag_max_num_seqs")
    running = seqs.input_value()
    seqs.fill("48" if running != "48" else "40")
    page.fill("#id_title", "Cap concurrent sequences")
    page.fill("#id_rationale", "Steadier inter-token latency at peak; measured before and after.")
    option = page.locator("#id_verify_profile option", has_text=PROFILE)
    page.select_option("#id_verify_profile", option.first.get_attribute("value"))
    page.select_option("#id_baseline_run", str(baseline))
    # The change has no effect at one request at a time (the simulator predicts 0 %), but on
    # this shared 2-core machine the other engineers' work moves millisecond latencies between
    # two runs by far more than the default +20 % (seen: ITL p95 +31 %, TTFT p95 +76 % and
    # +137 %), and the pipeline would rightly roll back. The story is the flow to a verified
    # outcome; the limits are the proposer's to set, and the judgement has its own tests.
    page.fill("#id_max_ttft_p95_regression", "400")
    page.fill("#id_max_itl_p95_regression", "400")
    preview = page.get_by_test_id("preview")
    preview.get_by_text("max_num_seqs").first.wait_for(timeout=30000)
    preview.get_by_test_id("prediction").wait_for(timeout=30000)
    page.get_by_test_id("submit-proposal").click()
    page.wait_for_url(re.compile(r"/changes/\d+/$"))
    assert page.get_by_test_id("change-state").get_attribute("data-change-state") == "pending"
    assert "Waiting for review: 0 of" in page.get_by_test_id("progress-headline").inner_text()
    return int(page.url.rstrip("/").rsplit("/", 1)[1])


def approve(panel, browser, base: str, change: int):
    """Step 3b: the approver, in a browser of their own, approves."""
    reviewer = wide_session(panel, browser, "approver")
    with step(panel, reviewer, "approver approves"):
        reviewer.goto(f"{base}/changes/{change}/")
        reviewer.fill("#review-comment", "Baseline measured, verification on: go.")
        reviewer.get_by_test_id("approve-change").click()
        reviewer.wait_for_selector("[data-change-state=approved]", timeout=30000)
        headline = reviewer.get_by_test_id("progress-headline").inner_text()
        assert headline == "Approved: ready to apply.", headline
    return reviewer


def apply_and_follow(page, change: int) -> str:
    """Step 3c: the operator applies; the progress block at the top follows the pipeline to
    its outcome, and the timeline and verdict say how the verification went. The state."""
    page.get_by_test_id("apply-change").wait_for(timeout=30000)
    with page.expect_navigation():
        page.get_by_test_id("apply-change").click()
    # From here on the page follows the pipeline live: a marker that a reload would wipe.
    page.evaluate("() => { window.__noReload = true; }")
    page.wait_for_selector(
        "[data-change-state=applying], [data-change-state=verifying]", timeout=30000
    )
    # While the pipeline runs, the block at the top says so and names the stage it is at
    # (a fast pipeline may already have ended by the time the block is re-fetched).
    page.wait_for_selector(
        "[data-testid=change-progress][data-running=true] [data-testid=progress-stage],"
        " [data-change-state=applied], [data-change-state=unverified]",
        timeout=60000,
    )
    page.wait_for_selector(
        "[data-testid=change-progress][data-running=false]", timeout=PIPELINE_TIMEOUT_MS
    )
    page.wait_for_selector(
        "[data-change-state=applied], [data-change-state=unverified]", timeout=30000
    )
    state = page.get_by_test_id("change-state").get_attribute("data-change-state")
    headline = page.get_by_test_id("progress-headline").inner_text()
    assert headline and "pipeline" not in headline, f"the block still says {headline!r}"
    # The verdict of the verification: within limits when applied, inconclusive (never a
    # rollback) when this loaded machine's noise straddles a threshold (24 requests).
    page.wait_for_selector(
        "[data-testid=timeline-item][data-stage=compare]"
        ":is([data-status=succeeded], [data-status=inconclusive])",
        timeout=30000,
    )
    verdict = page.locator("h2", has_text="Verification verdict")
    verdict.wait_for(timeout=30000)
    expected = "within limits" if state == "applied" else "inconclusive"
    assert expected in verdict.inner_text(), verdict.inner_text()
    assert page.get_by_test_id("comparison").is_visible()
    page.get_by_test_id("compare-link").wait_for(timeout=15000)
    fits_the_width(page)
    return state


def verification_run(page, baseline: int) -> int:
    """The verification run's pk, from the change page's link to its comparison with the
    baseline, which is the run measured in step 2 (the pipeline measured none of its own)."""
    href = page.get_by_test_id("compare-link").get_attribute("href")
    runs = [int(pk) for pk in re.findall(r"runs=(\d+)", href)]
    assert len(runs) == 2 and runs[0] == baseline, href
    skipped = page.locator("[data-testid=timeline-item][data-stage=baseline][data-status=skipped]")
    assert "using story-baseline as the baseline" in skipped.inner_text()
    return runs[1]


def compare_in_history(page, base: str, baseline: int, verification: int) -> None:
    """Step 4: the history page, both runs ticked, Compare: the baseline (the older) is the
    reference and the verification's numbers carry their deltas against it."""
    page.goto(f"{base}/benchmarks/")
    button = page.get_by_test_id("compare-selected")
    page.locator(f"tr[data-run='{baseline}'] input[name=runs]").check()
    assert button.is_disabled(), "Compare is live with one run ticked"
    page.locator(f"tr[data-run='{verification}'] input[name=runs]").check()
    assert button.is_enabled()
    button.click()
    page.wait_for_url(re.compile(r"/benchmarks/compare/\?"))
    heading = page.locator("h2", has_text="Key numbers").inner_text()
    assert f"deltas against #{baseline} story-baseline (reference)" in heading, heading
    headers = page.locator("[data-testid=compare-table] thead th")
    reference = headers.filter(has=page.get_by_test_id("compare-reference-badge"))
    # Headers are in capitals (CSS): compare without case.
    assert reference.count() == 1 and "story-baseline" in reference.inner_text().lower()
    rows = page.locator("[data-testid=compare-table] tbody tr[data-metric]")
    assert rows.count() > 0, "no key numbers"
    # Columns are oldest first: the reference's cells carry no delta, the verification's do.
    deltas = page.locator("[data-testid=compare-table] tbody tr[data-metric] td:nth-of-type(2)")
    shown = [d for d in deltas.locator("small.delta").all_inner_texts() if d.strip()]
    assert shown and all(re.search(r"\d", d) for d in shown), f"no deltas: {shown}"
    reference = page.locator("[data-testid=compare-table] tbody tr[data-metric] td:nth-of-type(1)")
    assert reference.locator("small.delta").count() == 0, "the reference has no delta"
    page.wait_for_selector("[data-chart][data-rendered=true] .main-svg", timeout=30000)
    fits_the_width(page)


def cost_of(page, base: str, deployment: str, baseline: int, verification: int) -> None:
    """Step 5: the cost page prices the deployment's runs per 1M tokens, charged for the one
    GPU of the host's two that it uses."""
    page.goto(f"{base}/cost/?runs={baseline}&runs={verification}")
    row = page.locator(f"[data-testid=cost-runs] tr[data-run='{verification}']")
    row.wait_for(timeout=15000)
    cells = row.locator("td")
    assert deployment in cells.nth(1).inner_text(), cells.nth(1).inner_text()
    per_million = cells.nth(8).inner_text()
    assert re.search(r"\d", per_million), f"no cost per 1M output tokens: {per_million!r}"
    share = row.get_by_test_id("gpu-share").inner_text()
    assert share.startswith("1 of 2 GPUs:"), share
    assert "not charged to this run" in share
    page.wait_for_selector("[data-chart][data-rendered=true] .main-svg", timeout=30000)
    fits_the_width(page)


def run_story(panel, browser, *, new_deployment: bool) -> None:
    base = panel.url
    page = wide_session(panel, browser, "operator")
    errors = []
    page.on("pageerror", lambda error: errors.append(str(error)))
    # The manual's screenshots are these (DOCS_SCREENSHOTS=docs/img: see docs/development.md).
    shots = Path(os.environ.get("DOCS_SCREENSHOTS") or panel.var_dir)

    with step(panel, page, "open the demo host"):
        host_url = open_demo_host(panel, page)
        panel.wait_for_running(page, DEMO_DEPLOYMENT)
    deployment = DEMO_DEPLOYMENT
    if new_deployment:
        with step(panel, page, "1 new deployment"):
            deployment = create_deployment(panel, page, host_url)
        page.screenshot(path=str(shots / "story-1-host.png"), full_page=True)
    with step(panel, page, "2 short profile"):
        create_short_profile(page, base)
    with step(panel, page, "2 baseline benchmark"):
        baseline = run_baseline(page, host_url, deployment)
    with step(panel, page, "3 propose"):
        change = propose(page, host_url, deployment, baseline)
    reviewer = approve(panel, browser, base, change)
    with step(panel, page, "3 apply and verify"):
        state = apply_and_follow(page, change)
        assert page.evaluate("() => window.__noReload === true"), "the page was reloaded"
        verification = verification_run(page, baseline)
    page.screenshot(path=str(shots / "story-3-change.png"), full_page=True)
    with step(panel, page, "4 compare"):
        compare_in_history(page, base, baseline, verification)
    page.screenshot(path=str(shots / "story-4-compare.png"), full_page=True)
    with step(panel, page, "5 cost"):
        cost_of(page, base, deployment, baseline, verification)
    page.screenshot(path=str(shots / "story-5-cost.png"), full_page=True)
    assert state in ("applied", "unverified")
    assert reviewer.viewport_size == VIEWPORT == page.viewport_size
    assert errors == [], errors


# Timing: its verdict compares two short real-time runs; with four workers loading the machine
# the new-deployment story failed a CI run (issue 37: verdicts that know when they can't judge).
@pytest.mark.timing
@pytest.mark.parametrize("new_deployment", [True, False], ids=["new-deployment", "demo"])
def test_full_story(panel, browser, new_deployment):
    run_story(panel, browser, new_deployment=new_deployment)
