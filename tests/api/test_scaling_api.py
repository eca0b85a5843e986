"""``GET /api/v1/deployments/{id}/scaling/``: the shape, who may read it, unknown ids."""

from __future__ import annotations

import json

import pytest
from django.urls import reverse
from drf_spectacular.generators import SchemaGenerator
from drf_spectacular.renderers import OpenApiJsonRenderer
from openapi_core import OpenAPI
from rest_framework.test import APIClient

from tests.api.test_schema import validate
from tests.factories import make_profile
from tests.scaling.test_state import STAGED, running, sample, staged_run

# The role matrix: its personas are made once for the module.
pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("shared_personas")]
ROLES = ["viewer", "operator", "approver", "admin"]


@pytest.fixture
def busy():
    a = running(name="llama-a")
    b = running(name="llama-b", model=a.model)
    run = staged_run(a, make_profile(name="staged", spec=STAGED))
    sample(a, 10.0, waiting=3.0)
    sample(b, 11.4, waiting=5.0)
    return a, b, run


def url(pk) -> str:
    return f"/api/v1/deployments/{pk}/scaling/"


def test_the_answer_names_the_evidence_the_decision_and_the_exports(busy, token_for, viewer):
    a, b, run = busy
    answer = token_for(viewer).get(url(a.pk))
    assert answer.status_code == 200, answer.content
    data = answer.json()
    assert data["deployment"] == a.pk and data["deployment_name"] == "llama-a"
    assert data["signals"]["requests_waiting"] == 3.0
    assert data["signals"]["ttft"]["1m"]["p95"] == 0.3
    cap = data["capacity"]
    assert cap["status"] == "measured" and cap["rps"] == 9.1
    assert cap["best"]["run_id"] == run.pk and cap["best"]["stage"] == "peak"
    assert cap["best"]["run_url"] == reverse("benchmarks:detail", args=[run.pk])
    assert cap["breach"]["stage"] == "burst"
    assert cap["profile"] == "staged v1" and cap["points"] == 3
    assert data["decision"]["current"] == 2
    assert data["decision"]["desired"] == 3 and data["decision"]["status"] == "under"
    assert "21.4 req/s arriving" in data["decision"]["reason"]
    t = data["thresholds"]
    assert t["requests_per_s"] == pytest.approx(9.1 * 0.8, abs=0.01)
    assert t["requests_waiting"] >= 1 and t["ttft_p95_seconds"] == 0.5
    assert f"run #{run.pk}" in t["evidence"]
    assert data["policy"]["saved"] is False and data["policy"]["slo"]["ttft_p95_ms"] == 500.0
    assert data["engine_start"]["seconds"] == 120.0 and "assumed" in data["engine_start"]["basis"]
    assert sorted(data["group"]["deployments"]) == sorted([a.pk, b.pk])
    links = data["links"]
    assert links["keda"] == f"/scaling/deployments/{a.pk}/export/keda.yaml"
    assert links["alerts"] == f"/scaling/deployments/{a.pk}/export/alerts.yaml"
    assert links["grafana"] == f"/scaling/deployments/{a.pk}/export/grafana.json"
    assert links["page"] == f"/scaling/deployments/{a.pk}/"


def test_a_deployment_without_evidence_or_signals_says_so(token_for, viewer):
    d = running()
    data = token_for(viewer).get(url(d.pk)).json()
    assert data["signals"] is None and data["signals_note"].startswith("no signals yet")
    assert data["capacity"]["status"] == "no_evidence"
    assert data["capacity"]["best"] is None and data["capacity"]["profile_id"] is None
    assert data["decision"]["status"] == "unknown" and data["decision"]["desired"] == 1


def test_unknown_id_is_a_problem_details_404(token_for, viewer):
    answer = token_for(viewer).get(url(999999))
    assert answer.status_code == 404
    assert answer["Content-Type"] == "application/problem+json"


@pytest.mark.parametrize("role", ROLES)
def test_every_role_reads(request, busy, token_for, role):
    assert token_for(request.getfixturevalue(role)).get(url(busy[0].pk)).status_code == 200


def test_no_role_is_403_and_anonymous_is_401(busy, token_for, nobody):
    client = token_for(nobody)
    answer = client.get(url(busy[0].pk))
    assert answer.status_code == 403
    assert answer["Content-Type"] == "application/problem+json"
    assert client.get(url(999999)).status_code == 403  # refused before the lookup
    answer = APIClient().get(url(busy[0].pk))
    assert answer.status_code == 401
    assert answer["WWW-Authenticate"].startswith("Bearer")


@pytest.mark.parametrize("method", ["post", "put", "patch", "delete"])
def test_writes_are_405(busy, token_for, admin, method):
    answer = getattr(token_for(admin), method)(url(busy[0].pk), {}, format="json")
    assert answer.status_code == 405


def test_the_answer_is_what_the_schema_says(busy, token_for, admin):
    schema = SchemaGenerator().get_schema(request=None, public=True)
    document = json.loads(OpenApiJsonRenderer().render(schema))
    assert "/api/v1/deployments/{id}/scaling/" in document["paths"]
    spec = OpenAPI.from_dict(document)
    client = token_for(admin)
    for pk in (busy[0].pk, busy[1].pk, running().pk):
        answer = client.get(url(pk), HTTP_ACCEPT="application/json")
        assert answer.status_code == 200
        validate(spec, "get", url(pk), answer)
