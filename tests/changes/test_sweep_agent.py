"""Tuning sweeps end to end against a real host agent supervising real simulator processes:
the prediction, the trials (config applied, real benchmarks at the searched loads), the
original config restored, the winner; a trial whose engine will not start fails with the
engine's own error and the lane goes on; a cancel mid-trial keeps what was measured and
restores the config; a deployment held by a sweep refuses other work.

The simulated H100 runs at half real time (time_scale 0.5), and the prediction is told so,
so that predicted and measured loads are comparable."""

from __future__ import annotations

import subprocess
import threading
import time
from unittest import mock

import pytest
from django.db import close_old_connections

from benchmarks.models import BenchmarkRun
from benchmarks.services import runs as benchmark_runs
from changes.choices import LaneState, SweepState, TrialState
from changes.models import Sweep, SweepTrial
from changes.rules_sweeps import SweepRefused
from changes.services import sweep_prediction, sweep_trials, sweeps
from hosts.models import EngineConfig, EngineOperation
from hosts.services import operations as host_operations
from tests.factories import make_host, make_profile, make_sim_deployment
from tests.hosts.agent.conftest import AgentProcess

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]

BASE = {"gpu_memory_utilization": 0.9, "max_model_len": 8192, "max_num_seqs": 4}
# Open loop, 100 measured requests of 256 → 32 tokens: long enough for a steady state at
# the loads searched (10–60 req/s on this simulated GPU), short enough for a test.
LOAD = {
    "stages": [{"name": "main", "request_rate": 10, "num_requests": 100}],
    "input_len": {"kind": "fixed", "mean": 256},
    "output_len": {"kind": "fixed", "mean": 32},
    "warmup_requests": 4,
}
SLO = {"ttft_p95_ms": 150}


@pytest.fixture
def agent(tmp_path):
    process = AgentProcess(tmp_path, "--simulate", "h100-sxm:1").start()
    yield process
    process.stop()


@pytest.fixture
def deployment(agent, settings):
    settings.CHANGE_HEALTH_TIMEOUT = 10
    settings.CHANGE_HEARTBEAT_SECONDS = 1
    host = make_host(name="sweep-host", port=agent.port, agent_token=agent.token)
    deployment = make_sim_deployment(
        host, simulator={"gpu": "h100-sxm", "startup_seconds": 0.3, "time_scale": 0.5}
    )
    config = EngineConfig.objects.create_next(deployment, BASE)
    op = EngineOperation.objects.create(deployment=deployment, kind="apply", config=config)
    host_operations.run_operation(EngineOperation.objects.get(pk=op.pk))
    deployment.refresh_from_db()
    assert deployment.active_config == config, EngineOperation.objects.get(pk=op.pk).error
    return deployment


def made(operator, deployment, **kw) -> Sweep:
    """A sweep created and predicted here (the prediction task's work, run inline)."""
    with mock.patch("changes.services.sweeps.enqueue_on_commit") as queued:
        sweep = sweeps.create_sweep(
            operator,
            deployment,
            title=kw.pop("title", "more throughput"),
            profile=kw.pop("profile", None) or make_profile(spec=LOAD),
            space=kw.pop("space", {"max_num_seqs": [2, 8]}),
            slo=kw.pop("slo", SLO),
            **{"max_trials": 2, "max_steps": 4, **kw},
        )
    queued.assert_called_once_with(sweeps.PREDICT_TASK, sweep.pk)
    return sweep_prediction.predict(Sweep.objects.get(pk=sweep.pk))


def started(operator, sweep) -> list[int]:
    with mock.patch("changes.services.sweeps.enqueue_on_commit") as queued:
        sweeps.start_sweep(operator, sweep)
    return [call.args[1] for call in queued.call_args_list]


