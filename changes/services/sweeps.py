"""Tuning sweeps, the people's side: make one (validated against the engine's flag spec, its
prediction queued at once), review it, start its trials, cancel it, propose its winner.

The worker's side (the prediction, the lanes running trials, restoring configs) is
``sweep_trials``; the pure search and the simulator's scoring are ``benchmarks.sweep``.
"""

from __future__ import annotations

from django.conf import settings as conf
from django.contrib.auth import get_user_model
from django.db import IntegrityError, transaction
from django.utils import timezone

from benchmarks.loadgen.spec import SpecError
from benchmarks.models import LoadProfile
from benchmarks.services import prices
from benchmarks.services import runs as benchmark_runs
from benchmarks.sweep import Slo, SloError, SpaceError, parse_space, sweep_workload
from benchmarks.sweep.load import apply_load
from changes import rules
from changes.choices import LANE_LOCK_STATES, Decision, LaneState, SweepState, TrialState
from changes.models import ChangeRequest
from changes.models_sweeps import Objective, Sweep, SweepApproval, SweepLane, SweepTrial
from changes.rules_sweeps import SweepRefused, require
from changes.services.review import propose_change
from changes.services.sweep_figures import QUANTITIES, load_key, quantity_text
from controlpanel import timelimits
from controlpanel.choices import OperationStatus
from controlpanel.jobs import enqueue_on_commit
from controlpanel.realtime import group_name, publish
from controlpanel.services import audit
from hosts.models import Deployment
from hosts.services import occupancy

S = SweepState
PREDICT_TASK = "changes.tasks.predict_sweep"
LANE_TASK = "changes.tasks.run_sweep_lane"


class SweepInvalid(ValueError):
    """What was asked cannot be a sweep; ``errors`` maps a form field to its message."""

    def __init__(self, errors: dict[str, str], space_errors: dict[str, str] | None = None):
        super().__init__("; ".join(f"{k}: {v}" if k else v for k, v in errors.items()))
        self.errors = errors
        # The space's problems by flag ("" for the space as a whole), for forms and the API.
        self.space_errors = space_errors or {}


# --- what a sweep runs on ----------------------------------------------------------------------
def is_production(deployment: Deployment) -> bool:
    return deployment.host.is_production


def required_approvals(deployments) -> int:
    """A sweep restarts every deployment it runs on: with a production-labelled host among
    them it needs what a change there needs (CHANGE_PRODUCTION_APPROVALS), else none."""
    if any(is_production(d) for d in deployments):
        return conf.CHANGE_PRODUCTION_APPROVALS
    return 0


OPEN_STATES = (S.PREDICTING, S.PENDING, S.READY, S.RUNNING)


def quota_problem(actor) -> str | None:
    """Why ``actor`` may not create another sweep now, or None: at most
    SWEEPS_PREDICTING_PER_USER of theirs predicting at once (each scores its whole space on a
    worker) and SWEEPS_OPEN_PER_USER not finished."""
    mine = Sweep.objects.filter(created_by=actor)
    predicting = mine.filter(state=S.PREDICTING).count()
    if predicting >= conf.SWEEPS_PREDICTING_PER_USER:
        return (
            f"You have {predicting} sweeps still predicting (at most "
            f"{conf.SWEEPS_PREDICTING_PER_USER} at once): wait for one to finish, or cancel one."
        )
    open_ = mine.filter(state__in=OPEN_STATES).count()
    if open_ >= conf.SWEEPS_OPEN_PER_USER:
        return (
            f"You have {open_} sweeps not finished (at most {conf.SWEEPS_OPEN_PER_USER}): "
            "finish, cancel or withdraw one first."
        )
    return None


