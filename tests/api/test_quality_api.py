"""The quality probe API: probe sets (list, detail with items, uploads refused line by line),
probe runs (start → 201 and queued, 409 while busy; list filters; detail with answers; cancel;
compare against a baseline, 400 across set versions) and who may do each."""

from __future__ import annotations

import json
from unittest import mock

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile

from benchmarks.models_quality import ProbeRun, ProbeSet
from tests.benchmarks.test_probe_pages import item, make_probe_run, make_probe_set
from tests.factories import make_deployment

# The role matrix: its personas are made once for the module.
pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("shared_personas")]

READ, START, CANCEL = "read", "start", "cancel"
ALLOWED = {
    "viewer": {READ},
    "operator": {READ, START, CANCEL},
    "approver": {READ, START, CANCEL},
    "admin": {READ, START, CANCEL},
    "nobody": set(),
}


@pytest.fixture
def world():
    deployment, probe_set = make_deployment(), make_probe_set()
    baseline = make_probe_run(deployment, probe_set)
    run = make_probe_run(deployment, probe_set, wrong={"ko-1"})
    queued = make_probe_run(make_deployment(), probe_set, status="queued")
    return {
        "deployment": deployment,
        "set": probe_set,
        "baseline": baseline,
        "run": run,
        "queued": queued,
    }


def _calls(world):
    run, baseline, queued = world["run"].pk, world["baseline"].pk, world["queued"].pk
    free = make_deployment()
    lines = json.dumps(item("x-1"))
    return [
        ("get", "/api/v1/quality-probes/", None, READ, 200),
        ("get", f"/api/v1/quality-probes/{run}/", None, READ, 200),
        ("get", f"/api/v1/quality-probes/{run}/compare/?baseline={baseline}", None, READ, 200),
        ("get", "/api/v1/probe-sets/", None, READ, 200),
        ("get", f"/api/v1/probe-sets/{world['set'].pk}/", None, READ, 200),
        (
            "post",
            "/api/v1/quality-probes/",
            {"deployment": free.pk, "probe_set": world["set"].pk},
            START,
            201,
        ),
        ("post", "/api/v1/probe-sets/", {"name": "up", "jsonl": lines}, START, 201),
        ("post", f"/api/v1/quality-probes/{queued}/cancel/", None, CANCEL, 200),
    ]


@pytest.mark.parametrize("role", sorted(ALLOWED))
def test_each_role_gets_what_the_pages_give_it(personas, token_for, world, role):
    api = token_for(personas[role])
    with mock.patch("benchmarks.tasks.run_probe.apply_async"):
        for method, path, body, kind, ok in _calls(world):
            answer = getattr(api, method)(path, body, format="json")
            expected = ok if kind in ALLOWED[role] else 403
            assert answer.status_code == expected, (role, method, path, answer.content[:300])
            if expected == 403:
                assert answer["Content-Type"].startswith("application/problem+json")


def test_without_a_token_everything_is_401(world):
    from rest_framework.test import APIClient

    for method, path, body, _, _ in _calls(world):
        answer = getattr(APIClient(), method)(path, body, format="json")
        assert answer.status_code == 401, path


def test_create_queues_the_task_and_answers_the_run(
    operator, token_for, world, django_capture_on_commit_callbacks
):
    api = token_for(operator)
    free = make_deployment()
    body = {
        "deployment": free.pk,
        "probe_set": world["set"].pk,
        "structured_output": True,
        "concurrency": 16,
        "label": "fp8",
    }
    with mock.patch("benchmarks.tasks.run_probe.apply_async") as apply_async:
        with django_capture_on_commit_callbacks(execute=True):
            answer = api.post("/api/v1/quality-probes/", body, format="json")
    assert answer.status_code == 201, answer.content
    data = answer.json()
    run = ProbeRun.objects.get(pk=data["id"])
    assert answer["Location"].endswith(f"/api/v1/quality-probes/{run.pk}/")
    assert data["status"] == "queued" and data["structured_output"] and data["concurrency"] == 16
    assert data["set_name"] == world["set"].name and data["total"] == world["set"].item_count
    assert data["results"] == {"count": 0, "offset": 0, "next_offset": None, "items": []}
    apply_async.assert_called_once()
    assert apply_async.call_args.args[0] == (run.pk,)


def test_create_on_a_busy_deployment_is_409(operator, token_for, world):
    api = token_for(operator)
    busy = world["queued"].deployment
    with mock.patch("benchmarks.tasks.run_probe.apply_async") as apply_async:
        answer = api.post(
            "/api/v1/quality-probes/",
            {"deployment": busy.pk, "probe_set": world["set"].pk},
            format="json",
        )
    assert answer.status_code == 409 and answer.json()["status"] == 409
    apply_async.assert_not_called()


@pytest.mark.parametrize(
    "body, field",
    [
        ({"deployment": 999999}, "deployment"),
        ({"probe_set": "x"}, "probe_set"),
        ({"concurrency": 0}, "concurrency"),
        ({"concurrency": 1000}, "concurrency"),
        ({"tempreature": 0}, "tempreature"),
    ],
)
def test_create_refuses_bad_bodies(operator, token_for, world, body, field):
    full = {"deployment": make_deployment().pk, "probe_set": world["set"].pk, **body}
    answer = token_for(operator).post("/api/v1/quality-probes/", full, format="json")
    assert answer.status_code == 400 and field in answer.json()["errors"]


