"""The apply pipeline end to end against a real host agent supervising real simulator
processes: a good change is applied and verified; a change the engine cannot start with is
rolled back with the engine's own error on the timeline; a change that regresses p95 TTFT is
rolled back after its verification benchmark; a worker lost mid-apply is resumed to a known
config; two concurrent applies on PostgreSQL: one wins, the other is refused."""

from __future__ import annotations

import threading
import time

import pytest
from django.db import close_old_connections

from benchmarks.models import RunPoint
from changes import rules
from changes.models import ChangeRequest
from changes.services import apply as change_apply
from changes.services import pipeline, review, verification
from controlpanel.models import AuditEntry
from hosts.models import EngineConfig, EngineOperation
from hosts.services import operations as host_operations
from tests.factories import make_finished_run, make_host, make_profile, make_sim_deployment
from tests.hosts.agent.conftest import AgentProcess

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]

# Small and quick: 8 streams, 48 measured requests of 256 → 32 tokens on a simulated H100
# running 5× faster than real time.
PROFILE = {
    "stages": [{"name": "main", "concurrency": 8, "num_requests": 48}],
    "input_len": {"kind": "fixed", "mean": 256},
    "output_len": {"kind": "fixed", "mean": 32},
    "warmup_requests": 4,
}
GOOD = {"gpu_memory_utilization": 0.9, "max_model_len": 8192, "max_num_seqs": 64}


@pytest.fixture
def agent(tmp_path):
    process = AgentProcess(tmp_path, "--simulate", "h100-sxm:1").start()
    yield process
    process.stop()


@pytest.fixture
def fleet(agent, settings):
    settings.CHANGE_HEALTH_TIMEOUT = 10
    settings.CHANGE_HEARTBEAT_SECONDS = 1
    host = make_host(name="change-host", port=agent.port, agent_token=agent.token)
    deployment = make_sim_deployment(
        host, simulator={"gpu": "h100-sxm", "startup_seconds": 0.3, "time_scale": 0.2}
    )
    good = EngineConfig.objects.create_next(deployment, GOOD)
    op = EngineOperation.objects.create(deployment=deployment, kind="apply", config=good)
    host_operations.run_operation(EngineOperation.objects.get(pk=op.pk))
    deployment.refresh_from_db()
    assert deployment.active_config == good, EngineOperation.objects.get(pk=op.pk).error
    return deployment


def approved(operator, approver, deployment, settings, **kw):
    change = review.propose_change(
        operator,
        deployment,
        title=kw.pop("title", "tune"),
        rationale="measured first",
        settings={**deployment.active_config.settings, **settings},
        **kw,
    )
    review.approve_change(approver, change)
    return change


def apply_inline(operator, change) -> ChangeRequest:
    """What apply_change + the Celery task do, with the pipeline run here."""
    from unittest import mock

    with mock.patch("changes.tasks.apply_change.apply_async"):
        change_apply.apply_change(operator, change)
    pipeline.run_pipeline(change.pk, "test-worker")
    change.refresh_from_db()
    return change


def stages(change) -> list[tuple[str, str]]:
    return [
        (e.after["stage"], e.after["status"])
        for e in AuditEntry.objects.filter(
            object_id=str(change.pk), action="change.stage"
        ).order_by("pk")
    ]


