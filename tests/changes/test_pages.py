"""The changes pages: the list with its locks, the proposal form generated from the engine's
flag spec (and its live preview), one change with its timeline and the actions each persona
gets, the actions themselves, and a deployment's config history with rollback proposals."""

from __future__ import annotations

from unittest import mock

import pytest
from django import forms
from django.contrib.messages import get_messages
from django.urls import reverse

from changes.forms import FLAG_PREFIX
from changes.models import Approval, ChangeRequest
from changes.services import facts, review, timeline
from hosts.engines.launch import RESERVED_SETTINGS
from tests.factories import (
    make_config,
    make_deployment,
    make_finished_run,
    make_gpu,
    make_host,
    make_profile,
)

pytestmark = pytest.mark.django_db

RUNNING = {"max_num_seqs": 64, "gpu_memory_utilization": 0.9}


def running(deployment, settings=None, **kw):
    config = make_config(deployment, dict(settings or RUNNING), **kw)
    deployment.active_config = config
    deployment.save()
    return config


@pytest.fixture
def deployment(db):
    deployment = make_deployment(make_host(name="gpu-a"), name="chat")
    running(
        deployment,
        env={"CUDA_VISIBLE_DEVICES": "0"},
        placement={"numa_node": 0, "cpus": "0-15"},
    )
    return deployment


def propose(actor, deployment, settings=None, **kw):
    proposed = dict(deployment.active_config.settings)
    proposed.update(settings or {"max_num_seqs": 128})
    kw.setdefault("title", "More sequences")
    kw.setdefault("rationale", "Queue wait dominates TTFT at peak.")
    return review.propose_change(
        actor,
        deployment,
        settings=proposed,
        env=deployment.active_config.env,
        placement=deployment.active_config.placement,
        **kw,
    )


def form_data(**flags) -> dict:
    data = {
        "title": "More sequences",
        "rationale": "Queue wait dominates TTFT at peak.",
        "max_error_rate_increase": "1",
        "max_ttft_p95_regression": "20",
        "max_itl_p95_regression": "20",
        "action": "submit",
    }
    values = {**RUNNING, **flags}
    data.update({FLAG_PREFIX + k: "" if v is None else str(v) for k, v in values.items()})
    return data


def new_url(deployment) -> str:
    return f"{reverse('changes:new')}?deployment={deployment.pk}"


def preview_url(deployment) -> str:
    return f"{reverse('changes:preview')}?deployment={deployment.pk}"


def said(response) -> list[str]:
    return [str(m) for m in get_messages(response.wsgi_request)]


# --- the proposal form -------------------------------------------------------------------------
def test_the_form_has_one_field_per_flag_of_the_engine_version(client, operator, deployment):
    client.force_login(operator)
    response = client.get(new_url(deployment))
    assert response.status_code == 200
    form = response.context["form"]
    flags = [f for f in facts.spec_flags(deployment) if f.dest not in RESERVED_SETTINGS]
    names = [n.removeprefix(FLAG_PREFIX) for n in form.fields if n.startswith(FLAG_PREFIX)]
    assert names == [f.dest for f in flags]
    # The version's flags only: 0.11.0 has --enable-log-requests, not the removed flag.
    assert "enable_log_requests" in names and "port" not in names

    seqs = form.fields[FLAG_PREFIX + "max_num_seqs"]
    assert isinstance(seqs, forms.IntegerField) and seqs.min_value == 1
    assert seqs.label == "--max-num-seqs" and "Maximum number of sequences" in seqs.help_text
    memory = form.fields[FLAG_PREFIX + "gpu_memory_utilization"]
    assert isinstance(memory, forms.FloatField) and memory.max_value == 1
    kv = form.fields[FLAG_PREFIX + "kv_cache_dtype"]
    assert isinstance(kv, forms.ChoiceField)
    assert [c for c, _ in kv.choices] == [
        "",
        "auto",
        "float16",
        "bfloat16",
        "fp8",
        "fp8_e4m3",
        "fp8_e5m2",
    ]
    assert "Default: auto" in kv.help_text
    prefix = form.fields[FLAG_PREFIX + "enable_prefix_caching"]
    assert [c for c, _ in prefix.choices] == ["", "true", "false"]
    assert isinstance(form.fields[FLAG_PREFIX + "served_model_name"], forms.CharField)

    # The running values are filled in; performance flags first, the rest folded away.
    assert seqs.initial == 64 and memory.initial == 0.9
    html = response.content.decode()
    assert 'name="flag_max_num_seqs" value="64"' in html
    assert html.index("--max-num-seqs") < html.index("Other settings") < html.index("--seed")
    # Environment and placement are fields too, holding the running ones (issue 21).
    assert "CUDA_VISIBLE_DEVICES=0</textarea>" in html and 'value="0-15"' in html


