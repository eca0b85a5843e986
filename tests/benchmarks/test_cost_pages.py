"""The cost page: its numbers, ranking, charts and form errors, and a run priced as other
instance types. The price list and the price services are in test_price_pages.py."""

from __future__ import annotations

from decimal import Decimal

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from benchmarks.models import Price
from benchmarks.services import prices as services
from tests.factories import (
    make_config,
    make_deployment,
    make_finished_run,
    make_gpu,
    make_host,
    make_run,
)

pytestmark = pytest.mark.django_db

# $2.50/h at 1280 output tok/s: 2.50 / (1280 × 3600) × 1e6
PER_M_OUTPUT = 0.542534722222222
# 10 successful req/s: 2.50 / 36,000
PER_REQUEST = 6.944444444444444e-05


@pytest.fixture(autouse=True)
def one_profile(monkeypatch):
    """Every run of a test measures one load profile: the page ranks one profile's runs only
    (those of another are listed, not ranked; test_cost_profiles.py)."""
    from tests import factories

    shared = factories.make_profile()
    monkeypatch.setattr(factories, "make_profile", lambda *a, **kw: shared)
    return shared


def cost_page(client, user, **params):
    client.force_login(user)
    response = client.get(reverse("cost"), params)
    assert response.status_code == 200
    return response


def rows_by_run(response):
    return {row["run"].pk: row for row in response.context["report"].rows}


# --- fleet summary --------------------------------------------------------------------------


def test_fleet_summary_per_gpu_hour_and_month(client, viewer):
    host = make_host(name="pricey", hourly_price=Decimal("8.00"))
    make_gpu(host)
    make_gpu(host)
    make_host(name="cheap", hourly_price=Decimal("2.00"))
    response = cost_page(client, viewer)
    assert response.context["total_hour"] == Decimal("10.00")
    assert response.context["total_month"] == Decimal("7300.00")
    rows = {row["host"].name: row for row in response.context["rows"]}
    assert rows["pricey"]["per_gpu_hour"] == Decimal("4")
    assert rows["pricey"]["per_month"] == Decimal("5840")
    assert rows["cheap"]["per_gpu_hour"] is None
    assert reverse("benchmarks:prices") in response.content.decode()


# --- one run's numbers ----------------------------------------------------------------------


def test_run_costs_at_the_measured_throughput(client, viewer):
    run = make_finished_run(label="base")  # host at 2.50/h, 10 req/s, 1280 tok/s
    row = rows_by_run(cost_page(client, viewer))[run.pk]
    assert row["price"] == Decimal("2.5000") and row["currency"] == "USD"
    assert row["cost"].per_request == pytest.approx(PER_REQUEST)
    assert row["cost"].per_million_output == pytest.approx(PER_M_OUTPUT)
    # 307,200 input tokens in 60 s = 5120 tok/s: 2.50 / 18,432,000 × 1e6
    assert row["cost"].per_million_input == pytest.approx(0.1356336805555556)
    assert row["meets_slo"] and row["cheapest"]
    assert row["text"]["per_million_output"] == "0.5425"


def test_utilisation_and_restart_overhead_from_the_form(client, viewer):
    run = make_finished_run()
    response = cost_page(client, viewer, utilisation_pct="50", restart_overhead_pct="10")
    row = rows_by_run(response)[run.pk]
    # serving share 0.5 × 0.9 = 0.45
    assert row["cost"].per_million_output == pytest.approx(PER_M_OUTPUT / 0.45)
    assert row["cost"].per_request == pytest.approx(2.50 / 16_200)
    page = response.content.decode()
    assert "0.5 × (1 − 0.1) = 0.45" in page
    assert "2.50 USD ÷ 2,073,600 × 1,000,000 = 1.2056327 USD" in page


def test_failed_requests_earn_nothing_on_the_page(client, viewer):
    # 600 sent, 60 failed in 60 s: 9 successful req/s.
    run = make_finished_run(completed=540, failed=60, error_rate=0.1, request_throughput=9.0)
    row = rows_by_run(cost_page(client, viewer))[run.pk]
    assert row["cost"].per_request == pytest.approx(2.50 / 32_400)
    assert row["text"]["error_rate"] == "10 %"


