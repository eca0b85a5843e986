"""Tuning sweeps without an engine: what is refused at creation, the prediction's outcomes
(trials chosen, an infeasible space, no point meeting the SLO), approvals, the queue's
budget and cancel, the winner and the end-of-sweep text, lost lanes, the deployment hold.
The worker path against a real agent and simulator is test_sweep_agent.py."""

from __future__ import annotations

from datetime import timedelta
from unittest import mock

import pytest
from django.core.exceptions import PermissionDenied
from django.utils import timezone

from changes.choices import LaneState, SweepState, TrialState
from changes.models import Sweep, SweepLane
from changes.rules_sweeps import SweepRefused
from changes.services import sweep_prediction, sweep_trials, sweeps
from controlpanel.models import AuditEntry
from hosts.services import occupancy
from hosts.transport.base import ApplyOutcome, TransportError
from tests.factories import make_config, make_host, make_profile, make_sim_deployment

pytestmark = [pytest.mark.django_db, pytest.mark.sqlite]

BASE = {"gpu_memory_utilization": 0.9, "max_model_len": 8192, "max_num_seqs": 4}
LOAD = {
    "stages": [{"name": "main", "request_rate": 10, "num_requests": 100}],
    "input_len": {"kind": "fixed", "mean": 256},
    "output_len": {"kind": "fixed", "mean": 32},
}


@pytest.fixture
def deployment():
    deployment = make_sim_deployment(make_host(name="sweep-unit"))
    deployment.active_config = make_config(deployment, BASE)
    deployment.save()
    return deployment


def create(user, deployment, **kw) -> Sweep:
    with mock.patch("changes.services.sweeps.enqueue_on_commit"):
        return sweeps.create_sweep(
            user,
            deployment,
            title="t",
            profile=kw.pop("profile", None) or make_profile(spec=LOAD),
            space=kw.pop("space", {"max_num_seqs": [2, 8, 16]}),
            slo=kw.pop("slo", {"ttft_p95_ms": 300}),
            **kw,
        )


def predicted(user, deployment, **kw) -> Sweep:
    return sweep_prediction.predict(Sweep.objects.get(pk=create(user, deployment, **kw).pk))


# --- creation ----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "kw, field, words",
    [
        ({"space": {}}, "space", "at least one flag"),
        ({"space": {"max_num_seqz": [1]}}, "space", "max_num_seqz"),
        ({"space": {"max_num_seqs": "a,b"}}, "space", "max_num_seqs"),
        ({"space": {"api_key": ["x"]}}, "space", "api_key"),
        ({"slo": {}}, "slo", "latency limit"),
        ({"slo": {"ttft_p95_ms": -1}}, "slo", "ttft_p95_ms"),
        ({"load_mode": "bursts"}, "load_mode", "rate"),
        ({"max_trials": 0}, "max_trials", "Between 1 and 30"),
        ({"max_steps": 40}, "max_steps", "Between 2 and 12"),
    ],
)
def test_bad_input_is_refused_by_field_and_nothing_is_stored(
    operator, deployment, kw, field, words
):
    with pytest.raises(sweeps.SweepInvalid) as refused:
        create(operator, deployment, **kw)
    assert words in refused.value.errors[field]
    assert not Sweep.objects.exists()


def test_space_errors_name_their_flag(operator, deployment):
    with pytest.raises(sweeps.SweepInvalid) as refused:
        create(operator, deployment, space={"max_num_seqs": [0], "max_model_len": [8192]})
    assert set(refused.value.space_errors) == {"max_num_seqs"}


def test_cost_objective_needs_a_price(operator, deployment):
    deployment.host.hourly_price = 0
    deployment.host.save()
    with pytest.raises(sweeps.SweepInvalid) as refused:
        create(operator, deployment, objective="cost_per_million")
    assert "hourly price" in refused.value.errors["objective"]


def test_viewers_cannot_make_sweeps(viewer, deployment):
    with pytest.raises(PermissionDenied):
        create(viewer, deployment)


def test_a_sweep_needs_a_running_config(operator, deployment):
    deployment.active_config = None
    deployment.save()
    with pytest.raises(sweeps.SweepInvalid, match="no running config"):
        create(operator, deployment)


