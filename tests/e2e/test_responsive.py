"""Small screens in a real browser on `make run`: the main pages at 375×812 (a phone) and
1440×900 (a laptop) do not scroll sideways, the header stays inside the viewport, on the phone
the navigation folds behind a Menu button that opens it (mouse and keyboard) and whose links
work, on the laptop the navigation shows without the button. Each page is saved as a
full-page screenshot per width (their paths are printed: the test's artifacts; set
E2E_SCREENSHOTS to a directory to keep them there).

The data is real where it is cheap: two short benchmark runs on the demo engine (the run page,
history, compare and cost show their charts and tables), a change proposed against it (the
change page and list), the demo fleet for hosts and scaling, the audit log they leave."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e

SEED = """
import json
from benchmarks.models import LoadProfile
from hosts.models import Deployment
profile = LoadProfile.objects.create_next("e2e-responsive", {
    "stages": [{"name": "main", "concurrency": 4, "num_requests": 24}],
    "input_len": {"kind": "fixed", "mean": 256},
    "output_len": {"kind": "fixed", "mean": 32},
    "warmup_requests": 1,
})
deployment = Deployment.objects.get(name="llama-8b")
print(json.dumps({"profile": profile.pk, "deployment": deployment.pk,
                  "host": deployment.host_id}))
"""
# A change pending review, proposed by the operator with the first run as its baseline, so
# that the change page shows its diff, prediction and evidence.
CHANGE = """
import json
from django.contrib.auth import get_user_model
from benchmarks.models import BenchmarkRun, LoadProfile
from changes.services import review
from hosts.models import Deployment
deployment = Deployment.objects.get(name="llama-8b")
running = deployment.active_config.settings
seqs = running.get("max_num_seqs") or 32
change = review.propose_change(
    get_user_model().objects.get(username="operator"),
    deployment,
    title="e2e: a larger batch for a long-named deployment setting that wraps on a phone",
    rationale="Queue wait at peak; " + "a long rationale without breaks " * 6,
    settings={**running, "max_num_seqs": seqs * 2},
    verify_profile=LoadProfile.objects.get(pk=%(profile)d),
    baseline_run=BenchmarkRun.objects.get(pk=%(run)d),
)
print(json.dumps({"change": change.pk}))
"""

PHONE = {"width": 375, "height": 812}
LAPTOP = {"width": 1440, "height": 900}
RUN_TIMEOUT_MS = 180000

# Everything that widens the document past the viewport, widest first: elements whose box
# leaves the viewport and that no scrolling (or clipping) ancestor inside the viewport holds.
# Each is named as a CSS-like path, so that a failure says what to fix.
OVERFLOW = """vw => {
  const name = el => {
    let s = el.tagName.toLowerCase();
    if (el.id) s += '#' + el.id;
    if (el.dataset && el.dataset.testid) s += `[data-testid=${el.dataset.testid}]`;
    const cls = typeof el.className === 'string' ? el.className.trim() : '';
    if (cls) s += '.' + cls.split(/\\s+/).join('.');
    return s;
  };
  const path = el => {
    const parts = [];
    for (let e = el; e && e !== document.body && parts.length < 5; e = e.parentElement)
      parts.unshift(name(e));
    return parts.join(' > ');
  };
  const clipped = el => {
    for (let a = el.parentElement; a && a !== document.body; a = a.parentElement) {
      if (getComputedStyle(a).overflowX !== 'visible') {
        const r = a.getBoundingClientRect();
        if (r.right <= vw + 1 && r.left >= -1) return true;
      }
    }
    return false;
  };
  const found = [];
  for (const el of document.body.querySelectorAll('*')) {
    const r = el.getBoundingClientRect();
    // Wholly left of the page is hidden on purpose (plotly's off-screen measuring svg).
    if (r.width === 0 || r.right <= 0 || (r.right <= vw + 1 && r.left >= -1)) continue;
    if (getComputedStyle(el).position === 'fixed' || clipped(el)) continue;
    // The outermost offender only: its descendants are reported through it.
    if (found.some(f => f.el.contains(el))) continue;
    const where = [r.left, r.right, r.width].map(Math.round);
    found.push({el, width: r.width,
                text: `${path(el)} (left ${where[0]}, right ${where[1]}, width ${where[2]})`});
  }
  found.sort((a, b) => b.width - a.width);
  return {
    scrollWidth: document.documentElement.scrollWidth,
    innerWidth: window.innerWidth,
    offenders: found.slice(0, 8).map(f => f.text),
  };
}"""
# The header's box and its visible children's boxes (the nav, its links, the user menu).
HEADER = """() => {
  const header = document.querySelector('header.topbar');
  if (!header) return {missing: location.href + ': ' + document.body.innerHTML.slice(0, 300)};
  const box = el => {
    const r = el.getBoundingClientRect();
    return {what: el.textContent.trim().slice(0, 40) || el.tagName, left: r.left, right: r.right};
  };
  const visible = el =>
    el.getClientRects().length > 0 && getComputedStyle(el).visibility !== 'hidden';
  const parts = Array.from(header.querySelectorAll('a, button, nav, .who')).filter(visible);
  return {header: box(header), scroll: header.scrollWidth, client: header.clientWidth,
          parts: parts.map(box), vw: document.documentElement.clientWidth};
}"""


def settle(page):
    """Wait until the page's charts are drawn (their size is part of the layout measured)."""
    page.wait_for_load_state("load")
    page.wait_for_function(
        """() => Array.from(document.querySelectorAll('[data-chart]'))
                .every(el => el.dataset.rendered === 'true')""",
        timeout=30000,
    )


