"""The change page puts predicted harm where a reviewer reads first (issue 21): a predicted
regression past ``advice.PREDICTED_HARM`` is a warning with its stage and numbers, and a config
the simulator predicts would not start blocks approval unless an Admin overrides it with a
written, audited reason (one rule, ``rules.start_problem``, for the buttons and the service)."""

from __future__ import annotations

import pytest
from django.contrib.messages import get_messages
from django.core.exceptions import PermissionDenied
from django.urls import reverse

from changes import advice, rules
from changes.models import ChangeRequest
from changes.rules import ChangeRefused
from changes.services import review, timeline
from controlpanel.models import AuditEntry
from tests.factories import make_config, make_deployment, make_gpu, make_host, make_profile

pytestmark = pytest.mark.django_db

PROFILE = {
    "stages": [
        {"name": "steady", "concurrency": 2, "num_requests": 32},
        {"name": "peak", "concurrency": 16, "num_requests": 64},
    ],
    "input_len": {"kind": "fixed", "mean": 256},
    "output_len": {"kind": "fixed", "mean": 64},
}


@pytest.fixture
def deployment(db):
    deployment = make_deployment(make_host(name="gpu-a"), name="chat")
    make_gpu(deployment.host)
    deployment.active_config = make_config(
        deployment, {"max_num_seqs": 64, "gpu_memory_utilization": 0.9}
    )
    deployment.save()
    return deployment


def propose(actor, deployment, **settings):
    proposed = {**deployment.active_config.settings, **settings}
    return review.propose_change(
        actor,
        deployment,
        title="Try it",
        rationale="measured",
        settings=proposed,
        verify_profile=make_profile("chat", spec=PROFILE),
    )


def fresh(change) -> ChangeRequest:
    return ChangeRequest.objects.get(pk=change.pk)


# --- predicted harm is a warning ---------------------------------------------------------------
def test_a_predicted_regression_is_a_warning_with_its_stage_and_numbers(operator, deployment):
    change = propose(operator, deployment, max_num_seqs=2)  # queues at peak: TTFT explodes
    harm = [w for w in change.warnings if w["code"] == "predicted_regression"]
    ttft = next(w["message"] for w in harm if "TTFT p95" in w["message"])
    assert "peak +" in ttft and " ms → " in ttft and "Warned at +20 %" in ttft
    # The stage table's number is the warning's number.
    peak = next(s for s in change.prediction["stages"] if s["stage"] == "peak")
    metric = next(m for m in peak["metrics"] if m["key"] == "ttft_p95_ms")
    assert f"peak {metric['change'] * 100:+.0f} %" in ttft


def test_the_warnings_sit_above_the_actions_and_name_the_harm(client, operator, deployment):
    change = propose(operator, deployment, max_num_seqs=2)
    client.force_login(operator)
    html = client.get(change.get_absolute_url()).content.decode()
    assert 'data-warning="predicted_regression"' in html and "Predicted harm:" in html
    assert "No warnings" not in html
    assert html.index('data-testid="warnings"') < html.index('data-testid="actions"')
    assert html.index('data-testid="warnings"') < html.index('data-testid="prediction"')


def test_an_older_change_without_stored_harm_warnings_still_shows_them(
    client, operator, deployment
):
    change = propose(operator, deployment, max_num_seqs=2)
    ChangeRequest.objects.filter(pk=change.pk).update(warnings=[])  # proposed before the rule
    client.force_login(operator)
    html = client.get(change.get_absolute_url()).content.decode()
    assert html.count('data-warning="predicted_regression"') >= 1


def test_small_predicted_changes_are_no_warning():
    prediction = {
        "available": True,
        "stages": [
            {
                "stage": "main",
                "after_error": None,
                "metrics": [
                    {
                        "key": "ttft_p95_ms",
                        "label": "TTFT p95",
                        "unit": "ms",
                        "change": 0.19,
                        "before": 100.0,
                        "after": 119.0,
                    },
                    {
                        "key": "output_throughput",
                        "label": "Output tok/s",
                        "unit": "tok/s",
                        "change": -0.09,
                        "before": 1000,
                        "after": 910,
                    },
                    {
                        "key": "ttft_p50_ms",
                        "label": "TTFT p50",
                        "unit": "ms",
                        "change": 3.0,
                        "before": 10.0,
                        "after": 40.0,
                    },
                ],
            }
        ],
    }
    assert advice.prediction_warnings(prediction) == []
    prediction["stages"][0]["metrics"][1]["change"] = -0.10
    (warning,) = advice.prediction_warnings(prediction)
    assert warning.code == "predicted_regression"
    assert "main -10 % (1,000 tok/s → 910 tok/s)" in warning.message


