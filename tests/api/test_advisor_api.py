"""The advisor's API: a deployment's diagnosis (active findings worst first, when evaluated,
the engine's scrape status; ``?refresh=1`` evaluates now), the fleet's findings with their
filters, and dismissing one (a reason required, audited, 409 when it has cleared)."""

from __future__ import annotations

import pytest

from changes.advisor import engine
from changes.advisor import rules as _registered  # noqa: F401 - registered before the patch
from changes.advisor.findings import CRITICAL, INFO, WARNING
from changes.advisor.findings import Finding as Found
from changes.models import Finding
from controlpanel.models import AuditEntry
from tests.factories import make_deployment, make_host

pytestmark = pytest.mark.django_db

FIELDS = {
    "id", "deployment", "deployment_name", "host_name", "rule", "severity", "state", "title",
    "seen", "why", "evidence", "suggestion", "source", "first_seen_at", "last_seen_at",
    "cleared_at", "dismissed_at", "dismissed_by", "dismiss_reason",
}  # fmt: skip


def finding(deployment, rule, severity=WARNING, **kw) -> Finding:
    return Finding.objects.create(
        deployment=deployment,
        rule=rule,
        severity=severity,
        title=f"{rule} title",
        seen="numbers",
        why="because",
        evidence={"n": 1},
        suggestion={"settings": {"max_num_seqs": 64}, "action": ""},
        source="live",
        **kw,
    )


@pytest.fixture
def fleet():
    a = make_deployment(make_host(name="gpu-a"), name="llama")
    b = make_deployment(make_host(name="gpu-b"), name="qwen")
    from django.utils import timezone

    return {
        "a": a,
        "b": b,
        "info": finding(a, "warmup", INFO),
        "critical": finding(b, "kv-bound", CRITICAL),
        "warning": finding(a, "queue-bound", WARNING),
        "dismissed": finding(b, "tp-small", WARNING, dismissed_at=timezone.now()),
        "cleared": finding(a, "old", CRITICAL, cleared_at=timezone.now()),
    }


def test_the_fleet_list_is_worst_first_with_one_shape(fleet, viewer, token_for):
    answer = token_for(viewer).get("/api/v1/findings/")
    assert answer.status_code == 200
    rows = answer.json()["results"]
    assert [r["rule"] for r in rows] == ["kv-bound", "queue-bound", "warmup"]
    assert set(rows[0]) == FIELDS
    assert rows[0]["host_name"] == "gpu-b" and rows[0]["state"] == "active"
    assert rows[0]["suggestion"] == {"settings": {"max_num_seqs": 64}, "action": ""}


@pytest.mark.parametrize(
    "query, rules",
    [
        ("severity=critical", ["kv-bound"]),
        ("rule=warmup", ["warmup"]),
        ("include=dismissed", ["kv-bound", "tp-small", "queue-bound", "warmup"]),
        ("include=cleared", ["old", "kv-bound", "queue-bound", "warmup"]),
        ("include=dismissed,cleared&severity=critical", ["old", "kv-bound"]),
    ],
)
def test_the_fleet_list_filters(fleet, viewer, token_for, query, rules):
    answer = token_for(viewer).get(f"/api/v1/findings/?{query}")
    assert answer.status_code == 200, answer.json()
    assert [r["rule"] for r in answer.json()["results"]] == rules


def test_the_deployment_filter(fleet, viewer, token_for):
    answer = token_for(viewer).get(f"/api/v1/findings/?deployment={fleet['a'].pk}")
    assert [r["rule"] for r in answer.json()["results"]] == ["queue-bound", "warmup"]


@pytest.mark.parametrize(
    "query, field",
    [("severity=bad", "severity"), ("include=all", "include"), ("deployment=x", "deployment"),
     ("colour=red", "colour")],
)  # fmt: skip
def test_bad_filters_are_400s_naming_the_field(fleet, viewer, token_for, query, field):
    answer = token_for(viewer).get(f"/api/v1/findings/?{query}")
    assert answer.status_code == 400
    assert field in answer.json()["errors"]