def test_default_selection_is_the_latest_20_succeeded_runs(client, viewer):
    deployment = make_deployment()
    runs = [make_finished_run(deployment) for _ in range(22)]
    make_run(deployment, status="failed")
    response = cost_page(client, viewer)
    shown = set(rows_by_run(response))
    assert shown == {run.pk for run in runs[-20:]}
    assert response.context["report"].default_selection


def test_chosen_runs_only(client, viewer):
    a, b, c = (make_finished_run() for _ in range(3))
    response = cost_page(client, viewer, runs=[a.pk, c.pk])
    assert set(rows_by_run(response)) == {a.pk, c.pk}
    assert not response.context["report"].default_selection


def test_price_list_pricing_is_used_and_said(client, viewer):
    host = make_host(hourly_price=Decimal("4.00"))
    run = make_finished_run(make_deployment(host))
    spot = Price.objects.create(name="p5.48xlarge", pricing="spot", hourly_price=Decimal("1.25"))
    spot.hosts.add(host)
    row = rows_by_run(cost_page(client, viewer, pricing="spot"))[run.pk]
    assert row["price"] == Decimal("1.2500")
    assert row["source"] == "p5.48xlarge (Spot / preemptible)"
    assert row["cost"].per_request == pytest.approx(1.25 / 36_000)
    # Reserved is not listed for this host: its own price, and the page says so.
    row = rows_by_run(cost_page(client, viewer, pricing="reserved"))[run.pk]
    assert row["price"] == Decimal("4.0000")
    assert "no reserved / committed price listed" in row["source"]


def test_runs_query_does_not_grow_with_the_runs(client, viewer):
    deployment = make_deployment()
    make_config(deployment)
    for _ in range(2):
        make_finished_run(deployment, engine_config=deployment.configs.first())
    client.force_login(viewer)
    with CaptureQueriesContext(connection) as few:
        client.get(reverse("cost"))
    for _ in range(10):
        make_finished_run(make_deployment(), engine_config=None)
    with CaptureQueriesContext(connection) as many:
        client.get(reverse("cost"))
    assert len(many) == len(few)


# --- ranking --------------------------------------------------------------------------------


def test_cheapest_meeting_the_slo_is_called_out(client, viewer):
    cheap_host = make_host(name="cheap-box", hourly_price=Decimal("1.00"))
    good_host = make_host(name="good-box", hourly_price=Decimal("2.50"))
    slow = make_finished_run(make_deployment(cheap_host), label="slow", ttft_p95_ms=700.0)
    fast = make_finished_run(make_deployment(good_host), label="fast", ttft_p95_ms=300.0)
    response = cost_page(client, viewer, slo_ttft_p95_ms="500")
    report = response.context["report"]
    assert report.cheapest["run"] == fast
    rows = rows_by_run(response)
    assert not rows[slow.pk]["meets_slo"] and rows[slow.pk]["status"].startswith("misses")
    page = response.content.decode()
    callout = page.split('data-testid="cheapest"')[1].split("</div>")[0]
    assert f"#{fast.pk} fast" in callout and "p95 TTFT ≤ 500 ms" in callout
    assert f'class="cheapest" data-run="{fast.pk}"' in page
    # Loosen the SLO and the cheaper, slower box wins.
    report = cost_page(client, viewer, slo_ttft_p95_ms="800").context["report"]
    assert report.cheapest["run"] == slow


def test_error_rate_slo(client, viewer):
    flaky = make_finished_run(label="flaky", error_rate=0.05, hourly_price=Decimal("1"))
    steady = make_finished_run(label="steady", error_rate=0.0)
    flaky.deployment.host.hourly_price = Decimal("1.00")
    flaky.deployment.host.save()
    # Errors count by default (1 %), shown on the page; an emptied field counts none.
    response = cost_page(client, viewer)
    assert response.context["report"].cheapest["run"] == steady
    assert "error rate ≤ 1 %" in response.content.decode()
    assert "error rate 5 % &gt; 1 %" in response.content.decode()
    report = cost_page(client, viewer, max_error_rate_pct="").context["report"]
    assert report.cheapest["run"] == flaky