@pytest.mark.timing
def test_a_sweep_measures_its_trials_and_restores_the_config(operator, deployment):
    original = deployment.active_config
    sweep = made(operator, deployment)
    assert sweep.state == SweepState.READY  # no production label: no review needed
    trials = list(sweep.trials.order_by("index"))
    assert [t.is_control for t in trials] == [True, False]
    # The best predicted point other than the running config: the bigger batch.
    assert trials[1].point == {"max_num_seqs": 8}
    assert trials[1].predicted["max_load"] > trials[0].predicted["max_load"]

    lanes = started(operator, sweep)
    assert len(lanes) == 1
    # While the lane holds the deployment, nothing else may use it.
    with pytest.raises(benchmark_runs.RunRefused, match="sweep"):
        benchmark_runs.start_benchmark(operator, deployment, make_profile())
    sweep_trials.run_lane(lanes[0])

    sweep.refresh_from_db()
    assert sweep.state == SweepState.DONE, sweep.outcome
    deployment.refresh_from_db()
    assert deployment.active_config == original  # back on the config it ran before
    lane = sweep.lanes.get()
    assert lane.state == LaneState.RESTORED
    trials = list(sweep.trials.order_by("index"))
    assert all(t.state == TrialState.SUCCEEDED for t in trials), [t.error for t in trials]
    for trial in trials:
        assert 2 <= len(trial.probes) <= sweep.max_steps
        runs = BenchmarkRun.objects.filter(pk__in=[p["run"] for p in trial.probes])
        assert runs.count() == len(trial.probes)
        for run in runs:  # ordinary runs of the trial's config, at the searched load
            assert run.engine_config == trial.config
            assert run.load_override["mode"] == "rate"
            assert "sweep #" in run.label
        assert trial.met_slo, trial.probes
        # The measured limit is within 15 % of the simulator's prediction.
        assert abs(trial.prediction_error) <= 0.15, (trial.max_load, trial.predicted["max_load"])
    assert trials[0].config == original  # the control ran the running config itself
    assert "temporary" in trials[1].config.note
    assert sweep.winner == trials[1]
    assert trials[1].objective_value > trials[0].objective_value
    assert "Winner: trial 2" in sweep.outcome


def test_a_trial_that_cannot_start_fails_and_the_lane_goes_on(operator, deployment):
    original = deployment.active_config
    # 0.05 of the GPU cannot hold the weights: the engine refuses to start.
    sweep = made(
        operator,
        deployment,
        space={"gpu_memory_utilization": [0.05, 0.9]},
        max_trials=3,
    )
    # The prediction knew it: the infeasible point is not among the trials.
    assert sweep.prediction["counts"]["feasible"] == 1
    assert "gpu_memory_utilization" in str(sweep.prediction["infeasible"])
    # Force it in to see the real engine refuse it (a prediction is not proof).
    SweepTrial.objects.create(
        sweep=sweep,
        index=9,
        point={"gpu_memory_utilization": 0.05},
        settings={**BASE, "gpu_memory_utilization": 0.05},
    )
    (lane,) = started(operator, sweep)
    sweep_trials.run_lane(lane)
    sweep.refresh_from_db()
    broken = sweep.trials.get(index=9)
    assert broken.state == TrialState.FAILED
    assert "did not start" in broken.error
    assert sweep.trials.get(index=1).state == TrialState.SUCCEEDED
    deployment.refresh_from_db()
    assert deployment.active_config == original
    assert sweep.state == SweepState.DONE


def test_cancel_mid_trial_keeps_what_was_measured_and_restores(operator, deployment):
    original = deployment.active_config
    sweep = made(operator, deployment, max_steps=6)
    (lane,) = started(operator, sweep)
    worker = threading.Thread(target=_lane_thread, args=(lane,))
    worker.start()
    try:
        deadline = time.monotonic() + 120
        # Wait until the second trial is measuring (its config applied, a run going).
        while time.monotonic() < deadline:
            trial = sweep.trials.get(index=2)
            if trial.state == TrialState.RUNNING and trial.runs.filter(status="running"):
                break
            time.sleep(0.2)
        else:
            pytest.fail("the second trial never started measuring")
        sweeps.cancel_sweep(operator, Sweep.objects.get(pk=sweep.pk))
    finally:
        worker.join(timeout=180)
    sweep.refresh_from_db()
    assert sweep.state == SweepState.CANCELLED
    assert sweep.trials.get(index=1).state == TrialState.SUCCEEDED  # kept
    assert sweep.trials.get(index=2).state == TrialState.CANCELLED
    deployment.refresh_from_db()
    assert deployment.active_config == original
    assert sweep.lanes.get().state == LaneState.RESTORED
    # Cancelled: its best is only the best so far, and it cannot be proposed.
    assert "cancelled" in sweep.outcome and "Winner" not in sweep.outcome


