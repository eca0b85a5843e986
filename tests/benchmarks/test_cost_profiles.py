"""The cost page ranks the runs of one load profile only (a config measured under a lighter
load looks cheaper): the chosen profile, by default the one most of the selected runs used
(the newest run's on a tie); runs of other profiles are listed, not ranked, and not charted.
Errors count against a default error SLO of 1 % that the page shows and the user may edit
(before, runs of any profiles were ranked together, and errors only with an error SLO set)."""

from __future__ import annotations

from decimal import Decimal

import pytest
from django.urls import reverse

from benchmarks import cost, cost_ranking
from tests.factories import make_deployment, make_finished_run, make_host, make_profile

pytestmark = pytest.mark.django_db


def report_of(client, user, **params):
    client.force_login(user)
    response = client.get(reverse("cost"), params)
    assert response.status_code == 200
    return response.context["report"], " ".join(response.content.decode().split())


@pytest.fixture
def fleet():
    """Three runs of "chat" and one of "light" (a trickle of short requests: 40 req/s on
    the same 2.50/h host, so four times cheaper per request than any chat run)."""
    chat, light = make_profile("chat"), make_profile("light")
    deployment = make_deployment(make_host(hourly_price=Decimal("2.50")))
    runs = {
        name: make_finished_run(deployment, label=name, load_profile=chat, request_throughput=rps)
        for name, rps in (("chat-a", 10.0), ("chat-b", 12.0), ("chat-c", 8.0))
    }
    runs["light"] = make_finished_run(
        deployment, label="light", load_profile=light, request_throughput=40.0
    )
    return chat, light, runs


def test_by_default_the_profile_most_runs_used_is_ranked(client, viewer, fleet):
    chat, light, runs = fleet
    report, page = report_of(client, viewer)
    assert report.profile == "chat v1" and report.profile_pk == chat.pk
    assert report.cheapest["run"] == runs["chat-b"]  # not the light run, cheaper per request
    light_row = next(row for row in report.rows if row["run"] == runs["light"])
    assert not light_row["ranked"] and light_row["status"].startswith(
        "not ranked: profile light v1, not chat v1"
    )
    assert report.other_profiles == [("light v1", 1)]
    assert 'data-testid="ranked-profile">chat v1' in page
    assert "the profile of most of the selected runs (3 of 4)" in page
    assert "light v1 (1 run)" in page
    charted = report.bars["data"][0]["x"]
    assert "light" not in charted and len(charted) == 3


def test_a_chosen_profile_is_ranked(client, viewer, fleet):
    chat, light, runs = fleet
    report, _ = report_of(client, viewer, profile=light.pk)
    assert report.profile == "light v1" and report.cheapest["run"] == runs["light"]
    # Without runs named, the runs priced are that profile's latest.
    assert [row["run"] for row in report.rows] == [runs["light"]]


def test_a_tie_goes_to_the_newest_runs_profile(client, viewer):
    older, newer = make_profile("older"), make_profile("newer")
    make_finished_run(load_profile=older)
    make_finished_run(load_profile=newer)
    report, _ = report_of(client, viewer)
    assert report.profile == "newer v1"


def test_errors_count_against_a_default_one_percent_shown_and_editable(client, viewer):
    profile = make_profile("chat")
    deployment = make_deployment(make_host(hourly_price=Decimal("2.50")))
    flaky = make_finished_run(
        deployment, label="flaky", load_profile=profile, request_throughput=20.0, error_rate=0.03
    )
    steady = make_finished_run(deployment, label="steady", load_profile=profile)
    report, page = report_of(client, viewer)
    assert report.slo.max_error_rate == cost_ranking.DEFAULT_MAX_ERROR_RATE == 0.01
    assert report.cheapest["run"] == steady
    assert "error rate ≤ 1 %" in page and 'name="max_error_rate_pct" value="1"' in page
    report, _ = report_of(client, viewer, max_error_rate_pct="5")
    assert report.cheapest["run"] == flaky


def test_an_unknown_profile_is_a_form_error(client, viewer, fleet):
    client.force_login(viewer)
    response = client.get(reverse("cost"), {"profile": "987654"})
    assert response.status_code == 200 and response.context["report"] is None
    assert "profile" in response.context["form"].errors


def test_rank_sets_other_profiles_aside():
    def option(key, profile, rps):
        run_cost = cost.RunCost(
            hourly_price=1.0, currency="USD", requests_per_s=rps, error_rate=0.0
        )
        return cost_ranking.Option(key, run_cost, 100.0, key, profile=profile)

    options = [option("a", "chat v1", 10), option("b", "light v1", 40)]
    ranking = cost_ranking.rank(options, currency="USD", profile="chat v1")
    assert [o.key for o in ranking.ranked] == ["a"]
    assert ranking.status(options[1]).startswith("not ranked: profile light v1, not chat v1")
    assert [o.key for o in cost_ranking.rank(options, currency="USD").ranked] == ["b", "a"]
