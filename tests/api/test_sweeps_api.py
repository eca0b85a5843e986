"""The tuning sweeps API: make one through ``create_sweep`` (its prediction queued), read it as
its page shows it, and act on it with the page's buttons and rules (four eyes, a production
host's approvals, states), with tokens, every write audited "via token NAME"."""

from __future__ import annotations

import json
from unittest import mock

import pytest
from django.contrib.auth.models import Group
from drf_spectacular.generators import SchemaGenerator
from drf_spectacular.renderers import OpenApiJsonRenderer
from openapi_core import OpenAPI
from rest_framework.test import APIClient

from changes.models import ChangeRequest
from changes.models_sweeps import Sweep
from controlpanel.models import AuditEntry
from tests.api.sweep_samples import SLO, make_done_sweep
from tests.api.test_schema import validate
from tests.factories import make_config, make_deployment, make_gpu, make_host, make_profile

pytestmark = pytest.mark.django_db

LIST = "/api/v1/sweeps/"
RUNNING = {"max_num_seqs": 64, "gpu_memory_utilization": 0.9}


def url(sweep, verb: str = "") -> str:
    pk = sweep if isinstance(sweep, int) else sweep.pk
    return f"{LIST}{pk}/" + (f"{verb}/" if verb else "")


def serving(host, **kw):
    deployment = make_deployment(host, **kw)
    make_gpu(host, index=host.gpus.count())
    deployment.active_config = make_config(deployment, dict(RUNNING))
    deployment.save()
    return deployment


@pytest.fixture
def deployment(db):
    return serving(make_host(name="gpu-a"), name="chat")


@pytest.fixture
def production(db):
    return serving(make_host(name="gpu-prod", labels={"env": "production"}), name="prod")


@pytest.fixture
def profile(db):
    return make_profile("sweep-load")


@pytest.fixture
def approver2(db, django_user_model):
    user = django_user_model.objects.create_user(username="bea-approver", password="pw")
    user.groups.add(Group.objects.get(name="Approver"))
    return user


def body(deployment, profile, **kw) -> dict:
    data = {
        "deployment": deployment.pk,
        "title": "More throughput",
        "load_profile": profile.pk,
        "load_mode": "rate",
        "space": {"max_num_seqs": [32, 128]},
        "slo": dict(SLO),
        "max_trials": 3,
    }
    data.update(kw)
    return data


def create(client, deployment, profile, **kw):
    """POST a new sweep, the prediction task's queueing captured: (answer, task mock)."""
    with mock.patch("changes.tasks.predict_sweep.apply_async") as task:
        answer = client.post(LIST, body(deployment, profile, **kw), format="json")
    return answer, task


# --- making and reading ------------------------------------------------------------------------
def test_create_queues_the_prediction_and_reads_back(
    operator, deployment, profile, token_for, django_capture_on_commit_callbacks
):
    ops = token_for(operator, "ops-ci")
    with mock.patch("changes.tasks.predict_sweep.apply_async") as task:
        with django_capture_on_commit_callbacks(execute=True):
            answer = ops.post(LIST, body(deployment, profile), format="json")
    assert answer.status_code == 201, answer.json()
    sweep = Sweep.objects.get()
    assert answer["Location"] == url(sweep)
    (args,), _ = task.call_args
    assert args == (sweep.pk,)
    data = answer.json()
    assert data["state"] == "predicting" and data["created_by"] == operator.username
    assert data["deployment"] == {"id": deployment.pk, "name": "chat", "host_name": "gpu-a"}
    assert data["space"] == {"max_num_seqs": [32, 128]}
    assert data["slo"]["ttft_p95_ms"] == 500
    assert data["budget"] == {"max_trials": 3, "max_minutes": 60, "max_steps": 5, "deadline": None}
    assert data["load_profile"]["id"] == profile.pk
    assert data["base_config"] == {"id": deployment.active_config_id, "version": 1}
    assert data["prediction"] is None and data["required_approvals"] == 0
    assert [lane["deployment"]["id"] for lane in data["lanes"]] == [deployment.pk]
    assert data["trials"] == [] and data["progress"]["total"] == 0
    # The author may cancel; nothing else until the prediction is in.
    assert data["actions"] == ["cancel"]
    entry = AuditEntry.objects.get(action="sweep.create")
    assert entry.via == "token ops-ci"

    listed = ops.get(LIST).json()
    assert listed["count"] == 1 and listed["results"][0]["id"] == sweep.pk


