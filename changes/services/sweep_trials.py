"""Tuning sweeps, the worker's side after the prediction (``sweep_prediction``): the lanes,
one task per deployment taking the next queued trial, applying its config,
finding the highest load that meets the SLO with real benchmarks, and in the end putting the
deployment's original config back, whatever ended the lane (done, cancelled, a broken engine,
a lost worker).
"""

from __future__ import annotations

import logging
import uuid
from datetime import timedelta

from django.db import transaction
from django.utils import timezone

from benchmarks.evidence import usable_as_evidence
from benchmarks.models import BenchmarkRun
from benchmarks.services import runs as benchmark_runs
from benchmarks.sweep import (
    Slo,
    step_search,
    sweep_workload,
)
from changes.choices import LaneState, SweepState, TrialState
from changes.models_sweeps import LANE, Objective, Sweep, SweepLane, SweepTrial
from changes.services import verification
from changes.services.stages import run_inline
from changes.services.sweeps import LANE_TASK, lane_time_limit, outcome_line, publish_sweep
from controlpanel.choices import OperationStatus
from controlpanel.jobs import enqueue
from controlpanel.services import audit
from hosts.choices import OperationOutcome
from hosts.models import EngineConfig
from hosts.services import operations as host_operations

log = logging.getLogger(__name__)
S = SweepState
T = TrialState


class Cancelled(Exception):
    """The sweep was cancelled: stop the trial, keep what it measured."""


class TrialBroken(Exception):
    """The engine did not start or became unhealthy: the trial fails, the lane restores the
    original config and goes on with the next trial."""


# --- a lane ------------------------------------------------------------------------------------
def claim_lane(lane_pk: int, owner: str) -> SweepLane | None:
    """Take the lane for ``owner`` unless a live worker has it."""
    return LANE.take(SweepLane.objects.all(), lane_pk, owner, also={"state": LaneState.RUNNING})


def run_lane(lane_pk: int, owner: str | None = None) -> SweepLane | None:
    """The worker's part of one lane: trials until none is left (or the sweep is cancelled,
    or its wall-time budget is spent), then the original config back, then the sweep's end
    when it was the last lane."""

    owner = owner or uuid.uuid4().hex
    lane = claim_lane(lane_pk, owner)
    if lane is None:
        return None
    with LANE.beating(SweepLane.objects.all(), lane.pk, owner, f"lane-{lane.pk}"):
        try:
            _fail_orphans(lane)
            while True:
                trial = _next_trial(lane)
                if trial is None:
                    break
                run_trial(trial, lane)
        finally:
            restore(lane)
            finish_if_done(lane.sweep_id)
    lane.refresh_from_db()
    return lane


def _fail_orphans(lane: SweepLane) -> None:
    """A trial left running by this lane's lost worker measured for nobody: fail it."""
    for trial in SweepTrial.objects.filter(lane=lane, state=T.RUNNING):
        for run in trial.runs.filter(status__in=(OperationStatus.QUEUED, OperationStatus.RUNNING)):
            benchmark_runs.fail_run(run, "the sweep's worker stopped during the run")
        if trial.operation is not None and not trial.operation.is_finished:
            host_operations.fail_operation(trial.operation, "the sweep's worker stopped")
        _end_trial(trial, T.FAILED, error="the worker running this trial stopped")


def _next_trial(lane: SweepLane) -> SweepTrial | None:
    """Claim the next queued trial (``skip_locked``: lanes take trials side by side), or end
    the queue early when the sweep is cancelled or out of time."""
    if SweepLane.objects.filter(pk=lane.pk, state=LaneState.RESTORE_PENDING).exists():
        return None  # its host stopped answering: no trial can run until it is back
    with transaction.atomic():
        sweep = Sweep.objects.get(pk=lane.sweep_id)
        trial = (
            SweepTrial.objects.select_for_update(skip_locked=True)
            .filter(sweep_id=lane.sweep_id, state=T.QUEUED)
            .order_by("index")
            .first()
        )
        if trial is None:
            return None
        if sweep.cancel_requested:
            SweepTrial.objects.filter(sweep=sweep, state=T.QUEUED).update(
                state=T.CANCELLED, note="the sweep was cancelled before this trial"
            )
            return None
        if sweep.deadline is not None and timezone.now() >= sweep.deadline:
            SweepTrial.objects.filter(sweep=sweep, state=T.QUEUED).update(
                state=T.SKIPPED,
                note=f"the sweep's wall-time budget ({sweep.max_minutes} min) was spent",
            )
            return None
        trial.state, trial.lane, trial.started_at = T.RUNNING, lane, timezone.now()
        trial.save(update_fields=["state", "lane", "started_at"])
    publish_sweep(sweep)
    return trial