def recount_approvals(actor, sweep: Sweep) -> str | None:
    """Required approvals follow the hosts' labels as they are now, not as they were when the
    sweep was created (as a change's: ``review.recount_approvals``): an Admin may label a
    host it restarts production in between. Raises the count when the rule now asks for
    more, audited; a ready sweep short of it goes back to review. Returns why, when it did.
    Call inside the sweep's lock."""
    deployments = [lane.deployment for lane in sweep.lanes.select_related("deployment__host")]
    needed = required_approvals(deployments)
    if needed <= sweep.required_approvals:
        return None
    before = sweep.required_approvals
    sweep.required_approvals = needed
    sweep.save(update_fields=["required_approvals", "updated_at"])
    why = (
        f"a host it restarts is labelled production now: the sweep needs {needed} approval"
        f"{'s' if needed != 1 else ''} (it needed {before} when it was created)"
    )
    audit(
        actor,
        "sweep.approvals_required",
        sweep,
        before={"required": before},
        after={"required": needed, "reason": why},
    )
    if sweep.state == S.READY and sweep.approvals_count() < needed:
        sweep.transition_to(S.PENDING)
    return why


# What the prediction models (GPU, count, time scale, GPU-hour price): one home below.
target = prices.deployment_target


def twins(deployment: Deployment):
    """Other deployments that can run the same trials side by side: the same engine and
    version, model, runner and GPUs (key and count), with a config running."""
    mine = target(deployment)
    candidates = (
        Deployment.objects.filter(
            engine=deployment.engine,
            engine_version=deployment.engine_version,
            model=deployment.model,
            runner=deployment.runner,
            active_config__isnull=False,
        )
        .exclude(pk=deployment.pk)
        .select_related("host")
    )
    out = []
    for other in candidates:
        theirs = target(other)
        if all(theirs[k] == mine[k] for k in ("gpu", "num_gpus", "time_scale")):
            out.append(other)
    return out


# --- making one --------------------------------------------------------------------------------
def create_sweep(
    actor,
    deployment: Deployment,
    *,
    title: str,
    profile: LoadProfile,
    space: dict,
    slo: dict,
    load_mode: str = "rate",
    objective: str = Objective.TPS_PER_GPU,
    max_trials: int = 4,
    max_minutes: int = 60,
    max_steps: int = 5,
    twin_deployments=(),
) -> Sweep:
    """Record a sweep of ``deployment`` (and of ``twin_deployments`` in parallel) and queue
    its prediction. Everything is checked first: the space against the engine's flag spec,
    the SLO, the profile as a sweep's load, the objective's price; ``SweepInvalid`` names
    each problem by field."""
    require("create", actor, None)
    errors: dict[str, str] = {}
    if deployment.active_config is None:
        errors[""] = f"{deployment} has no running config to sweep from."
    try:
        parsed_space = parse_space(deployment.engine, deployment.engine_version or None, space)
    except SpaceError as exc:
        errors["space"] = str(exc)
        space_errors = dict(exc.errors)
        parsed_space = None
    else:
        space_errors = {}
    try:
        parsed_slo = Slo.from_dict(slo)
    except SloError as exc:
        errors["slo"] = str(exc)
    if load_mode not in ("rate", "concurrency"):
        errors["load_mode"] = "Choose the request rate or the concurrency."
    else:
        try:
            sweep_workload(profile.spec, load_mode)
        except (SpecError, ValueError) as exc:
            errors["load_profile"] = f"{profile} cannot be a sweep's load: {exc}"
    facts = target(deployment)
    if objective == Objective.COST_PER_MILLION and not facts["price_per_gpu_hour"]:
        errors["objective"] = (
            f"{deployment.host} has no hourly price: set one (host or price list) to rank "
            "configs by cost."
        )
    lanes = [deployment]
    allowed = {d.pk for d in twins(deployment)}
    for other in twin_deployments:
        if other.pk not in allowed:
            errors["twins"] = (
                f"{other} cannot run this sweep's trials: it must run the same engine, "
                "version, model and GPUs, with a config."
            )
        elif other not in lanes:
            lanes.append(other)
    for field, value, low, high in (
        ("max_trials", max_trials, 1, 30),
        ("max_minutes", max_minutes, 2, 24 * 60),
        ("max_steps", max_steps, 2, 12),
    ):
        if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
            errors[field] = f"Between {low} and {high}."
    if errors:
        raise SweepInvalid(errors, space_errors)
    rules.require_code_loading(
        actor,
        deployment.engine,
        {flag: (None, v) for flag, values in parsed_space.to_dict().items() for v in values},
    )
    with transaction.atomic():
        if actor is not None:
            # One user's sweeps counted under a lock on the user: two requests at once cannot
            # both slip under the quota.
            get_user_model().objects.select_for_update().filter(pk=actor.pk).first()
            quota = quota_problem(actor)
            if quota:
                raise SweepRefused(quota)
        sweep = Sweep.objects.create(
            deployment=deployment,
            title=title.strip()[:120] or f"Tune {deployment.name}",
            created_by=actor,
            objective=objective,
            load_profile=profile,
            load_mode=load_mode,
            space=parsed_space.to_dict(),
            slo=parsed_slo.to_dict(),
            base_config=deployment.active_config,
            max_trials=max_trials,
            max_minutes=max_minutes,
            max_steps=max_steps,
            required_approvals=required_approvals(lanes),
            target=facts,
        )
        for lane in lanes:
            SweepLane.objects.create(
                sweep=sweep,
                deployment=lane,
                original_config=lane.active_config,
                state=LaneState.PLANNED,
            )
        audit(
            actor,
            "sweep.create",
            sweep,
            after={
                "deployments": [str(d) for d in lanes],
                "space": sweep.space,
                "slo": sweep.slo,
                "profile": str(profile),
                "load_mode": load_mode,
                "objective": objective,
                "max_trials": max_trials,
                "max_minutes": max_minutes,
            },
        )
        enqueue_on_commit(PREDICT_TASK, sweep.pk)
    return sweep