def test_rank_by_output_tokens(client, viewer):
    # a: 2.00/h, 10 req/s, 500 tok/s; b: 3.00/h, 10 req/s, 2000 tok/s
    a = make_finished_run(make_deployment(make_host(hourly_price=Decimal("2.00"))))
    b = make_finished_run(make_deployment(make_host(hourly_price=Decimal("3.00"))))
    a.output_tokens_per_s, b.output_tokens_per_s = 500.0, 2000.0
    a.save()
    b.save()
    assert cost_page(client, viewer).context["report"].cheapest["run"] == a
    by_tokens = cost_page(client, viewer, rank_by="per_million_output").context["report"]
    assert by_tokens.cheapest["run"] == b


def test_other_currencies_are_shown_but_never_ranked(client, viewer):
    euro_host = make_host(name="euro-box", hourly_price=Decimal("9.00"))
    euro = Price.objects.create(name="eu.big", hourly_price=Decimal("0.50"), currency="EUR")
    euro.hosts.add(euro_host)
    euro_run = make_finished_run(make_deployment(euro_host), label="in-euro")
    usd_run = make_finished_run(label="in-dollars")
    response = cost_page(client, viewer)
    report = response.context["report"]
    assert report.cheapest["run"] == usd_run  # 0.50 EUR is not "less" than 2.50 USD
    assert [row["run"] for row in report.left_out] == [euro_run]
    assert "priced in EUR" in rows_by_run(response)[euro_run.pk]["status"]
    page = response.content.decode()
    assert 'data-testid="left-out"' in page and f"#{euro_run.pk} in-euro (EUR)" in page
    # Charts carry only the panel's currency.
    labels = [x for trace in report.scatter["data"] for x in trace["text"]]
    assert not any("in-euro" in text for text in labels)
    assert report.bars["data"][0]["x"] == [f"#{usd_run.pk} in-dollars"]


def test_unpriced_host_is_not_the_cheapest(client, viewer):
    free = make_finished_run(make_deployment(make_host(hourly_price=Decimal("0"))))
    paid = make_finished_run()
    response = cost_page(client, viewer)
    assert response.context["report"].cheapest["run"] == paid
    assert "no price set" in rows_by_run(response)[free.pk]["status"]


def test_no_run_meets_the_slo(client, viewer):
    make_finished_run(ttft_p95_ms=900.0)
    response = cost_page(client, viewer, slo_ttft_p95_ms="500")
    assert response.context["report"].cheapest is None
    page = " ".join(response.content.decode().split())
    assert "No run of profile" in page
    assert "priced in USD meets p95 TTFT ≤ 500 ms and error rate ≤ 1 %" in page


# --- charts and formulas --------------------------------------------------------------------


def test_charts_are_server_built_with_the_slo_line(client, viewer):
    fast = make_finished_run(label="fast", ttft_p95_ms=300.0)
    slow = make_finished_run(label="slow", ttft_p95_ms=700.0, request_throughput=20.0)
    response = cost_page(client, viewer, slo_ttft_p95_ms="450")
    report = response.context["report"]
    traces = {trace["name"]: trace for trace in report.scatter["data"]}
    assert traces["cheapest meeting the SLO"]["x"] == [300.0]
    assert traces["misses the SLO"]["x"] == [700.0]
    assert traces["cheapest meeting the SLO"]["y"] == [pytest.approx(PER_M_OUTPUT, abs=1e-6)]
    line = report.scatter["layout"]["shapes"][0]
    assert line["x0"] == line["x1"] == 450.0
    bars = report.bars["data"][0]
    # Cheapest first: 20 req/s → 2.50 / 72,000; 10 req/s → 2.50 / 36,000
    assert bars["x"] == [f"#{slow.pk} slow", f"#{fast.pk} fast"]
    assert bars["y"] == [pytest.approx(2.50 / 72_000), pytest.approx(2.50 / 36_000)]
    page = response.content.decode()
    assert 'data-chart="cost-scatter-data"' in page and 'id="cost-scatter-data"' in page
    assert 'data-chart="cost-bars-data"' in page and "controlpanel/charts.js" in page


