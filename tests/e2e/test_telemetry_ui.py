"""The host page's telemetry in a real browser: clocks, throttle-reason and PCIe charts beside
utilisation, range buttons that fetch the range from the server, drag-to-zoom across every
chart (with finer data fetched for the window) and Reset zoom."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.e2e

ROOT = "[data-telemetry]"
# The x-axis window of a chart in seconds (plotly keeps date ranges as UTC strings).
SPAN = """el => {
    const ms = v => typeof v === "number" ? v : Date.parse(String(v).replace(" ", "T") + "Z");
    const r = el._fullLayout.xaxis.range;
    return (ms(r[1]) - ms(r[0])) / 1000;
}"""


def test_telemetry_charts_ranges_and_zoom(panel, browser):
    page = browser.new_page()
    failures = []
    page.on("pageerror", lambda error: failures.append(str(error)))
    panel.log_in(page, "viewer")
    panel.wait_for_demo_host(page)
    page.click("text=sim-h100-01")
    page.wait_for_selector("[data-live-connected=true]", timeout=20000)

    # The new charts are drawn, titled with their units, the throttle reasons named in words.
    for testid, title in (
        ("gpu-clocks-0", "clocks (MHz)"),
        ("gpu-throttle-0", "throttle"),
        ("gpu-pcie-0", "PCIe (MB/s)"),
    ):
        chart = page.get_by_test_id(testid)
        chart.locator(".main-svg").first.wait_for(timeout=20000)
        assert title in chart.inner_text(), chart.inner_text()
    legend = page.get_by_test_id("gpu-throttle-0").inner_text()
    assert "SW power cap" in legend and "HW thermal slowdown" in legend, legend
    assert "SM clock MHz" in page.get_by_test_id("gpu-clocks-0").inner_text()
    assert "TX MB/s" in page.get_by_test_id("gpu-pcie-0").inner_text()
    assert "live" in page.get_by_test_id("telemetry-status").inner_text()
    # No throttle reason is active on the demo's GPUs, so every reason's line starts hidden:
    # the time axis still shows the last minutes, not plotly's empty default (the year 2000).
    throttle = page.get_by_test_id("gpu-throttle-0").element_handle()
    page.wait_for_function(
        """el => { const r = el._fullLayout.xaxis.range;
            const ms = v => typeof v === "number" ? v
                : Date.parse(String(v).replace(" ", "T") + "Z");
            return Math.abs(ms(r[1]) - Date.now()) < 15 * 60 * 1000; }""",
        arg=throttle,
        timeout=20000,
    )
    assert page.get_by_test_id("reset-zoom").is_hidden()

    # A range button asks the server for that range and says where the data comes from.
    with page.expect_request(lambda r: "/telemetry/?range=24h" in r.url, timeout=20000):
        page.get_by_test_id("range-24h").click()
    page.wait_for_selector(f"{ROOT}[data-range='24h'][data-source=minute]:not([data-loading])")
    assert "minute aggregates" in page.get_by_test_id("telemetry-status").inner_text()
    assert page.get_by_test_id("range-24h").get_attribute("aria-pressed") == "true"

    # A month comes from the hourly aggregates (none yet on a fleet started a minute ago).
    with page.expect_request(lambda r: "/telemetry/?range=30d" in r.url, timeout=20000):
        page.get_by_test_id("range-30d").click()
    page.wait_for_selector(f"{ROOT}[data-range='30d'][data-source=hour]:not([data-loading])")
    status = page.get_by_test_id("telemetry-status").inner_text()
    assert "last 30 days" in status and "hourly aggregates" in status, status

    with page.expect_request(lambda r: "/telemetry/?range=1h" in r.url, timeout=20000):
        page.get_by_test_id("range-1h").click()
    page.wait_for_selector(f"{ROOT}[data-range='1h'][data-source=raw]:not([data-loading])")
    pcie = page.get_by_test_id("gpu-pcie-0")
    page.wait_for_function(f"el => Math.abs(({SPAN})(el) - 3600) < 5", arg=pcie.element_handle())

    # Drag across the middle half of the utilisation chart: every chart shows that window,
    # and the window's finer samples are fetched.
    drag = page.get_by_test_id("gpu-chart-0").locator(".nsewdrag").first
    drag.scroll_into_view_if_needed()
    box = drag.bounding_box()
    y = box["y"] + box["height"] / 2
    with page.expect_request(lambda r: "/telemetry/?start=" in r.url, timeout=20000):
        page.mouse.move(box["x"] + box["width"] * 0.25, y)
        page.mouse.down()
        page.mouse.move(box["x"] + box["width"] * 0.5, y, steps=5)
        page.mouse.move(box["x"] + box["width"] * 0.75, y, steps=5)
        page.mouse.up()
    page.wait_for_selector(f"{ROOT}[data-zoom]:not([data-loading])")
    for testid in ("gpu-pcie-0", "gpu-clocks-0", "gpu-throttle-0"):
        handle = page.get_by_test_id(testid).element_handle()
        page.wait_for_function(f"el => ({SPAN})(el) < 2400 && ({SPAN})(el) > 1200", arg=handle)
    assert page.locator(ROOT).get_attribute("data-bucket") == "3"
    assert "Zoomed" in page.get_by_test_id("telemetry-status").inner_text()
    assert page.get_by_test_id("reset-zoom").is_visible()

    # Reset zoom: back to the hour.
    page.get_by_test_id("reset-zoom").click()
    page.wait_for_selector(f"{ROOT}:not([data-zoom]):not([data-loading])[data-range='1h']")
    page.wait_for_function(f"el => Math.abs(({SPAN})(el) - 3600) < 60", arg=pcie.element_handle())
    assert page.get_by_test_id("reset-zoom").is_hidden()
    assert not failures, failures
