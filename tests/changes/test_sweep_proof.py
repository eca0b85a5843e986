"""The sweep's promise, measured on a simulated GPU through the whole panel path: with a
third of the grid's real trials, the sweep's winner is within 5 % of the best config a full
real grid finds, and every trial's measured max rate at the SLO is within 15 % of its
prediction.

A 6-point grid (max_num_seqs × max_num_batched_tokens) of Llama-3.1-8B on a simulated H100
at half real time: the full grid is 7 real trials (the 6 points and the running config as
control), the budgeted sweep 2 (a third of 6: the control and the best predicted point).
``scripts/bench_sweep_proof.py`` runs this test and prints its table (the manual.s numbers).
"""

from __future__ import annotations

import pytest

from changes.choices import SweepState, TrialState
from changes.services import sweep_trials
from tests.changes import test_sweep_agent as support
from tests.changes.test_sweep_agent import LOAD, made, started
from tests.factories import make_profile

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]

# The same simulated deployment as the worker-path tests.
agent = support.agent
deployment = support.deployment
SPACE = {"max_num_seqs": [4, 8, 12], "max_num_batched_tokens": [256, 1024]}
GRID_POINTS = 6


def run_sweep(operator, deployment, profile, max_trials: int):
    sweep = made(
        operator,
        deployment,
        profile=profile,
        space=SPACE,
        max_trials=max_trials,
        max_steps=6,
        title=f"{max_trials} trials",
    )
    (lane,) = started(operator, sweep)
    sweep_trials.run_lane(lane)
    sweep.refresh_from_db()
    assert sweep.state == SweepState.DONE, sweep.outcome
    return sweep


def key(trial) -> tuple:
    return tuple(sorted(trial.settings.items()))


@pytest.mark.timing
def test_a_third_of_the_grid_finds_a_config_within_5_percent_of_the_best(operator, deployment):
    profile = make_profile(spec=LOAD)
    grid = run_sweep(operator, deployment, profile, max_trials=GRID_POINTS + 1)
    trials = list(grid.trials.order_by("index"))
    assert len(trials) == GRID_POINTS + 1
    assert all(t.state == TrialState.SUCCEEDED for t in trials), [t.error for t in trials]

    budget = run_sweep(operator, deployment, profile, max_trials=GRID_POINTS // 3)
    assert budget.trials.count() == GRID_POINTS // 3

    measured = {key(t): t for t in trials}
    best = grid.winner
    chosen = budget.winner
    assert best is not None and chosen is not None
    # The budgeted sweep's choice, judged by the full grid's own measurement of it.
    chosen_in_grid = measured[key(chosen)].objective_value
    shortfall = 1 - chosen_in_grid / best.objective_value

    rows = []
    errors = []
    for trial in [*trials, *budget.trials.order_by("index")]:
        errors.append(abs(trial.prediction_error))
        rows.append(
            f"  sweep #{trial.sweep_id} trial {trial.index:<2} {trial.label:<52} "
            f"predicted {trial.predicted['max_load']:6.1f} req/s  measured "
            f"{trial.max_load:6.1f} req/s  error {trial.prediction_error:+6.1%}  "
            f"{trial.numbers['output_tps_per_gpu']:7.0f} tok/s/GPU"
        )
    print("\n".join(["", "Sweep proof (simulated H100 at time_scale 0.5, p95 TTFT <= 150 ms):"]))
    print("\n".join(rows))
    print(
        f"  full grid best: {best.label} {best.objective_value:.0f} tok/s/GPU; "
        f"budgeted (2 of 7 trials) chose {chosen.label}: {chosen_in_grid:.0f} tok/s/GPU "
        f"in the grid, {shortfall:+.1%} short; worst prediction error {max(errors):.1%}"
    )
    assert shortfall <= 0.05
    assert max(errors) <= 0.15
