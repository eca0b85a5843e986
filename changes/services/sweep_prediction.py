"""Tuning sweeps, the prediction: every point of the space scored in the simulator's virtual
time (``benchmarks.sweep.predict_space``, seconds), the trials chosen from it — the running
config as the control, then the best predicted configs up to the budget — and the sweep moved
on to review, or straight to ready when no approval is needed. Touches no engine. For the
page and the API: how far the prediction was from each trial's measurement, quantity by
quantity, and whether the profile is long enough to measure the loads searched at a steady
state (``reach_warning``, its rule stated above it).
"""

from __future__ import annotations

import math

from django.db import transaction

from benchmarks.loadgen.profile import normalize
from benchmarks.loadgen.spec import SpecError
from benchmarks.sweep import (
    PointScore,
    PredictError,
    Slo,
    candidates,
    parse_space,
    predict_space,
    score_point,
    sweep_workload,
)
from changes.choices import LaneState, SweepState
from changes.models_sweeps import Sweep, SweepTrial
from changes.services.sweep_figures import QUANTITIES, load_key, quantity_text
from changes.services.sweep_trials import search_bounds
from changes.services.sweeps import publish_sweep
from controlpanel.services import audit

S = SweepState


def predict(sweep: Sweep) -> Sweep:
    """Score every point of the space (``benchmarks.sweep.predict_space``), choose the trials
    (the control first, then the best predicted configs up to the budget) and move the
    sweep on to review, or straight to ready when no approval is needed."""
    deployment = sweep.deployment
    base = sweep.base_config.settings if sweep.base_config else {}
    slo = Slo.from_dict(sweep.slo)
    facts = sweep.target
    space = parse_space(deployment.engine, deployment.engine_version or None, sweep.space)
    workload = sweep_workload(sweep.load_profile.spec, sweep.load_mode)
    price = facts.get("price_per_gpu_hour")
    options = {
        "price_per_gpu_hour": price,
        "time_scale": facts.get("time_scale") or 1.0,
    }
    picked: list[tuple[dict, dict, PointScore | None, int | None]] = []
    prediction = None
    try:
        if not facts.get("gpu"):
            raise PredictError(f"the panel does not know the GPU of {deployment}")
        prediction = predict_space(
            deployment.engine,
            deployment.model,
            base,
            space,
            facts["gpu"],
            facts["num_gpus"],
            workload,
            sweep.load_mode,
            slo,
            sweep.objective,
            **options,
            on_progress=lambda done, total: _progress_note(sweep, done, total),
        )
    except PredictError as exc:
        prediction = None
        sweep.prediction_problem = f"No prediction: {exc}. The trials take the space in order."
        control_score = None
        for point in space.points():
            if len(picked) >= sweep.max_trials - 1:
                break
            settings = {**base, **point}
            if settings != base:
                picked.append((point, settings, None, None))
    else:
        if prediction.counts["feasible"] == 0:
            return _fail_prediction(sweep, prediction)
        control_score = score_point(
            deployment.engine,
            deployment.model,
            base,
            facts["gpu"],
            facts["num_gpus"],
            workload,
            sweep.load_mode,
            slo,
            objective=sweep.objective,
            **options,
        )
        ranked = [p for p in prediction.points if p.feasible]
        rank_of = {id(p): n for n, p in enumerate(ranked, start=1)}
        for score in candidates(prediction, len(ranked)):
            if len(picked) >= sweep.max_trials - 1:
                break
            if score.settings != base:
                picked.append((score.point, score.settings, score, rank_of.get(id(score))))
    with transaction.atomic():
        problem = sweep.prediction_problem
        sweep = Sweep.objects.select_for_update().get(pk=sweep.pk)
        if sweep.state == S.PREDICTING:  # not cancelled meanwhile
            _create_trials(sweep, base, control_score, picked)
            sweep.prediction_problem = problem
            sweep.prediction = prediction.to_dict() if prediction is not None else {}
            sweep.save(update_fields=["prediction", "prediction_problem"])
            sweep.transition_to(S.PENDING if sweep.required_approvals else S.READY)
            audit(None, "sweep.predicted", sweep, after={"trials": sweep.trials.count()})
    publish_sweep(sweep)
    return sweep


def _progress_note(sweep: Sweep, done: int, total: int) -> None:
    if done % 20 == 0 or done == total:
        Sweep.objects.filter(pk=sweep.pk).update(outcome=f"predicting: {done} of {total} points")


