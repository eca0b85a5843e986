"""``/metrics``: the deployments' scaling families (signals, capacity, desired replicas)."""

from __future__ import annotations

import ipaddress
from unittest import mock

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext

from scaling.planning.series import SERIES
from tests.api.test_metrics import families, value
from tests.factories import make_profile
from tests.scaling.test_state import STAGED, running, sample, staged_run

pytestmark = pytest.mark.django_db


@pytest.fixture
def scrape(token_for, viewer):
    client = token_for(viewer, "prometheus")
    return lambda: families(client.get("/metrics"))


@pytest.fixture
def busy():
    """Two running replicas of one model, benchmarked, both under load now."""
    a = running(name="llama-a")
    b = running(name="llama-b", model=a.model)
    staged_run(a, make_profile(spec=STAGED))
    sample(a, 10.0, waiting=3.0, p95=0.41)
    sample(b, 11.4, waiting=5.0, p95=0.62)
    return a, b


def test_every_series_of_the_registry_is_a_family(busy, scrape):
    fams = scrape()
    for series in SERIES:
        assert series.name in fams, series.name


def test_signals_capacity_and_desired_replicas_per_deployment(busy, scrape):
    a, b = busy
    fams = scrape()
    labels = {"deployment": "llama-a", "model": a.model, "host": a.host.name}
    assert value(fams, "llmpanel_deployment_requests_waiting", **labels) == 3.0
    assert value(fams, "llmpanel_deployment_requests_running", **labels) == 10.0
    assert value(fams, "llmpanel_deployment_arrival_requests_per_second", **labels) == 10.0
    assert value(fams, "llmpanel_deployment_ttft_p95_seconds", window="1m", **labels) == 0.41
    assert value(fams, "llmpanel_deployment_ttft_p95_seconds", window="5m", **labels) == 0.41
    assert value(fams, "llmpanel_deployment_capacity_rps_at_slo", **labels) == 9.1
    assert value(fams, "llmpanel_deployment_slo_ttft_p95_seconds", **labels) == 0.5
    assert value(fams, "llmpanel_deployment_replicas", **labels) == 2.0
    # 21.4 req/s over 9.1 × 80 % per replica, and b's p95 is over the SLO: 3 replicas.
    assert value(fams, "llmpanel_deployment_desired_replicas", **labels) == 3.0
    assert 0 <= value(fams, "llmpanel_deployment_signals_age_seconds", **labels) < 15
    other = {"deployment": "llama-b", "model": b.model, "host": b.host.name}
    assert value(fams, "llmpanel_deployment_requests_waiting", **other) == 5.0
    assert value(fams, "llmpanel_deployment_ttft_p95_seconds", window="1m", **other) == 0.62


def test_absent_values_are_left_out_never_zero(busy, scrape):
    a, b = busy
    fams = scrape()
    other = {"deployment": "llama-b"}
    # b has no benchmark of its own: no capacity, so no desired replicas either.
    assert value(fams, "llmpanel_deployment_capacity_rps_at_slo", **other) is None
    assert value(fams, "llmpanel_deployment_desired_replicas", **other) is None
    # Signals the engine did not give (no ITL window, no pending tokens) are not written.
    assert value(fams, "llmpanel_deployment_itl_p95_seconds", **other) is None
    assert value(fams, "llmpanel_deployment_pending_prompt_tokens", **other) is None
    # A deployment with neither signals nor capacity is not exported at all.
    quiet = running(name="quiet")
    fams = scrape()
    for family in fams.values():
        assert all(s.labels.get("deployment") != quiet.name for s in family.samples)


def test_stale_signals_are_not_exported_but_their_age_is(scrape):
    d = running(name="stale")
    sample(d, 10.0, ago=60.0, waiting=7.0)
    fams = scrape()
    assert value(fams, "llmpanel_deployment_requests_waiting", deployment="stale") is None
    assert value(fams, "llmpanel_deployment_signals_age_seconds", deployment="stale") >= 60


def test_a_broken_scaling_state_leaves_the_rest_of_the_scrape(busy, scrape):
    with mock.patch("api.metrics_scaling.fleet_states", side_effect=RuntimeError("boom")):
        fams = scrape()
    assert "llmpanel_runs_active" in fams
    assert "llmpanel_deployment_requests_waiting" not in fams


def test_a_token_or_an_allowed_address_is_still_required(busy, settings):
    assert Client().get("/metrics").status_code == 401
    settings.METRICS_ALLOWED_ADDRESSES = [ipaddress.ip_network("10.0.0.0/8")]
    assert Client(REMOTE_ADDR="192.168.1.5").get("/metrics").status_code == 401
    fams = families(Client(REMOTE_ADDR="10.1.2.3").get("/metrics"))
    assert value(fams, "llmpanel_deployment_requests_waiting", deployment="llama-a") == 3.0


def test_the_scaling_families_cost_the_same_queries_for_a_bigger_fleet(token_for, viewer):
    client = token_for(viewer, "prometheus")
    profile = make_profile(spec=STAGED)

    def queries() -> int:
        client.get("/metrics")
        with CaptureQueriesContext(connection) as ctx:
            families(client.get("/metrics"))
        return len(ctx.captured_queries)

    d = running()
    staged_run(d, profile)
    sample(d, 5.0)
    few = queries()
    for _ in range(4):
        d = running()
        staged_run(d, profile)
        sample(d, 5.0)
    assert queries() == few