# --- a trial -----------------------------------------------------------------------------------
def run_trial(trial: SweepTrial, lane: SweepLane) -> SweepTrial:
    """Apply the trial's config, then search the highest load meeting the SLO with real
    benchmarks (``step_search`` from the predicted one). A broken engine fails the trial and
    puts the original config back at once; a cancel keeps what was measured."""
    sweep = trial.sweep
    try:
        _apply(trial, lane)
        _search(trial, lane)
    except Cancelled:
        _end_trial(trial, T.CANCELLED, note="cancelled; the loads measured so far are kept")
    except TrialBroken as exc:
        _end_trial(trial, T.FAILED, error=str(exc))
        restore(lane, keep_lane=True)
    except Exception as exc:
        _end_trial(trial, T.FAILED, error=f"{type(exc).__name__}: {exc}")
        restore(lane, keep_lane=True)
        log.exception("sweep %s trial %s failed", sweep.pk, trial.index)
    return trial


def _config_for(trial: SweepTrial, lane: SweepLane) -> EngineConfig:
    """The version the trial runs on the lane's deployment: its original config when the
    settings are the same (the control), else a new version saying whose trial it is."""
    original = lane.original_config
    if original is not None and original.settings == trial.settings:
        return original
    return EngineConfig.objects.create_next(
        lane.deployment,
        trial.settings,
        env=original.env if original else {},
        placement=original.placement if original else {},
        created_by=trial.sweep.created_by,
        note=f"sweep #{trial.sweep_id} trial {trial.index} (temporary)",
    )


def _apply(trial: SweepTrial, lane: SweepLane) -> None:
    """Restart the engine on the trial's config (a cold start for every trial, the control
    included, so that each is measured from the same state) and check its health."""
    sweep, deployment = trial.sweep, lane.deployment
    config = _config_for(trial, lane)
    trial.config = config
    trial.save(update_fields=["config"])
    kind = "restart" if deployment.active_config_id == config.pk else "apply"
    try:
        operation = host_operations.request_operation(
            sweep.created_by,
            deployment,
            kind,
            config if kind == "apply" else None,
            enqueue=False,
            owner=sweep,
            # The host page labels it, so a trial's temporary config is not read as a change.
            note=f"Sweep #{sweep.pk} trial {trial.index} (temporary config)",
        )
    except host_operations.OperationRefused as exc:
        raise TrialBroken(f"could not restart the engine: {exc}") from None
    trial.operation = operation
    trial.save(update_fields=["operation"])
    publish_sweep(sweep)
    operation = run_inline(operation)
    if operation.outcome != OperationOutcome.READY:
        message = operation.error or operation.get_outcome_display()
        tail = "\n".join(operation.engine_log.splitlines()[-3:])
        raise TrialBroken(
            f"v{config.version} did not start: {message}" + (f"\n{tail}" * bool(tail))
        )
    deployment.refresh_from_db()
    problem = verification.health_problem(deployment, config)
    if problem:
        raise TrialBroken(f"the engine is not healthy on v{config.version}: {problem}")


