"""The review workflow on the services: propose, the state machine, four eyes, second approval
for production hosts, staleness and rebase, the deployment's lock, maintenance windows, and
the audit trail every step leaves (which is also the change's timeline)."""

from __future__ import annotations

from datetime import timedelta
from unittest import mock

import pytest
from django.core.exceptions import PermissionDenied
from django.utils import timezone

from changes import rules, tasks
from changes.models import ChangeRequest
from changes.services import apply as change_apply
from changes.services import pipeline, review, timeline
from controlpanel.models import AuditEntry, InvalidTransition
from tests.factories import make_config, make_deployment, make_gpu, make_host, make_profile

pytestmark = pytest.mark.django_db


@pytest.fixture
def deployment(db):
    host = make_host()
    make_gpu(host)
    make_gpu(host)
    deployment = make_deployment(host)
    config = make_config(deployment, {"max_num_seqs": 64, "gpu_memory_utilization": 0.9})
    deployment.active_config = config
    deployment.save()
    return deployment


def propose(actor, deployment, settings=None, **kw):
    base = dict(deployment.active_config.settings)
    base.update(settings or {"max_num_seqs": 128})
    kw.setdefault("title", "More sequences")
    kw.setdefault("rationale", "Queue wait dominates TTFT at peak.")
    return review.propose_change(actor, deployment, settings=base, **kw)


def entries(change):
    return list(
        AuditEntry.objects.filter(object_id=str(change.pk), action__startswith="change.")
        .order_by("pk")
        .values_list("action", flat=True)
    )


def test_propose_records_the_diff_against_the_running_config(operator, deployment):
    change = propose(operator, deployment)
    assert change.state == "pending" and change.base_config == deployment.active_config
    assert change.diff() == {"max_num_seqs": (64, 128)}
    assert change.required_approvals == 1
    assert entries(change) == ["change.propose", "change.transition"]
    first = AuditEntry.objects.get(object_id=str(change.pk), action="change.propose")
    assert first.actor == operator and first.after["diff"] == {"max_num_seqs": [64, 128]}


def test_draft_then_submit(operator, deployment):
    change = propose(operator, deployment, submit=False)
    assert change.state == "draft"
    review.submit_change(operator, change)
    change.refresh_from_db()
    assert change.state == "pending" and change.submitted_at is not None


@pytest.mark.parametrize(
    ("values", "words"),
    [
        ({"served_model_name": "x; rm -rf /"}, "--served-model-name"),
        ({"served_model_name": "--api-key=stolen"}, "--served-model-name"),
        ({"max_num_seqs": 0}, "--max-num-seqs"),
        ({"gpu_memory_utilization": 1.5}, "--gpu-memory-utilization"),
        ({"no_such_flag": 1}, "no_such_flag"),
        ({"tensor_parallel_size": 3}, "tensor_parallel_size"),
    ],
)
def test_bad_settings_are_refused_with_the_flag_named(operator, deployment, values, words):
    with pytest.raises(rules.ChangeRefused, match=words.replace("-", r"\-")):
        propose(operator, deployment, values)
    assert not ChangeRequest.objects.exists()


def test_a_flag_the_engine_version_lacks_is_refused(operator, deployment):
    deployment.engine_version = "0.10.0"
    deployment.save()
    with pytest.raises(rules.ChangeRefused, match="added in 0.10.1"):
        propose(operator, deployment, {"enable_log_requests": True})


def test_nothing_to_change_is_refused(operator, deployment):
    with pytest.raises(rules.ChangeRefused, match="Nothing differs"):
        propose(operator, deployment, {"max_num_seqs": 64})


def test_proposer_cannot_approve_their_own_change(approver, deployment):
    change = propose(approver, deployment)
    with pytest.raises(PermissionDenied, match="four-eyes"):
        review.approve_change(approver, change)
    change.refresh_from_db()
    assert change.state == "pending" and not change.approvals.exists()


def test_an_operator_cannot_approve(operator, deployment, django_user_model):
    other = django_user_model.objects.create_user("other-operator")
    other.groups.add(*operator.groups.all())
    change = propose(other, deployment)
    with pytest.raises(PermissionDenied, match="Approvers"):
        review.approve_change(operator, change)


def test_approve_and_reject(operator, approver, deployment):
    change = propose(operator, deployment)
    review.approve_change(approver, change, "looks right")
    change.refresh_from_db()
    assert change.state == "approved" and change.decided_at is not None
    assert change.approvals_count() == 1

    second = propose(operator, deployment, {"max_num_seqs": 32}, title="Fewer")
    with pytest.raises(rules.ChangeRefused, match="Say why"):
        review.reject_change(approver, second, " ")
    review.reject_change(approver, second, "measure first")
    second.refresh_from_db()
    assert second.state == "rejected"
    assert entries(second)[-2:] == ["change.reject", "change.transition"]