def test_list_filters_by_deployment_and_state(viewer, operator, deployment, profile, token_for):
    other = serving(make_host(name="gpu-b"), name="other")
    done = make_done_sweep(deployment, operator, profile)
    _, _ = create(token_for(operator), other, profile)
    api = token_for(viewer)
    assert api.get(LIST).json()["count"] == 2
    found = api.get(LIST, {"deployment": deployment.pk}).json()["results"]
    assert [s["id"] for s in found] == [done.pk]
    found = api.get(LIST, {"state": "predicting"}).json()["results"]
    assert [s["deployment"]["id"] for s in found] == [other.pk]
    bad = api.get(LIST, {"state": "sleeping"})
    assert bad.status_code == 400 and set(bad.json()["errors"]) == {"state"}
    bad = api.get(LIST, {"colour": "red"})
    assert bad.status_code == 400 and set(bad.json()["errors"]) == {"colour"}


def test_detail_of_a_done_sweep(viewer, operator, deployment, profile, token_for):
    sweep = make_done_sweep(deployment, operator, profile)
    answer = token_for(viewer).get(url(sweep))
    assert answer.status_code == 200, answer.json()
    data = answer.json()
    assert data["state"] == "done" and data["winner_id"] == sweep.winner_id
    prediction = data["prediction"]
    assert prediction["counts"] == {"total": 3, "feasible": 2, "meeting": 2}
    assert prediction["elapsed_s"] == 1.5 and prediction["no_point_meets"] is False
    assert [p["rank"] for p in prediction["top"]] == [1, 2]
    assert prediction["top"][0]["point"] == {"max_num_seqs": 128}
    assert prediction["infeasible"][0]["count"] == 1
    control, winner = data["trials"]
    assert control["is_control"] and control["predicted_max_load"] is None
    assert winner["predicted_max_load"] == 12.0 and winner["max_load"] == 11.0
    assert winner["met_slo"] is True and winner["prediction_error"] == pytest.approx(-1 / 12)
    probe = winner["probes"][0]
    assert probe["run_url"] == f"/api/v1/runs/{probe['run_id']}/"
    assert winner["run_ids"] == [probe["run_id"]]
    assert data["progress"] == {"total": 2, "done": 2, "current": None, "eta_s": None}
    # A Viewer reads; the buttons are not theirs.
    assert data["actions"] == []
    assert token_for(operator).get(url(sweep)).json()["actions"] == ["propose"]


# --- refusals of a new sweep -----------------------------------------------------------------
def test_an_unknown_flag_in_the_space_is_named(operator, deployment, profile, token_for):
    answer, task = create(token_for(operator), deployment, profile, space={"no_such_flag": [1, 2]})
    assert answer.status_code == 400, answer.json()
    assert answer["Content-Type"] == "application/problem+json"
    assert "no_such_flag" in answer.json()["errors"]["space"][0]
    assert not Sweep.objects.exists() and not task.called


def test_a_sweep_needs_an_slo(operator, deployment, profile, token_for):
    answer, _ = create(token_for(operator), deployment, profile, slo={})
    assert answer.status_code == 400
    assert "latency limit" in answer.json()["errors"]["slo"][0]


def test_ranking_by_cost_needs_a_price(operator, profile, token_for):
    unpriced = serving(make_host(name="gpu-free", hourly_price=0), name="free")
    answer, _ = create(token_for(operator), unpriced, profile, objective="cost_per_million")
    assert answer.status_code == 400
    assert "hourly price" in answer.json()["errors"]["objective"][0]