# --- review ------------------------------------------------------------------------------------
def _locked(sweep: Sweep) -> Sweep:
    return Sweep.objects.select_for_update().select_related("deployment__host").get(pk=sweep.pk)


def review_sweep(actor, sweep: Sweep, decision: str, comment: str = "") -> Sweep:
    """Approve or reject the sweep as a whole (its space, budget and the hosts it restarts):
    enough approvals make it ready to run; one rejection ends it."""
    decision = Decision(decision)
    with transaction.atomic():
        sweep = _locked(sweep)
        require("approve" if decision == Decision.APPROVE else "reject", actor, sweep)
        if decision == Decision.APPROVE:
            rules.require_code_loading(
                actor,
                sweep.deployment.engine,
                {flag: (None, v) for flag, values in sweep.space.items() for v in values},
            )
        try:
            with transaction.atomic():
                SweepApproval.objects.create(
                    sweep=sweep,
                    reviewer=actor,
                    reviewer_name=actor.get_username(),
                    decision=decision,
                    comment=comment,
                )
        except IntegrityError:
            raise SweepRefused(f"You already reviewed sweep #{sweep.pk}.") from None
        audit(actor, f"sweep.{decision.value}", sweep, after={"comment": comment})
        if decision == Decision.REJECT:
            sweep.transition_to(S.REJECTED)
            _release_lanes(sweep)
            SweepTrial.objects.filter(sweep=sweep, state=TrialState.QUEUED).update(
                state=TrialState.CANCELLED, note="the sweep was rejected"
            )
            sweep.outcome = f"rejected by {actor.get_username()}" + (
                f": {comment}" if comment else ""
            )
            sweep.save(update_fields=["outcome"])
        else:
            recount_approvals(actor, sweep)
            if sweep.approvals_count() >= sweep.required_approvals:
                sweep.transition_to(S.READY)
    publish_sweep(sweep)
    return sweep