def test_formulas_of_the_cheapest_or_the_chosen_run(client, viewer):
    cheap = make_finished_run(label="cheap")
    dear = make_finished_run(label="dear", request_throughput=5.0)
    response = cost_page(client, viewer)
    assert response.context["report"].focus["run"] == cheap
    page = response.content.decode()
    assert "2.50 USD ÷ (10 × 3,600 × 1) = 2.50 USD ÷ 36,000 = 0.000069444444 USD" in page
    response = cost_page(client, viewer, focus=str(dear.pk))
    assert response.context["report"].focus["run"] == dear
    assert "2.50 USD ÷ 18,000 = 0.00013888889 USD" in response.content.decode()
    assert f"focus={cheap.pk}" in response.content.decode()


# --- bad input ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "params, message",
    [
        ({"utilisation_pct": "0"}, "Utilisation must be more than 0 % and at most 100 %."),
        ({"utilisation_pct": "150"}, "Utilisation must be more than 0 % and at most 100 %."),
        ({"utilisation_pct": "lots"}, "Enter a number."),
        ({"restart_overhead_pct": "100"}, "Restart overhead must be at least 0 % and less"),
        ({"max_error_rate_pct": "120"}, "less than or equal to 100"),
        ({"slo_ttft_p95_ms": "-5"}, "greater than or equal to 0"),
        ({"pricing": "free"}, "Select a valid choice"),
        ({"runs": "999999"}, "Select a valid choice"),
        ({"runs": "abc"}, "is not a valid value"),
    ],
)
def test_bad_input_is_shown_on_the_form(client, viewer, params, message):
    make_finished_run()
    response = cost_page(client, viewer, **params)
    assert response.context["report"] is None
    page = response.content.decode()
    assert message in page.replace("&#x27;", "'").replace("&quot;", '"')
    assert 'data-testid="form-invalid"' in page
    assert response.context["total_hour"] is not None  # the fleet summary still shows


# --- a run priced as other instance types ---------------------------------------------------


def instance_types():
    """Two runs on one H100 each, and a price list. "fast": 2.50/h host, 10 req/s, 1280 tok/s,
    p95 TTFT 300 ms. "busy": 4.00/h host, 20 req/s, p95 TTFT 700 ms."""
    fast = make_finished_run(
        make_deployment(make_host(name="own-box", hourly_price=Decimal("2.50"))), label="fast"
    )
    busy = make_finished_run(
        make_deployment(make_host(name="slow-box", hourly_price=Decimal("4.00"))),
        label="busy",
        ttft_p95_ms=700.0,
        request_throughput=20.0,
    )
    prices = {
        "small": Price.objects.create(
            name="h100.small", hourly_price=Decimal("1.80"), gpu_model="H100", gpu_count=1
        ),
        "big": Price.objects.create(
            name="p5.48xlarge", hourly_price=Decimal("98.32"), gpu_model="H100", gpu_count=8
        ),
        "a100": Price.objects.create(
            name="a100.small", hourly_price=Decimal("1.00"), gpu_model="A100", gpu_count=1
        ),
        "spot": Price.objects.create(
            name="h100.small",
            pricing="spot",
            hourly_price=Decimal("0.90"),
            gpu_model="H100",
            gpu_count=1,
        ),
        "euro": Price.objects.create(
            name="h100.eu",
            hourly_price=Decimal("1.50"),
            currency="EUR",
            gpu_model="NVIDIA H100 80GB HBM3",
            gpu_count=1,
        ),
        "bare": Price.objects.create(name="no-gpus-said", hourly_price=Decimal("0.10")),
    }
    return fast, busy, prices


