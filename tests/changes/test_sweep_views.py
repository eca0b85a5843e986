"""The tuning sweep pages: who may see and do what (anonymous, no role, viewer, operator,
approver), the form and its errors (never a 500), CSRF on the actions, the detail page in
each state, the live fragment, "Propose the winner", and the entry points on other pages.

No task runs here: ``enqueue_on_commit`` is patched where a service queues one, and the
on-commit callbacks of a test transaction never fire anyway."""

from __future__ import annotations

from unittest import mock

import pytest
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from benchmarks.sweep import PointScore, Prediction
from changes.choices import ChangeState, LaneState, SweepState, TrialState
from changes.models import ChangeRequest, Sweep, SweepLane, SweepTrial
from changes.services import sweeps
from tests.factories import (
    make_config,
    make_deployment,
    make_finished_run,
    make_host,
    make_profile,
)

pytestmark = pytest.mark.django_db

RUNNING = {"max_num_seqs": 64, "gpu_memory_utilization": 0.9}
SLO = {"ttft_p95_ms": 500, "max_error_rate": 0.01}
LOAD = {
    "stages": [{"name": "main", "request_rate": 4, "num_requests": 40}],
    "input_len": {"kind": "fixed", "mean": 256},
    "output_len": {"kind": "fixed", "mean": 64},
    "warmup_requests": 2,
}


@pytest.fixture
def deployment(db):
    deployment = make_deployment(make_host(name="gpu-s"), name="chat")
    config = make_config(
        deployment, dict(RUNNING), env={"CUDA_VISIBLE_DEVICES": "0"}, placement={"numa_node": 0}
    )
    deployment.active_config = config
    deployment.save()
    return deployment


@pytest.fixture
def profile(db):
    return make_profile("sweep-load", spec=LOAD)


def make_sweep(deployment, profile, by, state=SweepState.PENDING, **kw) -> Sweep:
    sweep = Sweep.objects.create(
        deployment=deployment,
        title=kw.pop("title", "more throughput"),
        state=state,
        created_by=by,
        load_profile=profile,
        space=kw.pop("space", {"max_num_seqs": [32, 64, 128]}),
        slo=kw.pop("slo", {**SLO}),
        base_config=deployment.active_config,
        max_trials=2,
        max_steps=3,
        target={"gpu": "h100-sxm", "num_gpus": 1, "currency": "USD", "price_per_gpu_hour": 2.0},
        **kw,
    )
    SweepLane.objects.create(
        sweep=sweep,
        deployment=deployment,
        original_config=deployment.active_config,
        state=LaneState.RESTORED if sweep.is_finished else LaneState.PLANNED,
    )
    return sweep


def point(seqs: int, max_load: float | None, meets: bool = True, feasible: bool = True):
    numbers = {"ttft_p95_ms": 300.0, "output_tps_per_gpu": 40.0 * seqs, "output_tps_per_user": 30.0}
    return PointScore(
        point={"max_num_seqs": seqs},
        settings={**RUNNING, "max_num_seqs": seqs},
        feasible=feasible,
        error=None if feasible else "ValueError: not enough KV cache for 128 sequences",
        max_load=max_load,
        numbers=numbers if feasible else {},
        margin=0.4 if meets else -0.2,
        cost_per_million=1.5,
        objective=40.0 * seqs,
        curve=[
            {"load": 1, "ttft_p95_ms": 100, "output_tps_per_gpu": 60, "ok": True},
            {"load": 2, "ttft_p95_ms": 300, "output_tps_per_gpu": 110, "ok": True},
        ]
        if feasible
        else [],
        meets_slo=meets,
    )


def prediction(points) -> dict:
    return Prediction(
        engine="vllm",
        model="m",
        gpu="h100-sxm",
        num_gpus=1,
        mode="rate",
        objective="tps_per_gpu",
        slo=SLO,
        space={"max_num_seqs": [32, 64, 128]},
        base_settings=RUNNING,
        workload={},
        time_scale=1.0,
        price_per_gpu_hour=2.0,
        points=points,
        elapsed_s=1.5,
    ).to_dict()