def _fail_prediction(sweep: Sweep, prediction) -> Sweep:
    groups = prediction.to_dict().get("infeasible") or []
    reasons = (
        "; ".join(f"{g['count']}× {g['error']}" for g in groups[:3])
        or "the engine would refuse every config"
    )
    with transaction.atomic():
        sweep = Sweep.objects.select_for_update().get(pk=sweep.pk)
        sweep.prediction = prediction.to_dict()
        sweep.outcome = (
            f"No config of the space can start: the engine would refuse all "
            f"{prediction.counts['total']} of them ({reasons}). Nothing was run."
        )[:1000]
        sweep.save(update_fields=["prediction", "outcome"])
        sweep.transition_to(S.FAILED)
        sweep.lanes.update(state=LaneState.RESTORED, note="the sweep ended before its trials ran")
    publish_sweep(sweep)
    return sweep


def _create_trials(sweep, base: dict, control_score, picked) -> None:
    SweepTrial.objects.filter(sweep=sweep).delete()  # a redelivered prediction starts over
    SweepTrial.objects.create(
        sweep=sweep,
        index=1,
        is_control=True,
        point={k: base.get(k) for k in sweep.space},
        settings=base,
        predicted=control_score.to_dict() if control_score else {},
    )
    for index, (point, settings, score, rank) in enumerate(picked, start=2):
        SweepTrial.objects.create(
            sweep=sweep,
            index=index,
            point=point,
            settings=settings,
            predicted=score.to_dict() if score else {},
            predicted_rank=rank,
        )


def fail_prediction(sweep_pk: int, error: str) -> None:
    """The prediction task broke: the sweep ends failed, saying why (nothing was run)."""
    with transaction.atomic():
        sweep = Sweep.objects.select_for_update().get(pk=sweep_pk)
        if sweep.state != S.PREDICTING:
            return
        sweep.outcome = f"the prediction failed: {error}"[:1000]
        sweep.save(update_fields=["outcome"])
        sweep.transition_to(S.FAILED)
        sweep.lanes.update(state=LaneState.RESTORED, note="the sweep ended before its trials ran")
    publish_sweep(sweep)


def fail_lost_prediction(sweep: Sweep, why: str) -> None:
    """The prediction's worker was lost (``controlpanel.lostwork``): the sweep ends failed
    instead of "predicting" for ever. A sweep past its prediction is not touched."""
    fail_prediction(sweep.pk, why)


# --- how good the prediction was, quantity by quantity ------------------------------------------
# What the prediction says of a trial at its max load, and where the measurement keeps the same
# quantity: (quantity key, where predicted, where measured). "max_load" is the trial's field.
PREDICTED_QUANTITIES = (
    ("load", "max_load", "max_load"),
    ("output_tps_per_gpu", "numbers.output_tps_per_gpu", "numbers.output_tps_per_gpu"),
    ("output_tps_per_user", "numbers.output_tps_per_user", "numbers.output_tps_per_user"),
    ("ttft_p95_ms", "numbers.ttft_p95_ms", "numbers.ttft_p95_ms"),
    ("cost_per_million", "cost_per_million", "cost_per_million"),
)


def _at(data: dict, path: str):
    for part in path.split("."):
        data = data.get(part) if isinstance(data, dict) else None
    return data if isinstance(data, int | float) and not isinstance(data, bool) else None


def prediction_errors(trial, load_mode: str, currency: str = "") -> list[dict]:
    """(measured − predicted) ÷ predicted for each quantity the prediction predicts at the
    trial's max load at the SLO: the max load itself, output throughput per GPU, output
    speed per user, p95 TTFT and the cost per 1M output tokens. Each side is at its own max
    load (what the prediction said the config achieves at the SLO against what it did).
    Empty until the trial met the SLO somewhere."""
    if not trial.met_slo or not trial.predicted:
        return []
    measured = {
        "max_load": trial.max_load,
        "numbers": trial.numbers or {},
        "cost_per_million": trial.cost_per_million,
    }
    rows = []
    for key, predicted_at, measured_at in PREDICTED_QUANTITIES:
        predicted, actual = _at(trial.predicted, predicted_at), _at(measured, measured_at)
        if predicted is None or actual is None or predicted == 0:
            continue
        quantity = load_key(load_mode) if key == "load" else key
        unit = currency if key == "cost_per_million" else ""
        rows.append(
            {
                "quantity": quantity,
                "name": QUANTITIES[quantity][0],
                "predicted": predicted,
                "measured": actual,
                "predicted_text": quantity_text(quantity, predicted, unit),
                "measured_text": quantity_text(quantity, actual, unit),
                "error": (actual - predicted) / predicted,
            }
        )
    return rows


