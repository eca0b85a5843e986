"""The changes API: propose through the page's form and service, read a change as its page
shows it, and act on it with the page's buttons and rules (four eyes, states, the lock), with
every write audited "via token NAME"."""

from __future__ import annotations

from unittest import mock

import pytest
from rest_framework.test import APIClient

from changes.choices import Stage, StageStatus
from changes.models import Approval, ChangeRequest
from changes.services import review, timeline
from controlpanel.models import AuditEntry
from hosts.models import EngineOperation
from tests.factories import make_config, make_deployment, make_host, make_profile

pytestmark = pytest.mark.django_db

RUNNING = {"max_num_seqs": 64, "gpu_memory_utilization": 0.9}
LIST = "/api/v1/changes/"


def url(change, verb: str = "") -> str:
    pk = change if isinstance(change, int) else change.pk
    return f"{LIST}{pk}/" + (f"{verb}/" if verb else "")


@pytest.fixture
def deployment(db):
    deployment = make_deployment(make_host(name="gpu-a"), name="chat")
    config = make_config(
        deployment,
        dict(RUNNING),
        env={"CUDA_VISIBLE_DEVICES": "0"},
        placement={"numa_node": 0, "cpus": "0-15"},
    )
    deployment.active_config = config
    deployment.save()
    return deployment


def body(target, **kw) -> dict:
    data = {
        "deployment": target.pk,
        "title": "More sequences",
        "rationale": "Queue wait dominates TTFT at peak.",
        "settings": {"max_num_seqs": 128},
    }
    data.update(kw)
    return data


def propose(actor, deployment, settings=None, **kw):
    proposed = {**deployment.active_config.settings, **(settings or {"max_num_seqs": 128})}
    kw.setdefault("title", "More sequences")
    kw.setdefault("rationale", "Queue wait dominates TTFT at peak.")
    return review.propose_change(actor, deployment, settings=proposed, **kw)


def test_propose_submit_approve_apply(
    operator, approver, deployment, token_for, django_capture_on_commit_callbacks
):
    ops, boss = token_for(operator, "ops-ci"), token_for(approver, "review-bot")
    answer = ops.post(LIST, body(deployment, submit=False), format="json")
    assert answer.status_code == 201, answer.json()
    change = ChangeRequest.objects.get()
    assert answer["Location"] == url(change)
    data = answer.json()
    assert data["id"] == change.pk and data["state"] == "draft" and data["kind"] == "settings"
    assert data["deployment"] == {"id": deployment.pk, "name": "chat", "host_name": "gpu-a"}
    assert data["proposed_by"] == operator.username and data["actions"]
    assert data["diff"] == [{"flag": "max_num_seqs", "running": 64, "proposed": 128}]
    # As the page's form: what is not named keeps its running value, env and placement too.
    assert change.settings == {"max_num_seqs": 128, "gpu_memory_utilization": 0.9}
    assert change.env == {"CUDA_VISIBLE_DEVICES": "0"}
    assert change.placement == {"numa_node": 0, "cpus": "0-15"}
    # The page's default thresholds, in the page's units both ways.
    assert change.max_error_rate_increase == pytest.approx(0.01)
    assert change.max_ttft_p95_regression == pytest.approx(0.2)
    assert data["max_error_rate_increase"] == 1 and data["max_itl_p95_regression"] == 20
    assert data["base_config"] == {"id": deployment.active_config_id, "version": 1}

    answer = ops.post(url(change, "submit"), format="json")
    assert answer.status_code == 200 and answer.json()["state"] == "pending"

    answer = boss.post(url(change, "approve"), {"comment": "Looks right."}, format="json")
    assert answer.status_code == 200, answer.json()
    data = answer.json()
    assert data["state"] == "approved" and data["approved_by"] == [approver.username]
    assert data["decided_at"] and data["approvals_count"] == 1
    assert data["reviews"][0] | {"created_at": None} == {
        "reviewer": approver.username,
        "decision": "approve",
        "comment": "Looks right.",
        "created_at": None,
        "counts": True,
    }

    with mock.patch("changes.tasks.apply_change.apply_async") as task:
        with django_capture_on_commit_callbacks(execute=True):
            answer = ops.post(url(change, "apply"), format="json")
    assert answer.status_code == 200, answer.json()
    data = answer.json()
    assert data["state"] == "applying" and data["applied_by"] == operator.username
    assert data["lock"] == {"change_id": change.pk, "state": "applying"}
    (args,), kwargs = task.call_args
    assert args == (change.pk,) and kwargs["time_limit"] > 0
    actions = [item["action"] for item in data["timeline"]]
    assert actions == [
        "propose",
        "transition",
        "approve",
        "transition",
        "apply",
        "transition",
    ]
    assert [i["state"] for i in data["timeline"] if i["action"] == "transition"] == [
        "pending",
        "approved",
        "applying",
    ]


