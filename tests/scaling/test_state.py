"""A deployment's scaling state: evidence on the running config, the chosen profile, sweep
trials, replica groups, stale signals, and a bounded number of queries for the fleet."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from benchmarks.models import RunPoint
from changes.choices import SweepState, TrialState
from changes.models_sweeps import Sweep, SweepTrial
from hosts.models import EngineConfig
from scaling.models import EngineSample, ScalingPolicy
from scaling.planning.types import Signals, Window
from scaling.services.state import fleet_states, scaling_state
from tests.factories import make_config, make_deployment, make_finished_run, make_profile

pytestmark = pytest.mark.django_db

STAGED = {
    "stages": [
        {"name": "warm", "concurrency": 16, "num_requests": 100},
        {"name": "peak", "concurrency": 48, "num_requests": 300},
        {"name": "burst", "concurrency": 64, "num_requests": 300},
    ],
    "input_len": {"kind": "fixed", "mean": 500},
    "output_len": {"kind": "fixed", "mean": 100},
}


def stage_summary(rps: float, ttft: float, completed: int = 100, errors: float = 0.0) -> dict:
    return {
        "completed": completed,
        "failed": 0,
        "error_rate": errors,
        "request_throughput": rps,
        "p95_ttft_ms": ttft,
        "p95_itl_ms": 20.0,
        "output_throughput": rps * 100,
        "total_input_tokens": completed * 500,
        "total_output_tokens": completed * 100,
    }


def running(**kw):
    deployment = make_deployment(status="running", **kw)
    config = make_config(deployment, {"max_num_seqs": 256})
    deployment.active_config = config
    deployment.save()
    return deployment


def staged_run(deployment, profile, config=None, levels=None, gauges=True, **kw):
    """A finished run of the staged profile: warm fine, peak at 410 ms, burst at 730 ms."""
    levels = levels or {"warm": (4.0, 150.0), "peak": (9.1, 410.0), "burst": (9.4, 730.0)}
    run = make_finished_run(
        deployment,
        load_profile=profile,
        engine_config=config or deployment.active_config,
        stages={name: stage_summary(rps, ttft) for name, (rps, ttft) in levels.items()},
        **kw,
    )
    if gauges:
        waiting = {"warm": 0, "peak": 4, "burst": 14}
        kv = {"warm": 0.2, "peak": 0.6, "burst": 0.9}
        t = 0.0
        for name in levels:
            for _ in range(3):
                t += 1.0
                RunPoint.objects.create(
                    run=run,
                    t=t,
                    data={
                        "t": t,
                        "stage": name,
                        "server_waiting": waiting.get(name, 0),
                        "server_running": 20,
                        "kv_cache_usage": kv.get(name, 0.5),
                    },
                )
    return run


def sample(deployment, rps: float, *, ago: float = 1.0, waiting: float = 0.0, p95: float = 0.3):
    signals = Signals(
        at=0.0,
        engine="vllm",
        requests_waiting=waiting,
        requests_running=10.0,
        arrival_rps=rps,
        ttft={
            "1m": Window(seconds=60, requests=rps * 60, p50=p95 / 2, p95=p95),
            "5m": Window(seconds=300, requests=rps * 300, p50=p95 / 2, p95=p95),
        },
    )
    return EngineSample.objects.create(
        deployment=deployment,
        time=timezone.now() - timedelta(seconds=ago),
        signals=signals.as_dict(),
    )


def test_capacity_from_the_runs_stages_with_the_stage_gauges():
    deployment = running()
    profile = make_profile(spec=STAGED)
    run = staged_run(deployment, profile)
    state = scaling_state(deployment)
    cap = state.capacity
    assert cap.status == "measured"
    assert cap.rps == 9.1 and cap.concurrency == 48
    assert cap.best.run_id == run.pk and cap.best.stage == "peak"
    assert cap.breach.stage == "burst"
    assert cap.queue_at_breach == pytest.approx(4 + 10 * 90 / 320)
    assert cap.best.mean_prompt_tokens == 500
    assert f"run #{run.pk} stage 'peak' (48 clients)" in cap.explanation
    assert state.profile_id == profile.pk
    assert state.slo.ttft_p95_ms == 500.0  # the settings' default SLO
    assert state.evidence_points == 3


def test_runs_on_other_settings_are_ignored_but_equal_settings_count():
    deployment = running()
    profile = make_profile(spec=STAGED)
    old = deployment.active_config
    other = make_config(deployment, {"max_num_seqs": 64})
    staged_run(deployment, profile, config=other, levels={"peak": (20.0, 100.0)})
    assert scaling_state(deployment).capacity.status == "no_evidence"
    # A run on v1, then v2 (other settings), then v3 = v1's settings again (a rollback).
    staged_run(deployment, profile, config=old)
    rollback = EngineConfig.objects.create_next(deployment, dict(old.settings))
    deployment.active_config = rollback
    deployment.save()
    cap = scaling_state(deployment).capacity
    assert cap.status == "measured" and cap.rps == 9.1


def test_only_the_chosen_profiles_runs_count():
    deployment = running()
    staged = make_profile(spec=STAGED)
    light = make_profile(
        spec={**STAGED, "stages": [{"name": "main", "concurrency": 4, "num_requests": 50}]}
    )
    staged_run(deployment, staged)
    staged_run(deployment, light, levels={"main": (30.0, 100.0)})  # the newest run
    state = scaling_state(deployment)
    assert state.profile_id == light.pk and state.capacity.rps == 30.0
    ScalingPolicy.objects.create(deployment=deployment, load_profile=staged, slo_ttft_p95_ms=450)
    state = scaling_state(deployment)
    assert state.profile_id == staged.pk
    assert state.capacity.rps == 9.1 and state.slo.ttft_p95_ms == 450
    assert state.policy_saved


def test_sweep_trials_on_the_running_settings_add_their_max_load():
    deployment = running()
    profile = make_profile(spec=STAGED)
    staged_run(deployment, profile)

    def trial(settings: dict, index: int, rps: float):
        sweep = Sweep.objects.create(
            deployment=deployment,
            title="t",
            state=SweepState.DONE,
            load_profile=profile,
            load_mode="rate",
            slo={"ttft_p95_ms": 500.0},
            base_config=deployment.active_config,
        )
        return SweepTrial.objects.create(
            sweep=sweep,
            index=index,
            settings=settings,
            state=TrialState.SUCCEEDED,
            max_load=rps,
            met_slo=True,
            numbers={"ttft_p95_ms": 470.0, "error_rate": 0.0, "request_rate": rps},
            finished_at=timezone.now(),
        )

    trial({"max_num_seqs": 64}, 1, 50.0)  # other settings: ignored
    assert scaling_state(deployment).capacity.rps == 9.1
    t = trial({"max_num_seqs": 256}, 2, 9.3)
    cap = scaling_state(deployment).capacity
    assert cap.rps == 9.3 and cap.best.source == "sweep" and cap.best.sweep_id == t.sweep_id
    assert cap.breach.stage == "burst"


def test_the_group_counts_running_replicas_of_the_model_and_engine():
    a = running()
    b = running(model=a.model)
    running(model=a.model, engine="sglang")  # another engine: another group
    make_deployment(model=a.model, status="stopped")
    profile = make_profile(spec=STAGED)
    staged_run(a, profile)
    sample(a, 10.0)
    sample(b, 11.4)
    state = scaling_state(a)
    assert sorted(state.group) == sorted([a.pk, b.pk])
    assert state.decision.current == 2
    assert state.decision.demand_rps == pytest.approx(21.4)
    assert state.decision.desired == 3 and state.decision.status == "under"


def test_stale_signals_are_missing_with_a_note():
    deployment = running()
    staged_run(deployment, make_profile(spec=STAGED))
    sample(deployment, 10.0, ago=40.0)
    state = scaling_state(deployment)
    assert state.signals is None
    assert state.signals_age_s == pytest.approx(40.0, abs=2)
    assert "not used" in state.signals_note
    assert state.decision.status == "unknown" and state.decision.desired == 1
    fresh = running()
    assert scaling_state(fresh).signals_note.startswith("no signals yet")


def test_scale_down_waits_for_the_stabilisation_window():
    deployment = running()
    other = running(model=deployment.model)
    staged_run(deployment, make_profile(spec=STAGED))
    ScalingPolicy.objects.create(deployment=deployment, stabilisation_s=60)
    # A minute ago the pair was busy; now one replica would do.
    for ago in (50.0, 35.0, 20.0):
        sample(deployment, 10.0, ago=ago)
        sample(other, 10.0, ago=ago)
    sample(deployment, 2.0)
    sample(other, 2.0)
    decision = scaling_state(deployment).decision
    assert decision.raw_desired == 1 and decision.desired == 2
    assert "held at 2" in decision.reason


def test_engine_start_from_the_deployments_starts():
    deployment = running()
    state = scaling_state(deployment)
    assert state.engine_start_s == 120.0 and "assumed" in state.engine_start_basis
    assert state.policy.engine_start_s == 120.0


def _fleet(n: int):
    profile = make_profile(spec=STAGED)
    for i in range(n):
        d = running(model=f"m-{i % 3}")
        staged_run(d, profile)
        sample(d, 5.0, ago=20.0)
        sample(d, 5.0)
        ScalingPolicy.objects.create(deployment=d, load_profile=profile)


@pytest.mark.parametrize("n", [1, 10])
def test_the_fleet_costs_a_bounded_number_of_queries(n, django_assert_max_num_queries):
    _fleet(n)
    with django_assert_max_num_queries(10):
        states = fleet_states()
    assert len(states) == n
    assert all(s.capacity.status == "measured" and s.signals is not None for s in states)
