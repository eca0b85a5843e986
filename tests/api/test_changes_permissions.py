"""Who may do what with the changes API: the change pages' permission_required, role by role
(tests/controlpanel/test_permissions.py has the pages' matrix): a Viewer reads and writes
nothing, Operators propose, comment, apply and roll back, Approvers and Admins review, only
the proposer or an Admin submits and withdraws; no role gets nothing, no token gets a 401."""

from __future__ import annotations

from unittest import mock

import pytest
from rest_framework.test import APIClient

from changes.models import ChangeRequest
from controlpanel.models import AuditEntry
from hosts.models import EngineOperation
from tests.factories import make_config, make_deployment, make_host

# The role matrix: its personas are made once for the module.
pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("shared_personas")]

ALL = {"viewer", "operator", "approver", "admin"}
OPERATORS = {"operator", "approver", "admin"}
ROLES = sorted(ALL | {"nobody"})

# (method, path, roles allowed, status when allowed). The change is pending and proposed by
# someone outside the personas (as in the pages' matrix), so the "who" rules of
# changes.rules decide submit and withdraw (proposer or Admin); an allowed role may still
# meet a 409 from the change's state (apply of a pending change): past the permission.
ENDPOINTS = [
    ("get", "/api/v1/changes/", ALL, {200}),
    ("get", "/api/v1/changes/{change}/", ALL, {200}),
    ("post", "/api/v1/changes/", OPERATORS, {201}),
    ("post", "/api/v1/changes/propose-rollback/", OPERATORS, {201}),
    ("post", "/api/v1/changes/{draft}/submit/", {"admin"}, {200}),
    ("post", "/api/v1/changes/{change}/approve/", {"approver", "admin"}, {200}),
    ("post", "/api/v1/changes/{change}/reject/", {"approver", "admin"}, {200}),
    ("post", "/api/v1/changes/{change}/withdraw/", {"admin"}, {200}),
    ("post", "/api/v1/changes/{change}/comment/", OPERATORS, {200}),
    ("post", "/api/v1/changes/{change}/rebase/", OPERATORS, {409}),
    ("post", "/api/v1/changes/{approved}/apply/", OPERATORS, {200}),
    ("post", "/api/v1/changes/{change}/resume/", OPERATORS, {409}),
    ("post", "/api/v1/changes/{change}/rollback/", OPERATORS, {409}),
]
BODIES = {
    "approve": {"comment": "ok"},
    "reject": {"comment": "no"},
    "comment": {"comment": "a note"},
    "rollback": {"reason": "regression"},
}


@pytest.fixture
def world(django_user_model):
    deployment = make_deployment(make_host(name="gpu-a"), name="chat")
    older = make_config(deployment, {"max_num_seqs": 32})
    deployment.active_config = make_config(deployment, {"max_num_seqs": 64})
    deployment.save()
    # The older version ran until the newer was applied over it: a rollback target.
    EngineOperation.objects.create(
        deployment=deployment,
        kind="apply",
        config=deployment.active_config,
        previous_config=older,
        status="succeeded",
        outcome="ready",
    )
    stranger = django_user_model.objects.create_user("sam-stranger")

    def change(state: str) -> int:
        return ChangeRequest.objects.create(
            deployment=deployment,
            title=f"A {state} change",
            rationale="Queue wait dominates TTFT.",
            state=state,
            proposed_by=stranger,
            base_config=deployment.active_config,
            settings={"max_num_seqs": 128},
        ).pk

    return {
        "change": change("pending"),
        "draft": change("draft"),
        "approved": change("approved"),
        "deployment": deployment.pk,
        "older": older.pk,
    }


def request(api, method, template, world):
    path = template.format(**world)
    if method == "get":
        return api.get(path)
    if template == "/api/v1/changes/":
        data = {
            "deployment": world["deployment"],
            "title": "More sequences",
            "rationale": "Queue wait.",
            "settings": {"max_num_seqs": 96},
        }
    elif template.endswith("/propose-rollback/"):
        data = {"config": world["older"], "rationale": "v1 was faster."}
    else:
        data = BODIES.get(path.rstrip("/").rsplit("/", 1)[-1], {})
    with mock.patch("changes.tasks.apply_change.apply_async"):
        return api.post(path, data, format="json")


def snapshot() -> list:
    return list(ChangeRequest.objects.order_by("pk").values_list("pk", "state"))


@pytest.mark.parametrize("role", ROLES)
@pytest.mark.parametrize("method, template, allowed, ok", ENDPOINTS)
def test_each_role_gets_what_the_pages_give_it(
    personas, token_for, world, role, method, template, allowed, ok
):
    api = token_for(personas[role])
    before, entries = snapshot(), AuditEntry.objects.count()
    answer = request(api, method, template, world)
    if role in allowed:
        assert answer.status_code in ok, answer.json()
    else:
        assert answer.status_code == 403, answer.json()
        assert answer.json()["title"] == "Not allowed"
        assert snapshot() == before and AuditEntry.objects.count() == entries


@pytest.mark.parametrize("method, template, allowed, ok", ENDPOINTS)
def test_no_token_is_a_401(world, method, template, allowed, ok):
    before = snapshot()
    answer = request(APIClient(), method, template, world)
    assert answer.status_code == 401
    assert answer["WWW-Authenticate"].startswith("Bearer")
    assert snapshot() == before


@pytest.mark.parametrize("method", ["put", "patch", "delete"])
def test_methods_the_pages_do_not_have_are_refused(admin, token_for, world, method):
    path = f"/api/v1/changes/{world['change']}/"
    answer = getattr(token_for(admin), method)(path, {}, format="json")
    assert answer.status_code in (403, 405)
    assert ChangeRequest.objects.filter(pk=world["change"], state="pending").exists()


def test_actions_read_with_get_are_refused(admin, token_for, world):
    answer = token_for(admin).get(f"/api/v1/changes/{world['approved']}/apply/")
    assert answer.status_code in (403, 405)
    assert ChangeRequest.objects.get(pk=world["approved"]).state == "approved"