def test_writes_are_audited_via_the_token(operator, approver, deployment, token_for):
    answer = token_for(operator, "ops-ci").post(LIST, body(deployment), format="json")
    change = ChangeRequest.objects.get(pk=answer.json()["id"])
    token_for(approver, "review-bot").post(url(change, "approve"), {}, format="json")
    vias = dict(AuditEntry.objects.filter(object_id=str(change.pk)).values_list("action", "via"))
    assert vias["change.propose"] == "token ops-ci"
    assert vias["change.approve"] == "token review-bot"
    # Shown on the timeline too, with who did it.
    detail = token_for(operator, "reader").get(url(change)).json()
    assert [i["who"] for i in detail["timeline"][:1]] == [operator.username]


def test_the_proposer_cannot_approve_their_own_change(approver, deployment, token_for):
    # The page answers 403 (the four-eyes rule is a "who" rule: PermissionDenied).
    change = propose(approver, deployment)
    answer = token_for(approver).post(url(change, "approve"), {}, format="json")
    assert answer.status_code == 403
    assert "four-eyes" in answer.json()["detail"]
    change.refresh_from_db()
    assert change.state == "pending" and not Approval.objects.exists()
    assert "approve" not in token_for(approver, "r").get(url(change)).json()["actions"]


def test_reject_needs_a_comment(operator, approver, deployment, token_for):
    change = propose(operator, deployment)
    boss = token_for(approver)
    answer = boss.post(url(change, "reject"), {}, format="json")
    assert answer.status_code == 400 and "comment" in answer.json()["errors"]
    answer = boss.post(url(change, "reject"), {"comment": "   "}, format="json")
    assert answer.status_code == 400
    change.refresh_from_db()
    assert change.state == "pending"
    answer = boss.post(url(change, "reject"), {"comment": "Measure first."}, format="json")
    assert answer.status_code == 200 and answer.json()["state"] == "rejected"
    assert answer.json()["reviews"][0]["comment"] == "Measure first."


@pytest.mark.parametrize(
    ("flags", "key", "words"),
    [
        ({"max_num_seqs": 0}, "settings.max_num_seqs", "--max-num-seqs"),
        ({"max_num_seqs": "lots"}, "settings.max_num_seqs", "--max-num-seqs"),
        ({"max_num_seqs": 12.5}, "settings.max_num_seqs", "--max-num-seqs"),
        ({"gpu_memory_utilization": 1.5}, "settings.gpu_memory_utilization", "--gpu-memory"),
        ({"served_model_name": "x; rm -rf /"}, "settings.served_model_name", "--served-model"),
        ({"served_model_name": "--api-key=x"}, "settings.served_model_name", "--served-model"),
        ({"max_num_seqs": {"a": 1}}, "settings.max_num_seqs", "--max-num-seqs"),
        ({"max_num_seqs": [1, 2]}, "settings.max_num_seqs", "--max-num-seqs"),
        # Flags the form has no field for: the service's flag spec names them.
        ({"no_such_flag": 1}, "settings.no_such_flag", "no_such_flag"),
        ({"model": "other"}, "settings.model", "LaunchConfig.model"),
    ],
)
def test_a_bad_flag_is_a_400_naming_it_and_nothing_is_created(
    operator, deployment, token_for, flags, key, words
):
    answer = token_for(operator).post(LIST, body(deployment, settings=flags), format="json")
    assert answer.status_code == 400, answer.json()
    problem = answer.json()
    assert answer["Content-Type"] == "application/problem+json"
    assert key in problem["errors"], problem
    assert words in " ".join(problem["errors"][key]) and words in problem["detail"]
    assert (
        not ChangeRequest.objects.exists()
        and not AuditEntry.objects.filter(action__startswith="change.").exists()
    )