def _search(trial: SweepTrial, lane: SweepLane) -> None:
    sweep = trial.sweep
    slo = Slo.from_dict(sweep.slo)
    integer = sweep.load_mode == "concurrency"
    start, low, high = search_bounds(trial, sweep)

    def measure(load: float) -> dict:
        return _measure(trial, lane, load)

    result = step_search(
        measure,
        slo,
        start=start,
        integer=integer,
        max_steps=sweep.max_steps,
        min_load=low,
        max_load=high,
    )
    best = result.best
    trial.note = result.note[:500]
    gpus = _gpus_used(trial.settings)
    if best is not None:
        numbers = dict(best.numbers)
        tps = numbers.get("output_tps")
        numbers["output_tps_per_gpu"] = tps / gpus if tps else None
        trial.max_load, trial.met_slo, trial.numbers = best.load, True, numbers
        price = sweep.target.get("price_per_gpu_hour")
        if tps and price:
            trial.cost_per_million = price * gpus / (tps * 3600) * 1e6
        trial.objective_value = (
            trial.cost_per_million
            if sweep.objective == Objective.COST_PER_MILLION
            else numbers["output_tps_per_gpu"]
        )
    else:
        trial.met_slo = False
        closest = result.closest
        trial.numbers = dict(closest.numbers) if closest else {}
    predicted = (trial.predicted or {}).get("max_load")
    if trial.max_load is not None and predicted:
        trial.prediction_error = (trial.max_load - predicted) / predicted
    _end_trial(trial, T.SUCCEEDED)


def _gpus_used(settings: dict) -> int:
    return int(settings.get("tensor_parallel_size") or 1) * int(
        settings.get("pipeline_parallel_size") or 1
    )


def search_bounds(trial: SweepTrial, sweep: Sweep) -> tuple[float, float, float]:
    """Where the search starts (the predicted max load, else the profile's own load) and
    how far it may go."""
    predicted = (trial.predicted or {}).get("max_load")
    workload = sweep_workload(sweep.load_profile.spec, sweep.load_mode)
    if sweep.load_mode == "concurrency":
        own = float(workload.concurrency or 8)
        start = float(round(predicted)) if predicted else own
        seqs = int(trial.settings.get("max_num_seqs") or 256)
        return max(1.0, start), 1.0, float(max(4 * seqs, start * 4))
    own = float(workload.request_rate or 1.0)
    start = predicted or own
    return start, start / 16, start * 8


def _measure(trial: SweepTrial, lane: SweepLane, load: float) -> dict:
    """One benchmark of the sweep's profile at ``load`` on the trial's config: an ordinary
    run (history, compare, cost), labelled with the sweep and the load. A run that fails
    because the engine broke breaks the trial; one that fails on errors is a load the SLO
    does not hold at."""
    sweep = Sweep.objects.get(pk=trial.sweep_id)
    if sweep.cancel_requested:
        raise Cancelled()
    unit = "req/s" if sweep.load_mode == "rate" else "users"
    try:
        run = benchmark_runs.start_benchmark(
            sweep.created_by,
            lane.deployment,
            sweep.load_profile,
            label=f"sweep #{sweep.pk} trial {trial.index} @ {load:.3g} {unit}"[:100],
            enqueue=False,
            owner=sweep,
            # A new seed per load: fresh prompts, not the previous load's cached ones.
            load_override={
                "mode": sweep.load_mode,
                "value": load,
                "seed": _seed(sweep) + 1000 * trial.index + len(trial.probes) + 1,
            },
        )
    except benchmark_runs.RunRefused as exc:
        raise TrialBroken(f"the benchmark could not start: {exc}") from None
    trial.runs.add(run)
    try:
        benchmark_runs.execute_run(
            BenchmarkRun.objects.select_related(
                "deployment__host", "deployment__active_config", "engine_config", "load_profile"
            ).get(pk=run.pk)
        )
    except Exception as exc:  # noqa: BLE001 - recorded on the run, judged below
        benchmark_runs.fail_run(run, f"{type(exc).__name__}: {exc}")
    run.refresh_from_db()
    if run.status == OperationStatus.CANCELLED:
        raise Cancelled()
    if run.status != OperationStatus.SUCCEEDED:
        # A run fails when the engine fails it (its error rate limit, no success at all, a
        # lost connection); an overload only makes it slow. Either way its numbers are the
        # engine's trouble, not a load the SLO holds at or not: the trial cannot go on.
        problem = verification.health_problem(lane.deployment)
        raise TrialBroken(
            f"the engine failed during {run}: {run.error or run.status}"
            + (f"; now: {problem}" if problem else "")
        )
    evidence = usable_as_evidence(run)
    if evidence.limited:
        # Its numbers are the load generator's: neither a load the SLO holds at nor one it
        # breaks at, and a starved client will not search any better at the next load.
        raise TrialBroken(f"{run} at {load:.3g} {unit} is {evidence.refusal}: not a valid point")
    numbers = trial_numbers(run)
    slo = Slo.from_dict(sweep.slo)
    check = slo.check(numbers)
    trial.probes = [
        *trial.probes,
        {
            "load": load,
            "run": run.pk,
            "status": run.status,
            "ok": check.ok,
            "violations": check.violations,
            "margin": check.margin,
            "numbers": numbers,
        },
    ]
    trial.save(update_fields=["probes"])
    publish_sweep(sweep)
    return numbers