# --- the prediction ----------------------------------------------------------------------------
def test_prediction_chooses_the_control_and_the_best_points(operator, deployment):
    sweep = predicted(operator, deployment, max_trials=3)
    assert sweep.state == SweepState.READY
    trials = list(sweep.trials.order_by("index"))
    assert trials[0].is_control and trials[0].settings == BASE
    assert [t.point for t in trials[1:]] == [{"max_num_seqs": 16}, {"max_num_seqs": 8}]
    assert [t.predicted_rank for t in trials[1:]] == [1, 2]
    assert sweep.prediction["counts"]["total"] == 3
    # The control has its prediction too, for its prediction error.
    assert trials[0].predicted["max_load"] > 0


def test_an_infeasible_space_fails_with_the_engines_words(operator, deployment):
    sweep = predicted(operator, deployment, space={"gpu_memory_utilization": [0.05, 0.06]})
    assert sweep.state == SweepState.FAILED
    assert "No config of the space can start" in sweep.outcome
    assert "memory" in sweep.outcome.lower()
    assert not sweep.trials.exists()
    assert sweep.lanes.get().state == LaneState.RESTORED  # never held anything


def test_no_point_meeting_the_slo_is_said_with_the_closest(operator, deployment):
    sweep = predicted(operator, deployment, slo={"ttft_p95_ms": 1})
    assert sweep.prediction["no_point_meets"] is True
    assert sweep.prediction["closest"] is not None
    # Trials still run (a prediction is not proof): the closest candidates.
    assert sweep.trials.count() == sweep.max_trials


def test_a_production_host_needs_two_approvals_never_the_authors(
    operator, approver, admin, deployment
):
    deployment.host.labels = {"env": "production"}
    deployment.host.save()
    sweep = predicted(operator, deployment)
    assert sweep.required_approvals == 2
    assert sweep.state == SweepState.PENDING
    with pytest.raises(SweepRefused):
        sweeps.start_sweep(operator, sweep)
    with pytest.raises(PermissionDenied):
        sweeps.review_sweep(operator, sweep, "approve")  # Operators do not review
    sweeps.review_sweep(approver, sweep, "approve")
    assert Sweep.objects.get(pk=sweep.pk).state == SweepState.PENDING
    with pytest.raises(SweepRefused, match="already reviewed"):
        sweeps.review_sweep(approver, sweep, "approve")
    sweeps.review_sweep(admin, sweep, "approve", "looks safe")
    assert Sweep.objects.get(pk=sweep.pk).state == SweepState.READY


def test_a_host_labelled_production_after_creation_needs_its_approvals_at_start(
    operator, approver, admin, deployment
):
    """Issue 38 item 7, the sweep's side: the count was fixed at creation, so a sweep made on
    an unlabelled host ran on it with none after an Admin labelled it production."""
    sweep = predicted(operator, deployment)
    assert sweep.required_approvals == 0 and sweep.state == SweepState.READY
    deployment.host.labels = {"env": "production"}
    deployment.host.save()
    with pytest.raises(SweepRefused, match="back in review: a host it restarts is labelled"):
        sweeps.start_sweep(operator, sweep)
    sweep.refresh_from_db()
    assert (sweep.state, sweep.required_approvals) == (SweepState.PENDING, 2)
    assert not sweep.lanes.filter(state=LaneState.QUEUED).exists()
    assert AuditEntry.objects.filter(action="sweep.approvals_required", object_id=str(sweep.pk))
    sweeps.review_sweep(approver, sweep, "approve")
    assert Sweep.objects.get(pk=sweep.pk).state == SweepState.PENDING  # one of two
    sweeps.review_sweep(admin, sweep, "approve")
    assert started(operator, Sweep.objects.get(pk=sweep.pk)).state == SweepState.RUNNING


def test_approvals_are_recounted_when_reviewed(operator, approver, admin, deployment):
    deployment.host.labels = {"env": "production"}
    deployment.host.save()
    sweep = predicted(operator, deployment)
    Sweep.objects.filter(pk=sweep.pk).update(required_approvals=1)  # as counted long ago
    sweeps.review_sweep(approver, sweep, "approve")
    sweep.refresh_from_db()
    assert (sweep.state, sweep.required_approvals) == (SweepState.PENDING, 2)