@pytest.mark.parametrize(
    ("extra", "field"),
    [
        ({"colour": "red"}, "colour"),
        ({"deployment": 999999}, "deployment"),
        ({"deployment": "chat"}, "deployment"),
        ({"title": ""}, "title"),
        ({"settings": ["max_num_seqs"]}, "settings"),
        ({"verify_profile": 999999}, "verify_profile"),
        ({"baseline_run": 999999}, "baseline_run"),
        ({"max_error_rate_increase": 101}, "max_error_rate_increase"),
        ({"max_ttft_p95_regression": "fast"}, "max_ttft_p95_regression"),
        ({"window_start": "tomorrow"}, "window_start"),
        ({"submit": "perhaps"}, "submit"),
    ],
)
def test_a_malformed_proposal_is_a_400_naming_the_field(
    operator, deployment, token_for, extra, field
):
    answer = token_for(operator).post(LIST, body(deployment, **extra), format="json")
    assert answer.status_code == 400, answer.json()
    assert field in answer.json()["errors"]
    assert not ChangeRequest.objects.exists()


def test_refusals_of_the_service_are_400_on_a_proposal(operator, deployment, token_for):
    api = token_for(operator)
    answer = api.post(LIST, body(deployment, settings={"max_num_seqs": 64}), format="json")
    assert answer.status_code == 400 and "Nothing differs" in answer.json()["detail"]
    window = {"window_start": "2030-01-01T23:00:00Z", "window_end": "2030-01-01T22:00:00Z"}
    answer = api.post(LIST, body(deployment, **window), format="json")
    assert answer.status_code == 400 and "window must end after" in answer.json()["detail"]
    assert not ChangeRequest.objects.exists()


def test_a_code_loading_flag_needs_an_admin(operator, admin, deployment, token_for):
    settings = {"trust_remote_code": True}
    answer = token_for(operator).post(LIST, body(deployment, settings=settings), format="json")
    assert answer.status_code == 403 and "only an Admin" in answer.json()["detail"]
    assert not ChangeRequest.objects.exists()
    answer = token_for(admin).post(LIST, body(deployment, settings=settings), format="json")
    assert answer.status_code == 201
    assert "loads_code" in [w["code"] for w in answer.json()["warnings"]]


def test_proposal_options_as_the_page_takes_them(operator, deployment, token_for):
    profile = make_profile("chat-peak")
    answer = token_for(operator).post(
        LIST,
        body(
            deployment,
            settings={
                "max_num_seqs": 128,
                "gpu_memory_utilization": None,
                "enable_prefix_caching": False,
            },
            verify_profile=profile.pk,
            max_ttft_p95_regression=10,
            window_start="2030-01-01T22:00:00Z",
            window_end="2030-01-01T23:30:00Z",
        ),
        format="json",
    )
    assert answer.status_code == 201, answer.json()
    change = ChangeRequest.objects.get()
    # null unsets a flag; a flag left out keeps its running value.
    assert change.settings == {"max_num_seqs": 128, "enable_prefix_caching": False}
    assert change.verify_profile == profile and change.max_ttft_p95_regression == 0.1
    data = answer.json()
    assert data["verify_profile"] == {"id": profile.pk, "name": "chat-peak", "version": 1}
    assert data["window_start"].startswith("2030-01-01T22:00")
    assert data["prediction"]["profile"] == str(profile)
    assert data["max_ttft_p95_regression"] == 10