def test_unknown_body_fields_and_bad_budget_are_refused(operator, deployment, profile, token_for):
    api = token_for(operator)
    answer, _ = create(api, deployment, profile, max_trials=99, colour="red")
    assert answer.status_code == 400 and set(answer.json()["errors"]) == {"colour"}
    answer, _ = create(api, deployment, profile, max_trials=99)
    assert answer.status_code == 400 and set(answer.json()["errors"]) == {"max_trials"}


# --- who may ---------------------------------------------------------------------------------
def test_anonymous_and_viewers(viewer, operator, deployment, profile, token_for):
    sweep = make_done_sweep(deployment, operator, profile)
    anonymous = APIClient()
    for answer in (anonymous.get(LIST), anonymous.get(url(sweep))):
        assert answer.status_code == 401
        assert answer.json()["type"].endswith("/not-authenticated")
    assert anonymous.post(url(sweep, "cancel"), format="json").status_code == 401
    api = token_for(viewer)
    assert api.get(LIST).status_code == 200
    answer, _ = create(api, deployment, profile)
    assert answer.status_code == 403 and not Sweep.objects.exclude(pk=sweep.pk).exists()
    for verb in ("cancel", "start", "approve", "propose-winner"):
        assert api.post(url(sweep, verb), format="json").status_code == 403, verb


def test_an_approver_never_approves_their_own_sweep(approver, production, profile, token_for):
    api = token_for(approver)
    answer, _ = create(api, production, profile)
    assert answer.status_code == 201, answer.json()
    sweep = Sweep.objects.get()
    Sweep.objects.filter(pk=sweep.pk).update(state="pending")
    answer = api.post(url(sweep, "approve"), {"comment": "mine"}, format="json")
    assert answer.status_code == 403
    assert "four-eyes" in answer.json()["detail"]
    assert not sweep.approvals.exists()


# --- the buttons -----------------------------------------------------------------------------
def test_cancel_before_the_trials(operator, deployment, profile, token_for):
    api = token_for(operator, "ops-ci")
    create(api, deployment, profile)
    sweep = Sweep.objects.get()
    answer = api.post(url(sweep, "cancel"), format="json")
    assert answer.status_code == 200, answer.json()
    data = answer.json()
    assert data["state"] == "cancelled" and "before its trials" in data["outcome"]
    assert data["lanes"][0]["state"] == "restored" and data["actions"] == []
    assert AuditEntry.objects.get(action="sweep.cancel").via == "token ops-ci"
    again = api.post(url(sweep, "cancel"), format="json")
    assert again.status_code == 409 and again["Content-Type"] == "application/problem+json"
    assert "nothing to cancel" in again.json()["detail"]


def test_a_production_sweep_needs_two_approvals(
    operator, approver, approver2, production, profile, token_for
):
    ops = token_for(operator)
    create(ops, production, profile)
    sweep = Sweep.objects.get()
    assert sweep.required_approvals == 2
    # What the prediction does when approvals are needed (its worker is not run here).
    Sweep.objects.filter(pk=sweep.pk).update(state="pending")
    anna = token_for(approver)
    first = anna.post(url(sweep, "approve"), {"comment": "ok"}, format="json")
    assert first.status_code == 200, first.json()
    assert first.json()["state"] == "pending" and first.json()["approvals_count"] == 1
    again = anna.post(url(sweep, "approve"), format="json")
    assert again.status_code == 409 and "already reviewed" in again.json()["detail"]
    second = token_for(approver2).post(url(sweep, "approve"), format="json")
    assert second.status_code == 200
    data = second.json()
    assert data["state"] == "ready" and data["approvals_count"] == 2
    assert [r["reviewer"] for r in data["reviews"]] == [approver.username, approver2.username]
    assert "start" in ops.get(url(sweep)).json()["actions"]


