"""The live run page stays light on long runs: it reads only what it shows (per-request TTFT
samples for the recent past only), and the socket's backfill comes in bounded pages."""

from __future__ import annotations

import json
import re

import pytest
from django.urls import reverse
from django.utils import timezone

from benchmarks.loadgen.runner import TTFT_SAMPLES_PER_TICK
from benchmarks.models import RunPoint
from benchmarks.services import timeline as views
from tests.factories import make_run

THREE_HOURS = 3 * 3600


def point(t: float, samples: int = TTFT_SAMPLES_PER_TICK) -> dict:
    return {
        "t": t,
        "stage": "main",
        "in_flight": 8,
        "completed": int(t) * 10,
        "failed": 0,
        "requests_per_s": 10.0,
        "errors_per_s": 0.0,
        "output_tokens_per_s": 1280.5,
        "ttft_p50_ms": 120.0,
        "ttft_p95_ms": 310.0,
        "server_waiting": 0,
        "server_running": 8,
        "kv_cache_usage": 0.42,
        "gpus": [{"index": 0, "utilization_pct": 97, "memory_used_gib": 70.1, "power_w": 650}],
        "progress": round(t / THREE_HOURS, 4),
        "eta_s": THREE_HOURS - t,
        "ttfts": [[round(t - 1 + i / samples, 3), 100.0 + i] for i in range(samples)],
    }


def add_points(run, seconds: range) -> None:
    RunPoint.objects.bulk_create(
        [RunPoint(run=run, t=float(t), data=point(float(t))) for t in seconds], batch_size=500
    )


def samples(points: list[dict]) -> int:
    return sum(len(p.get("ttfts") or []) for p in points)


def embedded(response) -> list[dict]:
    match = re.search(
        r'<script id="run-points" type="application/json">(.*?)</script>',
        response.content.decode(),
        re.S,
    )
    return json.loads(match.group(1))


@pytest.mark.django_db
def test_a_three_hour_run_page_reads_few_queries_and_a_bounded_number_of_samples(
    client, viewer, django_assert_max_num_queries
):
    run = make_run(status="running", started_at=timezone.now())
    add_points(run, range(1, THREE_HOURS + 1))
    client.force_login(viewer)
    with django_assert_max_num_queries(15):
        page = client.get(run.get_absolute_url())
    assert page.status_code == 200
    points = embedded(page)
    # Every second is on the charts, in order; only the recent past carries its samples.
    assert [p["t"] for p in points] == [float(t) for t in range(1, THREE_HOURS + 1)]
    assert samples(points) <= views.RECENT_WITH_SAMPLES * TTFT_SAMPLES_PER_TICK
    assert all("ttfts" in p for p in points[-views.RECENT_WITH_SAMPLES :])
    assert not any("ttfts" in p for p in points[: -views.RECENT_WITH_SAMPLES])
    # An old point still has every number a chart draws, JSON types intact.
    old = points[0]
    assert old["gpus"] == point(1.0)["gpus"]
    assert old["output_tokens_per_s"] == 1280.5 and old["in_flight"] == 8
    assert old["kv_cache_usage"] == 0.42 and old["failed"] == 0
    assert set(views.CHART_KEYS) <= set(old)
    # The newest point is whole (the progress line and ETA come from it).
    assert points[-1] == point(float(THREE_HOURS))
    # ~1M samples (about 20 MB of JSON) are stored; the page carries every second's numbers
    # but only the recent samples: a few MB.
    assert len(page.content) < 5_000_000


@pytest.mark.django_db
def test_the_backfill_pages_through_what_was_missed(client, viewer, django_assert_max_num_queries):
    run = make_run(status="running", started_at=timezone.now())
    add_points(run, range(1, 2001))
    url = reverse("benchmarks:timeline", args=[run.pk])
    client.force_login(viewer)

    # A short gap: just the missed seconds, with their samples, and the run's status.
    reply = client.get(url, {"since": "1995"}).json()
    assert [p["t"] for p in reply["points"]] == [1996.0, 1997.0, 1998.0, 1999.0, 2000.0]
    assert reply["more"] is False and samples(reply["points"]) == 5 * TTFT_SAMPLES_PER_TICK
    assert reply["status"] == "running" and reply["finished"] is False
    assert reply["label"] == "Running" and reply["colour"] == "blue"  # the badge, as declared

    # A long one (or a fresh page asking from the start): bounded pages, no gap, no repeat.
    seen = []
    since = -1.0
    while True:
        with django_assert_max_num_queries(10):
            reply = client.get(url, {"since": str(since)}).json()
        assert len(reply["points"]) <= views.BACKFILL_PAGE
        assert samples(reply["points"]) <= views.RECENT_WITH_SAMPLES * TTFT_SAMPLES_PER_TICK
        seen += [p["t"] for p in reply["points"]]
        if not reply["more"]:
            break
        since = reply["points"][-1]["t"]
    assert seen == [float(t) for t in range(1, 2001)]

    # Nothing after the newest point: an empty, final page.
    reply = client.get(url, {"since": "2000"}).json()
    assert reply["points"] == [] and reply["more"] is False
    for bad in ("x", "nan", "inf"):
        assert client.get(url, {"since": bad}).status_code == 400


@pytest.mark.django_db
def test_the_backfill_tells_a_page_that_the_run_ended(client, viewer):
    run = make_run(status="succeeded", started_at=timezone.now(), finished_at=timezone.now())
    add_points(run, range(1, 4))
    client.force_login(viewer)
    reply = client.get(reverse("benchmarks:timeline", args=[run.pk]), {"since": "2"}).json()
    assert reply["status"] == "succeeded" and reply["finished"] is True
    assert reply["colour"] == "green"
    assert [p["t"] for p in reply["points"]] == [3.0]


@pytest.mark.django_db
def test_a_short_run_keeps_every_sample(client, viewer):
    run = make_run(status="running", started_at=timezone.now())
    add_points(run, range(1, 11))
    client.force_login(viewer)
    points = embedded(client.get(run.get_absolute_url()))
    assert points == [point(float(t)) for t in range(1, 11)]


@pytest.mark.django_db
def test_the_run_page_and_backfill_need_the_viewer_role(client, nobody):
    run = make_run()
    assert client.get(run.get_absolute_url()).status_code == 302
    client.force_login(nobody)
    assert client.get(run.get_absolute_url()).status_code == 403
    assert client.get(reverse("benchmarks:timeline", args=[run.pk])).status_code == 403