def test_secrets_are_kept_unset_and_never_shown(operator, deployment, token_for):
    deployment.active_config = make_config(deployment, {**RUNNING, "api_key": "sk-running-secret"})
    deployment.save()
    api = token_for(operator)
    answer = api.post(LIST, body(deployment), format="json")
    assert answer.status_code == 201, answer.json()
    kept = ChangeRequest.objects.get(pk=answer.json()["id"])
    assert kept.settings["api_key"] == "sk-running-secret"  # left out: kept, as on the page
    answer = api.post(LIST, body(deployment, settings={"api_key": "sk-new-secret"}), format="json")
    assert answer.status_code == 201, answer.json()
    text = api.get(url(answer.json()["id"])).content.decode()
    assert "sk-new-secret" not in text and "sk-running-secret" not in text
    assert "api_key" in text
    answer = api.post(LIST, body(deployment, settings={"api_key": None}), format="json")
    assert "api_key" not in ChangeRequest.objects.get(pk=answer.json()["id"]).settings


def test_state_refusals_are_409_with_the_rules_words(operator, approver, deployment, token_for):
    draft = propose(operator, deployment, submit=False)
    boss, ops = token_for(approver), token_for(operator, "ops")
    answer = boss.post(url(draft, "approve"), {}, format="json")
    assert answer.status_code == 409
    problem = answer.json()
    assert problem["title"] == "Conflict" and "only changes pending review" in problem["detail"]
    answer = ops.post(url(draft, "apply"), format="json")
    assert answer.status_code == 409 and "only approved changes" in answer.json()["detail"]
    answer = ops.post(url(draft, "rollback"), {"reason": "bad"}, format="json")
    assert answer.status_code == 409 and "propose a rollback change" in answer.json()["detail"]
    answer = ops.post(url(draft, "rollback"), {}, format="json")
    assert answer.status_code == 400 and "reason" in answer.json()["errors"]
    answer = ops.post(url(draft, "rebase"), format="json")
    assert answer.status_code == 409 and "not stale" in answer.json()["detail"]
    draft.refresh_from_db()
    assert draft.state == "draft"


def test_the_deployment_lock_is_a_409(operator, approver, deployment, token_for):
    first = propose(operator, deployment)
    second = propose(operator, deployment, {"max_num_seqs": 96})
    review.approve_change(approver, first)
    review.approve_change(approver, second)
    ops = token_for(operator)
    with mock.patch("changes.tasks.apply_change.apply_async"):
        assert ops.post(url(first, "apply"), format="json").status_code == 200
        answer = ops.post(url(second, "apply"), format="json")
    assert answer.status_code == 409 and f"locked by change #{first.pk}" in answer.json()["detail"]
    second.refresh_from_db()
    assert second.state == "approved"


def test_rollback_of_a_change_being_applied(
    operator, approver, deployment, token_for, django_capture_on_commit_callbacks
):
    change = propose(operator, deployment)
    review.approve_change(approver, change)
    ops = token_for(operator)
    with mock.patch("changes.tasks.apply_change.apply_async") as task:
        ops.post(url(change, "apply"), format="json")
        task.reset_mock()
        with django_capture_on_commit_callbacks(execute=True):
            answer = ops.post(url(change, "rollback"), {"reason": "p95 doubled"}, format="json")
    assert answer.status_code == 200, answer.json()
    data = answer.json()
    assert data["rollback_requested"] is True
    assert data["timeline"][-1]["action"] == "rollback_request"
    assert data["timeline"][-1]["message"] == "p95 doubled"
    assert task.called  # no pipeline alive: resumed at once


