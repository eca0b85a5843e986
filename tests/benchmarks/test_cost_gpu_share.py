"""A deployment pays for the GPUs it uses: the host's price × used GPUs ÷ host GPUs, the idle
share shown apart (the cost page's fleet table and run rows, the price recorded on a run)."""

from decimal import Decimal

import pytest
from django.urls import reverse

from benchmarks import cost
from benchmarks.services.results import store_results
from tests.factories import make_deployment, make_finished_run, make_gpu, make_host, make_run

pytestmark = pytest.mark.django_db


def test_gpu_share_charges_the_used_gpus_and_keeps_the_rest_apart():
    share = cost.gpu_share(Decimal("4.90"), 1, 2)
    assert share.charged == Decimal("2.45") and share.idle_price == Decimal("2.45")
    assert share.partial and share.idle == 1
    assert share.describe("USD") == "1 of 2 GPUs: 2.45 of 4.90 USD/h"
    # Unknown counts, or every GPU used (or more claimed): the whole price, nothing idle.
    for used, total in ((None, 2), (1, None), (2, 2), (3, 2)):
        whole = cost.gpu_share(Decimal("4.90"), used, total)
        assert whole.charged == Decimal("4.90") and not whole.partial and whole.idle == 0
    nobody = cost.idle_gpus(Decimal("4.90"), 0, 2)
    assert nobody.idle == 2 and nobody.idle_price == Decimal("4.90")
    with pytest.raises(ValueError):
        cost.gpu_share(-1, 1, 2)


def _two_gpu_host(**kw):
    host = make_host(hourly_price=Decimal("4.90"), **kw)
    return host, [make_gpu(host), make_gpu(host)]


def test_cost_page_prices_a_one_gpu_deployment_at_half_a_two_gpu_host(client, viewer):
    host, gpus = _two_gpu_host(name="half-used")
    deployment = make_deployment(host)
    deployment.gpus.set([gpus[0]])
    run = make_finished_run(deployment, gpu_count=1)
    client.force_login(viewer)
    response = client.get(reverse("cost"), {"runs": [run.pk]})
    row = response.context["report"].rows[0]
    assert row["price"] == Decimal("2.45")
    # 10 successful requests/s: 2.45 / 36,000, not the whole host's 4.90 / 36,000.
    assert row["cost"].per_request == pytest.approx(2.45 / 36000)
    assert row["share_text"] == (
        "1 of 2 GPUs: 2.45 of 4.90 USD/h; 1 idle GPU (2.45 USD/h) not charged to this run"
    )
    fleet = {r["host"].name: r for r in response.context["rows"]}
    assert fleet["half-used"]["idle_text"] == (
        "1 of 2 GPUs idle: 2.45 USD/h not charged to any deployment"
    )
    assert response.context["idle_hour"] == Decimal("2.45")
    page = response.content.decode()
    assert 'data-testid="gpu-share"' in page and 'data-testid="idle-hour"' in page
    assert "1 of 2 GPUs idle: 2.45 USD/h not charged to any deployment" in page


def test_a_deployment_on_the_whole_host_leaves_nothing_idle(client, viewer):
    host, _ = _two_gpu_host(name="whole")
    run = make_finished_run(make_deployment(host), gpu_count=2)  # no GPUs by index: all
    idle_host, _ = _two_gpu_host(name="empty")  # no deployment at all
    client.force_login(viewer)
    response = client.get(reverse("cost"), {"runs": [run.pk]})
    row = response.context["report"].rows[0]
    assert row["price"] == Decimal("4.90") and row["share_text"] == ""
    fleet = {r["host"].name: r for r in response.context["rows"]}
    assert fleet["whole"]["idle_text"] == ""
    assert fleet["empty"]["idle_text"].startswith("2 of 2 GPUs idle: 4.90 USD/h")
    assert idle_host.pk and response.context["idle_hour"] == Decimal("4.90")


def test_a_recorded_run_is_priced_at_the_gpus_it_used():
    host, gpus = _two_gpu_host()
    deployment = make_deployment(host)
    run = make_run(deployment, gpu_count=1)
    store_results(run, {"output_throughput": 1000.0})
    run.refresh_from_db()
    assert run.hourly_price == Decimal("2.45")
    assert run.cost_per_million_output == pytest.approx(2.45 / (1000 * 3600) * 1e6)
