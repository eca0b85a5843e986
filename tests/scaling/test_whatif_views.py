"""The what-if pages: who may see and make one, the form's errors, the plan's page with the
four policies side by side and its charts, and the status JSON."""

from __future__ import annotations

import json
from unittest import mock

import pytest
from django.urls import reverse

from scaling.models import WhatIfPlan
from scaling.planning.whatif import DayParams, run_day
from scaling.services import whatif as services
from tests.factories import make_config, make_host, make_sim_deployment
from tests.scaling.test_whatif import toy_curve

pytestmark = pytest.mark.django_db


@pytest.fixture
def deployment():
    deployment = make_sim_deployment(make_host(name="whatif-pages"))
    deployment.active_config = make_config(deployment, {"max_num_seqs": 32})
    deployment.save()
    return deployment


def finished_plan(deployment, price: float | None = 2.5) -> WhatIfPlan:
    """A plan as the worker leaves it, computed on a hand-made replica curve."""
    curve = toy_curve()
    params = DayParams(start_delay_s=90, price_per_gpu_hour=price)
    result = {
        **run_day(services.default_hourly(), curve, params),
        "curve": curve.as_dict(),
        "params": params.as_dict(),
        "profile": "Interactive chat v1",
        "config": "config v1",
        "gpu": "h100-sxm",
        "num_gpus": 1,
        "price_source": "host price",
        "start_delay_basis": "entered on the form",
    }
    result["words"] = services.result_words(result)
    return WhatIfPlan.objects.create(
        deployment=deployment,
        status="succeeded",
        traffic={"hourly": services.default_hourly()},
        result=result,
        progress=1.0,
    )


def form_data(**kw) -> dict:
    data = {
        "hourly_rates": ", ".join(str(r) for r in services.default_hourly()),
        "slo_ttft_p95_ms": "500",
        "min_replicas": "1",
        "max_replicas": "8",
        "fixed_replicas": "",
        "target_utilisation": "70",
        "target_utilisation_high": "95",
        "start_delay_s": "",
        "stabilisation_s": "300",
        "polling_interval_s": "15",
    }
    data.update(kw)
    return data


# --- permissions ---------------------------------------------------------------------------------
def test_anonymous_is_sent_to_log_in(client, deployment):
    plan = finished_plan(deployment)
    for url in (
        reverse("scaling:whatif_new", args=[deployment.pk]),
        reverse("scaling:whatif", args=[plan.pk]),
        reverse("scaling:whatif_status", args=[plan.pk]),
    ):
        response = client.get(url)
        assert response.status_code == 302 and "login" in response["Location"]


def test_viewing_is_for_every_role_making_for_those_who_run_benchmarks(
    client, personas, deployment
):
    plan = finished_plan(deployment)
    new = reverse("scaling:whatif_new", args=[deployment.pk])
    for name, user in personas.items():
        client.force_login(user)
        page = client.get(reverse("scaling:whatif", args=[plan.pk]))
        assert page.status_code == (403 if name == "nobody" else 200), name
        allowed = name in ("operator", "approver", "admin")
        assert client.get(new).status_code == (200 if allowed else 403), name
        with mock.patch("scaling.services.whatif.enqueue_on_commit"):
            posted = client.post(new, form_data())
        assert posted.status_code == (302 if allowed else 403), name
    assert WhatIfPlan.objects.count() == 1 + 3


# --- the form ------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "change, field, words",
    [
        ({"hourly_rates": "1, 2, 3"}, "hourly_rates", "24 hourly rates"),
        ({"hourly_rates": ", ".join(["0"] * 24)}, "hourly_rates", "nothing to plan"),
        ({"hourly_rates": ", ".join(["2"] * 23 + ["lots"])}, "hourly_rates", "not a number"),
        ({"hourly_rates": ", ".join(["2"] * 23 + ["-4"])}, "hourly_rates", "Hour 23"),
        ({"hourly_rates": ", ".join(["2"] * 23 + ["20000"])}, "hourly_rates", "10,000"),
        ({"min_replicas": "6", "max_replicas": "2"}, "min_replicas", "maximum"),
        ({"fixed_replicas": "12"}, "fixed_replicas", "maximum"),
        ({"slo_ttft_p95_ms": "0"}, "slo_ttft_p95_ms", ""),
    ],
)
def test_form_errors_are_shown_and_nothing_is_made(
    client, operator, deployment, change, field, words
):
    client.force_login(operator)
    response = client.post(reverse("scaling:whatif_new", args=[deployment.pk]), form_data(**change))
    assert response.status_code == 200
    errors = response.context["form"].errors
    assert field in errors and words in " ".join(errors[field])
    assert not WhatIfPlan.objects.exists()