def test_withdraw_and_comment(operator, deployment, token_for, django_user_model):
    change = propose(operator, deployment)
    ops = token_for(operator)
    answer = ops.post(url(change, "comment"), {"comment": "Measured at 14:00."}, format="json")
    assert answer.status_code == 200
    assert [c["text"] for c in answer.json()["comments"]] == ["Measured at 14:00."]
    assert ops.post(url(change, "comment"), {}, format="json").status_code == 400
    # Only the proposer (or an Admin) withdraws: another Operator gets the rule's 403.
    other = django_user_model.objects.create_user("other-operator")
    other.groups.add(*operator.groups.all())
    answer = token_for(other, "other").post(url(change, "withdraw"), {}, format="json")
    assert answer.status_code == 403 and "Only the proposer" in answer.json()["detail"]
    answer = ops.post(url(change, "withdraw"), {"reason": "superseded"}, format="json")
    assert answer.status_code == 200 and answer.json()["state"] == "withdrawn"


def test_unknown_fields_of_an_action_are_a_400(operator, approver, deployment, token_for):
    change = propose(operator, deployment)
    answer = token_for(approver).post(url(change, "approve"), {"coment": "typo"}, format="json")
    assert answer.status_code == 400 and "coment" in answer.json()["errors"]
    answer = token_for(operator).post(url(change, "submit"), {"force": True}, format="json")
    assert answer.status_code == 400 and "force" in answer.json()["errors"]
    change.refresh_from_db()
    assert change.state == "pending" and not Approval.objects.exists()


def test_propose_a_rollback_to_an_earlier_version(operator, deployment, token_for):
    first = deployment.active_config
    deployment.active_config = make_config(deployment, {**RUNNING, "max_num_seqs": 96})
    deployment.save()
    # v1 ran until v2 was applied over it: a version that ran healthy, a rollback target.
    EngineOperation.objects.create(
        deployment=deployment,
        kind="apply",
        config=deployment.active_config,
        previous_config=first,
        status="succeeded",
        outcome="ready",
    )
    api = token_for(operator)
    path = f"{LIST}propose-rollback/"
    answer = api.post(path, {"config": first.pk, "rationale": "v1 was faster."}, format="json")
    assert answer.status_code == 201, answer.json()
    data = answer.json()
    assert answer["Location"] == url(data["id"])
    assert data["kind"] == "rollback" and data["state"] == "pending"
    assert data["target_config"] == {"id": first.pk, "version": 1}
    assert {"flag": "max_num_seqs", "running": 96, "proposed": 64} in data["diff"]
    running = deployment.active_config.pk
    answer = api.post(path, {"config": running, "rationale": "again"}, format="json")
    assert answer.status_code == 409 and "already runs v2" in answer.json()["detail"]
    for bad, field in (
        ({"config": first.pk}, "rationale"),
        ({"config": 0, "rationale": "x"}, "config"),
    ):
        answer = api.post(path, bad, format="json")
        assert answer.status_code == 400 and field in answer.json()["errors"]
    assert ChangeRequest.objects.count() == 1


def test_a_missing_change_is_a_404(operator, token_for):
    api = token_for(operator)
    assert api.get(url(999999)).status_code == 404
    assert api.post(url(999999, "submit"), format="json").status_code == 404
    assert api.get(f"{LIST}abc/").status_code == 404