def finished_sweep(deployment, profile, by, *, winner_is_control=False, state=SweepState.DONE):
    """A sweep done with a measured trial and control, the trial (or control) winning."""
    sweep = make_sweep(
        deployment,
        profile,
        by,
        state=state,
        prediction=prediction([point(128, 4.0), point(64, 2.0)]),
    )
    sweep.started_at = sweep.finished_at = timezone.now()
    sweep.save()
    trials = []
    for index, seqs, control in ((1, 128, False), (2, 64, True)):
        run = make_finished_run(deployment, load_profile=profile)
        run.load_override = {"mode": "rate", "value": 3.0}
        run.save()
        trial = SweepTrial.objects.create(
            sweep=sweep,
            index=index,
            is_control=control,
            point={} if control else {"max_num_seqs": seqs},
            settings={**RUNNING, "max_num_seqs": seqs},
            predicted=point(seqs, 4.0).to_dict(),
            state=TrialState.SUCCEEDED,
            probes=[
                {
                    "load": 3.0,
                    "run": run.pk,
                    "ok": True,
                    "violations": [],
                    "margin": 0.25,
                    "numbers": {"ttft_p95_ms": 350.0, "output_tps": 500.0 + seqs},
                }
            ],
            max_load=3.0,
            met_slo=True,
            numbers={"output_tps_per_gpu": 500.0 + seqs, "output_tps_per_user": 25.0},
            objective_value=500.0 + seqs,
            cost_per_million=1.1,
            prediction_error=-0.25,
        )
        trial.runs.add(run)
        trials.append(trial)
    sweep.winner = trials[1] if winner_is_control else trials[0]
    sweep.save()
    return sweep


def url(name, sweep=None):
    return reverse(f"changes:{name}", args=[sweep.pk] if sweep else [])


# --- permissions ---
PAGES = ("sweep", "sweep_part")
ACTIONS = ("sweep_approve", "sweep_reject", "sweep_start", "sweep_cancel", "sweep_propose")


def test_anonymous_is_sent_to_log_in(client, deployment, profile, operator):
    sweep = make_sweep(deployment, profile, operator)
    for target in [url("sweeps"), url("sweep_new")] + [url(n, sweep) for n in PAGES]:
        response = client.get(target)
        assert response.status_code == 302 and "/accounts/login/" in response["Location"]
    for name in ACTIONS:
        response = client.post(url(name, sweep))
        assert response.status_code == 302 and "/accounts/login/" in response["Location"]
    assert Sweep.objects.get(pk=sweep.pk).state == SweepState.PENDING


def test_no_role_sees_nothing(client, nobody, deployment, profile, operator):
    sweep = make_sweep(deployment, profile, operator)
    client.force_login(nobody)
    for target in [url("sweeps"), url("sweep_new")] + [url(n, sweep) for n in PAGES]:
        assert client.get(target).status_code == 403


def test_viewer_sees_but_may_not_make_or_act(client, viewer, deployment, profile, operator):
    sweep = finished_sweep(deployment, profile, operator)
    pending = make_sweep(deployment, profile, operator)
    client.force_login(viewer)
    assert client.get(url("sweeps")).status_code == 200
    page = client.get(url("sweep", sweep))
    assert page.status_code == 200
    assert b'data-testid="propose-winner"' not in page.content
    assert client.get(url("sweep_part", sweep)).status_code == 200
    assert client.get(url("sweep_new") + f"?deployment={deployment.pk}").status_code == 403
    assert client.post(url("sweep_propose", sweep)).status_code == 403
    for name in ("sweep_approve", "sweep_reject", "sweep_start", "sweep_cancel"):
        assert client.post(url(name, pending)).status_code == 403, name
    assert Sweep.objects.get(pk=pending.pk).state == SweepState.PENDING
    assert not ChangeRequest.objects.exists()


def test_actions_are_post_only(client, operator, deployment, profile):
    sweep = make_sweep(deployment, profile, operator)
    client.force_login(operator)
    for name in ACTIONS:
        assert client.get(url(name, sweep)).status_code == 405


def test_actions_need_the_csrf_token(operator, deployment, profile):
    sweep = make_sweep(deployment, profile, operator)
    client = Client(enforce_csrf_checks=True)
    client.force_login(operator)
    for name in ACTIONS:
        assert client.post(url(name, sweep)).status_code == 403, name
    response = client.post(url("sweep_new") + f"?deployment={deployment.pk}", {})
    assert response.status_code == 403
    assert Sweep.objects.get(pk=sweep.pk).state == SweepState.PENDING