def test_a_sweep_cannot_start_on_a_busy_deployment(operator, deployment):
    sweep = made(operator, deployment)
    with mock.patch("benchmarks.services.runs.enqueue_on_commit"):
        benchmark_runs.start_benchmark(operator, deployment, make_profile())
    with pytest.raises(SweepRefused, match="Benchmark"):
        started(operator, sweep)
    assert Sweep.objects.get(pk=sweep.pk).state == SweepState.READY


def _lane_thread(lane_pk: int) -> None:
    try:
        sweep_trials.run_lane(lane_pk)
    finally:
        close_old_connections()


def test_twin_deployments_run_trials_side_by_side(operator, deployment):
    """Two deployments of the same model and GPU: each lane takes the next queued trial,
    so the trials spread over both, and both get their own config back."""
    twin = make_sim_deployment(
        deployment.host,
        name="llama-twin",
        simulator={"gpu": "h100-sxm", "startup_seconds": 0.3, "time_scale": 0.5},
    )
    config = EngineConfig.objects.create_next(twin, {**BASE, "max_num_seqs": 6})
    op = EngineOperation.objects.create(deployment=twin, kind="apply", config=config)
    host_operations.run_operation(EngineOperation.objects.get(pk=op.pk))
    twin.refresh_from_db()
    assert twin.active_config == config
    assert [d.pk for d in sweeps.twins(deployment)] == [twin.pk]

    sweep = made(
        operator,
        deployment,
        space={"max_num_seqs": [2, 8, 12]},
        max_trials=4,
        max_steps=2,
        twin_deployments=[twin],
    )
    lanes = started(operator, sweep)
    assert len(lanes) == 2
    workers = [threading.Thread(target=_lane_thread, args=(pk,)) for pk in lanes]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(timeout=300)
    sweep.refresh_from_db()
    assert sweep.state == SweepState.DONE, sweep.outcome
    used = {t.lane.deployment_id for t in sweep.trials.all()}
    assert used == {deployment.pk, twin.pk}
    twin.refresh_from_db()
    deployment.refresh_from_db()
    assert twin.active_config == config  # its own original, not the primary's
    assert deployment.active_config == sweep.base_config
    # The same settings on either lane: a trial on the twin ran the primary's settings.
    for trial in sweep.trials.filter(lane__deployment=twin):
        assert trial.config.settings == trial.settings


def test_an_engine_dying_mid_trial_fails_it_restores_and_goes_on(operator, deployment):
    original = deployment.active_config
    sweep = made(operator, deployment, space={"max_num_seqs": [2, 8, 12]}, max_trials=3)
    (lane,) = started(operator, sweep)
    worker = threading.Thread(target=_lane_thread, args=(lane,))
    worker.start()
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            trial = sweep.trials.get(index=2)
            if trial.state == TrialState.RUNNING and trial.runs.filter(status="running"):
                break
            time.sleep(0.2)
        else:
            pytest.fail("the second trial never started measuring")
        time.sleep(0.5)
        # The engine process dies under load (a crash, an OOM kill).
        subprocess.run(["pkill", "-9", "-f", f"port {deployment.port}"], check=False)
    finally:
        worker.join(timeout=240)
    sweep.refresh_from_db()
    broken = sweep.trials.get(index=2)
    assert broken.state == TrialState.FAILED
    assert "the engine failed during" in broken.error
    # The lane went on: the next trial ran on the original config's engine put back first.
    assert sweep.trials.get(index=3).state == TrialState.SUCCEEDED
    assert sweep.state == SweepState.DONE
    deployment.refresh_from_db()
    assert deployment.active_config == original
    assert sweep.lanes.get().state == LaneState.RESTORED
