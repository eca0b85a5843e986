"""The dashboard with a fleet (issue 22): counts and totals by the database, the chart and the
lists capped with a link on to the full list, the same queries for 5 hosts as for 60."""

from __future__ import annotations

from decimal import Decimal

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from home.attention import SHOWN
from home.views import CHART_HOSTS, DEPLOYMENTS_SHOWN
from hosts.models import Deployment, Gpu, Host

pytestmark = [pytest.mark.django_db, pytest.mark.sqlite]


def _fleet(n: int, *, start: int = 0, gpus: int = 8, status: str = "online") -> list[Host]:
    """``n`` hosts with ``gpus`` 80 GiB GPUs each; host i uses i GiB on each GPU; every host
    runs one deployment."""
    hosts = Host.objects.bulk_create(
        Host(
            name=f"fleet-{i:03d}",
            address="127.0.0.1",
            port=9100,
            status=status,
            hourly_price=Decimal("2.50"),
            last_error="connection refused" if status != "online" else "",
        )
        for i in range(start, start + n)
    )
    Gpu.objects.bulk_create(
        Gpu(
            host=h,
            index=g,
            uuid=f"GPU-{h.name}-{g}",
            name="NVIDIA H100 80GB HBM3",
            memory_bytes=80 * 2**30,
            last_sample={"memory_used_bytes": (start + i) * 2**30},
        )
        for i, h in enumerate(hosts)
        for g in range(gpus)
    )
    Deployment.objects.bulk_create(
        Deployment(
            host=h,
            name="engine",
            engine="vllm",
            engine_version="0.11.0",
            model="m",
            port=8000,
            status="failed" if h.name == "fleet-007" else "running",
        )
        for h in hosts
    )
    return hosts


def _queries(client) -> int:
    client.get(reverse("dashboard"))
    with CaptureQueriesContext(connection) as queries:
        response = client.get(reverse("dashboard"))
    assert response.status_code == 200
    return len(queries)


def test_the_dashboard_costs_the_same_queries_for_5_hosts_as_for_60(client, approver):
    client.force_login(approver)
    _fleet(4)
    _fleet(1, start=4, status="unreachable")
    few = _queries(client)
    _fleet(40, start=5)
    _fleet(15, start=45, status="unreachable")
    many = _queries(client)
    assert many == few, f"{few} queries for 5 hosts, {many} for 60"


def test_totals_come_from_the_whole_fleet(client, viewer):
    _fleet(60)
    _fleet(3, start=60, gpus=0)
    client.force_login(viewer)
    response = client.get(reverse("dashboard"))
    assert response.context["host_count"] == 63
    assert response.context["gpu_count"] == 480
    assert response.context["fleet_hourly"] == Decimal("157.5")
    assert response.context["deployment_count"] == 63
    page = response.content.decode()
    assert '<span class="value" data-testid="host-count">63</span>' in page
    assert '<span class="value">63</span><span class="label">deployments</span>' in page


def test_the_chart_shows_the_hosts_with_the_most_memory_in_use(client, viewer):
    _fleet(60)
    client.force_login(viewer)
    response = client.get(reverse("dashboard"))
    used, free = response.context["chart"]["data"]
    busiest = [f"fleet-{i:03d}" for i in range(59, 59 - CHART_HOSTS, -1)]
    assert used["x"] == busiest and free["x"] == busiest
    assert used["y"][0] == 59 * 8 and free["y"][0] == (80 - 59) * 8
    page = response.content.decode()
    assert f"the {CHART_HOSTS} with the most in use of 60" in page


def test_a_small_fleet_is_charted_whole_without_a_cap_note(client, viewer):
    _fleet(3)
    client.force_login(viewer)
    response = client.get(reverse("dashboard"))
    assert len(response.context["chart"]["data"][0]["x"]) == 3
    page = response.content.decode()
    assert 'data-testid="chart-capped"' not in page
    assert 'data-testid="deployments-capped"' not in page


def test_deployments_are_capped_the_failed_first(client, viewer):
    _fleet(30)
    client.force_login(viewer)
    response = client.get(reverse("dashboard"))
    shown = list(response.context["deployments"]())  # built when the shared card is
    assert len(shown) == DEPLOYMENTS_SHOWN
    assert shown[0].host.name == "fleet-007" and shown[0].status == "failed"
    page = response.content.decode()
    assert f"{DEPLOYMENTS_SHOWN} of 30, the ones to look at first" in page


def test_troubled_hosts_are_capped_with_a_link_to_all_of_them(client, viewer):
    _fleet(5)
    _fleet(SHOWN + 7, start=5, status="unreachable")
    client.force_login(viewer)
    response = client.get(reverse("dashboard"))
    attention = response.context["attention"]
    assert len(attention.hosts) == SHOWN and attention.hosts_more == 7
    page = response.content.decode()
    assert page.count('data-testid="attention-host"') == SHOWN
    assert '<a href="/hosts/?status=trouble">… and 7 more hosts in trouble: see all</a>' in page
    # The link lists exactly those hosts.
    listed = client.get("/hosts/?status=trouble")
    assert listed.context["page"].paginator.count == SHOWN + 7


def test_no_more_link_when_every_troubled_host_is_shown(client, viewer):
    _fleet(SHOWN, status="unreachable")
    client.force_login(viewer)
    response = client.get(reverse("dashboard"))
    assert response.context["attention"].hosts_more == 0
    assert 'data-testid="attention-hosts-more"' not in response.content.decode()