# --- the form ---
def form_data(profile, **kw):
    data = {
        "title": "tune it",
        "load_profile": profile.pk,
        "load_mode": "rate",
        "ttft_p95_ms": "500",
        "max_error_rate": "1",
        "objective": "tps_per_gpu",
        "max_trials": "2",
        "max_minutes": "30",
        "max_steps": "3",
        "space_max_num_seqs": "32,64,128",
        "space_max_num_batched_tokens": "",
    }
    data.update(kw)
    return data


def test_form_offers_the_performance_flags_with_running_values(client, operator, deployment):
    client.force_login(operator)
    page = client.get(url("sweep_new") + f"?deployment={deployment.pk}")
    assert page.status_code == 200
    html = page.content.decode()
    assert 'data-flag="max_num_seqs"' in html and 'data-flag="gpu_memory_utilization"' in html
    assert 'value="32,64,128"' in html  # ×0.5, ×1, ×2 of the running 64
    form = page.context["form"]
    assert form["space_max_num_seqs"].field.running == "64"
    assert form["space_max_num_batched_tokens"].initial in ("", None)  # not set: no guess


def test_pick_a_deployment_first(client, operator, deployment):
    client.force_login(operator)
    page = client.get(url("sweep_new"))
    assert page.status_code == 200
    assert f"?deployment={deployment.pk}" in page.content.decode()


def test_operator_makes_a_sweep(client, operator, deployment, profile):
    client.force_login(operator)
    with mock.patch("changes.services.sweeps.enqueue_on_commit") as queued:
        response = client.post(
            url("sweep_new") + f"?deployment={deployment.pk}",
            form_data(profile, space_gpu_memory_utilization="0.80:0.90:0.05"),
        )
    sweep = Sweep.objects.get()
    assert response.status_code == 302 and response["Location"] == sweep.get_absolute_url()
    queued.assert_called_once_with(sweeps.PREDICT_TASK, sweep.pk)
    assert sweep.space == {
        "max_num_seqs": [32, 64, 128],
        "gpu_memory_utilization": [0.8, 0.85, 0.9],
    }
    assert sweep.slo["ttft_p95_ms"] == 500 and sweep.slo["max_error_rate"] == pytest.approx(0.01)
    assert (sweep.max_trials, sweep.max_minutes, sweep.max_steps) == (2, 30, 3)
    assert sweep.created_by == operator and sweep.state == SweepState.PREDICTING
    page = client.get(sweep.get_absolute_url())
    assert page.status_code == 200 and b"Predicting" in page.content


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        ({"extra_flag": "no_such_flag", "extra_values": "1,2"}, "no setting 'no_such_flag'"),
        ({"space_max_num_seqs": "64:16"}, "the range goes down"),
        ({"space_max_num_seqs": "abc"}, "max-num-seqs"),
        ({"space_gpu_memory_utilization": "0.5:2:0.5"}, "gpu-memory-utilization"),
        ({"space_max_num_seqs": ""}, "at least one flag"),
        ({"ttft_p95_ms": ""}, "Set at least one SLO limit"),
        ({"ttft_p95_ms": "-5"}, "greater than or equal to 0"),
        ({"ttft_p95_ms": "0"}, "ttft_p95_ms must be above 0"),
        ({"max_trials": "0"}, "greater than or equal to 1"),
        ({"max_steps": "99"}, "less than or equal to 12"),
        ({"load_profile": "999999"}, "Select a valid choice"),
        ({"max_error_rate": "150"}, "less than or equal to 100"),
        ({"objective": "nonsense"}, "Select a valid choice"),
        ({"extra_flag": "api_key", "extra_values": "x"}, "credential"),
    ],
)
def test_bad_input_is_an_error_on_the_form(client, operator, deployment, profile, change, expected):
    client.force_login(operator)
    with mock.patch("changes.services.sweeps.enqueue_on_commit"):
        response = client.post(
            url("sweep_new") + f"?deployment={deployment.pk}", form_data(profile, **change)
        )
    assert response.status_code == 400
    html = response.content.decode()
    assert expected in html.replace("&#x27;", "'"), html[html.find("form-errors") :][:2000]
    assert not Sweep.objects.exists()


def test_bad_flag_error_sits_beside_its_row(client, operator, deployment, profile):
    client.force_login(operator)
    response = client.post(
        url("sweep_new") + f"?deployment={deployment.pk}",
        form_data(profile, space_max_num_seqs="0,8"),
    )
    assert response.status_code == 400
    assert response.context["form"].errors["space_max_num_seqs"]


