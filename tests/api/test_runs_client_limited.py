"""The runs API and the export say whether a run is client-limited (issue 37, finding 3):
the detail carries ``client_limited`` with the reasons and the health numbers, a list row the
verdict without the numbers."""

from __future__ import annotations

import pytest

from benchmarks.services import export
from tests.benchmarks.test_client_limited import LIMITED
from tests.factories import make_finished_run


@pytest.mark.django_db
def test_the_api_and_the_export_say_client_limited(viewer, token_for):
    run = make_finished_run(client_health=LIMITED)
    api = token_for(viewer)
    detail = api.get(f"/api/v1/runs/{run.pk}/").json()
    verdict = detail["client_limited"]
    assert verdict["limited"] is True and verdict["state"] == "client_limited"
    assert any("event-loop lag p99 48 ms" in r for r in verdict["reasons"])
    assert verdict["health"]["engine"]["ttft_mean_ms"] == 30.0
    row = api.get("/api/v1/runs/").json()["results"][0]
    assert row["client_limited"]["limited"] is True and "health" not in row["client_limited"]
    document = export.export_document(run)
    assert document["panel"]["client_limited"]["limited"] is True
    assert document["client_health"] == LIMITED
