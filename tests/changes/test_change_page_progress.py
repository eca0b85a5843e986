"""The top of the change page says where the change stands (issue 21): state, current stage,
a progress bar and the time left of the stage's benchmark, refreshed live while the pipeline
runs; the state-derived text replaces the one-shot "being applied" flash that outlived it."""

from __future__ import annotations

from datetime import timedelta
from unittest import mock

import pytest
from django.contrib.messages import get_messages
from django.urls import reverse
from django.utils import timezone

from benchmarks.models import RunPoint
from changes.models import ChangeRequest
from changes.services import progress, review
from tests.factories import make_config, make_deployment, make_host, make_profile, make_run

pytestmark = pytest.mark.django_db


@pytest.fixture
def deployment(db):
    deployment = make_deployment(make_host(name="gpu-a"), name="chat")
    deployment.active_config = make_config(deployment, {"max_num_seqs": 64})
    deployment.save()
    return deployment


@pytest.fixture
def approved(operator, approver, deployment):
    change = review.propose_change(
        operator,
        deployment,
        title="More sequences",
        rationale="queue wait",
        settings={"max_num_seqs": 128},
        verify_profile=make_profile("chat"),
    )
    review.approve_change(approver, change)
    return ChangeRequest.objects.get(pk=change.pk)


def verifying(change, operator, **run_fields):
    """The change in its verification benchmark, 20 s into a run planned for 70 s."""
    now = timezone.now()
    fields = {
        "status": "running",
        "started_at": now - timedelta(seconds=20),
        "planned_duration_s": 70.0,
        "progress": 0.3,
        **run_fields,
    }
    run = make_run(change.deployment, load_profile=change.verify_profile, **fields)
    ChangeRequest.objects.filter(pk=change.pk).update(
        state="verifying",
        stage="verify",
        applied_by=operator,
        verification_run=run,
        pipeline_owner="worker-1",
        pipeline_heartbeat_at=now,
    )
    return ChangeRequest.objects.get(pk=change.pk), run


def top(client, change) -> str:
    html = client.get(change.get_absolute_url()).content.decode()
    start = html.index('data-testid="change-progress"')
    return html[start : html.index("</section>", start)], html


def test_a_running_change_shows_its_stage_progress_and_time_left_at_the_top(
    client, operator, approved
):
    change, run = verifying(approved, operator)
    client.force_login(operator)
    block, html = top(client, change)
    # At the top: before the warnings, the actions and the prediction tables.
    assert html.index('data-testid="change-progress"') < html.index('data-testid="warnings"')
    assert html.index('data-testid="change-progress"') < html.index('data-testid="prediction"')
    assert "Verifying: the pipeline is running." in block
    assert "Step 8 of 11:" in block and "Verification benchmark" in block
    assert 'aria-label="Benchmark"' in block and 'aria-valuenow="30"' in block
    assert "30 %" in block and run.get_absolute_url() in block
    # No point yet: the planned 70 s less the 20 s elapsed.
    assert "about 50 s left" in block and "of about 1 min 10 s planned" in block
    # It keeps itself fresh while the pipeline runs.
    assert "every 3s" in block and 'hx-swap="outerHTML"' in block


def test_the_time_left_is_the_runs_own_estimate_at_its_newest_point(operator, approved):
    change, run = verifying(approved, operator)
    RunPoint.objects.create(run=run, t=10.0, data={"t": 10.0, "eta_s": 40.0})
    RunPoint.objects.create(run=run, t=19.0, data={"t": 19.0, "eta_s": 35.0})
    left = progress.progress(change)["benchmark"]["left_s"]
    assert 33.0 <= left <= 34.0  # 35 s at 19 s, one second ago


def test_the_progress_part_is_served_for_the_live_refresh(client, operator, approved):
    change, _ = verifying(approved, operator)
    client.force_login(operator)
    response = client.get(reverse("changes:part", args=[change.pk, "progress"]))
    assert response.status_code == 200
    assert 'data-testid="progress-eta"' in response.content.decode()


def test_a_finished_change_says_how_it_ended_and_stops_polling(client, operator, approved):
    change, run = verifying(approved, operator)
    run.status = "succeeded"
    run.save()
    ChangeRequest.objects.filter(pk=change.pk).update(
        state="rolled_back", outcome="Rolled back to v1: TTFT p95 +579 %", pipeline_owner=""
    )
    client.force_login(operator)
    block, _ = top(client, ChangeRequest.objects.get(pk=change.pk))
    assert "Rolled back to v1: TTFT p95 +579 %" in block
    assert "every 3s" not in block and "progressbar" not in block
    assert "being applied" not in block


def test_a_pending_change_says_what_it_waits_for(client, operator, approver, deployment):
    change = review.propose_change(
        operator, deployment, title="t", rationale="r", settings={"max_num_seqs": 96}
    )
    client.force_login(approver)
    block, _ = top(client, change)
    assert "Waiting for review: 0 of 1 approvals." in block


def test_apply_leaves_no_flash_that_could_outlive_the_state(client, operator, approved):
    client.force_login(operator)
    with mock.patch("changes.tasks.apply_change.apply_async"):
        response = client.post(reverse("changes:apply", args=[approved.pk]))
    assert response.status_code == 302
    assert list(get_messages(response.wsgi_request)) == []
    block, _ = top(client, ChangeRequest.objects.get(pk=approved.pk))
    assert "Applying:" in block  # the state says it instead, for as long as it is true


def test_an_extra_verification_run_shows_in_the_progress_block(client, operator, approved):
    """Issue 37: when the noise is too wide to judge, the compare step measures again; the
    block says which extra run of the change's budget runs, with its progress."""
    change, _ = verifying(approved, operator, status="succeeded", progress=1.0)
    extra = make_run(
        change.deployment,
        load_profile=change.verify_profile,
        status="running",
        started_at=timezone.now() - timedelta(seconds=10),
        planned_duration_s=70.0,
        progress=0.5,
    )
    change.extra_runs.add(extra)
    ChangeRequest.objects.filter(pk=change.pk).update(stage="compare")
    client.force_login(operator)
    block, _ = top(client, ChangeRequest.objects.get(pk=change.pk))
    assert "Compare with baseline" in block
    assert "Extra verification (1 of up to 2) benchmark" in block
    assert extra.get_absolute_url() in block and "50 %" in block