def test_unknown_deployment_is_404(client, operator):
    client.force_login(operator)
    assert client.get(url("sweep_new") + "?deployment=987654").status_code == 404


# --- the detail page in each state ---
def test_pending_sweep_offers_review_to_an_approver_only(
    client, approver, operator, deployment, profile
):
    sweep = make_sweep(deployment, profile, operator, required_approvals=1)
    client.force_login(operator)
    page = client.get(url("sweep", sweep)).content.decode()
    assert 'data-testid="sweep-approve"' not in page  # four-eyes: not the author
    assert 'data-testid="sweep-cancel"' in page
    client.force_login(approver)
    page = client.get(url("sweep", sweep)).content.decode()
    assert 'data-testid="sweep-approve"' in page and 'data-testid="sweep-reject"' in page
    response = client.post(url("sweep_approve", sweep), {"comment": "fine"})
    assert response.status_code == 302
    sweep.refresh_from_db()
    assert sweep.state == SweepState.READY
    assert sweep.approvals.get().comment == "fine"
    # Twice is refused with a message, not a 500.
    response = client.post(url("sweep_approve", sweep), follow=True)
    assert response.status_code == 200 and b"only sweeps pending review" in response.content


def test_reject_ends_the_sweep(client, approver, operator, deployment, profile):
    sweep = make_sweep(deployment, profile, operator, required_approvals=1)
    client.force_login(approver)
    client.post(url("sweep_reject", sweep), {"comment": "too wide"})
    sweep.refresh_from_db()
    assert sweep.state == SweepState.REJECTED and "too wide" in sweep.outcome


def test_start_and_cancel(client, operator, deployment, profile):
    sweep = make_sweep(deployment, profile, operator, state=SweepState.READY)
    SweepTrial.objects.create(sweep=sweep, index=1, is_control=True, settings=RUNNING)
    client.force_login(operator)
    page = client.get(url("sweep", sweep)).content.decode()
    assert 'data-testid="sweep-start"' in page
    with mock.patch("changes.services.sweeps.enqueue_on_commit") as queued:
        response = client.post(url("sweep_start", sweep))
    assert response.status_code == 302
    sweep.refresh_from_db()
    assert sweep.state == SweepState.RUNNING and queued.call_count == 1
    page = client.get(url("sweep", sweep)).content.decode()
    assert "0 of 1 trials done" in page and 'data-testid="sweep-progress"' in page
    client.post(url("sweep_cancel", sweep))
    assert Sweep.objects.get(pk=sweep.pk).cancel_requested


def test_done_with_a_winner(client, operator, deployment, profile):
    sweep = finished_sweep(deployment, profile, operator)
    client.force_login(operator)
    response = client.get(url("sweep", sweep))
    assert response.status_code == 200
    html = response.content.decode()
    for testid in ("sweep-winner", "propose-winner", "compare-winner", "predicted-top"):
        assert f'data-testid="{testid}"' in html, testid
    assert 'data-testid="pareto-per-user"' in html and 'data-testid="pareto-ttft"' in html
    assert "25 % inside the tightest limit" in html
    assert "-25 %" in html  # the prediction error
    assert "p95 TTFT ≤ 500 ms" in html
    assert "max_num_seqs ∈ {32, 64, 128}" in html
    for trial in sweep.trials.all():
        assert trial.runs.get().get_absolute_url() in html
    figures = response.context["figures"]
    names = [trace["name"] for trace in figures["ttft"]["data"]]
    assert "#1 predicted" in names and "#1 measured" in names
    assert figures["ttft"]["layout"]["shapes"][0]["x0"] == 500
    part = client.get(url("sweep_part", sweep))
    assert part.status_code == 200 and b"<html" not in part.content


def test_done_with_the_control_winning_offers_nothing_to_propose(
    client, operator, deployment, profile
):
    sweep = finished_sweep(deployment, profile, operator, winner_is_control=True)
    client.force_login(operator)
    html = client.get(url("sweep", sweep)).content.decode()
    assert 'data-testid="propose-winner"' not in html
    assert "nothing to change" in html
    response = client.post(url("sweep_propose", sweep), follow=True)
    assert b"nothing to change" in response.content
    assert not ChangeRequest.objects.exists()


