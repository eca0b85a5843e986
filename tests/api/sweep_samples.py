"""A finished tuning sweep with everything its API detail shows (a prediction, a lane, a
control and a winning trial with probes of real runs), made row by row: the worker's way of
getting there (simulator, agent, benchmarks) is tests/changes' business, not the API's."""

from __future__ import annotations

from datetime import timedelta

from django.utils import timezone

from changes.choices import LaneState, SweepState, TrialState
from changes.models_sweeps import Sweep, SweepLane, SweepTrial
from tests.factories import make_config, make_finished_run

SLO = {"ttft_p95_ms": 500.0, "max_error_rate": 0.01}


def score(point: dict, settings: dict, max_load: float, **kw) -> dict:
    """A ``benchmarks.sweep.PointScore`` dict as the prediction stores it."""
    data = {
        "point": point,
        "settings": settings,
        "feasible": True,
        "error": None,
        "gpus_used": 1,
        "max_load": max_load,
        "numbers": {"ttft_p95_ms": 300.0, "output_tps_per_gpu": 900.0},
        "margin": 0.2,
        "cost_per_million": None,
        "objective": None if max_load is None else max_load * 100,
        "curve": [],
        "meets_slo": True,
        "closest": None,
        "index": 0,
        "note": "",
    }
    data.update(kw)
    return data


def make_done_sweep(deployment, user, profile, *, winner_point=None) -> Sweep:
    """A sweep of ``deployment`` (which runs a config) that is done: trial 1 the control,
    trial 2 the winner (``winner_point`` on the running settings), each with a probe."""
    base = deployment.active_config
    winner_point = winner_point or {"max_num_seqs": 128}
    winner_settings = {**base.settings, **winner_point}
    now = timezone.now()
    points = [
        score(winner_point, winner_settings, 12.0),
        score({"max_num_seqs": 32}, {**base.settings, "max_num_seqs": 32}, 6.0, index=1),
        score(
            {"max_num_seqs": 1024},
            {**base.settings, "max_num_seqs": 1024},
            None,
            feasible=False,
            meets_slo=False,
            error="KV cache too small by 3.2 GiB",
            index=2,
        ),
    ]
    prediction = {
        "points": points,
        "counts": {"total": 3, "feasible": 2, "meeting": 2},
        "infeasible": [
            {
                "error": "KV cache too small by 3.2 GiB",
                "count": 1,
                "points": [{"max_num_seqs": 1024}],
            }
        ],
        "no_point_meets": False,
        "closest": None,
        "elapsed_s": 1.5,
    }
    sweep = Sweep.objects.create(
        deployment=deployment,
        title="More throughput",
        state=SweepState.DONE,
        created_by=user,
        load_profile=profile,
        load_mode="rate",
        space={"max_num_seqs": [32, 128, 1024]},
        slo=SLO,
        base_config=base,
        target={"gpu": "h100-sxm", "num_gpus": 1, "time_scale": 1.0},
        prediction=prediction,
        decided_at=now - timedelta(minutes=30),
        started_at=now - timedelta(minutes=30),
        finished_at=now,
        outcome="trial 2 won",
    )
    lane = SweepLane.objects.create(
        sweep=sweep, deployment=deployment, original_config=base, state=LaneState.RESTORED
    )
    trials = []
    for index, (point, settings, predicted, measured) in enumerate(
        [({}, base.settings, {}, 8.0), (winner_point, winner_settings, points[0], 11.0)], start=1
    ):
        config = base if index == 1 else make_config(deployment, winner_settings)
        run = make_finished_run(deployment, load_profile=profile, engine_config=config)
        trial = SweepTrial.objects.create(
            sweep=sweep,
            index=index,
            is_control=index == 1,
            point=point,
            settings=settings,
            predicted=predicted,
            predicted_rank=None if index == 1 else 1,
            state=TrialState.SUCCEEDED,
            lane=lane,
            config=config,
            probes=[
                {
                    "load": measured,
                    "run": run.pk,
                    "status": "succeeded",
                    "ok": True,
                    "violations": [],
                    "margin": 0.1,
                    "numbers": {"ttft_p95_ms": 300.0},
                }
            ],
            max_load=measured,
            met_slo=True,
            numbers={"ttft_p95_ms": 300.0, "output_tps_per_gpu": 1280.0},
            objective_value=measured * 100,
            prediction_error=None if index == 1 else (measured - 12.0) / 12.0,
            started_at=now - timedelta(minutes=20),
            finished_at=now - timedelta(minutes=10),
        )
        trial.runs.add(run)
        trials.append(trial)
    # The control's config is made before the winner's: the deployment still runs ``base``.
    deployment.active_config = base
    deployment.save(update_fields=["active_config"])
    sweep.winner = trials[1]
    sweep.save(update_fields=["winner"])
    return sweep
