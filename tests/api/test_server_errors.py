"""An unexpected exception anywhere in the API is a problem-details 500 (never Django's HTML
page): no traceback, no message of the exception (it may hold a secret), a reference that
the log gives with the traceback. One forced failure per view family of ``api/views`` (the
real one: ``?refresh=1`` on a deployment whose advisor pass raised), and one outside DRF's
handling (a middleware)."""

from __future__ import annotations

import logging
import pkgutil

import pytest

import api.views
from tests.factories import make_deployment

pytestmark = pytest.mark.django_db

SECRET = "hunter2-token-abc"


def boom(*args, **kwargs):
    raise TypeError(f"float() argument must be … not 'list' ({SECRET})")


# family → (path, what it calls that is made to raise); {d} is a deployment's id.
FAMILIES = {
    "account": ("/api/v1/me/", "api.views.account.role_names"),
    "advisor": (
        "/api/v1/deployments/{d}/diagnosis/?refresh=1",
        "changes.services.diagnosis.gather",
    ),
    "fleet": ("/api/v1/hosts/", "api.views.fleet._label_filter"),
    "runs": ("/api/v1/runs/", "api.views.runs.RunViewSet._filtered"),
    "changes": ("/api/v1/changes/", "api.views.changes.ChangeFilterForm.filter"),
    "quality": ("/api/v1/quality-probes/", "api.views.quality._ids"),
    "scaling": ("/api/v1/deployments/{d}/scaling/", "api.views.scaling.scaling_state"),
    "sweeps": ("/api/v1/sweeps/", "api.views.sweeps.SweepViewSet.paginate_queryset"),
}


def test_every_view_family_is_covered():
    modules = {m.name for m in pkgutil.iter_modules(api.views.__path__)}
    assert modules == set(FAMILIES)


def assert_problem_500(answer):
    assert answer.status_code == 500
    assert answer["Content-Type"] == "application/problem+json"
    body = answer.content.decode()
    assert "<html" not in body.lower() and "Traceback" not in body and SECRET not in body
    problem = answer.json()
    assert problem["status"] == 500 and problem["type"] == "/api/v1/problems/server-error"
    assert problem["reference"] in problem["detail"]
    return problem


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_an_exception_in_a_view_is_a_problem_500(family, admin, token_for, monkeypatch, caplog):
    path, target = FAMILIES[family]
    monkeypatch.setattr(target, boom)
    api = token_for(admin)
    with caplog.at_level(logging.ERROR, logger="api.errors"):
        answer = api.get(path.format(d=make_deployment().pk))
    problem = assert_problem_500(answer)
    logged = [r for r in caplog.records if problem["reference"] in r.getMessage()]
    assert logged and logged[0].exc_info and logged[0].exc_info[0] is TypeError


def test_an_exception_outside_the_view_is_a_problem_500_too(admin, token_for, monkeypatch):
    monkeypatch.setattr("api.metrics_middleware.view_label", boom)
    api = token_for(admin)
    api.raise_request_exception = False
    assert_problem_500(api.get("/api/v1/me/"))


def test_a_page_outside_the_api_keeps_its_html_500(admin, client, monkeypatch):
    monkeypatch.setattr("api.metrics_middleware.view_label", boom)
    client.force_login(admin)
    client.raise_request_exception = False
    answer = client.get("/hosts/")
    assert answer.status_code == 500 and answer["Content-Type"].startswith("text/html")
