"""The changes list and the navigation's review count cost the same queries for N and 3N
changes (issue 21: the changes page took 1.27 s with both cores busy)."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from changes.models import ChangeRequest
from tests.factories import make_config, make_deployment, make_host

pytestmark = pytest.mark.django_db

STATES = ["draft", "pending", "approved", "rejected", "applied", "failed"]


def _changes(n: int, by, deployment=None) -> None:
    deployment = deployment or make_deployment(make_host())
    if deployment.active_config is None:
        deployment.active_config = make_config(deployment, {"max_num_seqs": 64})
        deployment.save()
    for i in range(n):
        ChangeRequest.objects.create(
            deployment=deployment,
            title=f"change {i}",
            rationale="Queue wait dominates TTFT.",
            state=STATES[i % len(STATES)],
            proposed_by=by,
            base_config=deployment.active_config,
            settings={"max_num_seqs": 128 + i},
            prediction={"before": {}, "after": {}},
            comparison={"ttft_p95_ms": {"before": 300, "after": 280}},
        )


def _queries(client, url) -> tuple[int, object]:
    client.get(url)
    with CaptureQueriesContext(connection) as queries:
        response = client.get(url)
    assert response.status_code == 200
    return len(queries), response


def test_the_list_costs_the_same_queries_for_3n_changes(client, approver, operator):
    client.force_login(approver)
    _changes(6, operator)
    few, response = _queries(client, reverse("changes:list"))
    assert len(response.context["page"]) == 6
    _changes(18, operator)
    many, response = _queries(client, reverse("changes:list"))
    assert len(response.context["page"]) == 24
    assert many == few, f"{few} queries for 6 changes, {many} for 24"
    html = response.content.decode()
    # What the table shows of each row came with the page's query, not one query per row.
    assert "change 17" in html and operator.username in html


def test_the_review_count_costs_the_same_queries_for_3n_pending_changes(client, approver, operator):
    client.force_login(approver)
    _changes(6, operator)
    few, response = _queries(client, reverse("dashboard"))
    assert len(response.context["attention"].changes) == 1
    _changes(18, operator)
    many, response = _queries(client, reverse("dashboard"))
    assert len(response.context["attention"].changes) == 4
    assert many == few, f"{few} queries for 6 changes, {many} for 24"
    nav = {item["label"]: item for item in response.context["nav"]}
    assert int(nav["Changes"]["waiting"]) == 4


def test_ones_own_pending_changes_are_never_counted(client, approver, operator):
    _changes(6, approver)
    _changes(6, operator)
    client.force_login(approver)
    response = client.get(reverse("dashboard"))
    assert [c.proposed_by_id for c in response.context["attention"].changes] == [operator.pk]