def test_production_hosts_need_two_approvals(operator, approver, admin, deployment, settings):
    deployment.host.labels = {"env": "production"}
    deployment.host.save()
    change = propose(operator, deployment)
    assert change.required_approvals == settings.CHANGE_PRODUCTION_APPROVALS == 2
    review.approve_change(approver, change)
    change.refresh_from_db()
    assert change.state == "pending" and change.approvals_count() == 1
    with pytest.raises(rules.ChangeRefused, match="already reviewed"):
        review.approve_change(approver, change)
    review.approve_change(admin, change)
    change.refresh_from_db()
    assert change.state == "approved"


def test_a_host_labelled_production_after_the_proposal_needs_two_approvals(
    operator, approver, admin, deployment
):
    # Approved with one; then an Admin labels the host production: applying is refused, the
    # change goes back to review, and a second approval lets it through (issue 38).
    change = propose(operator, deployment)
    assert change.required_approvals == 1
    review.approve_change(approver, change)
    change.refresh_from_db()
    assert change.state == "approved"
    deployment.host.labels = {"env": "production"}
    deployment.host.save()
    with mock.patch("changes.tasks.apply_change.apply_async") as task:
        with pytest.raises(
            rules.ChangeRefused, match="labelled production now: the change needs 2"
        ):
            change_apply.apply_change(operator, change)
    task.assert_not_called()
    change.refresh_from_db()
    assert change.state == "pending" and change.required_approvals == 2
    assert "change.approvals_required" in entries(change)
    review.approve_change(admin, change)
    change.refresh_from_db()
    assert change.state == "approved"

    # Labelled before the first approval: that approval alone does not approve it.
    other = propose(operator, deployment, settings={"max_num_seqs": 96})
    deployment.host.labels = {}
    deployment.host.save()
    other.required_approvals = 1
    other.save(update_fields=["required_approvals"])
    deployment.host.labels = {"env": "production"}
    deployment.host.save()
    review.approve_change(approver, other)
    other.refresh_from_db()
    assert other.state == "pending" and other.required_approvals == 2


def test_withdraw_only_by_proposer_or_admin(operator, approver, admin, deployment):
    change = propose(operator, deployment)
    with pytest.raises(PermissionDenied):
        review.withdraw_change(approver, change)
    review.withdraw_change(operator, change, "not needed")
    change.refresh_from_db()
    assert change.state == "withdrawn" and change.finished_at is not None
    with pytest.raises(rules.ChangeRefused, match="cannot become"):
        review.withdraw_change(admin, change)


@pytest.mark.parametrize(
    ("state", "target"),
    [
        ("draft", "approved"),
        ("draft", "applying"),
        ("pending", "applying"),
        ("pending", "applied"),
        ("approved", "applied"),
        ("rejected", "approved"),
        ("applied", "rolled_back"),
        ("withdrawn", "pending"),
        ("verifying", "applying"),
        ("failed", "applying"),
    ],
)
def test_illegal_transitions_are_refused(operator, deployment, state, target):
    change = propose(operator, deployment)
    ChangeRequest.objects.filter(pk=change.pk).update(state=state)
    change.refresh_from_db()
    with pytest.raises(InvalidTransition, match="cannot become"):
        change.transition_to(target)
    change.refresh_from_db()
    assert change.state == state


def test_apply_refuses_what_is_not_approved(operator, deployment):
    change = propose(operator, deployment)
    with pytest.raises(rules.ChangeRefused, match="only approved"):
        change_apply.apply_change(operator, change)


def approved(operator, approver, deployment, **kw):
    change = propose(operator, deployment, **kw)
    review.approve_change(approver, change)
    change.refresh_from_db()
    return change


def test_apply_starts_the_pipeline_once_committed(
    operator, approver, deployment, django_capture_on_commit_callbacks
):
    change = approved(operator, approver, deployment)
    with mock.patch("changes.tasks.apply_change.apply_async") as task:
        with django_capture_on_commit_callbacks(execute=True):
            change_apply.apply_change(operator, change)
    change.refresh_from_db()
    assert change.state == "applying" and change.applied_by == operator
    (args,), kwargs = task.call_args
    assert args == (change.pk,) and kwargs["time_limit"] > kwargs["soft_time_limit"] > 0


def test_one_change_per_deployment_holds_the_lock(operator, approver, deployment):
    first = approved(operator, approver, deployment)
    second = approved(operator, approver, deployment, settings={"max_num_seqs": 96})
    with mock.patch("changes.tasks.apply_change.apply_async"):
        change_apply.apply_change(operator, first)
        with pytest.raises(rules.ChangeRefused, match=f"locked by change #{first.pk}"):
            change_apply.apply_change(operator, second)
    second.refresh_from_db()
    assert second.state == "approved"
    assert change_apply.lock_holder(deployment) == first


