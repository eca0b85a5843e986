"""``changes.rules``: one definition of who may do what with a change, read by the page's buttons
and by the services; explicit permissions (apply, override), not Django's change/delete."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import Permission
from django.core.exceptions import PermissionDenied

from changes import rules
from changes.models import ChangeRequest
from changes.services import apply as change_apply
from changes.services import review
from tests.factories import make_config, make_deployment, make_host

pytestmark = pytest.mark.django_db


@pytest.fixture
def deployment(db):
    deployment = make_deployment(make_host())
    deployment.active_config = make_config(deployment, {"max_num_seqs": 64})
    deployment.save()
    return deployment


def propose(actor, deployment, **kw):
    return review.propose_change(
        actor,
        deployment,
        title="More sequences",
        rationale="queue wait",
        settings={"max_num_seqs": 128},
        **kw,
    )


def user_with(django_user_model, name, *codenames):
    user = django_user_model.objects.create_user(name, password="x")
    user.user_permissions.set(
        Permission.objects.filter(content_type__app_label="changes", codename__in=codenames)
    )
    return django_user_model.objects.get(pk=user.pk)  # a fresh permission cache


def test_roles_hold_the_explicit_permissions(operator, approver, admin, viewer):
    assert operator.has_perm(rules.APPLY) and not operator.has_perm(rules.OVERRIDE)
    assert approver.has_perm(rules.APPLY) and approver.has_perm(rules.APPROVE)
    assert admin.has_perm(rules.OVERRIDE)
    assert not viewer.has_perm(rules.APPLY) and not viewer.has_perm(rules.PROPOSE)


def test_the_old_stand_in_permissions_no_longer_grant_apply_or_override(
    django_user_model, operator, approver, deployment
):
    change = propose(operator, deployment)
    review.approve_change(approver, change)
    change = ChangeRequest.objects.get(pk=change.pk)
    stand_in = user_with(
        django_user_model, "changer", "change_changerequest", "delete_changerequest"
    )
    assert "apply" not in change.allowed_actions(stand_in)
    with pytest.raises(PermissionDenied, match="apply changes"):
        change_apply.apply_change(stand_in, change)
    with pytest.raises(PermissionDenied, match="Only the proposer"):
        review.withdraw_change(stand_in, change)

    overrider = user_with(django_user_model, "overrider", "override_changerequest")
    review.withdraw_change(overrider, change, "superseded")
    change.refresh_from_db()
    assert change.state == "withdrawn"


def test_who_fails_before_when_and_each_with_its_own_error(operator, approver, admin, deployment):
    draft = propose(approver, deployment, submit=False)
    with pytest.raises(PermissionDenied, match="four-eyes"):
        rules.require("approve", approver, draft)  # the proposer, whatever the state
    with pytest.raises(PermissionDenied, match="Only Approvers"):
        rules.require("approve", operator, draft)
    with pytest.raises(rules.ChangeRefused, match="only changes pending review"):
        rules.require("approve", admin, draft)


def test_the_panel_itself_is_held_to_the_state_only(operator, deployment):
    draft = propose(operator, deployment, submit=False)
    with pytest.raises(rules.ChangeRefused, match="nothing to resume"):
        rules.require("resume", None, draft)


def test_the_buttons_are_exactly_the_actions_the_rules_allow(
    operator, approver, admin, viewer, deployment
):
    pending = propose(operator, deployment)
    for user in (operator, approver, admin, viewer):
        buttons = pending.allowed_actions(user)
        for action in rules.RULES:
            try:
                rules.require(action, user, pending)
            except (PermissionDenied, rules.ChangeRefused):
                assert action not in buttons, (user, action)
            else:
                assert action in buttons, (user, action)
    assert pending.allowed_actions(approver) >= {"approve", "reject", "comment"}
    assert pending.allowed_actions(operator) >= {"withdraw", "comment"}
    assert pending.allowed_actions(viewer) == set()