def rows_by_key(response):
    return {row["key"]: row for row in response.context["report"].rows}


def test_every_price_for_the_same_gpus_names_the_cheapest_combination(client, viewer):
    fast, busy, p = instance_types()
    small = p["small"].pk
    response = cost_page(client, viewer, price_as="matching", slo_ttft_p95_ms="500")
    rows = rows_by_key(response)
    # Each run at its host's price, at the 1 × H100 type, and at the EUR one (not ranked);
    # not at 8 × H100, A100, spot (another pricing) or a price that names no GPUs.
    assert set(rows) == {
        f"{run.pk}-{key}" for run in (fast, busy) for key in ("host", small, p["euro"].pk)
    }
    # fast: 2.50 / (10 × 3600) and 1.80 / 36,000; busy: 4.00 / (20 × 3600), 1.80 / 72,000.
    assert rows[f"{fast.pk}-host"]["cost"].per_request == pytest.approx(6.944444444444444e-05)
    assert rows[f"{fast.pk}-{small}"]["cost"].per_request == pytest.approx(5e-05)
    assert rows[f"{busy.pk}-host"]["cost"].per_request == pytest.approx(5.555555555555556e-05)
    assert rows[f"{busy.pk}-{small}"]["cost"].per_request == pytest.approx(2.5e-05)
    # 1.80 / (1280 × 3600) × 1e6
    assert rows[f"{fast.pk}-{small}"]["cost"].per_million_output == pytest.approx(0.390625)
    report = response.context["report"]
    best = report.cheapest  # busy at 1.80 is cheaper still, but misses the 500 ms SLO
    assert best["key"] == f"{fast.pk}-{small}" and best["source"] == "h100.small (On-demand)"
    assert best["label"] == f"#{fast.pk} fast @ h100.small (On-demand)"
    assert {row["key"] for row in report.left_out} == {
        f"{fast.pk}-{p['euro'].pk}",
        f"{busy.pk}-{p['euro'].pk}",
    }
    page = response.content.decode()
    callout = page.split('data-testid="cheapest"')[1].split("</div>")[0]
    assert f"#{fast.pk} fast @ h100.small (On-demand)" in callout
    assert "priced at 1.80 USD/h (h100.small (On-demand))" in callout
    assert "at 0.00005 USD per successful request" in callout
    assert f'class="cheapest" data-run="{fast.pk}" data-price="{small}"' in page
    # The formulas are the cheapest combination's, with its price.
    assert report.focus["key"] == f"{fast.pk}-{small}"
    assert "1.80 USD ÷ (10 × 3,600 × 1) = 1.80 USD ÷ 36,000 = 0.00005 USD" in page
    assert "1.80 USD ÷ 4,608,000 × 1,000,000 = 0.390625 USD" in page
    assert f"focus={busy.pk}-host#formulas" in page
    # Charts: one bar and one point per USD combination, cheapest bar first.
    bars = report.bars["data"][0]
    assert bars["x"] == [
        f"#{busy.pk} busy @ h100.small (On-demand)",
        f"#{fast.pk} fast @ h100.small (On-demand)",
        f"#{busy.pk} busy @ slow-box",
        f"#{fast.pk} fast @ own-box",
    ]
    assert bars["y"] == [
        pytest.approx(2.5e-05),
        pytest.approx(5e-05),
        pytest.approx(5.555555555555556e-05),
        pytest.approx(6.944444444444444e-05),
    ]
    traces = {trace["name"]: trace for trace in report.scatter["data"]}
    assert traces["cheapest meeting the SLO"]["y"] == [pytest.approx(0.390625)]
    assert sum(len(trace["x"]) for trace in report.scatter["data"]) == 4
    # A looser SLO lets the busier config on the cheap type win.
    report = cost_page(client, viewer, price_as="matching", slo_ttft_p95_ms="800").context["report"]
    assert report.cheapest["key"] == f"{busy.pk}-{small}"
    # The focus link of another row works the formulas out for it.
    page = cost_page(
        client, viewer, price_as="matching", focus=f"{busy.pk}-{small}"
    ).content.decode()
    assert "1.80 USD ÷ (20 × 3,600 × 1) = 1.80 USD ÷ 72,000 = 0.000025 USD" in page


