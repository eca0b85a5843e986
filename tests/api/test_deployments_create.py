"""``POST /api/v1/deployments/``: a new deployment through the same service as the host page's
form, refusals as problem details by field, the schema telling the truth about the answer."""

from __future__ import annotations

import json

import pytest
from drf_spectacular.generators import SchemaGenerator
from drf_spectacular.renderers import OpenApiJsonRenderer
from openapi_core import OpenAPI
from rest_framework.test import APIClient

from controlpanel.models import AuditEntry
from hosts.models import Deployment, EngineOperation
from tests.api.test_schema import validate
from tests.factories import make_deployment, make_gpu, make_host

pytestmark = pytest.mark.django_db
URL = "/api/v1/deployments/"


@pytest.fixture
def host():
    host = make_host(name="api-host", address="10.0.0.7", agent_tls=True)
    make_gpu(host, index=0)
    make_gpu(host, index=1)
    return host


def body(host, **kw) -> dict:
    values = {
        "host": host.pk,
        "name": "llama",
        "engine": "vllm",
        "engine_version": "0.11.0",
        "model": "meta-llama/Llama-3.1-8B-Instruct",
        "gpus": [0],
        "settings": {"max_num_seqs": 64},
    }
    values.update(kw)
    return values


def test_operator_creates_a_deployment(token_for, operator, host):
    answer = token_for(operator, "deployer").post(URL, body(host), format="json")
    assert answer.status_code == 201, answer.content
    data = answer.json()
    deployment = Deployment.objects.get(pk=data["id"])
    assert data["port"] == 8000  # omitted: the engine's default, free on this machine
    assert data["fit"]["fits"] is True and data["fit"]["kv_tokens"] > 0
    assert data["status"] == "starting" and data["gpus"][0]["index"] == 0
    assert deployment.configs.get().settings == {"max_num_seqs": 64}
    assert EngineOperation.objects.get(deployment=deployment).kind == "apply"
    entry = AuditEntry.objects.get(action="deployment.create")
    assert entry.actor == operator and entry.via == "token deployer"


def test_code_loading_options_need_an_admin_as_in_a_change(token_for, operator, admin, host):
    # The rule a change meets (hosts.services.code_loading): 403 for an Operator, nothing made.
    loads_code = body(host, settings={"trust_remote_code": True})
    refused = token_for(operator, "deployer").post(URL, loads_code, format="json")
    assert refused.status_code == 403, refused.content
    assert "--trust-remote-code" in refused.json()["detail"]
    assert "only an Admin" in refused.json()["detail"]
    assert not Deployment.objects.filter(name="llama").exists()
    made = token_for(admin, "admin-deployer").post(URL, loads_code, format="json")
    assert made.status_code == 201, made.content
    deployment = Deployment.objects.get(pk=made.json()["id"])
    assert deployment.configs.get().settings["trust_remote_code"] is True


def test_refusals_are_problem_details_by_field(token_for, operator, host):
    other = make_deployment(host, name="busy", port=8100)
    other.gpus.set([host.gpus.get(index=1)])
    answer = token_for(operator).post(
        URL,
        body(host, gpus=[1], port=8100, engine_version="latest", settings={"nope": 1}),
        format="json",
    )
    assert answer.status_code == 400
    assert answer["Content-Type"] == "application/problem+json"
    errors = answer.json()["errors"]
    assert errors["gpus"] == ["GPU 1 is used by busy."]
    assert "taken" in errors["port"][0]
    assert "engine_version" in errors and "settings" in errors
    assert not Deployment.objects.filter(name="llama").exists()


@pytest.mark.parametrize("name", ["Llama", "x; rm -rf /", "-lead", "a" * 64])
def test_a_name_that_cannot_be_a_unit_name_is_refused(token_for, operator, host, name):
    answer = token_for(operator).post(URL, body(host, name=name), format="json")
    assert answer.status_code == 400 and "name" in answer.json()["errors"]
    assert not Deployment.objects.exists()


def test_weights_that_do_not_fit_are_a_400(token_for, operator, host):
    answer = token_for(operator).post(
        URL, body(host, model="meta-llama/Llama-3.1-70B-Instruct"), format="json"
    )
    assert answer.status_code == 400
    assert "do not fit" in answer.json()["errors"]["gpus"][0]


def test_unknown_fields_and_bad_shapes_are_refused(token_for, operator, host):
    api = token_for(operator)
    answer = api.post(URL, {**body(host), "runner": "engine"}, format="json")
    assert answer.status_code == 400 and "runner" in answer.json()["errors"]
    answer = api.post(URL, body(host, gpus="0"), format="json")
    assert answer.status_code == 400 and "gpus" in answer.json()["errors"]


@pytest.mark.parametrize(
    "role, expected",
    [("viewer", 403), ("nobody", 403), ("operator", 201), ("approver", 201), ("admin", 201)],
)
def test_creating_needs_the_pages_permission(request, token_for, host, role, expected):
    answer = token_for(request.getfixturevalue(role)).post(URL, body(host), format="json")
    assert answer.status_code == expected, answer.content
    assert Deployment.objects.filter(name="llama").exists() == (expected == 201)


