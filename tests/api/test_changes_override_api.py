"""The API's counterpart of the change page's override: an Admin approves a change the simulator
predicts would not start, with a written reason; anyone else, or no reason, is refused and the
change stays pending."""

from __future__ import annotations

import pytest
from django.urls import reverse

from changes import advice
from changes.models import ChangeRequest
from changes.services import review
from controlpanel.models import AuditEntry
from tests.factories import make_config, make_deployment, make_gpu, make_host, make_profile

pytestmark = pytest.mark.django_db

PROFILE = {
    "stages": [{"name": "steady", "concurrency": 2, "num_requests": 32}],
    "input_len": {"kind": "fixed", "mean": 256},
    "output_len": {"kind": "fixed", "mean": 64},
}


@pytest.fixture
def doomed(operator):
    deployment = make_deployment(make_host(name="gpu-a"), name="chat")
    make_gpu(deployment.host)
    deployment.active_config = make_config(
        deployment, {"max_num_seqs": 64, "gpu_memory_utilization": 0.9}
    )
    deployment.save()
    change = review.propose_change(
        operator,
        deployment,
        title="Less memory",
        rationale="free memory for a sidecar",
        settings={"max_num_seqs": 64, "gpu_memory_utilization": 0.12},
        verify_profile=make_profile("chat", spec=PROFILE),
    )
    assert advice.start_failures(change.prediction), change.prediction
    return change


def url(change, verb):
    return reverse(f"api:change-{verb}", args=[change.pk])


def state(change):
    return ChangeRequest.objects.get(pk=change.pk).state


def test_a_plain_api_approve_is_refused_with_the_rules_words(token_for, doomed, admin):
    response = token_for(admin).post(url(doomed, "approve"), {}, format="json")
    assert response.status_code == 409
    assert "refuse to start" in response.json()["detail"]
    assert state(doomed) == "pending"


def test_an_admin_overrides_with_a_reason(token_for, doomed, admin):
    reason = "This engine build frees the sampler's memory; measured on the canary."
    response = token_for(admin).post(
        url(doomed, "approve-override"), {"reason": reason}, format="json"
    )
    assert response.status_code == 200, response.content
    assert response.json()["state"] == "approved"
    entry = AuditEntry.objects.get(action="change.start_override")
    assert entry.actor_id == admin.pk and entry.after["text"] == reason


def test_the_override_needs_a_reason(token_for, doomed, admin):
    response = token_for(admin).post(url(doomed, "approve-override"), {}, format="json")
    assert response.status_code == 400
    assert "reason" in str(response.json())
    assert state(doomed) == "pending"


def test_an_approver_who_is_not_an_admin_may_not_override(token_for, doomed, approver):
    response = token_for(approver).post(
        url(doomed, "approve-override"), {"reason": "I know better"}, format="json"
    )
    assert response.status_code == 403
    assert state(doomed) == "pending"


def test_an_override_where_nothing_is_predicted_to_fail_is_a_conflict(token_for, operator, admin):
    deployment = make_deployment(make_host(name="gpu-b"), name="chat")
    make_gpu(deployment.host)
    deployment.active_config = make_config(deployment, {"max_num_seqs": 64})
    deployment.save()
    change = review.propose_change(
        operator,
        deployment,
        title="More seqs",
        rationale="queueing",
        settings={"max_num_seqs": 128},
        verify_profile=make_profile("chat", spec=PROFILE),
    )
    response = token_for(admin).post(
        url(change, "approve-override"), {"reason": "why not"}, format="json"
    )
    assert response.status_code == 409 and "approve it plainly" in response.json()["detail"]