def _seed(sweep: Sweep) -> int:
    return int((sweep.load_profile.spec or {}).get("seed") or 0)


def trial_numbers(run: BenchmarkRun) -> dict:
    """What the SLO and the charts read off a run: the limits' percentiles, errors, and the
    throughput per user and overall. A run that did not succeed counts as all errors unless
    it measured its own rate (an early stop on errors)."""
    summary = run.summary if isinstance(run.summary, dict) else {}
    mean_tpot = summary.get("mean_tpot_ms")
    error_rate = run.error_rate
    if run.status != OperationStatus.SUCCEEDED and error_rate is None:
        error_rate = 1.0
    return {
        "ttft_p95_ms": run.ttft_p95_ms,
        "ttft_p99_ms": run.ttft_p99_ms,
        "itl_p95_ms": run.itl_p95_ms,
        "tpot_p95_ms": summary.get("p95_tpot_ms"),
        "error_rate": error_rate,
        "output_tps": run.output_tokens_per_s,
        "output_tps_per_user": 1000.0 / mean_tpot if mean_tpot else None,
        "request_rate": run.request_throughput,
    }


def _end_trial(trial: SweepTrial, state: TrialState, *, error: str = "", note: str = "") -> None:
    trial.state, trial.finished_at = state, timezone.now()
    trial.error = error or trial.error
    trial.note = (note or trial.note)[:500]
    trial.save()
    publish_sweep(trial.sweep)


# --- the way back ------------------------------------------------------------------------------
def restore(lane: SweepLane, *, keep_lane: bool = False) -> None:
    """Put the lane's original config back on its deployment (unless it already runs it);
    the lane then releases the deployment unless ``keep_lane`` (more trials follow). When the
    host does not answer the restore is *pending*: the lane keeps the deployment and the
    lost-work sweep tries again with backoff (``retry_pending_restores``) until it does. A
    restore the engine itself failed is said loudly: the deployment needs attention."""
    lane.refresh_from_db()
    if lane.state == LaneState.RESTORE_PENDING and (
        lane.restore_next_at is not None and lane.restore_next_at > timezone.now()
    ):
        return None  # not due yet: the next try is the sweep's
    deployment = lane.deployment
    deployment.refresh_from_db()
    original = lane.original_config
    if original is None or deployment.active_config_id == original.pk:
        if not keep_lane or lane.state == LaneState.RESTORE_PENDING:
            _end_lane(lane, LaneState.RESTORED, f"{deployment} runs v{original.version} again")
        return None
    try:
        operation = host_operations.request_operation(
            lane.sweep.created_by,
            deployment,
            "apply",
            original,
            enqueue=False,
            owner=lane.sweep,
            note=f"Restore v{original.version} after sweep #{lane.sweep_id}",
        )
    except host_operations.OperationRefused as exc:
        return _end_lane(lane, LaneState.FAILED, f"could not restore v{original.version}: {exc}")
    lane.restore_operation = operation
    lane.save(update_fields=["restore_operation"])
    operation = run_inline(operation)
    if operation.outcome == OperationOutcome.READY:
        if not keep_lane or lane.state == LaneState.RESTORE_PENDING:
            _end_lane(lane, LaneState.RESTORED, f"{deployment} runs v{original.version} again")
        return None
    if operation.host_unreachable:
        return _restore_pending(lane, original, operation.error)
    message = (
        f"restoring v{original.version} on {deployment} failed: "
        f"{operation.error or operation.get_outcome_display()} — the deployment needs attention"
    )
    audit(None, "sweep.restore_failed", lane.sweep, after={"deployment": str(deployment)})
    return _end_lane(lane, LaneState.FAILED, message)


# Waits between tries of a restore whose host did not answer; then every RESTORE_BACKOFF_S[-1].
RESTORE_BACKOFF_S = (30, 60, 120, 300, 600)