def test_same_gpus_under_the_chosen_pricing_and_the_hosts_own_type_once(client, viewer):
    fast, busy, p = instance_types()
    # Spot: the spot type (0.90 / 36,000); the host has no spot price: its own, said so.
    rows = rows_by_key(cost_page(client, viewer, price_as="matching", pricing="spot"))
    assert set(rows) == {
        f"{run.pk}-{key}" for run in (fast, busy) for key in ("host", p["spot"].pk)
    }
    assert rows[f"{fast.pk}-{p['spot'].pk}"]["cost"].per_request == pytest.approx(2.5e-05)
    assert "no spot / preemptible price listed" in rows[f"{fast.pk}-host"]["source"]
    # A host that is the 1 × H100 type is priced as it once, not as itself and again.
    p["small"].hosts.add(fast.deployment.host)
    rows = rows_by_key(cost_page(client, viewer, price_as="matching"))
    fast_rows = {key: row for key, row in rows.items() if row["run"] == fast}
    assert set(fast_rows) == {f"{fast.pk}-host", f"{fast.pk}-{p['euro'].pk}"}
    assert fast_rows[f"{fast.pk}-host"]["price"] == Decimal("1.8000")
    assert f"{busy.pk}-{p['small'].pk}" in rows


def test_chosen_prices_price_every_run_and_say_when_the_gpus_differ(client, viewer):
    fast, busy, p = instance_types()
    response = cost_page(
        client, viewer, prices=[p["big"].pk, p["a100"].pk], slo_ttft_p95_ms="500"
    )  # no price_as: chosen prices mean "each chosen price"
    report = response.context["report"]
    assert report.price_as == "chosen"
    rows = rows_by_key(response)
    assert set(rows) == {
        f"{run.pk}-{price.pk}" for run in (fast, busy) for price in (p["big"], p["a100"])
    }
    # The 8-GPU type charges fast's one GPU: 98.32 × 1/8 / 36,000; 1.00 / 36,000 for fast
    # on the 1-GPU A100; 1.00 / 72,000 for busy (misses the SLO).
    big = rows[f"{fast.pk}-{p['big'].pk}"]
    assert big["cost"].per_request == pytest.approx(0.0027311111111111113 / 8)
    assert big["share_text"].startswith("1 of 8 GPUs: 12.29 of 98.32 USD/h; 7 idle GPUs")
    assert rows[f"{fast.pk}-{p['a100'].pk}"]["cost"].per_request == pytest.approx(
        2.777777777777778e-05
    )
    assert rows[f"{busy.pk}-{p['a100'].pk}"]["cost"].per_request == pytest.approx(
        1.388888888888889e-05
    )
    assert report.cheapest["key"] == f"{fast.pk}-{p['a100'].pk}"
    note = rows[f"{fast.pk}-{p['a100'].pk}"]["gpu_note"]
    assert note.startswith("measured on 1 × NVIDIA H100 80GB HBM3; this price is for 1 × A100")
    assert "8 × H100" in rows[f"{fast.pk}-{p['big'].pk}"]["gpu_note"]
    page = response.content.decode()
    assert page.count('data-testid="gpu-note"') == 4
    assert "each run at each chosen price" in page
    # A chosen type with the run's GPUs needs no warning.
    rows = rows_by_key(cost_page(client, viewer, prices=[p["small"].pk]))
    assert rows[f"{fast.pk}-{p['small'].pk}"]["gpu_note"] == ""
    # "Each chosen price" without one is a form error; a focus naming no row is ignored.
    response = cost_page(client, viewer, price_as="chosen")
    assert response.context["report"] is None
    assert "Choose at least one price" in response.content.decode()
    report = cost_page(client, viewer, price_as="matching", focus="x; drop").context["report"]
    assert report.focus["key"] == report.cheapest["key"]


