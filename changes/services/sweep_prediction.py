"""Tuning sweeps, the prediction: every point of the space scored in the simulator's virtual
time (``benchmarks.sweep.predict_space``, seconds), the trials chosen from it — the running
config as the control, then the best predicted configs up to the budget — and the sweep moved
on to review, or straight to ready when no approval is needed. Touches no engine.
"""

from __future__ import annotations

from django.db import transaction

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