def _restore_pending(lane: SweepLane, original: EngineConfig, why: str) -> None:
    attempts = lane.restore_attempts + 1
    wait = RESTORE_BACKOFF_S[min(attempts, len(RESTORE_BACKOFF_S)) - 1]
    next_at = timezone.now() + timedelta(seconds=wait)
    note = (
        f"restore of v{original.version} pending: the host did not answer ({why}); "
        f"tried {attempts} time{'s' if attempts != 1 else ''}, next at {next_at:%H:%M:%S} UTC"
    )
    SweepLane.objects.filter(pk=lane.pk).update(
        state=LaneState.RESTORE_PENDING,
        restore_attempts=attempts,
        restore_next_at=next_at,
        note=note[:500],
        owner="",
    )
    lane.state, lane.restore_attempts, lane.restore_next_at = (
        LaneState.RESTORE_PENDING,
        attempts,
        next_at,
    )
    # The lane's other trials cannot run on a host that does not answer.
    SweepTrial.objects.filter(sweep_id=lane.sweep_id, state=T.QUEUED).update(
        state=T.SKIPPED, note="the host stopped answering; the original config is being restored"
    )
    audit(
        None,
        "sweep.restore_pending",
        lane.sweep,
        after={"deployment": str(lane.deployment), "attempts": attempts, "reason": why[:300]},
    )
    publish_sweep(lane.sweep)


def retry_pending_restores() -> int:
    """The lost-work sweep's pass: queue a try of each pending restore that is due."""
    due = SweepLane.objects.filter(
        state=LaneState.RESTORE_PENDING, restore_next_at__lte=timezone.now()
    ).values_list("pk", flat=True)
    lanes = list(due)
    for pk in lanes:
        enqueue(RETRY_RESTORE_TASK, pk)
    return len(lanes)


RETRY_RESTORE_TASK = "changes.tasks.retry_restore"


def retry_restore(lane_pk: int) -> SweepLane | None:
    """One try of a pending restore (its own task: it may wait for the engine's start)."""
    with transaction.atomic():
        lane = SweepLane.objects.select_for_update().filter(pk=lane_pk).first()
        if lane is None or lane.state != LaneState.RESTORE_PENDING:
            return lane
        if lane.restore_next_at is not None and lane.restore_next_at > timezone.now():
            return lane
        # Claimed for this try: a second beat meanwhile finds it not due.
        lane.restore_next_at = timezone.now() + timedelta(hours=1)
        lane.save(update_fields=["restore_next_at"])
    lane.restore_next_at = None
    SweepLane.objects.filter(pk=lane.pk).update(restore_next_at=None)
    try:
        restore(lane)
    except Exception as exc:  # noqa: BLE001 - tried again later, never left without a next try
        log.exception("sweep lane %s: restore try failed", lane.pk)
        lane.refresh_from_db()
        if lane.state == LaneState.RESTORE_PENDING:
            _restore_pending(lane, lane.original_config, f"{type(exc).__name__}: {exc}")
    finish_if_done(lane.sweep_id)
    lane.refresh_from_db()
    return lane


def resume_lost_lanes() -> int:
    """The lost-work sweep's pass: lanes whose worker died go on on a new worker (their
    running trial is failed there, the rest of the queue runs, the original config comes
    back)."""
    lanes = list(lost_lanes().select_related("sweep"))
    for lane in lanes:
        enqueue(LANE_TASK, lane.pk, **lane_time_limit(lane.sweep).options())
    return len(lanes)


def _end_lane(lane: SweepLane, state: LaneState, note: str) -> None:
    SweepLane.objects.filter(pk=lane.pk).update(state=state, note=note[:500], owner="")
    lane.state, lane.note = state, note