def test_an_unreadable_engine_version_is_said_not_a_server_error(client, operator, deployment):
    deployment.engine_version = "banana"
    deployment.save()
    client.force_login(operator)
    response = client.get(new_url(deployment))
    assert response.status_code == 200
    assert "engine version cannot be read" in response.content.decode()
    response = client.post(new_url(deployment), form_data(max_num_seqs=128))
    assert response.status_code == 200 and not ChangeRequest.objects.exists()
    assert "banana" in response.content.decode()


def test_without_a_deployment_the_page_offers_a_picker(client, operator, deployment):
    client.force_login(operator)
    response = client.get(reverse("changes:new"))
    assert response.status_code == 200
    assert f"?deployment={deployment.pk}" in response.content.decode()


def test_a_valid_proposal_is_pending_review_and_keeps_env_and_placement(
    client, operator, deployment
):
    profile = make_profile("chat-peak")
    baseline = make_finished_run(deployment, engine_config=deployment.active_config)
    client.force_login(operator)
    data = form_data(max_num_seqs=128)
    data.update(
        verify_profile=profile.pk,
        baseline_run=baseline.pk,
        max_ttft_p95_regression="10",
        window_start="2030-01-01T22:00",
        window_end="2030-01-01T23:30",
    )
    response = client.post(new_url(deployment), data)
    change = ChangeRequest.objects.get()
    assert response.status_code == 302 and response["Location"] == change.get_absolute_url()
    assert change.state == "pending" and change.proposed_by == operator
    assert change.settings == {"max_num_seqs": 128, "gpu_memory_utilization": 0.9}
    assert change.diff() == {"max_num_seqs": (64, 128)}
    assert change.env == {"CUDA_VISIBLE_DEVICES": "0"}
    assert change.placement == {"numa_node": 0, "cpus": "0-15"}
    assert change.verify_profile == profile and change.baseline_run == baseline
    assert change.max_error_rate_increase == pytest.approx(0.01)
    assert change.max_ttft_p95_regression == pytest.approx(0.1)
    assert change.window_start.hour == 22 and change.window_end.minute == 30


def test_save_as_draft_and_unset_flags_are_left_out(client, operator, deployment):
    client.force_login(operator)
    data = form_data(max_num_seqs=None, enable_prefix_caching="false")
    data["action"] = "draft"
    response = client.post(new_url(deployment), data)
    change = ChangeRequest.objects.get()
    assert response.status_code == 302 and change.state == "draft"
    assert change.settings == {"gpu_memory_utilization": 0.9, "enable_prefix_caching": False}


@pytest.mark.parametrize(
    ("flag", "value", "words"),
    [
        ("served_model_name", "x; rm -rf /", "--served-model-name"),
        ("served_model_name", "--api-key=stolen", "--served-model-name"),
        ("max_num_seqs", "0", "--max-num-seqs"),
        ("gpu_memory_utilization", "1.5", "--gpu-memory-utilization"),
        ("gpu_memory_utilization", "0", "--gpu-memory-utilization"),
        ("max_num_seqs", "lots", "--max-num-seqs"),
    ],
)
def test_a_bad_value_is_refused_naming_the_flag_and_nothing_is_created(
    client, operator, deployment, flag, value, words
):
    client.force_login(operator)
    response = client.post(new_url(deployment), form_data(**{flag: value}))
    assert response.status_code == 200
    errors = response.content.decode().split('data-testid="form-errors"')[1].split("</div>")[0]
    assert words in errors
    assert not ChangeRequest.objects.exists()


def test_a_proposal_that_changes_nothing_is_refused(client, operator, deployment):
    client.force_login(operator)
    response = client.post(new_url(deployment), form_data())
    assert response.status_code == 200
    assert "Nothing differs from the running config" in response.content.decode()
    assert not ChangeRequest.objects.exists()


