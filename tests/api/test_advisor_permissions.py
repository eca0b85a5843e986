"""Who may use the advisor's API: whoever reads deployments reads findings and diagnoses
(viewer up); dismissing is an operator's (changes.add_changerequest); a user with no role
gets 403 and a caller without a token 401."""

from __future__ import annotations

import pytest
from rest_framework.test import APIClient

from changes.advisor.findings import WARNING
from changes.models import Finding
from tests.factories import make_deployment

# The role matrix: its personas are made once for the module.
pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("shared_personas")]

READ, DISMISS = "read", "dismiss"
ALLOWED = {
    "viewer": {READ},
    "operator": {READ, DISMISS},
    "approver": {READ, DISMISS},
    "admin": {READ, DISMISS},
    "nobody": set(),
}
ENDPOINTS = [
    ("get", "/api/v1/findings/", READ, 200),
    ("get", "/api/v1/deployments/{deployment}/diagnosis/", READ, 200),
    ("post", "/api/v1/findings/{finding}/dismiss/", DISMISS, 200),
]


@pytest.fixture
def world():
    deployment = make_deployment()
    finding = Finding.objects.create(
        deployment=deployment, rule="queue-bound", severity=WARNING, title="t", seen="s", why="w"
    )
    return {"deployment": deployment.pk, "finding": finding.pk}


@pytest.mark.parametrize("role", sorted(ALLOWED))
@pytest.mark.parametrize("method, template, kind, ok", ENDPOINTS)
def test_each_role_gets_what_the_pages_give_it(
    personas, token_for, world, role, method, template, kind, ok
):
    api = token_for(personas[role])
    body = {"reason": "Known."} if method == "post" else None
    answer = getattr(api, method)(template.format(**world), body, format="json")
    if kind in ALLOWED[role]:
        assert answer.status_code == ok, answer.json()
    else:
        assert answer.status_code == 403, answer.json()
        assert answer.json()["title"] == "Not allowed"
        assert Finding.objects.get(pk=world["finding"]).dismissed_at is None


@pytest.mark.parametrize("method, template, kind, ok", ENDPOINTS)
def test_no_token_is_a_401(world, method, template, kind, ok):
    body = {"reason": "x"} if method == "post" else None
    answer = getattr(APIClient(), method)(template.format(**world), body, format="json")
    assert answer.status_code == 401
    assert Finding.objects.get(pk=world["finding"]).dismissed_at is None


@pytest.mark.parametrize("method", ["put", "patch", "delete"])
def test_methods_the_pages_do_not_have_are_refused(admin, token_for, world, method):
    answer = getattr(token_for(admin), method)(
        f"/api/v1/findings/{world['finding']}/", {}, format="json"
    )
    assert answer.status_code in (403, 404, 405)
    assert Finding.objects.filter(pk=world["finding"]).exists()