def test_done_without_a_winner_says_no_point_meets(client, operator, deployment, profile):
    misses = point(64, None, meets=False)
    refused = point(256, None, meets=False, feasible=False)
    sweep = make_sweep(
        deployment,
        profile,
        operator,
        state=SweepState.DONE,
        prediction=prediction([misses, refused]),
        outcome="no config met the SLO",
    )
    client.force_login(operator)
    html = client.get(url("sweep", sweep)).content.decode()
    assert 'data-testid="no-point-meets"' in html and "closest" in html
    assert "not enough KV cache" in html
    assert "no config met the SLO" in html
    assert 'data-testid="sweep-winner"' not in html


def test_failed_without_prediction_shows_the_problem(client, operator, deployment, profile):
    sweep = make_sweep(
        deployment,
        profile,
        operator,
        state=SweepState.FAILED,
        prediction_problem="the simulator has no model like 'm'",
    )
    client.force_login(operator)
    html = client.get(url("sweep", sweep)).content.decode()
    assert 'data-testid="prediction-problem"' in html and "no model like" in html
    assert 'data-testid="sweep-cancel"' not in html


def test_a_broken_saved_prediction_still_renders(client, operator, deployment, profile):
    sweep = make_sweep(
        deployment, profile, operator, prediction={"points": "nonsense"}, slo={"bogus": 1}
    )
    client.force_login(operator)
    assert client.get(url("sweep", sweep)).status_code == 200


# --- proposing the winner ---
def test_propose_the_winner(client, operator, viewer, deployment, profile):
    sweep = finished_sweep(deployment, profile, operator)
    client.force_login(operator)
    response = client.post(url("sweep_propose", sweep))
    change = ChangeRequest.objects.get()
    assert response.status_code == 302 and response["Location"] == change.get_absolute_url()
    assert change.sweep == sweep and change.state == ChangeState.PENDING
    assert change.proposed_by == operator
    # Verified under the sweep's load at the running config's measured limit (the control's).
    assert change.verify_profile.name == f"{profile.name} @ 3 req/s"
    assert change.verify_profile.spec["stages"][0]["request_rate"] == 3.0
    # The running config's environment and placement stay with the change.
    assert change.env == {"CUDA_VISIBLE_DEVICES": "0"} and change.placement["numa_node"] == 0
    assert change.settings["max_num_seqs"] == 128
    page = client.get(change.get_absolute_url()).content.decode()
    assert 'data-testid="change-sweep"' in page and sweep.get_absolute_url() in page
    html = client.get(url("sweep", sweep)).content.decode()
    assert 'data-testid="sweep-proposal"' in html


# --- entry points ---
def test_entry_points(client, operator, viewer, deployment, profile):
    client.force_login(operator)
    host = client.get(reverse("hosts:detail", args=[deployment.host_id]))
    assert host.status_code == 200
    assert f'data-testid="tune-{deployment.name}"'.encode() in host.content
    home = client.get(url("sweeps")).content.decode()
    # Sweeps is the page's entry in the navigation, not Changes (a prefix of its URL).
    assert 'class="active" aria-current="page">Sweeps</a>' in home
    assert 'aria-current="page">Changes</a>' not in home
    client.force_login(viewer)
    assert b'data-testid="new-sweep"' not in client.get(url("sweeps")).content
    run = make_finished_run(deployment, load_profile=profile)
    run.load_override = {"mode": "rate", "value": 12.5}
    run.save()
    page = client.get(run.get_absolute_url()).content.decode()
    assert "at 12.5 req/s (sweep load)" in page


def test_service_errors_land_on_their_fields(client, operator, deployment, profile):
    """What only the service knows (here: a space refused by flag, a budget) goes beside the
    field it names, whatever the form checked first."""
    client.force_login(operator)
    refused = sweeps.SweepInvalid(
        {"space": "max_num_seqs: no", "max_steps": "Between 2 and 12.", "": "whole"},
        {"max_num_seqs": "no such value here"},
    )
    with mock.patch("changes.services.sweeps.create_sweep", side_effect=refused):
        response = client.post(
            url("sweep_new") + f"?deployment={deployment.pk}", form_data(profile)
        )
    assert response.status_code == 400
    form = response.context["form"]
    assert form.errors["space_max_num_seqs"] == ["no such value here"]
    assert form.errors["max_steps"] == ["Between 2 and 12."]
    assert form.non_field_errors() == ["whole"]