def test_preview_shows_the_diff_and_the_warnings(client, operator, deployment):
    client.force_login(operator)
    response = client.post(
        preview_url(deployment), form_data(max_num_seqs=128, gpu_memory_utilization=0.97)
    )
    assert response.status_code == 200
    html = response.content.decode()
    assert 'data-flag="max_num_seqs"' in html and 'data-flag="gpu_memory_utilization"' in html
    assert 'data-warning="several_settings"' in html and "settings change at once" in html
    assert 'data-warning="memory_headroom"' in html
    assert response.context["facts"]["diff"] == {
        "gpu_memory_utilization": (0.9, 0.97),
        "max_num_seqs": (64, 128),
    }


def test_preview_needs_no_title_and_shows_what_the_engine_refuses(client, operator, deployment):
    client.force_login(operator)
    data = form_data(served_model_name="x; rm -rf /")
    data["title"] = data["rationale"] = ""
    response = client.post(preview_url(deployment), data)
    assert response.status_code == 200
    html = response.content.decode()
    assert 'data-testid="preview-errors"' in html and "--served-model-name" in html
    response = client.post(preview_url(deployment), form_data(max_num_seqs=0))
    assert "--max-num-seqs" in response.content.decode()


def test_preview_predicts_the_impact_for_the_chosen_profile(client, operator, deployment):
    make_gpu(deployment.host)
    profile = make_profile("chat")
    client.force_login(operator)
    data = form_data(max_num_seqs=8)
    data["verify_profile"] = profile.pk
    response = client.post(preview_url(deployment), data)
    prediction = response.context["facts"]["prediction"]
    assert prediction["available"], prediction
    assert "TTFT p95" in response.content.decode()


# --- one change --------------------------------------------------------------------------------
def detail(client, change):
    response = client.get(change.get_absolute_url())
    assert response.status_code == 200
    return response.content.decode()


def test_the_page_shows_the_change_its_timeline_and_the_live_hooks(client, operator, deployment):
    change = propose(operator, deployment)
    timeline.record(
        None, change, "stage", after={"stage": "apply", "status": "started", "message": "v2"}
    )
    client.force_login(operator)
    html = detail(client, change)
    assert 'data-change-state="pending"' in html
    assert f'data-live-socket="/ws/changes/{change.pk}/"' in html
    assert reverse("changes:timeline", args=[change.pk]) in html
    assert html.count('data-testid="timeline-item"') == 3
    assert 'data-action="propose"' in html and 'data-action="transition"' in html
    assert 'data-action="stage" data-stage="apply" data-status="started"' in html
    assert 'data-flag="max_num_seqs"' in html and "Queue wait dominates TTFT" in html


@pytest.mark.parametrize(
    ("persona", "shown", "hidden"),
    [
        ("operator", {"withdraw-change", "comment-change"}, {"approve-change", "apply-change"}),
        ("approver", {"approve-change", "reject-change", "comment-change"}, {"withdraw-change"}),
        ("viewer", set(), {"approve-change", "withdraw-change", "comment-change"}),
        ("admin", {"approve-change", "withdraw-change"}, {"submit-change", "apply-change"}),
    ],
)
def test_buttons_of_a_pending_change_per_persona(
    client, personas, deployment, persona, shown, hidden
):
    change = propose(personas["operator"], deployment)
    client.force_login(personas[persona])
    html = detail(client, change)
    for testid in shown:
        assert f'data-testid="{testid}"' in html, testid
    for testid in hidden:
        assert f'data-testid="{testid}"' not in html, testid


def test_buttons_of_a_draft_and_an_approved_change(client, operator, approver, deployment):
    draft = propose(operator, deployment, submit=False)
    client.force_login(operator)
    assert 'data-testid="submit-change"' in detail(client, draft)
    approved = propose(operator, deployment, {"max_num_seqs": 96})
    review.approve_change(approver, approved)
    html = detail(client, approved)
    assert 'data-testid="apply-change"' in html and 'data-testid="approve-change"' not in html


def test_the_proposer_may_not_approve_their_own_change(client, approver, deployment):
    change = propose(approver, deployment)
    client.force_login(approver)
    assert 'data-testid="approve-change"' not in detail(client, change)
    response = client.post(reverse("changes:approve", args=[change.pk]))
    assert response.status_code == 403
    change.refresh_from_db()
    assert change.state == "pending" and not Approval.objects.exists()