# --- running and cancelling --------------------------------------------------------------------
def start_sweep(actor, sweep: Sweep) -> Sweep:
    """Start the trials: every lane's deployment must be free (``occupancy``: no run, no
    operation, no change holding it) and still run the config the sweep was made from; then
    each lane holds its deployment until its config is back, and runs on a worker. A sweep
    whose hosts now need more approvals than it has goes back to review instead."""
    with transaction.atomic():
        sweep = _locked(sweep)
        require("start", actor, sweep)
        why = recount_approvals(actor, sweep)
    if why and sweep.state != S.READY:
        publish_sweep(sweep)
        raise SweepRefused(f"Sweep #{sweep.pk} is back in review: {why}.")
    with transaction.atomic():
        sweep = _locked(sweep)
        require("start", actor, sweep)
        lanes = list(sweep.lanes.select_related("deployment", "original_config"))
        for lane in lanes:
            deployment = Deployment.objects.select_for_update().get(pk=lane.deployment_id)
            if deployment.active_config_id != lane.original_config_id:
                raise SweepRefused(
                    f"{deployment} no longer runs the config this sweep was made from "
                    f"(v{lane.original_config.version}): make a new sweep."
                )
            try:
                occupancy.require_free(deployment, occupancy.Purpose.SWEEP, owner=sweep)
            except occupancy.DeploymentBusy as busy:
                raise SweepRefused(str(busy)) from None
        try:
            with transaction.atomic():
                for lane in lanes:
                    lane.state = LaneState.QUEUED
                    lane.save(update_fields=["state"])
        except IntegrityError:
            raise SweepRefused("Another sweep just started on one of its deployments.") from None
        sweep.transition_to(S.RUNNING)
        audit(actor, "sweep.start", sweep, after={"lanes": [str(x.deployment) for x in lanes]})
        for lane in lanes:
            enqueue_on_commit(LANE_TASK, lane.pk, **lane_time_limit(sweep).options())
    publish_sweep(sweep)
    return sweep


def lane_time_limit(sweep: Sweep):
    """The wall-time budget, plus the trial that may still run at its end (its restart and
    its benchmarks) and the restore of the original config."""
    per_run = benchmark_runs.time_limit_for(sweep.load_profile)
    restart = timelimits.operation_budget(conf.ENGINE_READY_TIMEOUT)
    soft = sweep.max_minutes * 60 + sweep.max_steps * per_run + 2 * restart
    return timelimits.TimeLimit.of(soft, 60)


def cancel_sweep(actor, sweep: Sweep) -> Sweep:
    """Stop a sweep at any moment. Before its trials it simply ends; while they run, the
    running benchmark is cancelled, no further trial starts, finished trials are kept and
    every lane restores its deployment's original config before the sweep ends cancelled."""
    with transaction.atomic():
        sweep = _locked(sweep)
        require("cancel", actor, sweep)
        audit(actor, "sweep.cancel", sweep, before={"state": sweep.state})
        if sweep.state != S.RUNNING:
            sweep.transition_to(S.CANCELLED)
            sweep.outcome = f"cancelled by {actor.get_username()} before its trials"
            sweep.save(update_fields=["outcome"])
            _release_lanes(sweep)
            SweepTrial.objects.filter(sweep=sweep, state=TrialState.QUEUED).update(
                state=TrialState.CANCELLED
            )
        else:
            sweep.cancel_requested = True
            sweep.save(update_fields=["cancel_requested"])
            running = [
                run
                for trial in sweep.trials.filter(state=TrialState.RUNNING)
                for run in trial.runs.filter(
                    status__in=(OperationStatus.QUEUED, OperationStatus.RUNNING)
                )
            ]
    if sweep.state == S.RUNNING:
        for run in running:
            try:
                benchmark_runs.cancel_benchmark(actor, run)
            except benchmark_runs.RunRefused:
                pass  # it ended meanwhile
    publish_sweep(sweep)
    return sweep


def _release_lanes(sweep: Sweep) -> None:
    # Lanes that never started hold nothing; mark them so the page does not say "queued".
    sweep.lanes.filter(state__in=(LaneState.PLANNED, LaneState.QUEUED)).update(
        state=LaneState.RESTORED, note="the sweep ended before its trials ran"
    )


