"""The runs API: the history list, starting and cancelling runs as the pages do, a run's
numbers under the export's names, its timeline, and the verdict against a baseline."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone
from rest_framework.test import APIClient

from benchmarks.models import BenchmarkRun, RunPoint
from changes.services import verification
from changes.verdict import Thresholds
from controlpanel.models import AuditEntry
from tests.factories import make_deployment, make_finished_run, make_profile, make_run

pytestmark = pytest.mark.django_db

LIST = "/api/v1/runs/"


def detail_url(run) -> str:
    return f"/api/v1/runs/{run.pk}/"


# --- the list ------------------------------------------------------------------------------------
def test_the_list_has_the_history_columns_and_its_filters(viewer, token_for):
    api = token_for(viewer)
    deployment = make_deployment()
    profile = make_profile("chat")
    fast = make_finished_run(deployment, load_profile=profile, ttft_p95_ms=100.0, label="fast")
    slow = make_finished_run(deployment, load_profile=profile, ttft_p95_ms=900.0, label="slow")
    other = make_finished_run(ttft_p95_ms=500.0, label="elsewhere")
    queued = make_run(deployment, load_profile=profile, label="waiting")

    body = api.get(LIST).json()
    assert body["count"] == 4
    assert [row["id"] for row in body["results"]] == [queued.pk, other.pk, slow.pk, fast.pk]
    row = next(r for r in body["results"] if r["id"] == slow.pk)
    assert row["deployment"] == deployment.pk and row["deployment_name"] == deployment.name
    assert row["host_name"] == deployment.host.name
    assert (row["profile"], row["profile_name"], row["profile_version"]) == (profile.pk, "chat", 1)
    assert row["ttft_p95_ms"] == 900.0 and row["itl_p95_ms"] == 20.0
    assert row["output_tokens_per_s"] == 1280.0 and row["error_rate"] == 0.0
    assert row["cost_per_million_output"] == pytest.approx(2.5 / (1280 * 3600) * 1e6)
    assert row["status"] == "succeeded" and row["finished_at"]
    assert row["created_at"].endswith("Z") or "+" in row["created_at"]

    def ids(**query):
        answer = api.get(LIST, query)
        assert answer.status_code == 200, answer.json()
        return [r["id"] for r in answer.json()["results"]]

    assert ids(ordering="ttft_p95_ms") == [fast.pk, other.pk, slow.pk, queued.pk]
    assert ids(ordering="-ttft_p95_ms") == [slow.pk, other.pk, fast.pk, queued.pk]
    assert ids(deployment=deployment.pk, status="succeeded") == [slow.pk, fast.pk]
    assert ids(profile=profile.pk, q="fa") == [fast.pk]
    assert ids(profile_name="chat", ordering="date") == [fast.pk, slow.pk, queued.pk]
    assert ids(host=other.deployment.host_id) == [other.pk]
    assert ids(page_size=1, page=2) == [other.pk]


@pytest.mark.parametrize(
    "query, field",
    [
        ({"ordering": "speed"}, "ordering"),
        ({"deployment": "abc"}, "deployment"),
        ({"profile": "1.5"}, "profile"),
        ({"status": "done"}, "status"),
        ({"date_from": "yesterday"}, "date_from"),
        ({"sort": "date"}, "sort"),  # the page's name: the API says ordering
        ({"stauts": "failed"}, "stauts"),
    ],
)
def test_a_bad_filter_is_a_400_naming_it(viewer, token_for, query, field):
    answer = token_for(viewer).get(LIST, query)
    assert answer.status_code == 400
    assert answer["Content-Type"] == "application/problem+json"
    assert field in answer.json()["errors"]


def test_the_list_reads_a_fixed_number_of_queries_and_no_json_parts(viewer, token_for):
    api = token_for(viewer)
    deployment = make_deployment()
    make_finished_run(deployment, summary={"big": "x" * 1000})

    def queries():
        with CaptureQueriesContext(connection) as captured:
            assert api.get(LIST, {"ordering": "-ttft_p95_ms"}).status_code == 200
        return [q["sql"] for q in captured.captured_queries]

    queries()  # the token's first use is recorded once
    few = len(queries())
    for _ in range(5):
        make_finished_run(make_deployment(), summary={"big": "x" * 1000})
    sql = queries()
    assert len(sql) == few, "a query per row"
    listing = next(q for q in sql if "ORDER BY" in q and "benchmarks_benchmarkrun" in q)
    for blob in ("summary", "distributions", "environment", "server", "stages", "log"):
        assert f'"benchmarks_benchmarkrun"."{blob}"' not in listing, blob


# --- starting a run ------------------------------------------------------------------------------
def test_an_operator_starts_a_run_and_gets_its_detail(operator, token_for):
    api = token_for(operator, "nightly")
    deployment = make_deployment()
    profile = make_profile("chat")
    answer = api.post(
        LIST, {"deployment": deployment.pk, "profile": profile.pk, "label": "ci"}, format="json"
    )
    assert answer.status_code == 201, answer.json()
    run = BenchmarkRun.objects.get()
    body = answer.json()
    assert answer["Location"].endswith(detail_url(run))
    assert body["id"] == run.pk and body["status"] == "queued" and body["finished"] is False
    assert body["label"] == "ci" and body["results"] is None
    assert (body["deployment"], body["profile"], body["profile_version"]) == (
        deployment.pk,
        profile.pk,
        1,
    )
    assert run.requested_by == operator
    entry = AuditEntry.objects.get(action="benchmark.start")
    assert entry.via == "token nightly"


def test_a_busy_deployment_is_a_409_with_the_reason_and_nothing_created(operator, token_for):
    api = token_for(operator)
    deployment = make_deployment()
    make_run(deployment, status="running")
    answer = api.post(
        LIST, {"deployment": deployment.pk, "profile": make_profile().pk}, format="json"
    )
    assert answer.status_code == 409
    assert "one benchmark at a time" in answer.json()["detail"]
    assert BenchmarkRun.objects.count() == 1


@pytest.mark.parametrize(
    "body, field",
    [
        ({"deployment": 999999, "profile": "PROFILE"}, "deployment"),
        ({"deployment": "DEPLOYMENT", "profile": 999999}, "profile"),
        ({"deployment": "x", "profile": "PROFILE"}, "deployment"),
        ({"deployment": ["DEPLOYMENT"], "profile": "PROFILE"}, "deployment"),
        ({"profile": "PROFILE"}, "deployment"),
        ({"deployment": "DEPLOYMENT", "profile": "PROFILE", "lable": "typo"}, "lable"),
        ({"deployment": "DEPLOYMENT", "profile": "PROFILE", "label": "x" * 101}, "label"),
    ],
)
def test_a_bad_body_is_a_400_naming_the_field(operator, token_for, body, field):
    deployment, profile = make_deployment(), make_profile()
    names = {"DEPLOYMENT": deployment.pk, "PROFILE": profile.pk}

    def fill(value):
        if isinstance(value, list):
            return [fill(v) for v in value]
        return names.get(value, value) if isinstance(value, str) else value

    answer = token_for(operator).post(LIST, {k: fill(v) for k, v in body.items()}, format="json")
    assert answer.status_code == 400
    assert field in answer.json()["errors"]
    assert not BenchmarkRun.objects.exists()


def test_a_non_object_body_is_a_400(operator, token_for):
    api = token_for(operator)
    for raw in ("[1, 2]", "null", "{", '"run"'):
        answer = api.generic("POST", LIST, raw, content_type="application/json")
        assert answer.status_code == 400, raw
    assert not BenchmarkRun.objects.exists()


def test_a_session_post_needs_the_csrf_token(operator):
    deployment, profile = make_deployment(), make_profile()
    browser = APIClient(enforce_csrf_checks=True)
    browser.force_login(operator)
    body = {"deployment": deployment.pk, "profile": profile.pk}
    refused = browser.post(LIST, body, format="json")
    assert refused.status_code == 403 and "CSRF" in refused.json()["detail"]
    assert not BenchmarkRun.objects.exists()
    browser.get("/api/tokens/")  # any page sets the CSRF cookie
    token = browser.cookies["csrftoken"].value
    assert browser.post(LIST, body, format="json", HTTP_X_CSRFTOKEN=token).status_code == 201


# --- one run -------------------------------------------------------------------------------------
def test_a_finished_runs_results_carry_the_export_names(viewer, token_for):
    run = make_finished_run(
        summary={"p95_ttft_ms": 300.0, "completed": 600, "failed": 0},
        notes=["warm engine"],
        stopped_early="",
    )
    body = token_for(viewer).get(detail_url(run)).json()
    results = body["results"]
    assert results["p95_ttft_ms"] == 300.0 and results["p95_itl_ms"] == 20.0
    assert results["completed"] == 600 and results["failed"] == 0
    assert results["error_rate"] == 0.0 and results["output_throughput"] == 1280.0
    assert results["model_id"] == run.model_name
    assert "timeline" not in results and "panel" not in results
    assert body["finished"] is True and body["progress"] == 0.0 and body["notes"] == ["warm engine"]
    assert body["links"] == {
        "page": f"/benchmarks/{run.pk}/",
        "timeline": f"/api/v1/runs/{run.pk}/timeline/",
        "export_json": f"/benchmarks/{run.pk}/export.json",
        "export_csv": f"/benchmarks/{run.pk}/requests.csv",
    }
    assert token_for(viewer, "x").get("/api/v1/runs/999999/").status_code == 404


def test_cancel_a_queued_run_and_a_finished_one_is_409(operator, token_for):
    api = token_for(operator)
    queued = make_run()
    answer = api.post(f"{detail_url(queued)}cancel/")
    assert answer.status_code == 200 and answer.json()["status"] == "cancelled"
    again = api.post(f"{detail_url(queued)}cancel/")
    assert again.status_code == 409 and "nothing to cancel" in again.json()["detail"]
    running = make_run(status="running", started_at=timezone.now())
    answer = api.post(f"{detail_url(running)}cancel/")
    assert answer.status_code == 200 and answer.json()["cancel_requested"] is True


def test_the_timeline_pages_points_after_since(viewer, token_for):
    api = token_for(viewer)
    run = make_run(status="running", started_at=timezone.now(), progress=0.5)
    for t in (1.0, 2.0, 3.0):
        RunPoint.objects.create(run=run, t=t, data={"t": t, "completed": int(t)})
    body = api.get(f"{detail_url(run)}timeline/", {"since": "1"}).json()
    assert [p["t"] for p in body["points"]] == [2.0, 3.0]
    assert body["status"] == "running" and body["progress"] == 0.5 and body["more"] is False
    assert len(api.get(f"{detail_url(run)}timeline/").json()["points"]) == 3
    for bad in ("x", "nan", "inf"):
        assert api.get(f"{detail_url(run)}timeline/", {"since": bad}).status_code == 400


# --- the verdict ---------------------------------------------------------------------------------
def pair(**after):
    deployment, profile = make_deployment(), make_profile("chat")
    baseline = make_finished_run(deployment, load_profile=profile)
    run = make_finished_run(deployment, load_profile=profile, **after)
    return baseline, run


def verdict_of(api, run, **query):
    return api.get(f"{detail_url(run)}verdict/", query)


@pytest.mark.parametrize(
    "after, query, outcome",
    [
        ({"ttft_p95_ms": 310.0}, {"ttft_p95": "0.10"}, "verified"),
        ({"ttft_p95_ms": 360.0}, {"ttft_p95": "0.10"}, "regressed"),
        ({"ttft_p95_ms": 360.0}, {"ttft_p95": "0.25"}, "verified"),
        ({"error_rate": 0.02}, {"error_rate": "0.005"}, "regressed"),
        ({"completed": 10}, {}, "inconclusive"),  # too few requests for a p95
    ],
)
def test_the_verdict_is_the_change_verification_rule(viewer, token_for, after, query, outcome):
    baseline, run = pair(**after)
    answer = verdict_of(token_for(viewer), run, baseline=baseline.pk, **query)
    assert answer.status_code == 200, answer.json()
    body = answer.json()
    assert body["outcome"] == outcome, body
    assert (body["run"], body["baseline"]) == (run.pk, baseline.pk)
    assert [c["metric"] for c in body["checks"]] == ["error_rate", "ttft_p95_ms", "itl_p95_ms"]
    assert {row["key"] for row in body["conditions"]} >= {"profile", "cache_state", "requests"}
    same = verification.judge_runs(
        baseline,
        run,
        Thresholds(
            **{
                {"ttft_p95": "ttft_p95_regression", "error_rate": "error_rate_increase"}[k]: float(
                    v
                )
                for k, v in query.items()
            }
        ),
    )
    assert body["outcome"] == same["outcome"] and body["reason"] == same["reason"]
    if outcome == "inconclusive":
        assert body["text"].startswith("inconclusive") and "within limits" not in body["text"]


def test_runs_of_another_profile_version_are_inconclusive(viewer, token_for):
    baseline, run = pair()
    run.load_profile = make_profile("chat")  # v2
    run.save()
    body = verdict_of(token_for(viewer), run, baseline=baseline.pk).json()
    assert body["outcome"] == "inconclusive" and "not the same load" in body["reason"]


@pytest.mark.parametrize(
    "query, field",
    [
        ({}, "baseline"),
        ({"baseline": "x"}, "baseline"),
        ({"baseline": "999999"}, "baseline"),
        ({"ttft_p95": "0"}, "ttft_p95"),
        ({"ttft_p95": "-0.5"}, "ttft_p95"),
        ({"itl_p95": "11"}, "itl_p95"),
        ({"itl_p95": "nan"}, "itl_p95"),
        ({"error_rate": "inf"}, "error_rate"),
        ({"error_rate": "half"}, "error_rate"),
    ],
)
def test_bad_verdict_parameters_are_a_400(viewer, token_for, query, field):
    baseline, run = pair()
    query = {"baseline": baseline.pk, **query} if "baseline" not in query and query else query
    answer = verdict_of(token_for(viewer), run, **query)
    assert answer.status_code == 400
    assert field in answer.json()["errors"]


def test_no_verdict_on_an_unfinished_run(viewer, token_for):
    baseline, _ = pair()
    running = make_run(baseline.deployment, status="running", load_profile=baseline.load_profile)
    answer = verdict_of(token_for(viewer), running, baseline=baseline.pk)
    assert answer.status_code == 409 and "no verdict yet" in answer.json()["detail"]