def test_a_rejected_sweep_ends_and_its_trials_never_run(operator, approver, deployment):
    deployment.host.labels = {"env": "production"}
    deployment.host.save()
    sweep = predicted(operator, deployment)
    sweeps.review_sweep(approver, sweep, "reject", "not during the sale")
    sweep.refresh_from_db()
    assert sweep.state == SweepState.REJECTED
    assert "not during the sale" in sweep.outcome
    assert not sweep.trials.filter(state=TrialState.QUEUED).exists()


def test_cancel_while_predicting_creates_no_trials(operator, deployment):
    sweep = create(operator, deployment)
    sweeps.cancel_sweep(operator, sweep)
    sweep_prediction.predict(Sweep.objects.get(pk=sweep.pk))
    sweep.refresh_from_db()
    assert sweep.state == SweepState.CANCELLED
    assert not sweep.trials.exists()


# --- running -----------------------------------------------------------------------------------
def started(user, sweep) -> Sweep:
    with mock.patch("changes.services.sweeps.enqueue_on_commit") as queued:
        sweeps.start_sweep(user, sweep)
    assert queued.call_count == sweep.lanes.count()
    return Sweep.objects.get(pk=sweep.pk)


def test_a_running_sweep_holds_its_deployment(operator, deployment):
    sweep = started(operator, predicted(operator, deployment))
    lane = sweep.lanes.get()
    assert lane.state == LaneState.QUEUED
    (holder,) = occupancy.occupants(deployment)
    assert holder.subject == sweep and "sweep" in holder.text.lower()


def test_a_config_changed_since_the_sweep_refuses_its_start(operator, deployment):
    sweep = predicted(operator, deployment)
    deployment.active_config = make_config(deployment, {**BASE, "max_num_seqs": 6})
    deployment.save()
    with pytest.raises(SweepRefused, match="no longer runs"):
        sweeps.start_sweep(operator, sweep)


def test_the_wall_time_budget_skips_trials_not_started(operator, deployment):
    sweep = started(operator, predicted(operator, deployment))
    Sweep.objects.filter(pk=sweep.pk).update(started_at=timezone.now() - timedelta(hours=2))
    lane = sweep.lanes.get()
    assert sweep_trials._next_trial(lane) is None
    skipped = sweep.trials.filter(state=TrialState.SKIPPED)
    assert skipped.count() == sweep.trials.count()
    assert "wall-time budget" in skipped.first().note


def test_a_lane_lost_by_its_worker_is_found_and_taken_over(operator, deployment, settings):
    settings.CHANGE_HEARTBEAT_SECONDS = 1
    sweep = started(operator, predicted(operator, deployment))
    lane = sweep.lanes.get()
    assert sweep_trials.claim_lane(lane.pk, "worker-a") is not None
    trial = sweep_trials._next_trial(SweepLane.objects.get(pk=lane.pk))
    assert sweep_trials.claim_lane(lane.pk, "worker-b") is None  # worker-a is alive
    SweepLane.objects.filter(pk=lane.pk).update(heartbeat_at=timezone.now() - timedelta(10))
    assert list(sweep_trials.lost_lanes()) == [lane]
    taken = sweep_trials.claim_lane(lane.pk, "worker-b")
    assert taken is not None and taken.owner == "worker-b"
    sweep_trials._fail_orphans(taken)
    trial.refresh_from_db()
    assert trial.state == TrialState.FAILED and "stopped" in trial.error


def measured(sweep, index, objective, *, met=True, state=TrialState.SUCCEEDED, **kw):
    trial = sweep.trials.get(index=index)
    trial.state, trial.met_slo, trial.objective_value = state, met, objective
    trial.max_load = kw.pop("max_load", 10.0)
    trial.numbers = {"output_tps_per_gpu": objective, "ttft_p95_ms": 200}
    trial.probes = [{"load": trial.max_load, "margin": kw.pop("margin", 0.1), "ok": met}]
    trial.finished_at = timezone.now()
    trial.save()
    return trial


def ended(sweep) -> Sweep:
    SweepLane.objects.filter(sweep=sweep).update(state=LaneState.RESTORED)
    sweep_trials.finish_if_done(sweep.pk)
    return Sweep.objects.get(pk=sweep.pk)


