"""Client-limited runs are refused as evidence by the consumers in ``changes`` and ``scaling``
(issue 37, finding 3), each in words: a change's verdict says "cannot judge", the pipeline does
not take such a run as its baseline, the advisor leaves it out of its facts and says so, a sweep
trial's run is no point of the search, capacity at SLO does not count its levels."""

from __future__ import annotations

from unittest import mock

import pytest

from benchmarks.evidence import usable_as_evidence
from benchmarks.models import BenchmarkRun
from changes.advisor.engine import evaluate
from changes.models import ChangeRequest
from changes.services import diagnosis_facts, stages, sweep_trials, verification
from changes.verdict import Thresholds
from scaling.services.state import scaling_state
from tests.benchmarks.test_client_limited import HEALTHY, LIMITED
from tests.changes.test_sweep_services import BASE, predicted, started
from tests.factories import (
    make_config,
    make_deployment,
    make_finished_run,
    make_host,
    make_profile,
    make_sim_deployment,
)
from tests.scaling.test_state import STAGED, running, staged_run

pytestmark = pytest.mark.django_db

THRESHOLDS = Thresholds(0.005, 0.10, 0.10)


def pair(**limited):
    deployment = make_deployment()
    profile = make_profile()
    baseline = make_finished_run(
        deployment, load_profile=profile, client_health=limited.get("baseline", HEALTHY)
    )
    after = make_finished_run(
        deployment,
        load_profile=profile,
        client_health=limited.get("verification", HEALTHY),
        itl_p95_ms=0.0,
        itl_p50_ms=0.0,
    )
    return baseline, after


def test_a_verdict_on_a_client_limited_verification_cannot_judge():
    """The issue's "ITL p95 0.0 → 0.0 ok": now "cannot judge", with the reason."""
    baseline, after = pair(verification=LIMITED)
    result = verification.judge_runs(baseline, after, THRESHOLDS)
    assert result["outcome"] == "inconclusive" and not result["regressed"]
    assert result["reason"].startswith(
        f"cannot judge: the verification run {after.numbered_name} is client-limited: "
        "event-loop lag p99 48 ms"
    )


def test_a_verdict_against_a_client_limited_baseline_cannot_judge():
    baseline, after = pair(baseline=LIMITED)
    result = verification.judge_runs(baseline, after, THRESHOLDS)
    assert result["outcome"] == "inconclusive"
    assert f"the baseline run {baseline.numbered_name} is client-limited" in result["reason"]


def test_usable_runs_are_judged_as_before():
    baseline, after = pair()
    assert "client-limited" not in verification.judge_runs(baseline, after, THRESHOLDS)["reason"]


def test_the_pipeline_measures_a_fresh_baseline_instead_of_a_client_limited_one(operator):
    deployment = make_deployment()
    chosen = make_finished_run(deployment, client_health=LIMITED)
    change = ChangeRequest(deployment=deployment, baseline_run=chosen)
    assert stages._chosen_baseline(change) is None
    change.baseline_run = make_finished_run(deployment, client_health=HEALTHY)
    assert stages._chosen_baseline(change) == change.baseline_run


def test_the_advisor_leaves_a_client_limited_run_out_and_says_so():
    deployment = make_deployment()
    good = make_finished_run(deployment, client_health=HEALTHY)
    bad = make_finished_run(deployment, client_health=LIMITED, error_rate=0.2, failed=150)
    gathered = diagnosis_facts.gather(deployment, live=False)
    assert [r.run_id for r in gathered.snapshot.runs] == [good.pk]
    (refused,) = gathered.snapshot.refused_runs
    assert refused[0] == bad.pk and refused[1].startswith("client-limited: event-loop lag")
    finding = next(f for f in evaluate(gathered.snapshot) if f.rule == "client-limited-run")
    assert f"Run {bad.pk} is client-limited" in finding.seen
    assert not any(f.rule == "errors-behind-speed" for f in evaluate(gathered.snapshot))


def test_a_sweep_trials_client_limited_run_is_no_point(operator):
    deployment = make_sim_deployment(make_host(name="sweep-limited"))
    deployment.active_config = make_config(deployment, BASE)
    deployment.save()
    sweep = started(operator, predicted(operator, deployment))
    lane = sweep.lanes.get()
    trial = sweep.trials.order_by("index").first()

    def execute(run):
        BenchmarkRun.objects.filter(pk=run.pk).update(
            status="succeeded", completed=100, failed=0, error_rate=0.0, client_health=LIMITED
        )

    with (
        mock.patch.object(sweep_trials.benchmark_runs, "execute_run", side_effect=execute),
        pytest.raises(sweep_trials.TrialBroken) as broken,
    ):
        sweep_trials._measure(trial, lane, 4.0)
    assert "is client-limited: event-loop lag p99 48 ms" in str(broken.value)
    assert "not a valid point" in str(broken.value)
    trial.refresh_from_db()
    assert trial.probes == []  # no point recorded from it


def test_capacity_at_slo_does_not_count_a_client_limited_run():
    deployment = running()
    profile = make_profile(spec=STAGED)
    bad = staged_run(deployment, profile, client_health=LIMITED)
    state = scaling_state(deployment)
    assert state.capacity.status == "no_evidence" and state.evidence_points == 0
    assert state.refused_runs == [(bad.pk, usable_as_evidence(bad).refusal)]
    good = staged_run(deployment, profile, client_health=HEALTHY)
    state = scaling_state(deployment)
    assert state.evidence_points == 3 and state.capacity.best.run_id == good.pk
    (refused,) = state.as_dict()["refused_runs"]
    assert refused["run_id"] == bad.pk and refused["reason"].startswith("client-limited: ")


def test_the_scaling_api_and_page_list_the_refused_runs(client, operator):
    deployment = running()
    profile = make_profile(spec=STAGED)
    bad = staged_run(deployment, profile, client_health=LIMITED)
    good = staged_run(deployment, profile, client_health=HEALTHY)
    client.force_login(operator)
    capacity = client.get(f"/api/v1/deployments/{deployment.pk}/scaling/").json()["capacity"]
    assert capacity["points"] == 3 and capacity["best"]["run_id"] == good.pk
    assert capacity["refused_runs"] == [
        {
            "run_id": bad.pk,
            "run_url": f"/benchmarks/{bad.pk}/",
            "reason": usable_as_evidence(bad).refusal,
        }
    ]
    page = client.get(f"/scaling/deployments/{deployment.pk}/").content.decode()
    assert f'href="/benchmarks/{bad.pk}/">run #{bad.pk}</a> is client-limited: ' in page