# The verification compares two real-time runs (limit +100 %): the machine must keep time.
@pytest.mark.timing
def test_a_good_change_is_applied_and_verified(fleet, operator, approver):
    deployment = fleet
    before = deployment.active_config
    change = approved(
        operator,
        approver,
        deployment,
        {"max_num_seqs": 128},
        verify_profile=make_profile(spec=PROFILE),
        # 8 streams of a simulated engine at ~6 ms a token on a loaded two-core machine: the
        # scheduler alone moves p95 ITL by a third between two runs. This test is about the
        # pipeline reaching "applied"; judging small regressions is advice's (unit-tested),
        # and a real regression is the max_num_seqs=1 test below.
        thresholds={"max_ttft_p95_regression": 1.0, "max_itl_p95_regression": 1.0},
    )
    change = apply_inline(operator, change)
    # When that noise (p95 TTFT of tens of ms, 48 requests) straddles even a +100 % limit,
    # the pipeline measures again (up to the change's budget of extra runs), then says it
    # cannot judge (applied, not verified) instead of rolling back on it.
    verified = change.comparison.get("outcome") == "verified"
    end = "applied" if verified else "unverified"
    assert change.state == end, (change.outcome, stages(change))
    deployment.refresh_from_db()
    assert deployment.active_config == change.applied_config
    assert change.applied_config.version == before.version + 1
    assert change.applied_config.settings["max_num_seqs"] == 128
    assert change.snapshot_config == before
    assert stages(change) == [
        ("snapshot", "started"),
        ("snapshot", "succeeded"),
        # The restart before the baseline: it starts cold, like the verification.
        ("prepare", "started"),
        ("prepare", "succeeded"),
        ("baseline", "started"),
        ("baseline", "succeeded"),
        ("apply", "started"),
        ("apply", "succeeded"),
        ("restart", "started"),
        ("restart", "succeeded"),
        ("health", "started"),
        ("health", "succeeded"),
        ("verify", "started"),
        ("verify", "succeeded"),
        ("compare", "started"),
        # When the noise band spans a limit, extra verification runs (the change's budget)
        # before the verdict (issue 37).
        *[("compare", "started"), ("compare", "succeeded")] * change.extra_runs.count(),
        ("compare", "succeeded" if verified else "inconclusive"),
        ("done", "succeeded" if verified else "inconclusive"),
    ]
    assert change.extra_runs.count() <= change.max_extra_runs
    baseline, verification = change.baseline_run, change.verification_run
    assert baseline.engine_config == before and verification.engine_config == change.applied_config
    assert baseline.completed == verification.completed == 48
    assert not change.comparison["regressed"]
    transitions = [
        (e.before["state"], e.after["state"])
        for e in AuditEntry.objects.filter(
            object_id=str(change.pk), action="change.transition"
        ).order_by("pk")
    ]
    assert transitions[-3:] == [
        ("approved", "applying"),
        ("applying", "verifying"),
        ("verifying", end),
    ]
    assert change.pipeline_owner == "" and change_apply.lock_holder(deployment) is None


def test_a_change_that_cannot_start_is_rolled_back_with_the_engine_error(fleet, operator, approver):
    deployment = fleet
    before = deployment.active_config
    change = approved(operator, approver, deployment, {"gpu_memory_utilization": 0.1})
    change = apply_inline(operator, change)
    assert change.state == "rolled_back", (change.outcome, stages(change))
    assert "No available memory for the cache blocks" in change.outcome
    restart = AuditEntry.objects.get(
        object_id=str(change.pk),
        action="change.stage",
        after__stage="restart",
        after__status="failed",
    )
    assert "No available memory for the cache blocks" in (
        restart.after["message"] + restart.after.get("detail", "")
    )
    assert ("rollback", "succeeded") in stages(change)
    deployment.refresh_from_db()
    assert deployment.active_config == before and deployment.status == "running"
    # The host really runs the last good config again.
    assert verification.health_problem(deployment) is None


def test_a_p95_ttft_regression_is_rolled_back(fleet, operator, approver):
    deployment = fleet
    before = deployment.active_config
    # One sequence at a time: 8 concurrent clients now queue behind each other.
    change = approved(
        operator,
        approver,
        deployment,
        {"max_num_seqs": 1, "max_num_batched_tokens": 8192},
        verify_profile=make_profile(spec=PROFILE),
    )
    change = apply_inline(operator, change)
    assert change.state == "rolled_back", (change.outcome, stages(change))
    assert change.outcome.startswith("regression: TTFT p95"), change.outcome
    assert change.comparison["regressed"]
    ttft = next(c for c in change.comparison["checks"] if c["metric"] == "ttft_p95_ms")
    assert ttft["ok"] is False and ttft["change"] > 0.2
    assert stages(change)[-3:] == [
        ("compare", "failed"),
        ("rollback", "started"),
        ("rollback", "succeeded"),
    ]
    deployment.refresh_from_db()
    assert deployment.active_config == before
    assert change.rollback_operation.config == before
    assert change.rollback_operation.outcome == "ready"