# --- "would not start" blocks approval ---------------------------------------------------------
@pytest.fixture
def doomed(operator, deployment):
    """A change whose config the simulator says the engine refuses (no memory for KV cache)."""
    change = propose(operator, deployment, gpu_memory_utilization=0.12)
    assert advice.start_failures(change.prediction), change.prediction
    assert change.warnings[0]["code"] == "would_not_start"
    return change


def test_the_service_refuses_to_approve_a_change_predicted_not_to_start(doomed, approver, admin):
    for reviewer in (approver, admin):
        with pytest.raises(ChangeRefused, match="refuse to start"):
            review.approve_change(reviewer, fresh(doomed))
    assert fresh(doomed).state == "pending" and not doomed.approvals.exists()
    assert "approve" not in rules.allowed_actions(admin, fresh(doomed))


def test_the_approve_button_is_replaced_by_an_explanation(client, doomed, approver):
    client.force_login(approver)
    html = client.get(doomed.get_absolute_url()).content.decode()
    assert 'data-testid="approve-change"' not in html
    assert 'data-testid="approval-blocked"' in html and "Only an Admin can override" in html
    assert 'data-testid="override-approve"' not in html
    assert 'data-testid="reject-change"' in html  # rejecting it stays possible
    response = client.post(reverse("changes:approve", args=[doomed.pk]), {"comment": ""})
    assert response.status_code == 302 and fresh(doomed).state == "pending"
    assert "refuse to start" in str(list(get_messages(response.wsgi_request))[0])


def test_an_admin_sees_the_override_form(client, doomed, admin):
    client.force_login(admin)
    html = client.get(doomed.get_absolute_url()).content.decode()
    assert 'data-testid="override-approve"' in html and 'data-testid="override-reason"' in html
    assert reverse("changes:approve_override", args=[doomed.pk]) in html
    assert 'data-testid="approve-change"' not in html


def test_a_non_admin_cannot_override(client, doomed, approver):
    client.force_login(approver)
    url = reverse("changes:approve_override", args=[doomed.pk])
    assert client.post(url, {"comment": "I know better"}).status_code == 403
    with pytest.raises(PermissionDenied):
        review.override_start_and_approve(approver, fresh(doomed), "I know better")
    assert fresh(doomed).state == "pending"


def test_the_override_needs_a_reason(client, doomed, admin):
    client.force_login(admin)
    url = reverse("changes:approve_override", args=[doomed.pk])
    response = client.post(url, {"comment": "   "})
    assert response.status_code == 302 and fresh(doomed).state == "pending"
    assert "Say why" in str(list(get_messages(response.wsgi_request))[0])


def test_an_admin_override_approves_and_is_audited(client, doomed, admin):
    client.force_login(admin)
    url = reverse("changes:approve_override", args=[doomed.pk])
    reason = "This engine build frees the sampler's memory; measured on the canary."
    response = client.post(url, {"comment": reason})
    assert response.status_code == 302
    change = fresh(doomed)
    assert change.state == "approved"
    entry = AuditEntry.objects.get(action="change.start_override")
    assert entry.actor_id == admin.pk and entry.after["text"] == reason
    assert "refuse to start" in entry.after["problem"]
    items = timeline.timeline(change)
    override = next(i for i in items if i["action"] == "start_override")
    assert override["message"] == reason
    assert change.approvals.get().comment == reason


def test_the_admin_who_proposed_it_cannot_override_their_own(admin, deployment):
    change = propose(admin, deployment, gpu_memory_utilization=0.12)
    with pytest.raises(PermissionDenied, match="four-eyes"):
        review.override_start_and_approve(admin, change, "trust me")


def test_an_override_is_refused_where_nothing_is_predicted_to_fail(operator, admin, deployment):
    change = propose(operator, deployment, max_num_seqs=128)
    with pytest.raises(ChangeRefused, match="approve it plainly"):
        review.override_start_and_approve(admin, change, "why not")