def assert_fits(page, label, width):
    """The document does not scroll sideways; if it does, name the widest offenders."""
    seen = page.evaluate(OVERFLOW, width)
    wide = max(seen["scrollWidth"], seen["innerWidth"])
    assert wide <= width + 1, (
        f"{label}: the page is {wide} px wide in a {width} px viewport; "
        f"widest elements outside it:\n  " + "\n  ".join(seen["offenders"])
    )
    assert not seen["offenders"], f"{label}: elements outside the viewport: {seen['offenders']}"


def assert_header_inside(page, label):
    seen = page.evaluate(HEADER)
    assert "missing" not in seen, f"{label}: no header.topbar on {seen.get('missing')}"
    vw = seen["vw"]
    outside = [p for p in [seen["header"], *seen["parts"]] if p["right"] > vw + 1 or p["left"] < -1]
    assert not outside, f"{label}: the header overflows the {vw} px viewport: {outside}"
    assert seen["scroll"] <= seen["client"] + 1, f"{label}: the header's content overflows it"


def check_phone_menu(page, label):
    """The Menu button shows, opens the navigation (links and logout inside the viewport),
    Escape closes it again; the keyboard opens it too."""
    toggle = page.get_by_test_id("nav-toggle")
    nav = page.locator("header nav[aria-label=Main]")
    assert toggle.is_visible(), f"{label}: no Menu button"
    assert not nav.is_visible(), f"{label}: the navigation is not folded"
    assert toggle.get_attribute("aria-expanded") == "false"
    assert toggle.get_attribute("aria-controls") == "topbar-menu"
    toggle.click(timeout=10000)
    page.wait_for_function(
        "() => document.querySelector('[data-testid=nav-toggle]')"
        ".getAttribute('aria-expanded') === 'true'"
    )
    nav.wait_for(state="visible")
    links = nav.locator("a")
    assert links.count() >= 8, f"{label}: the open menu lacks navigation links"
    for i in range(links.count()):
        assert links.nth(i).is_visible(), f"{label}: nav link {i} hidden in the open menu"
    logout = page.locator("header .who button", has_text="Log out")
    assert logout.is_visible(), f"{label}: Log out is not reachable from the open menu"
    assert_header_inside(page, f"{label} (menu open)")
    page.keyboard.press("Escape")
    nav.wait_for(state="hidden")
    assert toggle.get_attribute("aria-expanded") == "false"
    # Keyboard: focus the button, Enter opens, Escape closes and focus stays on the button.
    toggle.focus()
    page.keyboard.press("Enter")
    nav.wait_for(state="visible")
    page.keyboard.press("Escape")
    nav.wait_for(state="hidden")
    assert page.evaluate("() => document.activeElement.dataset.testid") == "nav-toggle"


def check_laptop_nav(page, label, one_line=True):
    """No Menu button; the navigation shows on one line, and with ``one_line`` (a wide
    screen: the bar as it always was) the user menu beside it."""
    toggle = page.get_by_test_id("nav-toggle")
    nav = page.locator("header nav[aria-label=Main]")
    assert not toggle.is_visible(), f"{label}: the Menu button shows"
    assert nav.is_visible(), f"{label}: the navigation is hidden"
    links = nav.locator("a")
    middles = {round(box["y"] + box["height"] / 2) for box in boxes(links)}
    assert len(middles) == 1, f"{label}: the navigation wraps onto {len(middles)} lines"
    logout = page.locator("header .who button", has_text="Log out")
    assert logout.is_visible(), f"{label}: no Log out"
    if one_line:
        who = page.locator("header .who").bounding_box()
        assert abs(who["y"] + who["height"] / 2 - middles.pop()) <= 4, (
            f"{label}: the user menu is not on the navigation's line"
        )


def boxes(locator) -> list[dict]:
    return [locator.nth(i).bounding_box() for i in range(locator.count())]


def start_run(page, panel, ids, label) -> int:
    base = panel.url
    page.goto(f"{base}/benchmarks/new/?profile={ids['profile']}&deployment={ids['deployment']}")
    page.fill("#id_label", label)
    page.get_by_test_id("start-run").click()
    page.wait_for_url(f"{base}/benchmarks/*/")
    run_pk = int(page.url.rstrip("/").rsplit("/", 1)[1])
    try:
        page.wait_for_selector("[data-run-status=succeeded]", timeout=RUN_TIMEOUT_MS)
        page.get_by_test_id("run-results").wait_for(timeout=30000)
    except Exception:
        raise panel.failure(page, f"the run {label} did not succeed") from None
    return run_pk


