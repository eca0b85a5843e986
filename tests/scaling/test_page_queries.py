"""The scaling pages read a deployment's evidence in a bounded number of queries and decode
only the runs they use (issue 21): N and 3N runs on the running config cost the same
queries, and a finished run's stage gauges come from the cache after the first page."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from scaling.models import ScalingPolicy
from scaling.services import state
from tests.factories import make_profile
from tests.scaling.test_state import STAGED, running, sample, staged_run

pytestmark = pytest.mark.django_db


def _queries(client, url) -> tuple[int, list[str]]:
    client.get(url)  # sessions, permissions, and the gauges cache warmed
    with CaptureQueriesContext(connection) as queries:
        response = client.get(url)
    assert response.status_code == 200
    return len(queries), [q["sql"] for q in queries.captured_queries]


@pytest.mark.parametrize("url_name", ["scaling:fleet", "scaling:deployment"])
def test_pages_cost_the_same_queries_for_3n_runs(client, viewer, url_name):
    profile = make_profile(spec=STAGED)
    deployment = running()
    ScalingPolicy.objects.create(deployment=deployment, load_profile=profile)
    sample(deployment, 5.0)
    url = reverse(url_name, args=[deployment.pk] if url_name.endswith("deployment") else [])
    client.force_login(viewer)
    for _ in range(3):
        staged_run(deployment, profile)
    few, _ = _queries(client, url)
    for _ in range(6):
        staged_run(deployment, profile)
    many, sql = _queries(client, url)
    assert many == few, f"{few} queries for 3 runs, {many} for 9"
    # The runs' per-second points were summed up once, on the first page: kept since.
    assert not any("benchmarks_runpoint" in s for s in sql)


def test_cached_gauges_are_the_ones_worked_out_from_the_points():
    profile = make_profile(spec=STAGED)
    deployment = running()
    run = staged_run(deployment, profile)
    fresh = state.scaling_state(deployment).capacity
    cached = state.scaling_state(deployment).capacity
    assert fresh == cached
    assert state._stage_gauges([run]) == state._gauges_from_points([run.pk])
    assert state._stage_gauges([run])[run.pk]["peak"]["waiting_max"] == 4


def test_only_the_newest_max_runs_are_read_whole(monkeypatch):
    profile = make_profile(spec=STAGED)
    deployment = running()
    runs = [staged_run(deployment, profile, gauges=False) for _ in range(4)]
    monkeypatch.setattr(state, "MAX_RUNS", 2)
    read = []
    real = state._run_points
    monkeypatch.setattr(state, "_run_points", lambda run, g: read.append(run.pk) or real(run, g))
    state.scaling_state(deployment)
    assert sorted(read) == sorted(r.pk for r in runs[-2:])