def test_the_database_refuses_a_second_lock_holder(operator, approver, deployment):
    from django.db import IntegrityError, transaction

    first = approved(operator, approver, deployment)
    second = approved(operator, approver, deployment, settings={"max_num_seqs": 96})
    ChangeRequest.objects.filter(pk=first.pk).update(state="applying")
    with pytest.raises(IntegrityError), transaction.atomic():
        ChangeRequest.objects.filter(pk=second.pk).update(state="verifying")


def test_apply_waits_for_the_maintenance_window(operator, approver, deployment):
    start = timezone.now() + timedelta(hours=2)
    change = approved(operator, approver, deployment, window=(start, start + timedelta(hours=1)))
    with pytest.raises(rules.ChangeRefused, match="maintenance window"):
        change_apply.apply_change(operator, change)
    with pytest.raises(rules.ChangeRefused, match="end after it starts"):
        propose(operator, deployment, {"max_num_seqs": 8}, window=(start, start))


def test_a_stale_change_must_be_rebased_and_reviewed_again(operator, approver, admin, deployment):
    change = approved(operator, approver, deployment)
    # Someone else's change lands first: the running config moves to v2.
    newer = make_config(deployment, {"max_num_seqs": 64, "gpu_memory_utilization": 0.85})
    deployment.active_config = newer
    deployment.save()
    change.refresh_from_db()
    assert change.is_stale()
    with pytest.raises(rules.ChangeRefused, match=r"v1 → v2\): rebase"):
        change_apply.apply_change(operator, change)

    review.rebase_change(operator, change)
    change.refresh_from_db()
    assert change.state == "pending" and change.base_config == newer
    # The diff is now against v2: memory 0.85 → 0.9 reappears as a change.
    assert change.diff() == {"gpu_memory_utilization": (0.85, 0.9), "max_num_seqs": (64, 128)}
    assert change.approvals_count() == 0, "the approval was for the old base"
    assert any(w["code"] == "several_settings" for w in change.warnings)
    review.approve_change(admin, change)
    change.refresh_from_db()
    assert change.state == "approved"
    assert entries(change).count("change.rebase") == 1


def test_approving_a_stale_pending_change_is_refused(operator, approver, deployment):
    change = propose(operator, deployment)
    deployment.active_config = make_config(deployment, {"max_num_seqs": 80})
    deployment.save()
    with pytest.raises(rules.ChangeRefused, match="rebase"):
        review.approve_change(approver, change)


def test_rollback_proposal_targets_an_earlier_version(operator, deployment):
    from hosts.models import EngineOperation

    v1 = deployment.active_config
    v2 = make_config(deployment, {"max_num_seqs": 200})
    # v1 ran until v2 was applied over it: a version that ran healthy, so a rollback target.
    EngineOperation.objects.create(
        deployment=deployment,
        kind="apply",
        config=v2,
        previous_config=v1,
        status="succeeded",
        outcome="ready",
    )
    deployment.active_config = v2
    deployment.save()
    change = review.propose_rollback(operator, v1, rationale="v2 raised p95 TTFT")
    assert change.kind == "rollback" and change.target_config == v1
    assert change.title == "Roll back to v1" and change.state == "pending"
    assert change.diff() == {"gpu_memory_utilization": (None, 0.9), "max_num_seqs": (200, 64)}
    with pytest.raises(rules.ChangeRefused, match="already runs"):
        review.propose_rollback(operator, v2, rationale="x")


def test_comments_go_on_the_timeline(operator, approver, deployment):
    change = propose(operator, deployment)
    review.comment_on_change(approver, change, "What about ITL?")
    with pytest.raises(rules.ChangeRefused):
        review.comment_on_change(approver, change, "   ")
    items = timeline.timeline(change)
    assert [i["action"] for i in items] == ["propose", "transition", "comment"]
    assert items[-1]["message"] == "What about ITL?" and items[-1]["who"] == approver.username


def test_every_transition_is_audited_with_before_and_after(operator, approver, deployment):
    change = approved(operator, approver, deployment)
    transitions = AuditEntry.objects.filter(
        object_id=str(change.pk), action="change.transition"
    ).order_by("pk")
    assert [(e.before["state"], e.after["state"]) for e in transitions] == [
        ("draft", "pending"),
        ("pending", "approved"),
    ]
    assert [e.actor for e in transitions] == [operator, approver]
    with pytest.raises(ValueError, match="append-only"):
        transitions[0].save()


