"""The cost page reads a bounded number of queries whatever the history's size (issue 21: it
took 2.15 s with both cores busy): N and 3N runs cost the same queries, for the default
selection (the latest succeeded runs) and for runs named in the query string."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from tests.factories import make_config, make_deployment, make_finished_run, make_gpu, make_host

pytestmark = pytest.mark.django_db


def _history(n: int) -> list[int]:
    """``n`` finished runs over two hosts, each with its JSON documents filled."""
    pks = []
    for h in range(2):
        host = make_host()
        make_gpu(host)
        deployment = make_deployment(host)
        config = make_config(deployment, {"max_num_seqs": 64})
        for i in range(n // 2):
            run = make_finished_run(
                deployment,
                engine_config=config,
                label=f"run {h}-{i}",
                summary={"p95_ttft_ms": 300.0},
                stages={"main": {"completed": 600}},
                distributions={"q": [0.5], "ttft_ms": [120.0]},
                environment={"host": {"name": host.name}},
            )
            pks.append(run.pk)
    return pks


def _queries(client, params) -> tuple[int, int]:
    client.get(reverse("cost"), params)  # sessions and permissions warmed
    with CaptureQueriesContext(connection) as queries:
        response = client.get(reverse("cost"), params)
    assert response.status_code == 200
    return len(queries), len(response.context["report"].rows)


def test_the_default_selection_costs_the_same_queries_for_3n_runs(client, viewer):
    client.force_login(viewer)
    _history(4)
    few, few_rows = _queries(client, {})
    _history(12)
    many, many_rows = _queries(client, {})
    assert (few_rows, many_rows) == (4, 16)
    assert many == few, f"{few} queries for 4 runs, {many} for 16"


def test_named_runs_cost_the_same_queries_for_3n_runs(client, viewer):
    client.force_login(viewer)
    few, few_rows = _queries(client, {"runs": _history(4)})
    many, many_rows = _queries(client, {"runs": _history(12)})
    assert (few_rows, many_rows) == (4, 12)
    assert many == few, f"{few} queries for 4 runs, {many} for 12"


def test_the_latest_runs_are_the_newest_succeeded_ones_newest_first(client, viewer):
    # The default selection picks ids first, then reads those rows: same runs, same order.
    client.force_login(viewer)
    pks = _history(30)
    deployment = make_deployment()
    failed = make_finished_run(deployment, status="failed")
    rows = client.get(reverse("cost")).context["report"].rows
    shown = [row["run"].pk for row in rows]
    assert failed.pk not in shown
    assert shown == sorted(pks, reverse=True)[:20]