# --- the winner --------------------------------------------------------------------------------
def winner_proposal(sweep: Sweep) -> dict:
    """What "Propose the winner" fills the change form with: the winner's settings on the
    deployment's running config, a title, and a rationale citing the measured evidence."""
    require("propose", None, sweep)
    trial = sweep.winner
    control = sweep.trials.filter(is_control=True).first()
    running = sweep.deployment.active_config
    settings = dict(running.settings if running else {})
    settings.update(trial.point)
    lines = [
        f"Tuning sweep #{sweep.pk} ({sweep.title}) measured trial {trial.index} "
        f"({trial.label}) as the best config under {Slo.from_dict(sweep.slo).describe()}:",
        f"- {outcome_line(sweep, trial)}",
    ]
    if control is not None and control.state == TrialState.SUCCEEDED:
        lines.append(f"- control (running config): {outcome_line(sweep, control)}")
    lines.append(f"Evidence: {sweep.get_absolute_url()}")
    return {
        "settings": settings,
        # The running config's environment and CPU placement stay, as the change form
        # keeps them: the sweep searched engine flags only.
        "env": dict(running.env) if running else {},
        "placement": dict(running.placement) if running else {},
        "title": f"Sweep #{sweep.pk} winner: {trial.label}"[:120],
        "rationale": "\n".join(lines),
        "verify_profile": verification_profile(sweep, control),
    }


def verification_profile(sweep: Sweep, control: SweepTrial | None) -> LoadProfile:
    """The load the winner's change is verified under: the sweep's profile at the highest
    load the running config met the SLO at (the control's measured limit), where the change
    must be no worse. At the profile's saved load (a few req/s) both configs idle and the
    verification could show nothing; at the winner's own limit the running config is far
    past its capacity, its baseline unusable. Without a measured control: the profile as
    saved."""
    if control is None or not control.met_slo or not control.max_load:
        return sweep.load_profile
    profile = sweep.load_profile
    unit = "req/s" if sweep.load_mode == "rate" else "users"
    return LoadProfile.objects.create_next(
        f"{profile.name} @ {control.max_load:.3g} {unit}"[:100],
        apply_load(profile.spec, sweep.load_mode, control.max_load),
        description=f"{profile} at the running config's limit measured by sweep #{sweep.pk}.",
        note=f"sweep #{sweep.pk}: verifies its winner where the running config met the SLO",
        created_by=sweep.created_by,
    )


def outcome_line(sweep: Sweep, trial: SweepTrial) -> str:
    """The trial's result in words, each number named with its quantity and unit (the load
    is the whole config's, its throughput said for the config and per GPU): "max load at the
    SLO 503 req/s; output throughput 2,282 tok/s (1,141 tok/s per GPU over 2 GPUs); …"."""
    if trial.max_load is None or not trial.met_slo:
        return "did not meet the SLO at any load tried"
    numbers = trial.numbers or {}
    key = load_key(sweep.load_mode)
    parts = [f"{QUANTITIES[key][0]} {quantity_text(key, trial.max_load)}"]
    total, per_gpu = numbers.get("output_tps"), numbers.get("output_tps_per_gpu")
    if total is not None and per_gpu:
        gpus = round(total / per_gpu)
        parts.append(
            f"output throughput {quantity_text('output_tps', total)} "
            f"({quantity_text('output_tps_per_gpu', per_gpu)} over {gpus} GPU"
            f"{'s' if gpus != 1 else ''})"
        )
    elif per_gpu is not None:
        parts.append(f"output throughput {quantity_text('output_tps_per_gpu', per_gpu)}")
    if numbers.get("ttft_p95_ms") is not None:
        parts.append(f"p95 TTFT {quantity_text('ttft_p95_ms', numbers['ttft_p95_ms'])}")
    if trial.cost_per_million is not None:
        currency = sweep.target.get("currency", "")
        parts.append(f"{trial.cost_per_million:.3g} {currency} per 1M output tokens".strip())
    return "; ".join(parts)


