"""The fault tests of the work that resumes (issue 38 item 5): the compose worker (Redis broker,
PostgreSQL) runs a change's apply pipeline, or a sweep's lane, against an engine a real host
agent supervises, and is killed with SIGKILL mid-benchmark. The lost-work sweep (run here, as
beat runs it every minute) resumes the work on a second worker, which closes what the first
left running and takes it to a known end: the change ends (applied, verified or rolled back)
and releases its lock; the sweep's orphaned trial fails, its config comes back, the sweep ends.
The deployment runs a config the record names, never a half-applied one.

Tasks the sweep queues go to the Redis broker the workers read (the test process's own app is
in-memory); time is moved on for the pipeline's minute of grace, not waited for."""

from __future__ import annotations

import os
import signal
from datetime import timedelta
from unittest import mock

import pytest
from celery import Celery
from django.db import transaction
from django.utils import timezone

from benchmarks.models import BenchmarkRun
from changes.choices import LaneState, SweepState, TrialState
from changes.models import ChangeRequest, Sweep, SweepTrial
from changes.services import apply as change_apply
from changes.services import review, sweep_prediction, sweeps
from controlpanel import lostwork
from controlpanel.choices import OperationStatus
from controlpanel.models import AuditEntry
from hosts.models import EngineConfig, EngineOperation
from hosts.services import occupancy
from hosts.services import operations as host_operations
from tests.factories import make_host, make_profile, make_sim_deployment
from tests.hosts.agent.conftest import AgentProcess
from tests.integration.processes import compose_command, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]

GOOD = {"gpu_memory_utilization": 0.9, "max_model_len": 8192, "max_num_seqs": 64}
# Paced (4 requests a second): long enough to be caught running, short once resumed.
SLOW = {
    "stages": [{"name": "main", "request_rate": 4, "num_requests": 60}],
    "input_len": {"kind": "fixed", "mean": 256},
    "output_len": {"kind": "fixed", "mean": 32},
    "warmup_requests": 0,
}
HEARTBEAT = "0.5"
WAIT_S = 240


@pytest.fixture
def deployment(tmp_path, settings, shared_key):
    settings.CHANGE_HEALTH_TIMEOUT = 20
    settings.CHANGE_HEARTBEAT_SECONDS = float(HEARTBEAT)
    agent = AgentProcess(tmp_path, "--simulate", "h100-sxm:1").start()
    host = make_host(name="lost-pipeline-host", port=agent.port, agent_token=agent.token)
    deployment = make_sim_deployment(
        host, simulator={"gpu": "h100-sxm", "startup_seconds": 0.3, "time_scale": 0.2}
    )
    good = EngineConfig.objects.create_next(deployment, GOOD)
    op = EngineOperation.objects.create(deployment=deployment, kind="apply", config=good)
    host_operations.run_operation(EngineOperation.objects.get(pk=op.pk))
    deployment.refresh_from_db()
    assert deployment.active_config == good, EngineOperation.objects.get(pk=op.pk).error
    yield deployment
    agent.stop()


@pytest.fixture
def workers(production_env, start, shared_key):
    env = {
        **production_env,
        "CHANGE_HEARTBEAT_SECONDS": HEARTBEAT,
        "LOST_WORK_HEARTBEAT_SECONDS": HEARTBEAT,
        "CHANGE_HEALTH_TIMEOUT_SECONDS": "20",
    }
    broker = Celery(broker=production_env["REDIS_URL"], set_as_current=False)

    def send(name, *args, **options):
        broker.send_task(name, args=list(args), **options)

    def forward(name, *args, **options):
        # As enqueue_on_commit does: the worker must find the row as committed.
        transaction.on_commit(lambda: send(name, *args, **options))

    def worker(name: str):
        process = start(name, compose_command("worker"), env)
        process.wait_for_output("ready.", timeout=60)
        return process

    # What the panel's services queue reaches the workers, as in production.
    with (
        mock.patch("changes.services.apply.enqueue_on_commit", side_effect=forward),
        mock.patch("changes.services.sweeps.enqueue_on_commit", side_effect=forward),
        mock.patch("changes.services.sweep_trials.enqueue", side_effect=send),
    ):
        yield worker


def kill(process) -> None:
    os.killpg(process.proc.pid, signal.SIGKILL)
    process.proc.wait(30)


def a_minute_later():
    """``timezone.now`` for the pipeline pass, 70 s on: its grace after the stamps stop."""
    later = timezone.now() + timedelta(seconds=70)
    return mock.patch("controlpanel.workflow.timezone.now", return_value=later)