def test_a_deployments_diagnosis(fleet, viewer, token_for):
    api = token_for(viewer)
    answer = api.get(f"/api/v1/deployments/{fleet['a'].pk}/diagnosis/")
    assert answer.status_code == 200
    data = answer.json()
    assert data["deployment"] == fleet["a"].pk
    assert data["evaluated_at"] is None and data["engine_status"] == "unknown"
    assert [f["rule"] for f in data["findings"]] == ["queue-bound", "warmup"]
    assert set(data["findings"][0]) == FIELDS
    assert api.get("/api/v1/deployments/999999/diagnosis/").status_code == 404


def test_refresh_evaluates_now(fleet, viewer, token_for, monkeypatch, settings):
    settings.ADVISOR_SCRAPE_SECONDS = 0
    seen = Found("queue-bound", CRITICAL, "Queue", "12 waiting", "why", {"waiting": 12}, "live")
    monkeypatch.setattr(engine, "RULES", {"stub": lambda snapshot: [seen]})
    answer = token_for(viewer).get(f"/api/v1/deployments/{fleet['a'].pk}/diagnosis/?refresh=1")
    data = answer.json()
    assert data["evaluated_at"] is not None
    assert data["engine_status"] == "unavailable" and "/metrics" in data["engine_error"]
    # queue-bound refreshed (now critical, no suggestion), warmup cleared.
    assert [(f["rule"], f["severity"]) for f in data["findings"]] == [("queue-bound", CRITICAL)]
    assert data["findings"][0]["suggestion"] is None
    assert Finding.objects.get(pk=fleet["info"].pk).state == "cleared"


def test_dismissing(fleet, operator, token_for):
    api = token_for(operator)
    pk = fleet["warning"].pk
    missing = api.post(f"/api/v1/findings/{pk}/dismiss/", {}, format="json")
    assert missing.status_code == 400 and "reason" in missing.json()["errors"]
    extra = api.post(f"/api/v1/findings/{pk}/dismiss/", {"reason": "x", "why": 1}, format="json")
    assert extra.status_code == 400 and "why" in extra.json()["errors"]
    answer = api.post(f"/api/v1/findings/{pk}/dismiss/", {"reason": "Known."}, format="json")
    assert answer.status_code == 200
    data = answer.json()
    assert data["state"] == "dismissed" and data["dismissed_by"] == operator.username
    assert data["dismiss_reason"] == "Known."
    entry = AuditEntry.objects.get(action="finding.dismiss")
    assert entry.via == "token ci" and entry.actor == operator
    again = api.post(f"/api/v1/findings/{pk}/dismiss/", {"reason": "Again."}, format="json")
    assert again.status_code == 409
    cleared = api.post(
        f"/api/v1/findings/{fleet['cleared'].pk}/dismiss/", {"reason": "x"}, format="json"
    )
    assert cleared.status_code == 409
    assert (
        api.post("/api/v1/findings/999999/dismiss/", {"reason": "x"}, format="json").status_code
        == 404
    )


def test_a_proposal_through_the_api_carries_its_finding(operator, token_for):
    from tests.factories import make_config

    deployment = make_deployment(make_host(name="gpu-c"), name="chat")
    deployment.active_config = make_config(deployment, {"max_num_seqs": 32})
    deployment.save()
    found = finding(deployment, "queue-bound")
    other = finding(make_deployment(make_host(name="gpu-d"), name="x"), "queue-bound")
    api = token_for(operator)
    body = {
        "deployment": deployment.pk,
        "title": "More sequences",
        "rationale": "Queue-bound at peak.",
        "settings": {"max_num_seqs": 64},
    }
    refused = api.post("/api/v1/changes/", {**body, "finding": other.pk}, format="json")
    assert refused.status_code == 400 and "finding" in refused.json()["errors"]
    made = api.post("/api/v1/changes/", {**body, "finding": found.pk}, format="json")
    assert made.status_code == 201, made.content
    assert made.json()["finding"] == {
        "id": found.pk,
        "rule": "queue-bound",
        "title": "queue-bound title",
        "severity": "warning",
    }
