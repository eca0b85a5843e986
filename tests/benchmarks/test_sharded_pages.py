"""Where a sharded run is asked for and shown (issue 22): the New run form and the runs API
accept 1 to 16 load generators and say why not otherwise; the run page lists each shard's
worker, counts, clock offset, send lateness and status; the export carries the same."""

from __future__ import annotations

import pytest
from django.urls import reverse

from benchmarks.forms.runs import RunForm
from benchmarks.models import BenchmarkRun, RunShard
from tests.api.conftest import token_for  # noqa: F401 - shared fixture
from tests.factories import make_deployment, make_finished_run, make_profile

pytestmark = pytest.mark.django_db

RATE = {"stages": [{"name": "a", "request_rate": 50, "num_requests": 100}]}
CLOSED = {"stages": [{"name": "users", "concurrency": 8, "num_requests": 100}]}


def form(profile, shards, deployment=None):
    data = {"deployment": (deployment or make_deployment()).pk, "load_profile": profile.pk}
    if shards is not None:
        data["shards"] = shards
    return RunForm(data, extra_profile=profile)


@pytest.mark.parametrize(
    ("shards", "embedded", "spec", "error"),
    [
        (0, False, RATE, "greater than or equal to 1"),
        (17, False, RATE, "less than or equal to 16"),
        ("two", False, RATE, "Enter a whole number"),
        (2, True, RATE, "needs Celery workers on the loadgen queue"),
        (2, False, CLOSED, "Stage(s) users run a fixed number of users"),
    ],
)
def test_the_form_refuses_what_cannot_be_sharded(settings, shards, embedded, spec, error):
    settings.EMBEDDED = embedded
    bound = form(make_profile(spec=spec), shards)
    assert not bound.is_valid()
    assert error in " ".join(bound.errors["shards"]), bound.errors


@pytest.mark.parametrize(("shards", "expected"), [(None, 1), ("", 1), (1, 1), (16, 16)])
def test_the_form_takes_1_to_16(settings, shards, expected):
    settings.EMBEDDED = False
    bound = form(make_profile(spec=RATE), shards)
    assert bound.is_valid(), bound.errors
    assert bound.cleaned_data["shards"] == expected


def test_the_page_starts_a_sharded_run(client, operator, settings):
    settings.EMBEDDED = False
    deployment, profile = make_deployment(), make_profile(spec=RATE)
    client.force_login(operator)
    response = client.post(
        reverse("benchmarks:new"),
        {"deployment": deployment.pk, "load_profile": profile.pk, "shards": 4},
    )
    run = BenchmarkRun.objects.get()
    assert response.status_code == 302 and run.shards == 4


LIST = "/api/v1/runs/"


def test_the_api_takes_shards_and_says_why_not(operator, token_for, settings):  # noqa: F811
    api = token_for(operator)
    deployment, profile = make_deployment(), make_profile(spec=RATE)
    body = {"deployment": deployment.pk, "profile": profile.pk}
    for bad in (0, 17, "x"):
        answer = api.post(LIST, {**body, "shards": bad}, format="json")
        assert answer.status_code == 400 and "shards" in answer.json()["errors"], answer.json()
    settings.EMBEDDED = True
    answer = api.post(LIST, {**body, "shards": 2}, format="json")
    assert answer.status_code == 409 and "embedded" in answer.json()["detail"]
    assert not BenchmarkRun.objects.exists()
    settings.EMBEDDED = False
    answer = api.post(LIST, {**body, "shards": 2}, format="json")
    assert answer.status_code == 201, answer.json()
    assert answer.json()["shards"] == 2 and BenchmarkRun.objects.get().shards == 2


def sharded_run():
    run = make_finished_run(shards=2)
    RunShard.objects.create(
        run=run,
        number=0,
        status="done",
        hostname="loadgen1@a",
        pid=41,
        sent=300,
        done=299,
        failed=1,
        offset_ms=0.42,
        offset_uncertainty_ms=0.05,
        late_p99_ms=3.24,
    )
    RunShard.objects.create(
        run=run,
        number=1,
        status="done",
        hostname="loadgen2@b",
        pid=42,
        sent=300,
        done=300,
        offset_ms=-1.5,
        offset_uncertainty_ms=0.1,
        late_p99_ms=75.0,
        behind=True,
    )
    return run


def rows(page: str) -> list[str]:
    return [page.split(f'data-testid="run-shard-{n}"')[1].split("</tr>")[0] for n in (0, 1)]


def test_the_run_page_shows_each_shard(client, viewer):
    run = sharded_run()
    client.force_login(viewer)
    page = client.get(run.get_absolute_url()).content.decode()
    first, second = rows(page)
    assert "loadgen1@a" in first and "pid 41" in first
    assert ">300<" in first and ">299<" in first and ">1<" in first
    assert "0.42 ± 0.05" in first and "3.2" in first and ">ok<" in first
    assert "loadgen2@b" in second and "-1.50 ± 0.10" in second and "75.0" in second
    assert ">behind<" in second
    # The part htmx re-fetches on a status change is the same table.
    part = client.get(reverse("benchmarks:part", args=[run.pk, "shards"])).content.decode()
    assert "loadgen2@b" in part


def test_a_failed_shard_shows_its_reason_and_a_one_process_run_no_table(client, viewer):
    run = sharded_run()
    RunShard.objects.filter(run=run, number=1).update(
        status="failed", error="no word from it for 30 s: its worker is gone"
    )
    client.force_login(viewer)
    second = rows(client.get(run.get_absolute_url()).content.decode())[1]
    assert ">failed<" in second and "its worker is gone" in second
    single = make_finished_run()
    assert 'data-testid="run-shards"' not in client.get(single.get_absolute_url()).content.decode()


def test_the_export_and_the_api_carry_the_shard_health(client, viewer, token_for):  # noqa: F811
    run = sharded_run()
    client.force_login(viewer)
    panel = client.get(reverse("benchmarks:export_json", args=[run.pk])).json()["panel"]
    assert panel["shards"] == 2
    assert [(s["shard"], s["hostname"], s["sent"], s["behind"]) for s in panel["shard_health"]] == [
        (0, "loadgen1@a", 300, False),
        (1, "loadgen2@b", 300, True),
    ]
    assert panel["shard_health"][0]["offset_ms"] == 0.42
    body = token_for(viewer).get(f"{LIST}{run.pk}/").json()
    assert body["shards"] == 2 and body["shard_health"][1]["late_p99_ms"] == 75.0
