"""Work that outlives a lost worker (issue 38 item 5, ``controlpanel.lostwork``): every long
job holds a claim with a heartbeat while its task runs; one sweep ends the jobs whose claim went
stale through their kind's own failure path (which releases what they held), a cancel of a lost
job ends it at once, and a live worker's job is never touched. The kill of a real worker is
tests/integration/test_lost_workers.py; here the claims are made as a dead worker leaves them."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from benchmarks.models import BenchmarkRun, ProbeRun
from benchmarks.services import probes
from benchmarks.services import runs as run_services
from changes.choices import SweepState
from changes.models import Sweep
from changes.rules_sweeps import SweepRefused
from controlpanel import lostwork
from controlpanel.choices import OperationStatus
from controlpanel.models import WorkClaim
from hosts.choices import OperationOutcome
from hosts.models import EngineOperation
from hosts.services import occupancy
from scaling.models import WhatIfPlan
from tests.changes.test_sweep_services import create
from tests.factories import make_config, make_deployment, make_host, make_run

pytestmark = pytest.mark.django_db

PROBE_LINE = (
    b'{"id": "q1", "category": "factual", "language": "en", "messages": [{"role": "user", '
    b'"content": "2+2?"}], "answer": {"scorer": "exact", "expected": "4"}, "reference": "4", '
    b'"wrong": "5", "max_tokens": 8}\n'
)


def left_by_a_dead_worker(row, seconds_ago: float = 600) -> WorkClaim:
    """The claim a worker that died ``seconds_ago`` left: its heartbeat stopped then."""
    at = timezone.now() - timedelta(seconds=seconds_ago)
    return WorkClaim.objects.create(
        kind=lostwork.kind_of(row),
        object_id=row.pk,
        owner="worker-7:4242:1",
        claimed_at=at,
        heartbeat_at=at,
    )


@pytest.fixture
def deployment():
    deployment = make_deployment(make_host())
    deployment.active_config = make_config(deployment, {"max_num_seqs": 64})
    deployment.save()
    return deployment


def probe_on(deployment) -> ProbeRun:
    probe_set = probes.upload_set(None, "lost", PROBE_LINE)
    run = probes.start_probe(None, deployment, probe_set, enqueue=False)
    run.transition_to(OperationStatus.RUNNING)
    return run


def test_a_lost_probe_is_failed_with_the_words_and_frees_its_deployment(deployment):
    run = probe_on(deployment)
    assert occupancy.occupants(deployment)  # the probe holds the engine
    left_by_a_dead_worker(run)
    assert lostwork.sweep_lost_work()["ended"] == [f"benchmarks.proberun #{run.pk}"]
    run.refresh_from_db()
    assert run.status == "failed"
    assert "its worker (worker-7:4242:1) stopped answering: last heard of at" in run.error
    assert "the job was ended, not finished" in run.error
    assert occupancy.occupants(deployment) == []
    assert not WorkClaim.objects.exists()
    # A second pass finds nothing.
    assert lostwork.sweep_lost_work()["ended"] == []


def test_a_live_workers_job_is_left_alone(deployment, settings):
    settings.LOST_WORK_AFTER_SECONDS = 120
    run = probe_on(deployment)
    left_by_a_dead_worker(run, seconds_ago=30)  # beat 30 s ago: alive, if slow
    assert lostwork.sweep_lost_work()["ended"] == []
    run.refresh_from_db()
    assert run.status == "running" and not lostwork.is_lost(run)


def test_a_job_without_a_claim_is_its_owners_business(deployment):
    """A benchmark a change's pipeline runs inline holds no claim: the pipeline's own
    heartbeat, or the benchmark's silence check, decides about it."""
    run = make_run(deployment, status="running", started_at=timezone.now())
    assert lostwork.end_lost() == [] and not lostwork.is_lost(run)


def test_cancel_of_a_lost_probe_ends_it_at_once(deployment):
    """It answered 200 and changed nothing: the flag was for a worker that was gone."""
    run = probe_on(deployment)
    left_by_a_dead_worker(run)
    probes.cancel_probe(None, run)
    run.refresh_from_db()
    assert run.status == "cancelled" and "its worker was lost" in run.error
    assert "stopped answering" in run.log
    assert occupancy.occupants(deployment) == [] and not WorkClaim.objects.exists()