def finish_if_done(sweep_pk: int) -> Sweep | None:
    """When no lane holds a deployment any more, the sweep ends: cancelled, failed (a config
    could not be restored) or done with its winner — the trial with the best measured
    objective among those that met the SLO, or none, said so with the closest."""
    with transaction.atomic():
        sweep = Sweep.objects.select_for_update().get(pk=sweep_pk)
        if sweep.state != S.RUNNING or sweep.lanes.filter(state__in=_HOLDING).exists():
            return None
        SweepTrial.objects.filter(sweep=sweep, state=T.QUEUED).update(
            state=T.CANCELLED if sweep.cancel_requested else T.SKIPPED
        )
        trials = list(sweep.trials.all())
        winner = pick_winner(sweep, trials)
        sweep.winner = winner
        sweep.outcome = summary_text(sweep, trials, winner)[:1000]
        sweep.save(update_fields=["winner", "outcome"])
        broken = sweep.lanes.filter(state=LaneState.FAILED)
        if sweep.cancel_requested:
            state = S.CANCELLED
        elif broken.exists():
            state = S.FAILED
        else:
            state = S.DONE
        sweep.transition_to(state)
        audit(None, f"sweep.{state.value}", sweep, after={"outcome": sweep.outcome})
    publish_sweep(sweep)
    return sweep


_HOLDING = (LaneState.QUEUED, LaneState.RUNNING, LaneState.RESTORE_PENDING)


def pick_winner(sweep: Sweep, trials: list[SweepTrial]) -> SweepTrial | None:
    met = [t for t in trials if t.state == T.SUCCEEDED and t.met_slo and t.objective_value]
    if not met:
        return None
    if sweep.objective == Objective.COST_PER_MILLION:
        return min(met, key=lambda t: (t.objective_value, t.index))
    return max(met, key=lambda t: (t.objective_value, -t.index))


def summary_text(sweep: Sweep, trials: list[SweepTrial], winner: SweepTrial | None) -> str:
    """How the sweep ended, in words, on the evidence of its trials."""
    measured = [t for t in trials if t.state == T.SUCCEEDED]
    failed = [t for t in trials if t.state == T.FAILED]
    head = f"{len(measured)} of {len(trials)} trials measured"
    if failed:
        head += f", {len(failed)} failed"
    if sweep.cancel_requested:
        head = "cancelled; " + head
    broken = [lane for lane in sweep.lanes.all() if lane.state == LaneState.FAILED]
    tail = "".join(f" {lane.note}." for lane in broken)
    if winner is None:
        closest = max(
            (t for t in measured if t.probes),
            key=lambda t: max((p.get("margin") or -1e9) for p in t.probes),
            default=None,
        )
        text = f"{head}. No trial met the SLO at any load tried"
        if closest is not None:
            text += f"; closest: trial {closest.index} ({closest.label})"
        return text + "." + tail
    # A cancelled sweep did not run all its trials: its best is only the best so far.
    verb = "Best so far" if sweep.cancel_requested else "Winner"
    text = f"{head}. {verb}: trial {winner.index} ({winner.label}): {outcome_line(sweep, winner)}"
    control = next((t for t in trials if t.is_control), None)
    if control is not None and control is not winner and control.met_slo:
        if control.objective_value:
            gain = winner.objective_value / control.objective_value - 1
            if sweep.objective == Objective.COST_PER_MILLION:
                text += f"; {-gain:.0%} cheaper per 1M tokens than the running config"
            else:
                text += f"; {gain:+.0%} output tok/s per GPU against the running config"
    elif control is winner:
        text += "; the running config is already the best measured"
    return text + "." + tail


# --- lost workers ------------------------------------------------------------------------------
def abandon_lane(lane_pk: int, error: str) -> None:
    """The lane's task broke or ran out of time: fail its running trial, restore, end."""
    lane = SweepLane.objects.select_related("sweep", "deployment").filter(pk=lane_pk).first()
    if lane is None or not lane.holds_lock:
        return
    for trial in SweepTrial.objects.filter(lane=lane, state=T.RUNNING):
        for run in trial.runs.filter(status__in=(OperationStatus.QUEUED, OperationStatus.RUNNING)):
            benchmark_runs.fail_run(run, f"the sweep's lane stopped: {error}")
        _end_trial(trial, T.FAILED, error=f"the lane stopped: {error}")
    try:
        restore(lane)
    except Exception as exc:  # noqa: BLE001 - the record is what matters now
        _end_lane(lane, LaneState.FAILED, f"the lane stopped ({error}) and restoring failed: {exc}")
    finish_if_done(lane.sweep_id)


def lost_lanes():
    """Lanes running with no heartbeat for three beats: their worker is gone."""
    return LANE.lost(SweepLane.objects.filter(state=LaneState.RUNNING))
