"""The hosts list with a fleet (issue 22): pages of 50, filters by name, status, GPU model and
labels that page links keep, bad filter values explained and ignored, and the same number of
queries for 5 hosts as for 60."""

from __future__ import annotations

import re
from html import unescape

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from hosts.models import Gpu, Host
from hosts.services.fleet_list import PAGE_SIZE
from tests.factories import make_deployment

pytestmark = [pytest.mark.django_db, pytest.mark.sqlite]

URL = reverse("hosts:list")


def _fleet(n: int, *, start: int = 0, gpus: int = 8, **host) -> list[Host]:
    """``n`` hosts named fleet-<i> with ``gpus`` GPUs each, readings on every GPU."""
    hosts = Host.objects.bulk_create(
        Host(
            name=f"fleet-{i:03d}",
            address="127.0.0.1",
            port=9100,
            labels=host.get("labels", {"zone": "eu" if i % 2 else "us"}),
            status=host.get("status", "online"),
        )
        for i in range(start, start + n)
    )
    Gpu.objects.bulk_create(
        Gpu(
            host=h,
            index=g,
            uuid=f"GPU-{h.name}-{g}",
            name=host.get("gpu", "NVIDIA H100 80GB HBM3"),
            memory_bytes=80 * 2**30,
            last_sample={"utilization_gpu_pct": 42.0, "memory_used_bytes": 2**30, "power_w": 300},
        )
        for h in hosts
        for g in range(gpus)
    )
    return hosts


def _names(response) -> list[str]:
    return re.findall(r'<tr data-host="([^"]+)"', response.content.decode())


def _get(client, **params):
    response = client.get(URL, params)
    assert response.status_code == 200
    return response


def _links(response) -> list[str]:
    pager = response.content.decode().split('data-testid="host-pager"')[1].split("</p>")[0]
    return [unescape(href) for href in re.findall(r'href="([^"]+)"', pager)]


def test_the_list_comes_in_pages_of_50(client, viewer):
    _fleet(60)
    client.force_login(viewer)
    first = _get(client)
    assert _names(first) == [f"fleet-{i:03d}" for i in range(PAGE_SIZE)]
    assert "Showing 1–50 of 60 hosts." in first.content.decode()
    assert "?page=2" in _links(first)
    second = _get(client, page=2)
    assert _names(second) == [f"fleet-{i:03d}" for i in range(50, 60)]
    assert "Showing 51–60 of 60 hosts." in second.content.decode()
    assert "page 2 of 2" in second.content.decode()


@pytest.mark.parametrize("asked, shown", [("99", 2), ("0", 2), ("abc", 1), ("2.5", 1)])
def test_a_page_that_does_not_exist_is_explained_not_an_error(client, viewer, asked, shown):
    _fleet(60)
    client.force_login(viewer)
    response = _get(client, page=asked)
    assert response.context["page"].number == shown
    assert f"There is no page &#x27;{asked}&#x27;; showing page {shown} of 2." in (
        response.content.decode()
    )
    assert len(_names(response)) == (10 if shown == 2 else 50)


def test_rows_keep_what_the_list_showed(client, viewer):
    (host,) = _fleet(1, gpus=2, labels={"zone": "eu", "tier": "gold"})
    make_deployment(host)
    make_deployment(host)
    client.force_login(viewer)
    page = _get(client).content.decode()
    row = page.split('<tr data-host="fleet-000">')[1].split("</tr>")[0]
    assert "0: NVIDIA H100 80GB HBM3" in row and "1: NVIDIA H100 80GB HBM3" in row
    assert row.count("42 %") == 2 and "1.0 / 80 GiB" in row and "300 / " in row
    assert "<td>2</td>" in row  # deployments
    # A label links to the hosts that carry it.
    assert 'href="/hosts/?label=zone=eu"' in row and "tier=gold" in row
    assert "table-scroll" in page and 'class="card" data-testid="host-list"' in page
    # Filtered on its GPUs, the host still counts two deployments (not one per matching GPU).
    filtered = _get(client, gpu="H100", label="tier=gold").content.decode()
    assert "<td>2</td>" in filtered.split('<tr data-host="fleet-000">')[1].split("</tr>")[0]


def test_odd_readings_show_a_dash_and_text_is_escaped(client, viewer):
    """The GPU cells are built in Python (hosts/templatetags/fleet.py): what an agent sends is
    shown as the template showed it, a reading that is not a number is a dash, not a 500."""
    (host,) = _fleet(1, gpus=3)
    odd = [
        {"utilization_gpu_pct": "N/A", "memory_used_bytes": "N/A", "power_w": None},
        {"utilization_gpu_pct": 99.6, "power_w": "412.4", "power_limit_w": None},
        {"utilization_gpu_pct": True, "throttle_reasons": ["idle", "sw_power_cap", "<b>x</b>"]},
    ]
    for gpu, sample in zip(host.gpus.order_by("index"), odd, strict=True):
        gpu.last_sample = sample
        gpu.name = "<script>GPU</script>" if gpu.index == 0 else gpu.name
        gpu.save()
    Gpu.objects.filter(host=host, index=2).update(memory_bytes=40 * 2**30)
    client.force_login(viewer)
    row = _get(client).content.decode().split('<tr data-host="fleet-000">')[1].split("</tr>")[0]
    cells = re.findall(r"<div[^>]*>(.*?)</div>", row)
    names, util, memory, power = cells[0:3], cells[3:6], cells[6:9], cells[9:12]
    assert names[0] == "0: &lt;script&gt;GPU&lt;/script&gt;" and "<script>" not in row
    # An idle clock-down is not a clock event; the rest are listed, escaped.
    assert names[2].endswith('title="clock events">sw_power_cap, &lt;b&gt;x&lt;/b&gt;</span>')
    assert util == ["—", "100 %", "—"]
    assert memory == ["— / 80 GiB", "— / 80 GiB", "— / 40 GiB"]
    assert power == ["—", "412 / — W", "—"]


