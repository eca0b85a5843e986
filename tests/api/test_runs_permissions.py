"""Who may do what with the runs API: the pages' permissions, role by role (viewer reads;
operator, approver and admin start and cancel; a user with no role and a caller without a
token get nothing)."""

from __future__ import annotations

import pytest
from rest_framework.test import APIClient

from benchmarks.models import BenchmarkRun
from tests.factories import make_deployment, make_finished_run, make_profile, make_run

# The role matrix: its personas are made once for the module.
pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("shared_personas")]

READ, START, CANCEL = "read", "start", "cancel"
# role → what it may do (benchmarks.view / add / change_benchmarkrun, as the pages ask).
ALLOWED = {
    "viewer": {READ},
    "operator": {READ, START, CANCEL},
    "approver": {READ, START, CANCEL},
    "admin": {READ, START, CANCEL},
    "nobody": set(),
}
# (method, path template, kind, status when allowed)
ENDPOINTS = [
    ("get", "/api/v1/runs/", READ, 200),
    ("get", "/api/v1/runs/{run}/", READ, 200),
    ("get", "/api/v1/runs/{run}/timeline/", READ, 200),
    ("get", "/api/v1/runs/{run}/verdict/?baseline={baseline}", READ, 200),
    ("post", "/api/v1/runs/", START, 201),
    ("post", "/api/v1/runs/{queued}/cancel/", CANCEL, 200),
]


@pytest.fixture
def world():
    deployment, profile = make_deployment(), make_profile()
    baseline = make_finished_run(deployment, load_profile=profile)
    run = make_finished_run(deployment, load_profile=profile)
    queued = make_run(make_deployment(), load_profile=profile)
    return {
        "run": run.pk,
        "baseline": baseline.pk,
        "queued": queued.pk,
        "body": {"deployment": deployment.pk, "profile": profile.pk},
    }


@pytest.mark.parametrize("role", sorted(ALLOWED))
@pytest.mark.parametrize("method, template, kind, ok", ENDPOINTS)
def test_each_role_gets_what_the_pages_give_it(
    personas, token_for, world, role, method, template, kind, ok
):
    api = token_for(personas[role])
    path = template.format(**world)
    body = world["body"] if template == "/api/v1/runs/" and method == "post" else None
    before = BenchmarkRun.objects.count()
    answer = getattr(api, method)(path, body, format="json")
    if kind in ALLOWED[role]:
        assert answer.status_code == ok, answer.json()
    else:
        assert answer.status_code == 403, answer.json()
        assert answer.json()["title"] == "Not allowed"
        assert BenchmarkRun.objects.count() == before
        assert BenchmarkRun.objects.get(pk=world["queued"]).status == "queued"


@pytest.mark.parametrize("method, template, kind, ok", ENDPOINTS)
def test_no_token_is_a_401(world, method, template, kind, ok):
    answer = getattr(APIClient(), method)(template.format(**world), world["body"], format="json")
    assert answer.status_code == 401


@pytest.mark.parametrize("method", ["put", "patch", "delete"])
def test_methods_the_pages_do_not_have_are_refused(admin, token_for, world, method):
    answer = getattr(token_for(admin), method)(f"/api/v1/runs/{world['run']}/", {}, format="json")
    assert answer.status_code in (403, 405)
    assert BenchmarkRun.objects.filter(pk=world["run"]).exists()
