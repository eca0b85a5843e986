"""Config history that tells the truth: each version says how it ended (running now, was good,
rolled back, failed to start, never applied) from the operations and changes that applied it;
only a version that ran healthy can be the target of a rollback proposal (the button and the
service ask the same rule); and a version's diff is against the version it was made from."""

from __future__ import annotations

import pytest
from django.contrib.messages import get_messages
from django.urls import reverse

from changes.choices import ChangeKind, ChangeState, VersionOutcome
from changes.models import ChangeRequest
from changes.rules import ChangeRefused
from changes.services import config_history, review
from controlpanel.choices import OperationStatus
from hosts.choices import OperationKind, OperationOutcome
from hosts.models import EngineOperation
from tests.factories import make_config, make_deployment, make_host

pytestmark = pytest.mark.django_db

V1 = {"max_num_seqs": 128, "gpu_memory_utilization": 0.9}


@pytest.fixture
def deployment(db):
    deployment = make_deployment(make_host(name="gpu-a"), name="chat")
    deployment.active_config = make_config(deployment, dict(V1))
    deployment.save()
    return deployment


def applied(deployment, config, outcome=OperationOutcome.READY, error=""):
    """An apply of ``config`` as the worker leaves it; READY makes it the running config."""
    ok = outcome == OperationOutcome.READY
    operation = EngineOperation.objects.create(
        deployment=deployment,
        kind=OperationKind.APPLY,
        config=config,
        previous_config=deployment.active_config,
        status=OperationStatus.SUCCEEDED if ok else OperationStatus.FAILED,
        outcome=outcome,
        error=error,
    )
    if ok:
        deployment.active_config = config
        deployment.save()
    return operation


def change(deployment, state, *, base, applied_config=None, operation=None, outcome=""):
    return ChangeRequest.objects.create(
        deployment=deployment,
        title="raise the memory share",
        rationale="more KV cache",
        kind=ChangeKind.SETTINGS,
        state=state,
        base_config=base,
        snapshot_config=base,
        applied_config=applied_config,
        operation=operation,
        outcome=outcome,
    )


def failed_verification(deployment):
    """v2 came up healthy, failed its verification and was rolled back to v1."""
    v1 = deployment.active_config
    v2 = make_config(deployment, {**V1, "max_num_seqs": 512})
    operation = applied(deployment, v2)
    bad = change(
        deployment,
        ChangeState.ROLLED_BACK,
        base=v1,
        applied_config=v2,
        operation=operation,
        outcome="regression: p95 TTFT +579 %",
    )
    bad.rollback_operation = applied(deployment, v1)
    bad.save()
    return v1, v2, bad


def test_a_version_rolled_back_after_failing_verification(deployment):
    v1, v2, bad = failed_verification(deployment)
    ends = config_history.endings([v1, v2])
    assert ends[v1.pk].outcome == VersionOutcome.RUNNING
    assert ends[v2.pk].outcome == VersionOutcome.ROLLED_BACK
    assert ends[v2.pk].change == bad.pk and "p95 TTFT +579 %" in ends[v2.pk].reason
    with pytest.raises(ChangeRefused, match="v2 rolled back.*only a version that ran healthy"):
        review.propose_rollback(bad.proposed_by, v2, rationale="try again")


def test_versions_that_never_started(deployment):
    v1 = deployment.active_config
    # The host could not start v2 and put v1 back itself.
    v2 = make_config(deployment, {**V1, "max_num_seqs": 256})
    applied(deployment, v2, OperationOutcome.ROLLED_BACK, "CUDA out of memory")
    # v3 was created by a change that stopped before the engine was restarted on it.
    v3 = make_config(deployment, {**V1, "max_num_seqs": 96})
    stopped = change(
        deployment, ChangeState.FAILED, base=v1, applied_config=v3, outcome="the host refused"
    )
    ends = config_history.endings([v1, v2, v3])
    assert ends[v2.pk].outcome == VersionOutcome.FAILED
    assert ends[v2.pk].reason == "CUDA out of memory"
    assert ends[v3.pk].outcome == VersionOutcome.NEVER and ends[v3.pk].change == stopped.pk
    for version in (v2, v3):
        assert not ends[version.pk].outcome.rollback_target
        with pytest.raises(ChangeRefused, match="only a version that ran healthy"):
            review.propose_rollback(None, version, rationale="x")