def test_main_pages_fit_a_phone_and_a_laptop(panel, browser):
    base = panel.url
    laptop = browser.new_context(viewport=LAPTOP).new_page()
    panel.log_in(laptop, "admin")
    panel.wait_for_demo_host(laptop)
    ids = panel.seed(SEED)
    laptop.goto(f"{base}/hosts/{ids['host']}/")
    panel.wait_for_running(laptop)
    first = start_run(laptop, panel, ids, "e2e responsive one")
    second = start_run(laptop, panel, ids, "e2e responsive two")
    change = panel.seed(CHANGE % {"profile": ids["profile"], "run": first})["change"]

    pages = [
        ("dashboard", "/"),
        ("hosts", "/hosts/"),
        ("host", f"/hosts/{ids['host']}/"),
        ("run", f"/benchmarks/{second}/"),
        ("history", "/benchmarks/"),
        ("compare", f"/benchmarks/compare/?runs={first}&runs={second}"),
        ("cost", f"/cost/?runs={first}&runs={second}"),
        ("changes", "/changes/"),
        ("change", f"/changes/{change}/"),
        ("sweeps", "/changes/sweeps/"),
        ("scaling", "/scaling/"),
        ("scaling-deployment", f"/scaling/deployments/{ids['deployment']}/"),
        ("audit", "/audit/"),
        ("profiles", "/benchmarks/profiles/"),
        # Two forms: their fields must fit a phone too.
        ("run-form", f"/benchmarks/new/?profile={ids['profile']}&deployment={ids['deployment']}"),
        ("change-form", f"/changes/new/?deployment={ids['deployment']}"),
    ]
    # Not is_mobile: a mobile browser zooms out to show a page wider than the screen, which
    # widens its layout viewport, and every full-width box would then look guilty; at a fixed
    # 375 px viewport the boxes that stick out are the ones to fix.
    phone = browser.new_context(viewport=PHONE).new_page()
    panel.log_in(phone, "admin")
    # Under the panel's var/ (pytest keeps only the last few temporary directories), or where
    # E2E_SCREENSHOTS says, to keep them (CI artifacts, a before/after look).
    shots = Path(os.environ.get("E2E_SCREENSHOTS") or panel.var_dir / "screenshots")
    errors = []
    for page in (phone, laptop):
        page.on("pageerror", lambda error: errors.append(str(error)))

    failures = []
    for width, page in ((375, phone), (1440, laptop)):
        for name, url in pages:
            label = f"{name} at {width} px ({url})"
            page.goto(base + url)
            settle(page)
            shot = shots / f"{name}-{width}.png"
            page.screenshot(path=str(shot), full_page=True)
            print(f"screenshot: {shot}")
            try:
                assert_fits(page, label, width)
                assert_header_inside(page, label)
                if width == 375:
                    check_phone_menu(page, label)
                else:
                    check_laptop_nav(page, label)
            except AssertionError as failure:
                failures.append(str(failure))
            except Exception as failure:  # a Playwright time-out: what it waited for
                failures.append(f"{label}: {str(failure).splitlines()[0]}")
    # Between the two: a tablet (the menu folded) and a small laptop (the bar wraps).
    for width, height in ((768, 1024), (1024, 768)):
        laptop.set_viewport_size({"width": width, "height": height})
        label = f"dashboard at {width} px"
        laptop.goto(base + "/")
        settle(laptop)
        laptop.screenshot(path=str(shots / f"dashboard-{width}.png"), full_page=True)
        print(f"screenshot: {shots / f'dashboard-{width}.png'}")
        try:
            assert_fits(laptop, label, width)
            assert_header_inside(laptop, label)
            if width < 900:
                check_phone_menu(laptop, label)
            else:
                check_laptop_nav(laptop, label, one_line=False)
        except AssertionError as failure:
            failures.append(str(failure))
    # On the phone the menu's links work: Hosts from the dashboard's open menu.
    phone.goto(base + "/")
    try:
        phone.get_by_test_id("nav-toggle").click(timeout=10000)
        phone.locator("header nav").wait_for(state="visible", timeout=10000)
        phone.screenshot(path=str(shots / "menu-open-375.png"))
        print(f"screenshot: {shots / 'menu-open-375.png'}")
        phone.locator("header nav a", has_text="Hosts").click(timeout=10000)
        phone.wait_for_url(base + "/hosts/")
    except Exception as failure:
        failures.append(f"the Hosts link of the phone's menu: {str(failure).splitlines()[0]}")
    # Every page is checked (and photographed) before failing, so one run lists all to fix.
    assert not failures, "\n\n".join(failures)
    assert not errors, errors