def test_a_change_whose_worker_dies_mid_baseline_is_resumed_to_an_end(
    deployment, workers, operator, approver
):
    first = workers("worker")
    change = review.propose_change(
        operator,
        deployment,
        title="more sequences",
        rationale="measured first",
        settings={**GOOD, "max_num_seqs": 96},
        verify_profile=make_profile("paced", spec=SLOW),
    )
    review.approve_change(approver, change)
    change_apply.apply_change(operator, ChangeRequest.objects.get(pk=change.pk))

    def baseline_running():
        change.refresh_from_db()
        run = change.baseline_run
        return run is not None and run.status == OperationStatus.RUNNING and run.points.exists()

    def said():
        entries = AuditEntry.objects.filter(object_id=str(change.pk))
        state = ChangeRequest.objects.get(pk=change.pk).state
        return f"{state} {list(entries.values_list('action', 'after'))}\n{first.output()[-1500:]}"

    wait_until(baseline_running, WAIT_S, said)
    lost_baseline = change.baseline_run
    kill(first)
    workers("worker-2")

    wait_until(
        lambda: not ChangeRequest.objects.get(pk=change.pk).pipeline_alive(),
        60,
        "the pipeline's stamps never stopped",
    )
    with a_minute_later():
        done = lostwork.sweep_lost_work()
    assert done["pipelines_resumed"] == 1, done

    wait_until(
        lambda: not ChangeRequest.objects.get(pk=change.pk).holds_lock,
        WAIT_S,
        lambda: f"the change never ended: {ChangeRequest.objects.get(pk=change.pk).state}",
    )
    change.refresh_from_db()
    deployment.refresh_from_db()
    assert change.state in ("applied", "unverified", "rolled_back"), (change.state, change.outcome)
    # The run the first worker was measuring is closed as measured for nobody.
    lost_baseline = BenchmarkRun.objects.get(pk=lost_baseline.pk)
    assert lost_baseline.status == "failed", lost_baseline.status
    assert "stopped during the run" in lost_baseline.error
    assert occupancy.occupants(deployment) == []
    # On a config the record names: the new one when it stayed, the snapshot when not.
    expected = change.applied_config if change.state != "rolled_back" else change.snapshot_config
    assert deployment.active_config == expected


def test_a_sweep_lane_whose_worker_dies_mid_trial_goes_on_and_restores(
    deployment, workers, operator
):
    first = workers("worker")
    with mock.patch("changes.services.sweeps.enqueue_on_commit"):
        sweep = sweeps.create_sweep(
            operator,
            deployment,
            title="lost lane",
            profile=make_profile("paced-sweep", spec=SLOW),
            space={"max_num_seqs": [32, 96]},
            slo={"ttft_p95_ms": 2000},
            max_trials=2,
            max_steps=2,
        )
    sweep = sweep_prediction.predict(Sweep.objects.get(pk=sweep.pk))
    assert sweep.state == SweepState.READY, sweep.outcome
    sweeps.start_sweep(operator, sweep)
    lane = sweep.lanes.get()
    original = lane.original_config

    def trial_measuring():
        runs = SweepTrial.objects.filter(sweep=sweep).values_list("runs", flat=True)
        return BenchmarkRun.objects.filter(
            pk__in=[pk for pk in runs if pk], status=OperationStatus.RUNNING, points__isnull=False
        ).exists()

    wait_until(trial_measuring, WAIT_S, lambda: first.output()[-3000:])
    kill(first)
    workers("worker-2")
    wait_until(
        lambda: lostwork.sweep_lost_work()["lanes_resumed"] == 1,
        60,
        "the lane was never found lost",
        interval=0.5,
    )
    wait_until(
        lambda: Sweep.objects.get(pk=sweep.pk).state not in (SweepState.RUNNING,),
        WAIT_S,
        lambda: f"the sweep never ended: {list(sweep.lanes.values('state', 'note'))}",
    )
    sweep.refresh_from_db()
    lane.refresh_from_db()
    deployment.refresh_from_db()
    assert lane.state == LaneState.RESTORED, lane.note
    assert deployment.active_config == original
    assert occupancy.occupants(deployment) == []
    orphan = sweep.trials.filter(state=TrialState.FAILED).first()
    assert orphan is not None and "stopped" in orphan.error, list(sweep.trials.values())
    assert sweep.state in (SweepState.DONE, SweepState.FAILED), sweep.outcome