def test_the_winner_is_the_best_measured_that_met_the_slo(operator, deployment):
    sweep = started(operator, predicted(operator, deployment, max_trials=3))
    measured(sweep, 1, 800.0)
    measured(sweep, 2, 2000.0, met=False)  # faster, but out of SLO: not a winner
    winner = measured(sweep, 3, 1200.0)
    sweep = ended(sweep)
    assert sweep.state == SweepState.DONE
    assert sweep.winner == winner
    assert "Winner: trial 3" in sweep.outcome and "+50%" in sweep.outcome


def test_cost_objective_takes_the_cheapest(operator, deployment):
    sweep = started(operator, predicted(operator, deployment, max_trials=3))
    Sweep.objects.filter(pk=sweep.pk).update(objective="cost_per_million")
    sweep.refresh_from_db()
    measured(sweep, 1, 3.0)
    cheapest = measured(sweep, 2, 1.5)
    measured(sweep, 3, 2.0)
    assert ended(sweep).winner == cheapest


def test_no_trial_meeting_the_slo_says_so_with_the_closest(operator, deployment):
    sweep = started(operator, predicted(operator, deployment, max_trials=2))
    measured(sweep, 1, 800.0, met=False, margin=-0.5)
    measured(sweep, 2, 900.0, met=False, margin=-0.1)
    sweep = ended(sweep)
    assert sweep.winner is None and sweep.state == SweepState.DONE
    assert "No trial met the SLO" in sweep.outcome and "closest: trial 2" in sweep.outcome
    with pytest.raises(SweepRefused, match="no winner"):
        sweeps.propose_winner(operator, sweep)


def test_a_failed_restore_fails_the_sweep_and_says_so(operator, deployment):
    sweep = started(operator, predicted(operator, deployment, max_trials=2))
    measured(sweep, 1, 800.0)
    measured(sweep, 2, 900.0)
    SweepLane.objects.filter(sweep=sweep).update(
        state=LaneState.FAILED, note="restoring v1 failed: engine failed"
    )
    sweep_trials.finish_if_done(sweep.pk)
    sweep.refresh_from_db()
    assert sweep.state == SweepState.FAILED
    assert "restoring v1 failed" in sweep.outcome


def test_propose_the_winner_makes_a_change_with_the_sweep_as_evidence(operator, deployment):
    sweep = started(operator, predicted(operator, deployment, max_trials=2))
    measured(sweep, 1, 800.0)
    winner = measured(sweep, 2, 1600.0)
    sweep = ended(sweep)
    change = sweeps.propose_winner(operator, sweep)
    assert change.sweep == sweep and change.state == "pending"
    assert change.settings == {**BASE, **winner.point}
    assert f"/sweeps/{sweep.pk}/" in change.rationale
    # Verified where the running config met the SLO (the control's measured limit).
    assert change.verify_profile.spec["stages"][0]["request_rate"] == 10.0
    assert change.verify_profile.name.startswith(sweep.load_profile.name + " @ 10")


def test_the_control_winning_cannot_be_proposed(operator, deployment):
    sweep = started(operator, predicted(operator, deployment, max_trials=2))
    measured(sweep, 1, 1800.0)
    measured(sweep, 2, 900.0)
    sweep = ended(sweep)
    assert sweep.winner.is_control
    assert "already the best" in sweep.outcome
    with pytest.raises(SweepRefused, match="nothing to change"):
        sweeps.propose_winner(operator, sweep)


def test_restoring_the_original_config_is_labelled_as_the_sweeps_restore(operator, deployment):
    """The host page lists engine operations by their note: a sweep's way back says what it is,
    not a bare 'Apply config v1' that reads like a change."""
    sweep = started(operator, predicted(operator, deployment))
    lane = sweep.lanes.get()
    original = lane.original_config
    trial_config = make_config(deployment, {**BASE, "max_num_seqs": 16})
    deployment.active_config = trial_config
    deployment.save()

    def ready(operation):
        operation.outcome = "ready"
        return operation

    with mock.patch.object(sweep_trials, "run_inline", side_effect=ready):
        sweep_trials.restore(lane)
    lane.refresh_from_db()
    operation = lane.restore_operation
    assert operation.config_id == original.pk
    assert operation.note == f"Restore v{original.version} after sweep #{sweep.pk}"
    assert lane.state == LaneState.RESTORED