def test_a_pipeline_lost_mid_restart_is_resumed_to_a_known_config(fleet, operator, approver):
    deployment = fleet
    before = deployment.active_config
    change = approved(operator, approver, deployment, {"max_num_seqs": 96})
    from unittest import mock

    with mock.patch("changes.tasks.apply_change.apply_async"):
        change_apply.apply_change(operator, change)
    # The first worker got as far as asking the host for the restart, then died: its
    # operation row says running and nobody stamps the change any more.
    with mock.patch.object(
        host_operations, "run_operation", side_effect=SystemExit("worker killed")
    ):
        with pytest.raises(SystemExit):
            pipeline.run_pipeline(change.pk, "worker-that-dies")
    change.refresh_from_db()
    assert change.state == "applying" and change.operation is not None
    EngineOperation.objects.filter(pk=change.operation_id).update(status="running")
    ChangeRequest.objects.filter(pk=change.pk).update(pipeline_heartbeat_at=None)

    # A resume (by hand, or the broker's redelivery) takes it to an end with a record.
    with mock.patch("changes.tasks.apply_change.apply_async") as task:
        change_apply.resume_change(operator, change)
    assert task.called
    pipeline.run_pipeline(change.pk, "second-worker")
    change.refresh_from_db()
    assert change.state == "rolled_back", (change.outcome, stages(change))
    operation = EngineOperation.objects.get(pk=change.operation_id)
    assert "the worker stopped during the operation" in operation.error
    deployment.refresh_from_db()
    assert deployment.active_config == before
    assert verification.health_problem(deployment) is None


def test_concurrent_applies_one_wins_one_is_refused(postgres, fleet, operator, approver):
    deployment = fleet
    first = approved(operator, approver, deployment, {"max_num_seqs": 96}, title="a")
    second = approved(operator, approver, deployment, {"max_num_seqs": 32}, title="b")
    barrier = threading.Barrier(2)
    outcomes = {}
    from unittest import mock

    def apply(change):
        try:
            barrier.wait()
            change_apply.apply_change(operator, change)
            outcomes[change.pk] = "started"
        except rules.ChangeRefused as exc:
            outcomes[change.pk] = str(exc)
        finally:
            close_old_connections()

    with mock.patch("changes.tasks.apply_change.apply_async"):
        threads = [threading.Thread(target=apply, args=(c,)) for c in (first, second)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
    assert sorted(v == "started" for v in outcomes.values()) == [False, True], outcomes
    refused = next(v for v in outcomes.values() if v != "started")
    assert "locked by change #" in refused
    states = sorted(ChangeRequest.objects.values_list("state", flat=True))
    assert states == ["applying", "approved"]


def test_roll_back_now_during_the_verification(fleet, operator, approver):
    deployment = fleet
    before = deployment.active_config
    long_profile = dict(PROFILE, stages=[{"name": "main", "concurrency": 4, "num_requests": 4000}])
    change = approved(
        operator,
        approver,
        deployment,
        {"max_num_seqs": 96},
        verify_profile=make_profile(spec=long_profile),
        baseline_run=make_finished_run(deployment, engine_config=before),
    )
    from unittest import mock

    with mock.patch("changes.tasks.apply_change.apply_async"):
        change_apply.apply_change(operator, change)
    worker = threading.Thread(target=pipeline.run_pipeline, args=(change.pk, "w"))
    worker.start()
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            run_pk = ChangeRequest.objects.get(pk=change.pk).verification_run_id
            if run_pk and RunPoint.objects.filter(run_id=run_pk).exists():
                break
            time.sleep(0.2)
        else:
            raise AssertionError(stages(change))
        asked = time.monotonic()
        change_apply.request_rollback(
            approver, ChangeRequest.objects.get(pk=change.pk), "p99 spikes"
        )
        worker.join(60)
    finally:
        close_old_connections()
    change.refresh_from_db()
    assert change.state == "rolled_back", (change.outcome, stages(change))
    assert time.monotonic() - asked < 30, "the running benchmark was not cancelled"
    assert change.verification_run.status == "cancelled"
    assert "rollback was requested during the verification" in change.outcome
    deployment.refresh_from_db()
    assert deployment.active_config == before
