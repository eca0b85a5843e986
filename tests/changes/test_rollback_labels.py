"""Rollbacks are called rollbacks wherever engine operations are listed: the pipeline's own
rollback after a failed verification, a reviewed rollback change, and (rows from before
operations carried a note) an apply back to an older version. The pipeline runs against the
scripted host of ``test_pipeline_stages``; then the end-to-end story of the config history:
the rolled-back version is marked and offered no rollback button."""

from __future__ import annotations

from unittest import mock

import pytest
from django.urls import reverse

from changes.choices import ChangeKind, VersionOutcome
from changes.models import ChangeRequest
from changes.services import apply as change_apply
from changes.services import config_history, review
from hosts.models import EngineOperation
from tests.changes import test_pipeline_stages as scripted

# The scripted host, health check and benchmarks of the pipeline's own tests.
applying, run = scripted.applying, scripted.run
deployment, host, health, bench = (
    scripted.deployment,
    scripted.host,
    scripted.health,
    scripted.bench,
)

pytestmark = pytest.mark.django_db


def host_page(client, user, deployment) -> str:
    client.force_login(user)
    response = client.get(reverse("hosts:detail", args=[deployment.host_id]))
    assert response.status_code == 200
    return response.content.decode()


def test_the_pipelines_rollback_after_a_failed_verification_is_labelled(
    client, operator, approver, viewer, deployment, host, health, bench
):
    bench.numbers["verification"]["ttft_p95_ms"] = 900.0
    change = run(applying(operator, approver, deployment))
    assert change.state == "rolled_back"

    rollback = change.rollback_operation
    assert rollback.note.startswith(f"Rollback to v1 (change #{change.pk}: regression: TTFT p95")
    assert change.operation.note == "", "the change's own apply is a plain apply"
    html = host_page(client, viewer, deployment)
    assert f"Rollback to v1 (change #{change.pk}: regression" in html
    assert "Apply config v2" in html
    detail = client.get(reverse("hosts:operation", args=[rollback.pk])).content.decode()
    assert f'data-testid="operation-label">Rollback to v1 (change #{change.pk}' in detail

    # The config history agrees: v2 was rolled back, and is no rollback target.
    v1, v2 = change.snapshot_config, change.applied_config
    ends = config_history.endings([v1, v2])
    assert ends[v2.pk].outcome == VersionOutcome.ROLLED_BACK
    assert ends[v1.pk].outcome == VersionOutcome.RUNNING
    page = client.get(reverse("changes:configs", args=[deployment.pk])).content.decode()
    assert 'data-ending="rolled_back"' in page and 'data-testid="rollback-to-v2"' not in page


def test_a_reviewed_rollback_changes_apply_is_labelled(
    client, operator, approver, viewer, deployment, host, health, bench
):
    first = run(applying(operator, approver, deployment, verify=False))
    assert first.state == "applied"
    target = first.snapshot_config
    rollback = review.propose_rollback(operator, target, rationale="v2 doubled the p95 TTFT.")
    assert rollback.kind == ChangeKind.ROLLBACK
    review.approve_change(approver, rollback)
    with mock.patch("changes.tasks.apply_change.apply_async"):
        change_apply.apply_change(operator, ChangeRequest.objects.get(pk=rollback.pk))
    rollback = run(ChangeRequest.objects.get(pk=rollback.pk))
    assert rollback.state == "applied"

    assert rollback.operation.note == (
        f"Rollback to v1 (change #{rollback.pk}: v2 doubled the p95 TTFT.)"
    )
    assert rollback.operation.note in host_page(client, viewer, deployment)


def test_an_older_apply_back_to_an_earlier_version_is_still_called_a_rollback(
    client, viewer, deployment
):
    v1 = deployment.active_config
    v2 = deployment.configs.create(version=2, settings={"max_num_seqs": 96})
    for config, previous in ((v2, v1), (v1, v2)):
        EngineOperation.objects.create(
            deployment=deployment,
            kind="apply",
            config=config,
            previous_config=previous,
            status="succeeded",
            outcome="ready",
        )
    html = host_page(client, viewer, deployment)
    assert "Rollback to v1 (from v2)" in html and "Apply config v2" in html