def test_the_hosts_own_price_stays_the_default(client, viewer):
    fast, busy, _ = instance_types()
    report = cost_page(client, viewer).context["report"]
    assert report.price_as == "host"
    assert [row["key"] for row in report.rows] == [f"{busy.pk}-host", f"{fast.pk}-host"]
    assert [row["label"] for row in report.rows] == [f"#{busy.pk} busy", f"#{fast.pk} fast"]


def test_matching_prices_cost_no_query_per_run(client, viewer):
    instance_types()
    client.force_login(viewer)
    with CaptureQueriesContext(connection) as few:
        client.get(reverse("cost"), {"price_as": "matching"})
    for _ in range(5):
        make_finished_run(make_deployment(make_host()), engine_config=None)
    with CaptureQueriesContext(connection) as many:
        response = client.get(reverse("cost"), {"price_as": "matching"})
    assert len(many) == len(few)
    assert len(response.context["report"].rows) == 7 * 3


@pytest.mark.parametrize(
    "price_model, price_count, run_model, run_count, same",
    [
        ("H100", 1, "NVIDIA H100 80GB HBM3", 1, True),
        ("h100 80gb", 1, "NVIDIA H100 80GB HBM3", 1, True),
        ("NVIDIA H100 80GB HBM3", 1, "NVIDIA H100 80GB HBM3", 1, True),
        ("A100", 1, "NVIDIA A100-SXM4-80GB", 1, True),
        ("A100-SXM4-40GB", 1, "NVIDIA A100-SXM4-80GB", 1, False),
        ("H10", 1, "NVIDIA H100 80GB HBM3", 1, False),  # whole words only
        ("H100", 8, "NVIDIA H100 80GB HBM3", 1, False),
        ("H100", 2, "NVIDIA A100, NVIDIA H100 80GB HBM3", 2, False),  # mixed: no one type
        ("H100", None, "NVIDIA H100 80GB HBM3", 1, False),
        ("", 1, "NVIDIA H100 80GB HBM3", 1, False),
        ("H100", 1, "", None, False),
    ],
)
def test_same_gpus(price_model, price_count, run_model, run_count, same):
    price = Price(name="t", hourly_price=Decimal("1"), gpu_model=price_model, gpu_count=price_count)
    assert services.same_gpus(price, run_model, run_count) is same


# --- one cost of a run, and which ---------------------------------------------------------------


def test_a_run_s_own_cost_is_priced_when_it_ran_and_the_cost_page_says_it_uses_today_s(
    client, viewer
):
    """Issue 39: a run had two costs, the price stored when it finished and the cost page's
    re-pricing at today's prices, with nothing saying which was shown. Now each says."""
    from benchmarks.loadgen.stats import summarize
    from benchmarks.services.results import store_results

    host = make_host(name="repriced", hourly_price=Decimal("2.50"))
    run = make_run(make_deployment(host), status="succeeded")
    store_results(run, {**summarize([]), "output_throughput": 1280.0})
    run.refresh_from_db()
    assert run.hourly_price == Decimal("2.5000")
    host.hourly_price = Decimal("5.00")  # the price changed since
    host.save()

    client.force_login(viewer)
    text = client.get(reverse("benchmarks:part", args=[run.pk, "results"])).content.decode()
    assert "priced when it ran (2.50 USD/h)" in text and "at today's prices</a>" in text
    detail = client.get(f"/api/v1/runs/{run.pk}/").json()
    assert detail["cost"] == {
        "priced": "when the run finished",
        "hourly_price": 2.5,
        "currency": "USD",
        "per_million_output": pytest.approx(PER_M_OUTPUT),
    }
    today = cost_page(client, viewer, runs=[run.pk])
    assert rows_by_run(today)[run.pk]["price"] == Decimal("5.0000")
    assert 'data-testid="priced-today"' in today.content.decode()