def test_anonymous_is_401(host):
    assert APIClient().post(URL, body(host), format="json").status_code == 401


def test_the_answer_is_what_the_schema_says(token_for, operator, host, django_db_blocker):
    schema = SchemaGenerator().get_schema(request=None, public=True)
    spec = OpenAPI.from_dict(json.loads(OpenApiJsonRenderer().render(schema)))
    answer = token_for(operator).post(URL, body(host), format="json")
    assert answer.status_code == 201
    validate(spec, "post", URL, answer)


def test_a_first_start_on_a_production_host_waits_for_two_approvals_not_the_creators(
    token_for, operator, approver, admin, host
):
    """Issue 38 item 3: a new deployment on a production-labelled host was started at once,
    with no review, while any change to it needed two approvals."""
    host.labels = {"env": "production"}
    host.save()
    as_operator, as_approver, as_admin = token_for(operator), token_for(approver), token_for(admin)
    created = as_operator.post(URL, body(host), format="json")
    assert created.status_code == 201, created.content
    data = created.json()
    assert (data["status"], data["required_approvals"]) == ("in_review", 2)
    assert data["status_detail"] == "0 of 2 approvals: api-host is a production host"
    deployment = Deployment.objects.get(pk=data["id"])
    assert deployment.created_by == operator
    assert not EngineOperation.objects.filter(deployment=deployment).exists()  # nothing sent

    review = f"{URL}{deployment.pk}/review/"
    own = as_operator.post(review, {"decision": "approve"}, format="json")
    assert own.status_code == 403 and "Approvers and Admins" in own.json()["detail"]
    first = as_approver.post(review, {"decision": "approve", "comment": "ok"}, format="json")
    assert first.status_code == 200, first.content
    assert (first.json()["status"], first.json()["status_detail"]) == (
        "in_review",
        "1 of 2 approvals",
    )
    again = as_approver.post(review, {"decision": "approve"}, format="json")
    assert again.status_code == 409 and "already reviewed" in again.json()["detail"]
    assert not EngineOperation.objects.filter(deployment=deployment).exists()
    second = as_admin.post(review, {"decision": "approve"}, format="json")
    assert second.status_code == 200 and second.json()["status"] == "starting"
    operation = EngineOperation.objects.get(deployment=deployment)
    assert operation.kind == "apply" and operation.note == "first start"
    assert operation.config == deployment.configs.get()
    assert AuditEntry.objects.filter(action="deployment.approve").count() == 2
    late = as_admin.post(review, {"decision": "reject"}, format="json")
    assert late.status_code == 409 and "not awaiting approval" in late.json()["detail"]


def test_a_creator_who_is_an_approver_still_needs_others(token_for, approver, host):
    host.labels = {"env": "production"}
    host.save()
    as_approver = token_for(approver)
    created = as_approver.post(URL, body(host), format="json").json()
    own = as_approver.post(f"{URL}{created['id']}/review/", {"decision": "approve"}, format="json")
    assert own.status_code == 403
    assert "You created this deployment: someone else must approve" in own.json()["detail"]


def test_a_rejected_first_start_never_runs(token_for, operator, approver, host):
    host.labels = {"env": "production"}
    host.save()
    created = token_for(operator).post(URL, body(host), format="json").json()
    rejected = token_for(approver).post(
        f"{URL}{created['id']}/review/",
        {"decision": "reject", "comment": "not during the sale"},
        format="json",
    )
    assert rejected.status_code == 200
    assert rejected.json()["status"] == "stopped"
    assert "first start rejected by" in rejected.json()["status_detail"]
    assert "not during the sale" in rejected.json()["status_detail"]
    assert not EngineOperation.objects.filter(deployment_id=created["id"]).exists()


def test_the_host_page_offers_the_review_to_approvers(client, operator, approver, host):
    host.labels = {"env": "production"}
    host.save()
    client.force_login(operator)
    made = client.post(
        f"/hosts/{host.pk}/deployments/new/",
        {
            "name": "llama",
            "engine": "vllm",
            "engine_version": "0.11.0",
            "model": "meta-llama/Llama-3.1-8B-Instruct",
            "gpus": [0],
            "port": 8000,
            "launch_style": "process",
            "flags": "--max-num-seqs 64",
        },
        follow=True,
    )
    assert "its first start waits for 2 approvals" in made.content.decode(), made.content[:3000]
    deployment = Deployment.objects.get(name="llama")
    assert 'data-testid="review-llama"' not in made.content.decode()  # not an Operator's
    client.force_login(approver)
    page = client.get(f"/hosts/{host.pk}/").content.decode()
    assert 'data-testid="review-llama"' in page and "Awaiting approval" in page
    client.post(f"/hosts/deployments/{deployment.pk}/review/", {"decision": "approve"})
    deployment.refresh_from_db()
    assert deployment.status_detail == "1 of 2 approvals"
