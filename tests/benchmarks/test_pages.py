"""Benchmark history, one run, and the cost page."""

from decimal import Decimal

import pytest
from django.urls import reverse

from tests.factories import make_gpu, make_host, make_profile, make_run

pytestmark = pytest.mark.django_db


def test_history_lists_runs_and_profiles(client, viewer):
    run = make_run(label="baseline-run", load_profile=make_profile(name="chat-peak"))
    client.force_login(viewer)
    page = client.get(reverse("benchmarks:list")).content.decode()
    assert "baseline-run" in page and "chat-peak" in page and run.get_absolute_url() in page


def test_run_detail_shows_error_of_a_failed_run(client, viewer):
    run = make_run(label="broken", status="failed", error="engine refused the connection")
    client.force_login(viewer)
    page = client.get(run.get_absolute_url()).content.decode()
    assert "engine refused the connection" in page


def test_open_loop_profile_needs_a_rate():
    from django.core.exceptions import ValidationError

    profile = make_profile(mode="open", request_rate=None)
    with pytest.raises(ValidationError, match="request rate"):
        profile.clean()


def test_cost_page_prices_per_gpu_hour_and_month(client, viewer):
    host = make_host(name="pricey", hourly_price=Decimal("8.00"))
    make_gpu(host)
    make_gpu(host)
    make_host(name="cheap", hourly_price=Decimal("2.00"))
    client.force_login(viewer)
    response = client.get(reverse("cost"))
    assert response.context["total_hour"] == Decimal("10.00")
    assert response.context["total_month"] == Decimal("7300.00")
    rows = {row["host"].name: row for row in response.context["rows"]}
    assert rows["pricey"]["per_gpu_hour"] == Decimal("4")
    assert rows["cheap"]["per_gpu_hour"] is None
