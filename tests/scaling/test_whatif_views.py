"""The what-if pages: who may see and make one, the form's errors, the plan's page with the
four policies side by side and its charts, and the status JSON."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from unittest import mock

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.urls import reverse

from benchmarks.choices import ProfileSource
from benchmarks.loadgen import traffic
from benchmarks.loadgen.traffic import TrafficRow
from scaling.models import WhatIfPlan
from scaling.planning.whatif import DayParams, run_day
from scaling.services import whatif as services
from tests.factories import make_config, make_host, make_profile, make_sim_deployment
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
        "Panel's KEDA export (queue, pending tokens, arrivals, p95 TTFT)",
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


# --- a day from a traffic sample -----------------------------------------------------------------
SAMPLE_DAY = datetime(2026, 3, 2, tzinfo=UTC).timestamp()


def sample_jsonl() -> bytes:
    """Hours 08–18 UTC of one day at 0.05 req/s × (hour − 7), then one request at 19:00
    (which ends the sample: hour 19 is not covered)."""
    lines = []
    for hour in range(8, 19):
        count = 180 * (hour - 7)
        for i in range(count):
            t = SAMPLE_DAY + hour * 3600 + i * 3600 / count
            lines.append({"timestamp": t, "input_tokens": 400, "output_tokens": 100})
    lines.append({"timestamp": SAMPLE_DAY + 19 * 3600, "input_tokens": 400, "output_tokens": 300})
    return "\n".join(json.dumps(x) for x in lines).encode()


def post_sample(client, deployment, content: bytes, name: str = "traffic.jsonl", **change):
    upload = SimpleUploadedFile(name, content, content_type="application/octet-stream")
    with mock.patch("scaling.services.whatif.enqueue_on_commit"):
        return client.post(
            reverse("scaling:whatif_new", args=[deployment.pk]),
            {**form_data(**change), "traffic_sample": upload},
        )


def test_the_form_takes_uploads(client, operator, deployment):
    client.force_login(operator)
    html = client.get(reverse("scaling:whatif_new", args=[deployment.pk])).content.decode()
    assert 'enctype="multipart/form-data"' in html and 'name="traffic_sample"' in html
    assert "UTC" in html


def test_a_sample_gives_the_hours_it_covers_and_the_form_the_rest(client, operator, deployment):
    client.force_login(operator)
    response = post_sample(client, deployment, sample_jsonl())
    plan = WhatIfPlan.objects.get()
    assert response.status_code == 302 and response["Location"] == plan.get_absolute_url()
    traffic = plan.traffic
    assert traffic["source"] == "sample"
    typed = services.default_hourly()
    for hour in range(24):
        expected = 0.05 * (hour - 7) if 8 <= hour <= 18 else typed[hour]
        assert traffic["hourly"][hour] == pytest.approx(expected, rel=1e-5), hour
    assert traffic["sample"] == {
        "filename": "traffic.jsonl",
        "requests": 11_881,
        "covered_hours": list(range(8, 19)),
        "fallback_hours": [*range(0, 8), *range(19, 24)],
        "placement": "UTC clock",
        "mean_input_tokens": 400.0,
        "mean_output_tokens": pytest.approx((11_880 * 100 + 300) / 11_881, abs=0.05),
    }
    page = client.get(plan.get_absolute_url()).content.decode()
    assert "Hours 08–18 from traffic.jsonl (11,881 requests, UTC); the rest as entered." in page


def test_a_sample_covering_the_day_needs_no_typed_rates(client, operator, deployment):
    lines = [
        f"{SAMPLE_DAY + i * 60:.0f},300,50" for i in range(24 * 60 + 1)
    ]  # one a minute, midnight to midnight
    client.force_login(operator)
    content = ("time,prompt_tokens,completion_tokens\n" + "\n".join(lines)).encode()
    response = post_sample(client, deployment, content, name="day.csv", hourly_rates="")
    assert response.status_code == 302, response.context["form"].errors
    plan = WhatIfPlan.objects.get()
    assert plan.traffic["sample"]["fallback_hours"] == []
    assert plan.traffic["hourly"][5] == pytest.approx(1 / 60, rel=1e-5)
    page = client.get(plan.get_absolute_url()).content.decode()
    assert "All 24 hours from day.csv (1,441 requests, UTC)." in page


def test_without_rates_or_a_sample_the_rates_are_asked_for(client, operator, deployment):
    client.force_login(operator)
    url = reverse("scaling:whatif_new", args=[deployment.pk])
    response = client.post(url, form_data(hourly_rates=""))
    assert "or a traffic sample" in " ".join(response.context["form"].errors["hourly_rates"])
    assert not WhatIfPlan.objects.exists()


@pytest.mark.parametrize(
    "content, words",
    [
        (b'{"timestamp": 1772438400, "input_tokens": 5, "output_tokens": 5}\n{"oops"\n', "Line 2"),
        (b'{"input_tokens": 5, "output_tokens": 5}\n', "no arrival times"),
        (b'{"timestamp": 1772438400, "input_tokens": 5, "output_tokens": 5}\n', "no hour"),
        (b"\xff\xfe", "not UTF-8"),
    ],
)
def test_a_bad_sample_is_refused_on_its_field(client, operator, deployment, content, words):
    client.force_login(operator)
    response = post_sample(client, deployment, content)
    assert response.status_code == 200
    assert words in " ".join(response.context["form"].errors["traffic_sample"])
    assert not WhatIfPlan.objects.exists()


def test_a_sample_leaving_hours_uncovered_needs_rates_for_them(client, operator, deployment):
    client.force_login(operator)
    response = post_sample(client, deployment, sample_jsonl(), hourly_rates="")
    errors = " ".join(response.context["form"].errors["traffic_sample"])
    assert "00–07, 19–23" in errors and not WhatIfPlan.objects.exists()


def test_a_sample_over_the_size_limit_is_refused_before_it_is_read(client, operator, deployment):
    client.force_login(operator)
    with (
        mock.patch("benchmarks.loadgen.traffic.MAX_BYTES", 1024),
        mock.patch("benchmarks.loadgen.traffic.parse") as parse,
    ):
        response = post_sample(client, deployment, sample_jsonl())
    assert "a sample is at most" in " ".join(response.context["form"].errors["traffic_sample"])
    parse.assert_not_called()
    assert not WhatIfPlan.objects.exists()


def test_a_replay_profiles_requests_can_be_the_sample(client, operator, deployment):
    spec = traffic.replay(
        [TrafficRow(float(i * 4), 200, 40, line=i + 1) for i in range(1801)], time_scale=0.5
    )
    profile = make_profile("replayed day", spec, source=ProfileSource.REPLAY)
    client.force_login(operator)
    with mock.patch("scaling.services.whatif.enqueue_on_commit"):
        response = client.post(
            reverse("scaling:whatif_new", args=[deployment.pk]),
            form_data(replay_profile=str(profile.pk)),
        )
    assert response.status_code == 302, response.context["form"].errors
    plan = WhatIfPlan.objects.get()
    # 1,801 requests 2 s apart: 00:00 to 01:00, 1,800 of them in hour 0.
    assert plan.traffic["sample"]["placement"] == "from 00:00"
    assert plan.traffic["sample"]["covered_hours"] == [0]
    assert plan.traffic["hourly"][0] == pytest.approx(0.5)
    page = client.get(plan.get_absolute_url()).content.decode()
    assert "Hour 00 from replayed day v1 (1,801 requests, its times placed from 00:00)" in page


def test_a_typed_day_is_said_to_be_typed(client, viewer, deployment):
    plan = finished_plan(deployment)
    client.force_login(viewer)
    html = client.get(reverse("scaling:whatif", args=[plan.pk])).content.decode()
    assert "The day&#x27;s 24 hourly rates as entered." in html