# --- can the profile reach the loads searched? ---------------------------------------------------
# The rule: a benchmark at a load measures a steady state when the engine spends most of the run
# full, not filling up. At a request rate r the number of requests in flight climbs for about W,
# the time one request spends in the engine (Little's law: r × W in flight), so the main stage
# must keep arriving for at least STEADY_LATENCIES × W (the ramp-up then weighs at most a fifth)
# and never under STEADY_MIN_S. At a concurrency c every client starts at once; each must send at
# least STEADY_REQUESTS_PER_USER requests so the first round is at most a fifth of the run.
STEADY_MIN_S = 10.0
STEADY_LATENCIES = 5
STEADY_REQUESTS_PER_USER = 5


def _main_stage(spec: dict) -> dict | None:
    """The stage a sweep moves (``sweep_workload``'s choice): the most requests, first on a
    tie; a stage given by duration counts its requests at its own load."""
    try:
        stages = normalize(dict(spec or {}))["stages"]
    except (SpecError, KeyError, TypeError, ValueError):
        return None

    def count(stage):
        if stage.get("num_requests"):
            return stage["num_requests"]
        load = stage.get("request_rate") or stage.get("concurrency") or 1
        return load * (stage.get("duration_s") or 0)

    return max(stages, key=count) if stages else None


def _request_seconds(trial, output_tokens: float) -> float | None:
    """W: p95 TTFT plus the output at the predicted speed per user, at the trial's max load."""
    numbers = (trial.predicted or {}).get("numbers") or {}
    ttft, speed = _at(numbers, "ttft_p95_ms"), _at(numbers, "output_tps_per_user")
    if ttft is None or not speed:
        return None
    return ttft / 1000 + output_tokens / speed


def reach_warning(sweep, trials) -> str:
    """Why the sweep's profile cannot measure the highest loads its trials may search at a
    steady state (the rule above), with the load it can reach and what would fix it; empty
    when it can (or before there are trials)."""
    stage = _main_stage(sweep.load_profile.spec if sweep.load_profile else {})
    if stage is None or not trials:
        return ""
    try:
        output_tokens = float(
            sweep_workload(sweep.load_profile.spec, sweep.load_mode).output_tokens
        )
        highest = max(((search_bounds(t, sweep)[2], t) for t in trials), key=lambda p: p[0])
    except (SpecError, ValueError, TypeError):
        return ""
    load, trial = highest
    count, duration = stage.get("num_requests"), stage.get("duration_s")
    name = stage.get("name") or "main"
    if sweep.load_mode == "concurrency":
        if count is None:
            return ""  # a duration keeps every client busy for all of it
        per_user = count / load
        if per_user >= STEADY_REQUESTS_PER_USER:
            return ""
        reach = count // STEADY_REQUESTS_PER_USER
        return (
            f"The profile cannot measure the loads searched at a steady state: its stage "
            f"“{name}” sends {count} requests, {per_user:.2g} per user at "
            f"{quantity_text('load_concurrency', load)} (the most a trial may search); each "
            f"user needs at least {STEADY_REQUESTS_PER_USER}, so loads above {reach} "
            f"concurrent users are measured in their first round. Give the profile at least "
            f"{int(load * STEADY_REQUESTS_PER_USER):,} requests or a duration."
        )
    w = _request_seconds(trial, output_tokens)
    needed = max(STEADY_MIN_S, STEADY_LATENCIES * w) if w is not None else STEADY_MIN_S
    lasts = min(count / load if count else float("inf"), duration or float("inf"))
    if lasts >= needed:
        return ""
    why = (
        f"the larger of {STEADY_MIN_S:g} s and {STEADY_LATENCIES} × {w:.2g} s, the time one "
        "request is predicted to spend in the engine"
        if w is not None
        else f"at least {STEADY_MIN_S:g} s"
    )
    if count and (not duration or count / load <= duration):
        reach = count / needed
        sends = f"sends {count:,} requests"
        fix = f"at least {math.ceil(load * needed):,} requests or a duration of {needed:.0f} s"
    else:
        reach = None
        sends = f"lasts {duration:g} s"
        fix = f"a duration of at least {needed:.0f} s"
    beyond = (
        f"; loads above {quantity_text('load_rate', reach)} are measured while the engine "
        "still fills up"
        if reach
        else ""
    )
    return (
        f"The profile is too short for the rates searched: its stage “{name}” {sends}, so at "
        f"{quantity_text('load_rate', load)} (the highest rate a trial may search) it lasts "
        f"{lasts:.2g} s, under the {needed:.2g} s a steady state needs ({why}){beyond}. "
        f"Give it {fix}."
    )