def test_cancel_of_a_live_probe_asks_its_worker(deployment):
    run = probe_on(deployment)
    left_by_a_dead_worker(run, seconds_ago=1)
    probes.cancel_probe(None, run)
    run.refresh_from_db()
    assert run.status == "running" and run.cancel_requested


def test_cancel_of_a_lost_benchmark_ends_it_at_once(deployment):
    run = make_run(deployment, status="running", started_at=timezone.now())
    left_by_a_dead_worker(run)
    run_services.cancel_benchmark(None, run)
    run.refresh_from_db()
    assert run.status == "cancelled" and not WorkClaim.objects.exists()


def test_each_kind_is_ended_its_own_way(deployment, operator):
    operation = EngineOperation.objects.create(
        deployment=deployment, kind="apply", config=deployment.active_config, status="running"
    )
    plan = WhatIfPlan.objects.create(deployment=deployment, status="running")
    benchmark = make_run(make_deployment(make_host()), status="running")
    for row in (operation, plan, benchmark):
        left_by_a_dead_worker(row)
    ended = lostwork.end_lost()
    assert len(ended) == 3
    operation.refresh_from_db()
    assert (operation.status, operation.outcome) == ("failed", OperationOutcome.FAILED)
    deployment.refresh_from_db()
    assert deployment.status == "unknown" and "stopped answering" in deployment.status_detail
    assert WhatIfPlan.objects.get(pk=plan.pk).status == "failed"
    assert BenchmarkRun.objects.get(pk=benchmark.pk).status == "failed"


def test_a_lost_prediction_ends_the_sweep_failed_not_predicting_for_ever(deployment, operator):
    sweep = create(operator, deployment)
    assert sweep.state == SweepState.PREDICTING
    left_by_a_dead_worker(sweep)
    lostwork.end_lost()
    sweep.refresh_from_db()
    assert sweep.state == SweepState.FAILED
    assert sweep.outcome.startswith("the prediction failed: its worker")


def test_queued_predictions_and_open_sweeps_have_a_quota(deployment, operator, settings):
    settings.SWEEPS_PREDICTING_PER_USER = 2
    settings.SWEEPS_OPEN_PER_USER = 3
    first, second = create(operator, deployment), create(operator, deployment)
    with pytest.raises(SweepRefused, match="You have 2 sweeps still predicting .at most 2"):
        create(operator, deployment)
    Sweep.objects.filter(pk=first.pk).update(state=SweepState.PENDING)
    third = create(operator, deployment)  # one predicting fewer: allowed
    Sweep.objects.filter(pk__in=[second.pk, third.pk]).update(state=SweepState.READY)
    with pytest.raises(SweepRefused, match="You have 3 sweeps not finished .at most 3"):
        create(operator, deployment)
    Sweep.objects.filter(pk=first.pk).update(state=SweepState.DONE)
    create(operator, deployment)


def test_the_sweep_is_one_beat_task(settings):
    from controlpanel.celery import app

    entry = app.conf.beat_schedule["sweep-lost-work"]
    assert entry == {"task": "controlpanel.tasks.sweep_lost_work", "schedule": 60.0}
    # The passes it replaced are not scheduled on their own any more.
    names = {e["task"] for e in app.conf.beat_schedule.values()}
    assert not names & {
        "benchmarks.tasks.fail_stale_runs",
        "changes.tasks.resume_lost_pipelines",
        "changes.tasks.resume_lost_sweep_lanes",
    }


def test_a_day_old_claim_of_work_that_resumes_on_its_own_is_forgotten(deployment, operator):
    """A pipeline's or a lane's claim is replaced when the work resumes; one left by work that
    ended another way goes after a day (it is only a record), an hour-old one stays."""
    sweep = create(operator, deployment)
    lane = sweep.lanes.get()
    day_old = left_by_a_dead_worker(lane, seconds_ago=2 * 86400)
    WorkClaim.objects.filter(pk=day_old.pk).update(kind="changes.sweeplane")
    recent = left_by_a_dead_worker(sweep, seconds_ago=3600)
    WorkClaim.objects.filter(pk=recent.pk).update(kind="changes.changerequest")
    lostwork.end_lost()
    assert list(WorkClaim.objects.values_list("kind", flat=True)) == ["changes.changerequest"]