def test_a_host_without_gpus_keeps_the_columns(client, viewer):
    _fleet(1, gpus=0)
    client.force_login(viewer)
    row = _get(client).content.decode().split('<tr data-host="fleet-000">')[1].split("</tr>")[0]
    assert row.count("<td") == 10 and '<span class="muted">—</span>' in row


@pytest.fixture
def mixed(db):
    _fleet(3, labels={"zone": "eu", "tier": "gold"}, gpu="NVIDIA H100 80GB HBM3")
    _fleet(2, start=3, labels={"zone": "us"}, gpu="NVIDIA A100-SXM4-40GB", status="unreachable")
    _fleet(1, start=5, labels={"contains": "x"}, gpu="NVIDIA L40S", status="auth_failed")
    _fleet(1, start=6, labels={}, gpus=0, status="unknown")


@pytest.mark.parametrize(
    "params, expected",
    [
        ({}, range(7)),
        ({"q": "FLEET-00"}, range(7)),
        ({"q": "-004"}, [4]),
        ({"status": "unreachable"}, [3, 4]),
        ({"status": "trouble"}, [3, 4, 5]),  # every red badge
        ({"status": "unknown"}, [6]),
        ({"gpu": "a100"}, [3, 4]),
        ({"gpu": "NVIDIA"}, range(6)),  # a host with 8 matching GPUs is one row
        ({"label": "zone=eu"}, [0, 1, 2]),
        ({"label": "zone"}, range(5)),
        ({"label": "zone=us, tier"}, []),
        ({"label": "zone, tier=gold"}, [0, 1, 2]),
        ({"label": ["zone", "tier=gold"]}, [0, 1, 2]),  # repeated ?label= (links)
        ({"label": "contains"}, [5]),  # a key that is a lookup name stays a key
        ({"label": "contains=x"}, [5]),
        ({"q": "fleet", "status": "trouble", "gpu": "L40S"}, [5]),
    ],
)
def test_each_filter(client, viewer, mixed, params, expected):
    client.force_login(viewer)
    response = _get(client, **params)
    assert _names(response) == [f"fleet-{i:03d}" for i in expected]
    if params:
        total = len(expected)
        assert "matching the filters (7 in the fleet)" in response.content.decode()
        assert response.context["page"].paginator.count == total


def test_no_match_says_so(client, viewer, mixed):
    client.force_login(viewer)
    page = _get(client, q="nothing-like-this").content.decode()
    assert "No host matches these filters." in page and "No host matching the filters" in page


@pytest.mark.parametrize(
    "params, error, expected",
    [
        ({"status": "bogus"}, "bogus is not a host status; ignored.", range(7)),
        ({"status": "bogus", "label": "zone=eu"}, "not a host status", [0, 1, 2]),
        ({"label": "Not A Key"}, "&#x27;Not A Key&#x27; is not a label", range(7)),
        ({"label": "=x", "gpu": "a100"}, "&#x27;=x&#x27; is not a label", [3, 4]),
        ({"q": "x" * 300}, "at most 100 characters", range(7)),
    ],
)
def test_a_bad_filter_is_explained_and_ignored(client, viewer, mixed, params, error, expected):
    client.force_login(viewer)
    response = _get(client, **params)
    assert error in response.content.decode()
    assert 'data-testid="filter-error"' in response.content.decode()
    assert _names(response) == [f"fleet-{i:03d}" for i in expected]


def test_page_links_keep_the_filters(client, viewer):
    _fleet(120)  # 60 in zone=eu
    client.force_login(viewer)
    first = _get(client, label="zone=eu", gpu="H100")
    assert "Showing 1–50 of 60 hosts matching the filters (120 in the fleet)." in (
        first.content.decode()
    )
    following = [link for link in _links(first) if "page=2" in link]
    assert following and all("label=zone%3Deu" in link and "gpu=H100" in link for link in following)
    second = client.get(URL + following[0])
    assert _names(second) == [f"fleet-{i:03d}" for i in range(101, 120, 2)]
    assert "Showing 51–60 of 60" in second.content.decode()
    # The form shows what is filtered on, so the next search starts from it.
    assert 'value="zone=eu"' in second.content.decode()


def _queries(client, params: dict) -> int:
    client.get(URL, params)
    with CaptureQueriesContext(connection) as queries:
        response = client.get(URL, params)
    assert response.status_code == 200
    return len(queries)


@pytest.mark.parametrize(
    "params", [{}, {"label": "zone=eu", "gpu": "H100", "status": "online", "page": "1"}]
)
def test_the_same_queries_for_5_hosts_as_for_60(client, viewer, params):
    client.force_login(viewer)
    hosts = _fleet(5)
    for host in hosts:
        make_deployment(host)
    few = _queries(client, params)
    for host in _fleet(55, start=5):
        make_deployment(host)
    many = _queries(client, params)
    assert many == few, f"{few} queries for 5 hosts, {many} for 60"
    assert many <= 12