def test_resume_refuses_a_live_pipeline(operator, approver, deployment):
    change = approved(operator, approver, deployment)
    ChangeRequest.objects.filter(pk=change.pk).update(
        state="applying", pipeline_owner="w1", pipeline_heartbeat_at=timezone.now()
    )
    change.refresh_from_db()
    with pytest.raises(rules.ChangeRefused, match="alive"):
        change_apply.resume_change(operator, change)
    ChangeRequest.objects.filter(pk=change.pk).update(
        pipeline_heartbeat_at=timezone.now() - timedelta(minutes=5)
    )
    change.refresh_from_db()
    with mock.patch("changes.tasks.apply_change.apply_async"):
        change_apply.resume_change(operator, change)
    assert entries(change)[-1] == "change.resume"


def test_claim_takes_over_only_a_silent_pipeline(operator, approver, deployment):
    change = approved(operator, approver, deployment)
    ChangeRequest.objects.filter(pk=change.pk).update(
        state="applying", pipeline_owner="w1", pipeline_heartbeat_at=timezone.now()
    )
    assert pipeline.claim(change.pk, "w2", wait_s=0) is None
    assert pipeline.claim(change.pk, "w1", wait_s=0) is not None
    ChangeRequest.objects.filter(pk=change.pk).update(
        pipeline_heartbeat_at=timezone.now() - timedelta(minutes=5)
    )
    assert pipeline.claim(change.pk, "w2", wait_s=0).pipeline_owner == "w2"


def test_prediction_for_the_chosen_profile(operator, deployment):
    deployment.runner = "simulator"
    deployment.simulator = {"gpu": "h100-sxm"}
    deployment.save()
    profile = make_profile()
    change = propose(operator, deployment, {"max_num_seqs": 1}, verify_profile=profile)
    stage = change.prediction["stages"][0]
    ttft = next(m for m in stage["metrics"] if m["label"] == "TTFT p95")
    assert ttft["after"] > ttft["before"] and ttft["verdict"] == "worse"


def test_beat_resumes_pipelines_that_stopped_stamping(
    operator, approver, deployment, django_capture_on_commit_callbacks
):
    lost = approved(operator, approver, deployment)
    alive = approved(operator, approver, deployment, settings={"max_num_seqs": 96})
    queued = approved(operator, approver, deployment, settings={"max_num_seqs": 32})
    long_ago = timezone.now() - timedelta(minutes=10)
    ChangeRequest.objects.filter(pk=lost.pk).update(
        state="applying", pipeline_owner="gone", pipeline_heartbeat_at=long_ago
    )
    # Another deployment's change, alive; and one whose task has not started yet.
    other = make_deployment(deployment.host)
    other.active_config = make_config(other, {"max_num_seqs": 64})
    other.save()
    ChangeRequest.objects.filter(pk=alive.pk).update(
        deployment=other, state="verifying", pipeline_heartbeat_at=timezone.now()
    )
    third = make_deployment(deployment.host)
    ChangeRequest.objects.filter(pk=queued.pk).update(deployment=third, state="applying")
    with mock.patch("changes.tasks.apply_change.apply_async") as task:
        with django_capture_on_commit_callbacks(execute=True):
            resumed = change_apply.resume_lost_pipelines()
    assert [c.pk for c in resumed] == [lost.pk]
    assert task.call_args.args[0] == (lost.pk,)
    # Beat reaches it through the task the schedule names (it once named a function that
    # had moved, and every sweep raised AttributeError).
    ChangeRequest.objects.filter(pk=lost.pk).update(pipeline_heartbeat_at=long_ago)
    with mock.patch("changes.tasks.apply_change.apply_async") as task:
        with django_capture_on_commit_callbacks(execute=True):
            assert tasks.resume_lost_pipelines() == 1
    assert task.call_args.args[0] == (lost.pk,)


def test_a_broken_pipeline_closes_what_it_left_running(operator, approver, deployment):
    from hosts.models import EngineOperation
    from tests.factories import make_run

    change = approved(operator, approver, deployment)
    operation = EngineOperation.objects.create(
        deployment=deployment, kind="apply", config=deployment.active_config, status="running"
    )
    run = make_run(deployment, status="running")
    ChangeRequest.objects.filter(pk=change.pk).update(
        state="verifying", stage="verify", operation=operation, verification_run=run
    )
    # No agent listens on the host's port: the engine's state is reported unknown.
    pipeline.abandon(change.pk, "the apply pipeline ran out of time")
    change.refresh_from_db()
    operation.refresh_from_db()
    run.refresh_from_db()
    assert change.state == "failed" and change.pipeline_owner == ""
    assert "ran out of time; the engine was found unknown" in change.outcome
    assert operation.status == "failed" and "pipeline stopped" in operation.error
    assert run.status == "failed" and "pipeline stopped" in run.error
    assert change_apply.lock_holder(deployment) is None