def test_a_version_that_ran_healthy_is_good_and_can_be_rolled_back_to(operator, deployment):
    v1 = deployment.active_config
    v2 = make_config(deployment, {**V1, "max_num_seqs": 256})
    made = change(deployment, ChangeState.APPLIED, base=v1, applied_config=v2)
    made.operation = applied(deployment, v2)
    made.save()
    v3 = make_config(deployment, {**V1, "max_num_seqs": 320})
    applied(deployment, v3)
    ends = config_history.endings([v1, v2, v3])
    # v1 has no apply of its own: it ran until v2 replaced it.
    assert [ends[c.pk].outcome for c in (v1, v2, v3)] == [
        VersionOutcome.GOOD,
        VersionOutcome.GOOD,
        VersionOutcome.RUNNING,
    ]
    rollback = review.propose_rollback(operator, v2, rationale="v3 is slower")
    assert rollback.kind == ChangeKind.ROLLBACK and rollback.target_config == v2


def test_the_page_offers_rollback_only_to_good_versions_and_refuses_a_post_for_bad_ones(
    client, operator, deployment
):
    v1, v2, _ = failed_verification(deployment)
    v3 = make_config(deployment, {**V1, "gpu_memory_utilization": 0.95})
    applied(deployment, v3)
    client.force_login(operator)
    response = client.get(reverse("changes:configs", args=[deployment.pk]))
    html = response.content.decode()
    assert 'data-testid="rollback-to-v1"' in html
    assert 'data-testid="rollback-to-v2"' not in html, "a rolled-back version is no target"
    assert 'data-testid="rollback-to-v3"' not in html, "v3 runs now"
    shown = {row["config"].version: row["ending"].outcome for row in response.context["rows"]}
    assert shown == {
        3: VersionOutcome.RUNNING,
        2: VersionOutcome.ROLLED_BACK,
        1: VersionOutcome.GOOD,
    }
    assert 'data-ending="rolled_back"' in html and "Rolled back" in html

    url = reverse("changes:propose_rollback", args=[v2.pk])
    response = client.post(url, {"rationale": "v2 looked faster"})
    assert response.status_code == 302
    assert not ChangeRequest.objects.filter(kind=ChangeKind.ROLLBACK).exists()
    message = str(next(iter(get_messages(response.wsgi_request))))
    assert "v2 rolled back" in message and "only a version that ran healthy" in message


def test_the_diff_is_against_the_version_it_was_made_from(client, viewer, deployment):
    # v2 (max_num_seqs 512) was rolled back; v3 was proposed against v1 and only raises the
    # memory share: nothing of v2's max_num_seqs belongs in v3's diff.
    v1, v2, _ = failed_verification(deployment)
    v3 = make_config(deployment, {**V1, "gpu_memory_utilization": 0.95})
    made = change(deployment, ChangeState.APPLIED, base=v1, applied_config=v3)
    made.operation = applied(deployment, v3)
    made.save()
    client.force_login(viewer)
    for url in (
        reverse("changes:configs", args=[deployment.pk]),
        reverse("changes:all_configs"),
    ):
        response = client.get(url)
        rows = {row["config"].version: row for row in response.context["rows"]}
        assert rows[3]["diff"] == {"gpu_memory_utilization": (0.9, 0.95)}
        assert rows[3]["parent"] == v1 and rows[3]["parent_recorded"]
        assert rows[2]["diff"] == {"max_num_seqs": (128, 512)}
        assert "from v1, the version it was made from" in response.content.decode()


def test_without_a_recorded_parent_the_version_before_stands_in_and_says_so(
    client, viewer, deployment
):
    make_config(deployment, {**V1, "max_num_seqs": 512})
    make_config(deployment, {**V1, "gpu_memory_utilization": 0.95})
    client.force_login(viewer)
    response = client.get(reverse("changes:configs", args=[deployment.pk]))
    row = response.context["rows"][0]
    assert row["config"].version == 3 and not row["parent_recorded"]
    assert row["diff"] == {"gpu_memory_utilization": (0.9, 0.95), "max_num_seqs": (512, 128)}
    assert "the version it was made from is not recorded" in response.content.decode()


def test_the_history_page_reads_a_bounded_number_of_queries(
    client, viewer, deployment, django_assert_max_num_queries
):
    for n in range(20):
        applied(deployment, make_config(deployment, {**V1, "max_num_seqs": 130 + n}))
    client.force_login(viewer)
    with django_assert_max_num_queries(16):
        response = client.get(reverse("changes:configs", args=[deployment.pk]))
    assert len(response.context["rows"]) == 21
