"""Issue 14 item 3 on the panel's side: a change that turns on a flag that loads code
(``trust_remote_code``: the model repository's Python runs on the GPU server) may be proposed
and approved only by Admins, and the review calls it out first, in red."""

from __future__ import annotations

import pytest
from django.core.exceptions import PermissionDenied
from django.urls import reverse

from changes import rules
from changes.models import ChangeRequest
from changes.services import review
from tests.factories import make_config, make_deployment, make_gpu, make_host

pytestmark = pytest.mark.django_db


@pytest.fixture
def deployment(db):
    host = make_host()
    make_gpu(host)
    deployment = make_deployment(host)
    deployment.active_config = make_config(deployment, {"max_num_seqs": 64})
    deployment.save()
    return deployment


@pytest.fixture
def other_admin(django_user_model):
    from django.contrib.auth.models import Group

    user = django_user_model.objects.create_user(username="ada-admin", password="pw")
    user.groups.add(Group.objects.get(name="Admin"))
    return user


def propose(actor, deployment, **settings):
    return review.propose_change(
        actor,
        deployment,
        title="Custom model code",
        rationale="the model needs its own modelling code",
        settings={"max_num_seqs": 64, **settings},
    )


@pytest.mark.parametrize("persona", ["operator", "approver"])
def test_trust_remote_code_is_refused_to_operators_and_approvers(request, deployment, persona):
    user = request.getfixturevalue(persona)
    with pytest.raises(PermissionDenied, match="only an Admin"):
        propose(user, deployment, trust_remote_code=True)
    assert not ChangeRequest.objects.exists()


def test_the_form_says_why_and_keeps_what_was_typed(client, operator, deployment):
    client.force_login(operator)
    url = reverse("changes:new") + f"?deployment={deployment.pk}"
    response = client.post(
        url,
        {
            "title": "Custom model code",
            "rationale": "needs it",
            "flag_max_num_seqs": "64",
            "flag_trust_remote_code": "true",
            "max_error_rate_increase": "1",
            "max_ttft_p95_regression": "20",
            "max_itl_p95_regression": "20",
            "action": "submit",
        },
    )
    assert response.status_code == 200 and not ChangeRequest.objects.exists()
    page = response.content.decode()
    assert "only an Admin may propose or approve it" in page
    assert 'value="Custom model code"' in page


def test_an_admin_proposes_it_with_a_warning_and_only_an_admin_approves(
    client, admin, other_admin, approver, viewer, deployment
):
    change = propose(admin, deployment, trust_remote_code=True)
    assert change.state == "pending"
    # Called out first in the review, whatever else it warns about.
    assert change.warnings[0]["code"] == "loads_code"
    assert "--trust-remote-code" in change.warnings[0]["message"]

    # An Approver may reject it but not approve it: no button, and the service refuses.
    assert "approve" not in change.allowed_actions(approver)
    assert "reject" in change.allowed_actions(approver)
    with pytest.raises(PermissionDenied, match="only an Admin"):
        review.approve_change(approver, change)
    assert "approve" in change.allowed_actions(other_admin)
    review.approve_change(other_admin, change)
    change.refresh_from_db()
    assert change.state == "approved"

    client.force_login(viewer)
    page = client.get(change.get_absolute_url()).content.decode()
    assert 'data-warning="loads_code" class="danger" role="alert"' in page


def test_turning_code_loading_off_needs_no_admin(operator, admin, deployment):
    deployment.active_config = make_config(
        deployment, {"max_num_seqs": 64, "trust_remote_code": True}
    )
    deployment.save()
    change = propose(operator, deployment)  # trust_remote_code left out: unset
    assert change.diff() == {"trust_remote_code": (True, None)}
    assert not rules.code_loading_flags("vllm", change.diff())
    assert all(w["code"] != "loads_code" for w in change.warnings)


def test_a_rollback_to_a_version_that_loads_code_needs_an_admin(operator, admin, deployment):
    from hosts.models import EngineOperation

    old = make_config(deployment, {"max_num_seqs": 64, "trust_remote_code": True})
    deployment.active_config = make_config(deployment, {"max_num_seqs": 64})
    deployment.save()
    # ``old`` ran until the running version was applied over it: a rollback target.
    EngineOperation.objects.create(
        deployment=deployment,
        kind="apply",
        config=deployment.active_config,
        previous_config=old,
        status="succeeded",
        outcome="ready",
    )
    with pytest.raises(PermissionDenied):
        review.propose_rollback(operator, old, rationale="back")
    assert review.propose_rollback(admin, old, rationale="back").kind == "rollback"