class Unreachable:
    """A host transport that does not answer ``fails`` times, then applies as asked."""

    def __init__(self, fails: int):
        self.fails, self.tries = fails, 0

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def apply_config(self, name, launch, *, previous, ready_timeout_s):
        self.tries += 1
        if self.tries <= self.fails:
            raise TransportError("connection refused (the agent is not listening yet)")
        return ApplyOutcome("ready")


def test_a_restore_the_host_did_not_answer_is_pending_and_retried_with_backoff(
    operator, deployment, monkeypatch
):
    """Issue 38 item 5: a sweep lost mid-trial tried its restore once, before the agents
    listened, ended "failed" and left the deployment on the trial's config. Now the restore
    is pending (the deployment held, the page says so) and is retried until the host
    answers, then the sweep ends as it would have."""
    sweep = started(operator, predicted(operator, deployment))
    lane = sweep.lanes.get()
    original = lane.original_config
    deployment.active_config = make_config(deployment, {**BASE, "max_num_seqs": 16})
    deployment.save()
    host = Unreachable(fails=2)
    monkeypatch.setattr("hosts.services.operations.transport_for", lambda h, d=None: host)
    queued = []
    monkeypatch.setattr(sweep_trials, "enqueue", lambda name, *args, **kw: queued.append(args))

    sweep_trials.abandon_lane(lane.pk, "the worker was lost")
    lane.refresh_from_db()
    assert lane.state == LaneState.RESTORE_PENDING and lane.restore_attempts == 1
    assert "the host did not answer" in lane.note and "connection refused" in lane.note
    assert lane.restore_operation.host_unreachable
    wait = (lane.restore_next_at - timezone.now()).total_seconds()
    assert 25 < wait <= sweep_trials.RESTORE_BACKOFF_S[0]
    (holder,) = occupancy.occupants(deployment)  # still held, and says why
    assert holder.text.startswith(f"Restore pending: tuning sweep #{sweep.pk} could not put")
    assert Sweep.objects.get(pk=sweep.pk).state == SweepState.RUNNING
    assert not sweep.trials.filter(state=TrialState.QUEUED).exists()  # no trial on a dead host

    assert sweep_trials.retry_pending_restores() == 0  # not due yet
    SweepLane.objects.filter(pk=lane.pk).update(restore_next_at=timezone.now())
    assert sweep_trials.retry_pending_restores() == 1 and queued == [(lane.pk,)]
    sweep_trials.retry_restore(lane.pk)  # the task: the host still does not answer
    lane.refresh_from_db()
    assert lane.state == LaneState.RESTORE_PENDING and lane.restore_attempts == 2
    wait = (lane.restore_next_at - timezone.now()).total_seconds()
    assert sweep_trials.RESTORE_BACKOFF_S[0] < wait <= sweep_trials.RESTORE_BACKOFF_S[1]

    SweepLane.objects.filter(pk=lane.pk).update(restore_next_at=timezone.now())
    sweep_trials.retry_restore(lane.pk)  # the agent listens again
    lane.refresh_from_db()
    deployment.refresh_from_db()
    assert lane.state == LaneState.RESTORED and deployment.active_config_id == original.pk
    assert occupancy.occupants(deployment) == []
    sweep.refresh_from_db()
    assert sweep.state in (SweepState.DONE, SweepState.FAILED) and host.tries == 3


def test_a_restore_the_engine_failed_still_fails_loudly(operator, deployment, monkeypatch):
    sweep = started(operator, predicted(operator, deployment))
    lane = sweep.lanes.get()
    deployment.active_config = make_config(deployment, {**BASE, "max_num_seqs": 16})
    deployment.save()

    def failed(operation):
        operation.outcome = "failed"
        operation.error = "CUDA out of memory"
        return operation

    with mock.patch.object(sweep_trials, "run_inline", side_effect=failed):
        sweep_trials.restore(lane)
    lane.refresh_from_db()
    assert lane.state == LaneState.FAILED and "needs attention" in lane.note
