"""Stale findings say so, with how stale and why: when an advisor pass fails the findings
stay, and the host page's Advisor section and the API's diagnosis say "as of 14:02 (12 min
ago): the advisor failed since 14:03: TypeError"; findings older than three advisor
intervals are stale too (the beat is not running). They showed silently before."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.core.cache import cache
from django.urls import reverse
from django.utils import timezone

from changes.advisor import engine
from changes.advisor.findings import WARNING, Suggestion
from changes.advisor.findings import Finding as Found
from changes.services import diagnosis
from tests.factories import make_config, make_deployment, make_host

pytestmark = pytest.mark.django_db


def queue_bound(snapshot):
    return [
        Found(
            rule="queue-bound",
            severity=WARNING,
            title="Requests wait for a sequence slot",
            seen="12 requests waiting",
            why="They queue while the GPU has room.",
            evidence={"waiting_mean": 12},
            source="live",
            suggestion=Suggestion(settings={"max_num_seqs": 64}),
        )
    ]


@pytest.fixture
def deployment(monkeypatch, settings):
    settings.ADVISOR_INTERVAL_SECONDS = 60.0
    monkeypatch.setattr(engine, "RULES", {"stub": queue_bound})
    d = make_deployment(make_host(status="online"), name="llama")
    d.active_config = make_config(d, {"max_num_seqs": 4})
    d.save()
    cache.delete(diagnosis._status_key(d.pk))
    yield d
    cache.delete(diagnosis._status_key(d.pk))


def fail_from_now_on(monkeypatch):
    def broken(*args, **kwargs):
        raise TypeError("float() argument must be a string or a real number, not 'list'")

    monkeypatch.setattr(diagnosis, "gather", broken)


def test_a_failing_pass_is_recorded_and_the_findings_say_how_stale_and_why(deployment, monkeypatch):
    diagnosis.refresh(deployment, live=False)
    good = diagnosis.last_evaluation(deployment)["evaluated_at"]
    fail_from_now_on(monkeypatch)
    for _ in range(2):
        with pytest.raises(TypeError):
            diagnosis.refresh(deployment, live=False)
    status = diagnosis.last_evaluation(deployment)
    assert status["evaluated_at"] == good and status["error_class"] == "TypeError"
    assert status["failed_since"] <= status["failed_at"]

    later = timezone.now() + timedelta(minutes=12)
    fresh = diagnosis.freshness(status, now=later)
    assert fresh.stale and fresh.error_class == "TypeError"
    assert fresh.text.startswith("as of ") and "(12 min ago): the advisor failed since " in (
        fresh.text
    )
    assert fresh.text.endswith(": TypeError")


def test_the_host_page_section_says_it(deployment, monkeypatch, client, viewer):
    diagnosis.refresh(deployment, live=False)
    fail_from_now_on(monkeypatch)
    with pytest.raises(TypeError):
        diagnosis.refresh(deployment, live=False)
    client.force_login(viewer)
    page = client.get(reverse("changes:advisor_deployment", args=[deployment.pk])).content.decode()
    assert 'data-testid="advisor-stale"' in page
    assert "the advisor failed since" in page and "TypeError" in page
    assert 'data-testid="finding-queue-bound"' in page  # the findings stay, marked


def test_the_api_says_it(deployment, monkeypatch, admin, client):
    diagnosis.refresh(deployment, live=False)
    fail_from_now_on(monkeypatch)
    client.force_login(admin)
    api = client
    assert api.get(f"/api/v1/deployments/{deployment.pk}/diagnosis/?refresh=1").status_code == 500
    data = api.get(f"/api/v1/deployments/{deployment.pk}/diagnosis/").json()
    fresh = data["freshness"]
    assert fresh["stale"] is True and fresh["error_class"] == "TypeError"
    assert "the advisor failed since" in fresh["text"] and data["findings"]


def test_a_good_pass_clears_the_failure(deployment, monkeypatch):
    with monkeypatch.context() as patched:
        fail_from_now_on(patched)
        with pytest.raises(TypeError):
            diagnosis.refresh(deployment, live=False)
    diagnosis.refresh(deployment, live=False)
    fresh = diagnosis.freshness(diagnosis.last_evaluation(deployment))
    assert not fresh.stale and fresh.reason == "" and fresh.text.startswith("as of ")


def test_findings_three_intervals_old_are_stale_without_a_failure(deployment):
    diagnosis.refresh(deployment, live=False)
    status = diagnosis.last_evaluation(deployment)
    assert not diagnosis.freshness(status, now=timezone.now() + timedelta(seconds=170)).stale
    old = diagnosis.freshness(status, now=timezone.now() + timedelta(minutes=12))
    assert old.stale and "(12 min ago): the advisor has not run since" in old.text


def test_the_live_page_is_told_when_findings_go_stale_and_fresh_again(deployment, monkeypatch):
    sent = []
    monkeypatch.setattr(diagnosis, "publish", lambda group, event, data: sent.append(data))
    diagnosis.refresh(deployment, live=False)
    sent.clear()
    with monkeypatch.context() as patched:
        fail_from_now_on(patched)
        for _ in range(3):
            with pytest.raises(TypeError):
                diagnosis.refresh(deployment, live=False)
    assert [d.get("freshness") for d in sent] == [True]  # once, on the first failure
    diagnosis.refresh(deployment, live=False)
    assert [d.get("freshness") for d in sent] == [True, True]  # and once when it recovers