def test_another_approver_approves(client, operator, approver, deployment):
    change = propose(operator, deployment)
    client.force_login(approver)
    response = client.post(
        reverse("changes:approve", args=[change.pk]), {"comment": "Looks right."}
    )
    assert response.status_code == 302 and response["Location"] == change.get_absolute_url()
    change.refresh_from_db()
    assert change.state == "approved"
    assert Approval.objects.get().comment == "Looks right."
    assert said(response) == [f"You approved change #{change.pk}."]


def test_a_rejection_needs_a_reason(client, operator, approver, deployment):
    change = propose(operator, deployment)
    client.force_login(approver)
    response = client.post(reverse("changes:reject", args=[change.pk]))
    assert response.status_code == 302 and "Say why" in said(response)[0]
    change.refresh_from_db()
    assert change.state == "pending"
    client.post(reverse("changes:reject", args=[change.pk]), {"comment": "Measure first."})
    change.refresh_from_db()
    assert change.state == "rejected"


def test_apply_starts_the_pipeline(
    client, operator, approver, deployment, django_capture_on_commit_callbacks
):
    change = propose(operator, deployment)
    review.approve_change(approver, change)
    client.force_login(operator)
    with mock.patch("changes.tasks.apply_change.apply_async") as apply_async:
        with django_capture_on_commit_callbacks(execute=True):
            response = client.post(reverse("changes:apply", args=[change.pk]))
    assert response.status_code == 302
    change.refresh_from_db()
    assert change.state == "applying" and change.applied_by == operator
    apply_async.assert_called_once()
    assert apply_async.call_args.args[0] == (change.pk,)
    # Applying: the lock is shown, and the roll back / resume buttons (no heartbeat yet).
    html = detail(client, change)
    assert 'data-testid="rollback-change"' in html and 'data-testid="resume-change"' in html
    listing = client.get(reverse("changes:list")).content.decode()
    assert f'data-lock="{deployment.pk}"' in listing


def test_an_action_the_state_does_not_allow_is_refused_with_a_message(client, operator, deployment):
    change = propose(operator, deployment)
    client.force_login(operator)
    with mock.patch("changes.tasks.apply_change.apply_async") as apply_async:
        response = client.post(reverse("changes:apply", args=[change.pk]))
    assert response.status_code == 302 and response["Location"] == change.get_absolute_url()
    assert "only approved changes are applied" in said(response)[0]
    change.refresh_from_db()
    assert change.state == "pending"
    apply_async.assert_not_called()


def test_submit_withdraw_and_comment(client, operator, deployment):
    change = propose(operator, deployment, submit=False)
    client.force_login(operator)
    client.post(reverse("changes:submit", args=[change.pk]))
    change.refresh_from_db()
    assert change.state == "pending"
    client.post(reverse("changes:comment", args=[change.pk]), {"comment": "Peak is at 18:00."})
    client.post(reverse("changes:withdraw", args=[change.pk]))
    change.refresh_from_db()
    assert change.state == "withdrawn"
    html = detail(client, change)
    assert "Peak is at 18:00." in html and 'data-action="comment"' in html
    assert 'data-testid="withdraw-change"' not in html


def test_someone_else_may_not_withdraw(client, operator, approver, deployment):
    change = propose(operator, deployment)
    client.force_login(approver)
    assert client.post(reverse("changes:withdraw", args=[change.pk])).status_code == 403
    change.refresh_from_db()
    assert change.state == "pending"


def test_a_stale_change_shows_the_banner_and_rebases(client, operator, deployment):
    change = propose(operator, deployment)
    running(deployment, {"max_num_seqs": 64, "gpu_memory_utilization": 0.85})
    client.force_login(operator)
    html = detail(client, change)
    assert 'data-testid="stale-banner"' in html and 'data-testid="rebase-change"' in html
    listing = client.get(reverse("changes:list")).content.decode()
    assert 'data-testid="stale"' in listing
    response = client.post(reverse("changes:rebase", args=[change.pk]))
    assert response.status_code == 302
    change.refresh_from_db()
    assert change.base_config == deployment.active_config and not change.is_stale()