def propose_winner(actor, sweep: Sweep, **fields) -> ChangeRequest:
    """The winner as a change of the deployment, through the normal review, with the sweep
    attached as its evidence."""
    require("propose", actor, sweep)
    proposal = winner_proposal(sweep)
    proposal.update(fields)
    change = propose_change(actor, sweep.deployment, **proposal)
    ChangeRequest.objects.filter(pk=change.pk).update(sweep=sweep)
    change.sweep = sweep
    return change


# --- live page ---------------------------------------------------------------------------------
def progress(sweep: Sweep) -> dict:
    """Trial n of k and an ETA from the trials finished so far (or the budget, before)."""
    trials = list(sweep.trials.all())
    total = len(trials)
    done = sum(1 for t in trials if t.is_finished)
    running = [t for t in trials if t.state == TrialState.RUNNING]
    eta_s = None
    finished = [t for t in trials if t.finished_at and t.started_at and t.state != "skipped"]
    if sweep.state == S.RUNNING and total:
        lanes = max(1, sweep.lanes.count())
        left = total - done
        if finished:
            each = sum((t.finished_at - t.started_at).total_seconds() for t in finished) / len(
                finished
            )
            eta_s = each * left / lanes
        if sweep.deadline is not None:
            budget_left = (sweep.deadline - timezone.now()).total_seconds()
            eta_s = max(0.0, budget_left) if eta_s is None else min(eta_s, max(0.0, budget_left))
    return {
        "total": total,
        "done": done,
        "current": running[0].index if running else None,
        "eta_s": eta_s,
    }


def publish_sweep(sweep: Sweep) -> None:
    publish(
        group_name("sweep", sweep.pk),
        "sweep.updated",
        {
            "id": sweep.pk,
            "state": sweep.state,
            "state_label": sweep.state_choice.label,
            "colour": sweep.state_choice.colour,
            "progress": progress(sweep),
            "outcome": sweep.outcome,
        },
    )


def occupants(deployment: Deployment) -> list[occupancy.Occupant]:
    """The ``occupancy`` holder of sweeps: a lane queued or running on the deployment holds
    it; the trial configs it applies, its benchmarks and its restore are its own parts."""
    lane = (
        SweepLane.objects.filter(deployment=deployment, state__in=LANE_LOCK_STATES)
        .select_related("sweep", "original_config")
        .first()
    )
    if lane is None:
        return []
    sweep = lane.sweep
    trials = SweepTrial.objects.filter(sweep=sweep)
    run_ids = trials.values_list("runs", flat=True)
    op_ids = set(trials.exclude(operation=None).values_list("operation_id", flat=True))
    op_ids |= set(
        sweep.lanes.exclude(restore_operation=None).values_list("restore_operation_id", flat=True)
    )
    parts = frozenset(
        {("benchmarks.benchmarkrun", pk) for pk in run_ids if pk is not None}
        | {("hosts.engineoperation", pk) for pk in op_ids}
    )
    text = (
        f"Tuning sweep #{sweep.pk} ({sweep.title}) is running its trials on it: only the "
        "sweep restarts or measures the engine until it has put the original config back."
    )
    if lane.state == LaneState.RESTORE_PENDING:
        version = lane.original_config.version if lane.original_config else "?"
        when = f"{lane.restore_next_at:%H:%M:%S} UTC" if lane.restore_next_at else "soon"
        text = (
            f"Restore pending: tuning sweep #{sweep.pk} could not put v{version} back because "
            f"the host did not answer (tried {lane.restore_attempts} time"
            f"{'s' if lane.restore_attempts != 1 else ''}; next try at {when}). The sweep "
            "keeps the deployment until it has."
        )
    return [occupancy.Occupant(sweep, text, parts)]