def test_reject_says_why(operator, approver, production, profile, token_for):
    create(token_for(operator, "ops"), production, profile)
    sweep = Sweep.objects.get()
    Sweep.objects.filter(pk=sweep.pk).update(state="pending")
    api = token_for(approver)
    assert api.post(url(sweep, "reject"), format="json").status_code == 400
    answer = api.post(url(sweep, "reject"), {"comment": "not at peak"}, format="json")
    assert answer.status_code == 200
    assert answer.json()["state"] == "rejected" and "not at peak" in answer.json()["outcome"]


def test_start_is_refused_until_ready(operator, deployment, profile, token_for):
    api = token_for(operator)
    create(api, deployment, profile)
    sweep = Sweep.objects.get()
    answer = api.post(url(sweep, "start"), format="json")
    assert answer.status_code == 409
    assert "only a sweep ready to run is started" in answer.json()["detail"]
    assert api.post(url(sweep, "start"), {"now": True}, format="json").status_code == 400


def test_start_a_ready_sweep_queues_its_lanes(
    operator, deployment, profile, token_for, django_capture_on_commit_callbacks
):
    api = token_for(operator)
    create(api, deployment, profile)
    sweep = Sweep.objects.get()
    Sweep.objects.filter(pk=sweep.pk).update(state="ready")
    with mock.patch("changes.tasks.run_sweep_lane.apply_async") as task:
        with django_capture_on_commit_callbacks(execute=True):
            answer = api.post(url(sweep, "start"), format="json")
    assert answer.status_code == 200, answer.json()
    assert answer.json()["state"] == "running" and answer.json()["lanes"][0]["state"] == "queued"
    (args,), _ = task.call_args
    assert args == (sweep.lanes.get().pk,)


def test_propose_the_winner(operator, deployment, profile, token_for):
    sweep = make_done_sweep(deployment, operator, profile)
    api = token_for(operator)
    answer = api.post(url(sweep, "propose-winner"), format="json")
    assert answer.status_code == 201, answer.json()
    data = answer.json()
    change = ChangeRequest.objects.get(pk=data["change_id"])
    assert change.sweep_id == sweep.pk and change.settings["max_num_seqs"] == 128
    assert data["url"] == answer["Location"] == f"/api/v1/changes/{change.pk}/"
    assert api.get(data["url"]).status_code == 200


def test_propose_is_refused_without_a_winner(operator, deployment, profile, token_for):
    api = token_for(operator)
    create(api, deployment, profile)
    answer = api.post(url(Sweep.objects.get(), "propose-winner"), format="json")
    assert answer.status_code == 409 and "no winner" in answer.json()["detail"]


def test_missing_sweeps_are_404(viewer, token_for):
    api = token_for(viewer)
    assert api.get(url(999)).status_code == 404
    assert api.get(f"{LIST}abc/").status_code == 404


# --- the schema --------------------------------------------------------------------------------
def test_the_schema_documents_the_sweeps(admin, operator, deployment, profile, token_for):
    schema = json.loads(
        OpenApiJsonRenderer().render(SchemaGenerator().get_schema(request=None, public=True))
    )
    paths = schema["paths"]
    assert set(paths[LIST]) >= {"get", "post"}
    assert "get" in paths["/api/v1/sweeps/{id}/"]
    for verb in ("approve", "reject", "start", "cancel", "propose-winner"):
        assert "post" in paths[f"/api/v1/sweeps/{{id}}/{verb}/"], verb
    # The answers are what the schema says (openapi-core), a done sweep's detail included.
    spec = OpenAPI.from_dict(schema)
    sweep = make_done_sweep(deployment, operator, profile)
    api = token_for(admin)
    for path in (LIST, url(sweep)):
        answer = api.get(path, HTTP_ACCEPT="application/json")
        assert answer.status_code == 200
        validate(spec, "get", path, answer)
    ops = token_for(operator)
    created, _ = create(ops, deployment, profile)
    validate(spec, "post", LIST, created)
    proposed = ops.post(url(sweep, "propose-winner"), format="json")
    validate(spec, "post", url(sweep, "propose-winner"), proposed)
