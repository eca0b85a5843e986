"""The sweep page's numbers each name one quantity with its unit: the outcome said "max 503
req/s, 1141 tok/s/GPU" (the whole config's load beside a per-GPU throughput), the charts' axes
and hovers carry units, the prediction error is given per quantity the prediction predicts
(it was the max load's only), and a profile too short for the rates the trials search says so
(the rule: ``changes.services.sweep_prediction``, STEADY_*)."""

from __future__ import annotations

import re

import pytest

from changes.models_sweeps import SweepTrial
from changes.services import sweep_figures, sweep_prediction, sweeps
from tests.changes.test_sweep_views import (
    LOAD,
    RUNNING,
    deployment,  # noqa: F401 - fixture
    finished_sweep,
    make_sweep,
    point,
    profile,  # noqa: F401 - fixture
    url,
)
from tests.factories import make_profile

pytestmark = pytest.mark.django_db


def test_the_outcome_names_each_quantity_with_its_unit(deployment, profile, operator):  # noqa: F811
    sweep = make_sweep(deployment, profile, operator)
    trial = SweepTrial(
        sweep=sweep,
        index=2,
        settings={**RUNNING, "tensor_parallel_size": 2},
        max_load=503.0,
        met_slo=True,
        numbers={"output_tps": 2282.0, "output_tps_per_gpu": 1141.0, "ttft_p95_ms": 420.0},
        cost_per_million=0.61,
    )
    text = sweeps.outcome_line(sweep, trial)
    assert text == (
        "max load at the SLO 503 req/s; output throughput 2,282 tok/s (1,141 tok/s per GPU "
        "over 2 GPUs); p95 TTFT 420 ms; 0.61 USD per 1M output tokens"
    )


def test_every_axis_is_one_quantity_with_its_unit(client, operator, deployment, profile):  # noqa: F811
    sweep = finished_sweep(deployment, profile, operator)
    figures = sweep_figures.figures(sweep, list(sweep.trials.all()))
    assert set(figures) == {"per_user", "ttft"}
    titles = {
        name: (fig["layout"]["xaxis"]["title"]["text"], fig["layout"]["yaxis"]["title"]["text"])
        for name, fig in figures.items()
    }
    assert titles["per_user"] == (
        "output speed per user (tok/s per user)",
        "output throughput per GPU (tok/s per GPU)",
    )
    assert titles["ttft"][0] == "p95 TTFT (ms)"
    assert titles["ttft"][1].startswith("output throughput (tok/s)")
    for fig in figures.values():
        for trace in fig["data"]:
            if "hovertemplate" in trace:
                assert re.search(r"%\{x:\.4g\} \S", trace["hovertemplate"])  # a unit follows


def test_the_prediction_error_is_given_per_quantity(client, operator, deployment, profile):  # noqa: F811
    sweep = finished_sweep(deployment, profile, operator)
    trial = sweep.trials.get(index=1)  # predicted 4 req/s, 5120 tok/s/GPU, 30 tok/s/user, 1.5
    errors = {e["quantity"]: e for e in sweep_prediction.prediction_errors(trial, "rate", "USD")}
    assert set(errors) == {
        "load_rate",
        "output_tps_per_gpu",
        "output_tps_per_user",
        "cost_per_million",
    }
    assert errors["load_rate"]["error"] == pytest.approx(-0.25)
    assert errors["load_rate"]["predicted_text"] == "4 req/s"
    assert errors["output_tps_per_gpu"]["error"] == pytest.approx(628 / 5120 - 1)
    assert errors["output_tps_per_user"]["error"] == pytest.approx(25 / 30 - 1)
    assert errors["cost_per_million"]["measured_text"] == "1.1 USD"
    client.force_login(operator)
    page = client.get(url("sweep", sweep)).content.decode()
    assert 'data-quantity="output_tps_per_gpu"' in page and "output speed per user -17 %" in page
    data = client.get(f"/api/v1/sweeps/{sweep.pk}/").json()
    first = next(t for t in data["trials"] if t["index"] == 1)
    assert {e["quantity"] for e in first["prediction_errors"]} == set(errors)


def test_a_profile_too_short_for_the_rates_searched_says_so(client, operator, deployment, profile):  # noqa: F811
    # 40 requests; the trials start at their predicted 4 req/s and may go to 8 × that.
    sweep = finished_sweep(deployment, profile, operator)
    warning = sweep_prediction.reach_warning(sweep, list(sweep.trials.all()))
    assert "its stage “main” sends 40 requests, so at 32 req/s" in warning
    assert "it lasts 1.2 s, under the 12 s a steady state needs" in warning
    assert "5 × 2.4 s" in warning  # W = 0.3 s TTFT + 64 tokens at 30 tok/s
    assert "loads above 3.29 req/s" in warning and "at least 390 requests" in warning
    client.force_login(operator)
    page = client.get(url("sweep", sweep)).content.decode()
    assert 'data-testid="sweep-reach-warning"' in page
    assert client.get(f"/api/v1/sweeps/{sweep.pk}/").json()["reach_warning"] == warning


def test_a_long_enough_profile_has_no_warning(client, operator, deployment):  # noqa: F811
    long = make_profile(
        "long", spec={**LOAD, "stages": [{**LOAD["stages"][0], "num_requests": 400}]}
    )
    sweep = finished_sweep(deployment, long, operator)
    assert sweep_prediction.reach_warning(sweep, list(sweep.trials.all())) == ""


def test_a_closed_loop_needs_five_requests_per_user(operator, deployment):  # noqa: F811
    closed = make_profile(
        "closed", spec={**LOAD, "stages": [{"name": "main", "concurrency": 8, "num_requests": 100}]}
    )
    sweep = make_sweep(deployment, closed, operator, load_mode="concurrency")
    trial = SweepTrial.objects.create(
        sweep=sweep, index=1, is_control=True, settings=RUNNING, predicted=point(64, 16).to_dict()
    )
    # max_num_seqs 64: the search may go to 4 × 64 = 256 users, 0.39 requests each.
    warning = sweep_prediction.reach_warning(sweep, [trial])
    assert "sends 100 requests, 0.39 per user at 256 concurrent users" in warning
    assert "loads above 20 concurrent users" in warning