def test_form_is_prefilled_and_a_plan_is_queued(client, operator, deployment):
    client.force_login(operator)
    url = reverse("scaling:whatif_new", args=[deployment.pk])
    page = client.get(url)
    assert page.context["form"].initial["slo_ttft_p95_ms"] == 500
    assert "no engine start measured" in page.content.decode()
    with mock.patch("scaling.services.whatif.enqueue_on_commit") as queued:
        response = client.post(url, form_data(fixed_replicas="3", start_delay_s="95"))
    plan = WhatIfPlan.objects.get()
    assert response["Location"] == plan.get_absolute_url()
    queued.assert_called_once_with("scaling.tasks.run_what_if", plan.pk)
    assert plan.params["fixed_replicas"] == 3 and plan.params["start_delay_s"] == 95
    assert len(plan.traffic["hourly"]) == 24 and plan.requested_by == operator


# --- the plan's page -----------------------------------------------------------------------------
def test_the_page_shows_the_policies_side_by_side_and_the_charts(client, viewer, deployment):
    plan = finished_plan(deployment)
    client.force_login(viewer)
    response = client.get(reverse("scaling:whatif", args=[plan.pk]))
    html = response.content.decode()
    rows = response.context["rows"]
    assert [r["key"] for r in rows] == [
        "fixed",
        "utilisation",
        "utilisation_high",
        "queue",
        "tokens",
    ]
    for label in (
        "Fixed N",
        "GPU utilisation (HPA, target 70%)",
        "GPU utilisation (HPA, target 95%)",
        "Queue depth (KEDA)",
        "Pending tokens",
    ):
        assert label in html
    assert "never scales up" in html  # the high target's trap, said in words
    for chart in ("whatif-fig-traffic", "whatif-fig-replicas", "whatif-fig-ttft"):
        assert f'data-chart="{chart}"' in html and f'id="{chart}"' in html
    ttft = response.context["figures"]["ttft"]
    assert ttft["data"][-1]["y"] == [500.0, 500.0]  # the SLO line
    assert len(ttft["data"][0]["y"]) == 24 * 60
    assert "vendor/plotly.min.js" in html
    assert "Basis: toy" in html and "start-up delay 90 s" in html
    assert "USD" in html  # priced


def test_without_a_price_the_page_says_so(client, viewer, deployment):
    plan = finished_plan(deployment, price=None)
    client.force_login(viewer)
    html = client.get(reverse("scaling:whatif", args=[plan.pk])).content.decode()
    assert "No price is known" in html and "no price" in html


def test_a_running_plan_polls_its_status(client, viewer, deployment):
    plan = WhatIfPlan.objects.create(deployment=deployment, status="running", progress=0.4)
    client.force_login(viewer)
    html = client.get(reverse("scaling:whatif", args=[plan.pk])).content.decode()
    assert 'data-testid="whatif-running"' in html and "scaling/whatif.js" in html
    status = json.loads(client.get(reverse("scaling:whatif_status", args=[plan.pk])).content)
    assert status == {
        "status": "running",
        "label": "Running",
        "finished": False,
        "progress": 0.4,
        "error": "",
    }


def test_a_failed_plan_shows_its_error(client, viewer, deployment):
    plan = WhatIfPlan.objects.create(deployment=deployment, status="failed", error="no GPU known")
    client.force_login(viewer)
    html = client.get(reverse("scaling:whatif", args=[plan.pk])).content.decode()
    assert "no GPU known" in html