def test_timeline_json_for_the_backfill(client, viewer, operator, deployment):
    change = propose(operator, deployment)
    client.force_login(viewer)
    data = client.get(reverse("changes:timeline", args=[change.pk])).json()
    assert data["state"] == "pending" and data["label"] == "Pending review"
    assert [i["action"] for i in data["items"]] == ["propose", "transition"]
    assert data["items"][0]["id"] < data["items"][1]["id"]


def test_the_actions_fragment(client, approver, operator, deployment):
    change = propose(operator, deployment)
    client.force_login(approver)
    response = client.get(reverse("changes:part", args=[change.pk, "actions"]))
    assert 'data-testid="approve-change"' in response.content.decode()
    assert client.get(reverse("changes:part", args=[change.pk, "nope"])).status_code == 404


# --- the list ----------------------------------------------------------------------------------
def test_the_list_filters_and_counts_approvals(client, operator, approver, deployment):
    other = make_deployment(make_host(name="gpu-b"), name="batch")
    running(other)
    mine = propose(operator, deployment)
    review.approve_change(approver, mine)
    theirs = propose(approver, other, submit=False)
    client.force_login(operator)

    def listed(**query):
        response = client.get(reverse("changes:list"), query)
        assert response.status_code == 200
        return [c.pk for c in response.context["page"]]

    assert listed() == [theirs.pk, mine.pk]  # newest first
    assert listed(state="approved") == [mine.pk]
    assert listed(host=other.host.pk) == [theirs.pk]
    assert listed(deployment=deployment.pk) == [mine.pk]
    assert listed(proposer=approver.pk) == [theirs.pk]
    html = client.get(reverse("changes:list")).content.decode()
    assert "1/1" in html and "0/1" in html and 'data-change-state="draft"' in html
    assert 'data-testid="propose-change"' in html


def test_the_list_reads_a_page_in_a_bounded_number_of_queries(
    client, viewer, operator, deployment, django_assert_max_num_queries
):
    for n in range(30):
        propose(operator, deployment, {"max_num_seqs": 100 + n})
    client.force_login(viewer)
    with django_assert_max_num_queries(12):
        response = client.get(reverse("changes:list"))
    assert len(response.context["page"]) == 25
    assert 'data-testid="propose-change"' not in response.content.decode()


# --- config history ----------------------------------------------------------------------------
def test_config_history_and_a_rollback_proposal(client, operator, deployment):
    from hosts.models import EngineOperation

    first = deployment.active_config
    second = running(
        deployment,
        {"max_num_seqs": 128, "gpu_memory_utilization": 0.9},
        env=first.env,
        placement=first.placement,
    )
    # v1 ran until v2 was applied over it (a version that ran healthy: a rollback target).
    EngineOperation.objects.create(
        deployment=deployment,
        kind="apply",
        config=second,
        previous_config=first,
        status="succeeded",
        outcome="ready",
    )
    client.force_login(operator)
    response = client.get(reverse("changes:configs", args=[deployment.pk]))
    assert response.status_code == 200
    diffs = [row["diff"] for row in response.context["rows"]]
    assert diffs[0] == {"max_num_seqs": (64, 128)}
    html = response.content.decode()
    assert 'data-testid="rollback-to-v1"' in html and 'data-testid="rollback-to-v2"' not in html

    url = reverse("changes:propose_rollback", args=[first.pk])
    response = client.post(url, {"rationale": ""})
    assert response.status_code == 302 and not ChangeRequest.objects.exists()
    response = client.post(url, {"rationale": "v2 doubled the TTFT p95."})
    change = ChangeRequest.objects.get()
    assert response["Location"] == change.get_absolute_url()
    assert change.kind == "rollback" and change.target_config == first
    assert change.state == "pending" and change.diff() == {"max_num_seqs": (128, 64)}


def test_all_configs_page_shows_what_each_version_changed(client, viewer):
    deployment = make_deployment(name="chat")
    make_config(deployment, {"max_num_seqs": 256})
    make_config(deployment, {"max_num_seqs": 512})
    client.force_login(viewer)
    response = client.get(reverse("changes:all_configs"))
    diffs = [row["diff"] for row in response.context["rows"]]
    # The first version also names the model it pinned (a later version may switch it).
    model = deployment.model
    assert diffs == [
        {"max_num_seqs": (256, 512)},
        {"max_num_seqs": (None, 256), "model": (None, model)},
    ]
