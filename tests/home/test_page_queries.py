"""The dashboard costs the same queries for N and 3N runs, checks and pending changes (issue
21): its short lists leave the runs' JSON and the hosts' credentials in the database, and
what they show must not come back as one query per row."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from hosts.models import HostCheck
from tests.factories import make_deployment, make_finished_run, make_host

pytestmark = pytest.mark.django_db


def _history(n: int) -> None:
    for _ in range(n):
        host = make_host()
        HostCheck.objects.create(host=host)
        make_finished_run(make_deployment(host), summary={"p95_ttft_ms": 300.0}, failed=3)


def _queries(client) -> tuple[int, str]:
    client.get(reverse("dashboard"))
    with CaptureQueriesContext(connection) as queries:
        response = client.get(reverse("dashboard"))
    assert response.status_code == 200
    return len(queries), response.content.decode()


def test_the_dashboard_costs_the_same_queries_for_3n_rows(client, approver):
    client.force_login(approver)
    _history(2)
    few, _ = _queries(client)
    _history(6)
    many, html = _queries(client)
    assert many == few, f"{few} queries for 2 runs and checks, {many} for 8"
    # The lists show what they showed before: the runs' deployments and badges.
    assert "Succeeded with errors" in html