def test_the_list_filters_as_the_page_does(operator, approver, deployment, token_for):
    first = propose(operator, deployment)
    second = propose(approver, deployment, {"max_num_seqs": 96}, submit=False)
    other = make_deployment(deployment.host, name="code")
    other.active_config = make_config(other, dict(RUNNING))
    other.save()
    third = propose(operator, other)
    review.approve_change(approver, first)
    api = token_for(operator)

    def ids(query=""):
        answer = api.get(LIST + query)
        assert answer.status_code == 200, answer.json()
        return [item["id"] for item in answer.json()["results"]]

    assert ids() == [third.pk, second.pk, first.pk]  # newest first
    assert ids("?state=draft") == [second.pk]
    assert ids(f"?deployment={other.pk}") == [third.pk]
    assert ids(f"?proposer={approver.pk}") == [second.pk]
    assert ids(f"?proposer={approver.username}") == [second.pk]
    assert ids(f"?host={deployment.host_id}&state=approved") == [first.pk]
    item = api.get(LIST + "?state=approved").json()["results"][0]
    assert item["approved_by"] == [approver.username] and item["decided_at"]
    assert item["deployment"] == {"id": deployment.pk, "name": "chat", "host_name": "gpu-a"}
    assert set(item) >= {"title", "kind", "proposed_by", "created_at", "stage", "state"}
    assert api.get(LIST + "?page_size=1").json()["count"] == 3
    for bad in ("?state=sideways", "?deployment=999999", "?proposer=nobody-here", "?sate=x"):
        answer = api.get(LIST + bad)
        assert answer.status_code == 400, bad


def test_the_detail_has_the_verdict_and_the_runs(operator, approver, deployment, token_for):
    change = propose(operator, deployment)
    comparison = {
        "outcome": "regressed",
        "regressed": True,
        "reason": "TTFT p95 +40%",
        "checks": [
            {
                "metric": "ttft_p95_ms",
                "label": "TTFT p95",
                "baseline": 100.0,
                "after": 140.0,
                "change": 0.4,
                "limit": "+20%",
                "ok": False,
            }
        ],
        "throughput_change": -0.1,
        "conditions": [],
        "notes": [],
    }
    ChangeRequest.objects.filter(pk=change.pk).update(
        comparison=comparison, state="rolled_back", outcome="rolled back: regression"
    )
    timeline.record_stage(change, Stage.BASELINE, StageStatus.SUCCEEDED, "measured")
    data = token_for(operator).get(url(change)).json()
    stage = data["timeline"][-1]
    assert stage["action"] == "stage" and stage["title"] == "Baseline benchmark: succeeded"
    assert (stage["stage"], stage["status"], stage["message"]) == (
        "baseline",
        "succeeded",
        "measured",
    )
    assert stage["at"].endswith("Z") and data["stage"] == "baseline"
    assert data["verdict"]["outcome"] == "regressed"
    assert data["verdict"]["checks"][0]["ok"] is False
    assert data["outcome"] == "rolled back: regression"
    assert data["baseline_run_id"] is None and data["verification_run_id"] is None
    assert data["snapshot_config"] is None and data["applied_config"] is None
    assert data["actions"] == ["comment"]


def test_session_posts_need_the_csrf_token(operator, deployment):
    api = APIClient(enforce_csrf_checks=True)
    api.force_login(operator)
    assert api.get(LIST).status_code == 200  # reading needs no token
    answer = api.post(LIST, body(deployment), format="json")
    assert answer.status_code == 403 and "CSRF" in answer.json()["detail"]
    assert not ChangeRequest.objects.exists()


def test_a_change_of_model_is_proposed_with_its_quality_probe(operator, deployment, token_for):
    model = deployment.model
    answer = token_for(operator, "ops-ci").post(
        LIST,
        body(deployment, settings={}, model=f"{model}-AWQ", max_quality_loss=3),
        format="json",
    )
    assert answer.status_code == 201, answer.json()
    detail = answer.json()
    assert detail["model"] == f"{model}-AWQ" and detail["max_quality_loss"] == 3
    assert {"flag": "model", "running": model, "proposed": f"{model}-AWQ"} in [
        {k: row[k] for k in ("flag", "running", "proposed")} for row in detail["diff"]
    ]
    change = ChangeRequest.objects.get(pk=detail["id"])
    assert change.probe_set is not None and change.max_quality_loss == 0.03