def test_list_filters(viewer, token_for, world):
    api = token_for(viewer)
    everything = api.get("/api/v1/quality-probes/").json()
    assert everything["count"] == 3
    mine = api.get("/api/v1/quality-probes/", {"deployment": world["deployment"].pk}).json()
    assert {r["id"] for r in mine["results"]} == {world["run"].pk, world["baseline"].pk}
    queued = api.get("/api/v1/quality-probes/", {"status": "queued"}).json()
    assert [r["id"] for r in queued["results"]] == [world["queued"].pk]
    assert api.get("/api/v1/quality-probes/", {"set": world["set"].pk}).json()["count"] == 3
    assert api.get("/api/v1/quality-probes/", {"status": "done"}).status_code == 400
    assert api.get("/api/v1/quality-probes/", {"deployment": "x"}).status_code == 400
    assert api.get("/api/v1/quality-probes/", {"colour": "x"}).status_code == 400


def test_detail_has_summary_and_answers(viewer, token_for, world):
    api = token_for(viewer)
    data = api.get(f"/api/v1/quality-probes/{world['run'].pk}/").json()
    assert data["simulated"] is False and data["finished"] and data["progress"] == 1.0
    assert data["summary"]["ko"] == {"n": 20, "correct": 19, "accuracy": 0.95}
    assert data["results"]["count"] == 44 and len(data["results"]["items"]) == 44
    wrong = api.get(f"/api/v1/quality-probes/{world['run'].pk}/", {"wrong": "true"}).json()
    assert [r["item_id"] for r in wrong["results"]["items"]] == ["ko-1"]
    assert (
        api.get(f"/api/v1/quality-probes/{world['run'].pk}/?results_offset=-1").status_code == 400
    )
    assert api.get("/api/v1/quality-probes/999999/").status_code == 404


def test_cancel(operator, token_for, world):
    api = token_for(operator)
    answer = api.post(f"/api/v1/quality-probes/{world['queued'].pk}/cancel/")
    assert answer.status_code == 200 and answer.json()["status"] == "cancelled"
    again = api.post(f"/api/v1/quality-probes/{world['queued'].pk}/cancel/")
    assert again.status_code == 409


def test_compare(viewer, token_for, world):
    api = token_for(viewer)
    url = f"/api/v1/quality-probes/{world['run'].pk}/compare/"
    data = api.get(url, {"baseline": world["baseline"].pk, "max_loss": 0.05}).json()
    assert data["baseline"] == world["baseline"].pk and data["candidate"] == world["run"].pk
    assert data["max_loss"] == 0.05 and data["groups"][0]["key"] == "overall"
    assert [c["id"] for c in data["changed"]] == ["ko-1"]
    assert data["verdict"] in ("loss", "no loss", "no significant loss", "cannot tell")
    assert data["text"] == f"{data['verdict']}: {data['reason']}"
    assert api.get(url).status_code == 400  # baseline is required
    assert api.get(url, {"baseline": 999999}).status_code == 400
    assert api.get(url, {"baseline": world["baseline"].pk, "max_loss": 2}).status_code == 400


def test_compare_across_set_versions_is_400(viewer, token_for, world):
    newer = make_probe_set(world["set"].name)
    other = make_probe_run(world["deployment"], newer)
    answer = token_for(viewer).get(
        f"/api/v1/quality-probes/{other.pk}/compare/", {"baseline": world["baseline"].pk}
    )
    assert answer.status_code == 400
    assert "same set version" in answer.json()["errors"]["baseline"][0]


def test_probe_sets_list_without_items_detail_with(viewer, token_for, world):
    api = token_for(viewer)
    listed = api.get("/api/v1/probe-sets/").json()["results"]
    assert listed and "items" not in listed[0]
    one = api.get(f"/api/v1/probe-sets/{world['set'].pk}/").json()
    assert len(one["items"]) == world["set"].item_count
    assert one["coverage"] == {"factual/en": 20, "factual/ko": 20, "json/en": 4}


def test_upload_bad_lines_is_400_with_each_line(operator, token_for):
    lines = json.dumps(item("a")) + "\n{oops\n" + json.dumps({**item("b"), "language": 5})
    answer = token_for(operator).post(
        "/api/v1/probe-sets/", {"name": "mine", "jsonl": lines}, format="json"
    )
    assert answer.status_code == 400
    errors = answer.json()["errors"]["jsonl"]
    assert [e.split(":")[0] for e in errors] == ["line 2", "line 3"]
    assert not ProbeSet.objects.filter(name="mine").exists()


def test_upload_as_a_file_makes_the_next_version(operator, token_for):
    make_probe_set("mine", [item("a")])
    upload = SimpleUploadedFile("s.jsonl", json.dumps(item("b")).encode())
    answer = token_for(operator).post(
        "/api/v1/probe-sets/", {"name": "mine", "file": upload}, format="multipart"
    )
    assert answer.status_code == 201, answer.content
    assert answer.json()["version"] == 2 and answer.json()["items"][0]["id"] == "b"


def test_upload_needs_items(operator, token_for):
    answer = token_for(operator).post("/api/v1/probe-sets/", {"name": "x"}, format="json")
    assert answer.status_code == 400 and "jsonl" in answer.json()["errors"]
