"""Who may read the fleet endpoints: every role reads (like the pages: Viewer and up hold the
view permissions), a signed-in user without a role is refused, an anonymous caller is asked to
authenticate, and nobody can write to these read-only resources."""

from __future__ import annotations

from decimal import Decimal

import pytest
from rest_framework.test import APIClient

from benchmarks.models import Price
from controlpanel.services import audit
from tests.factories import make_config, make_deployment, make_gpu, make_host, make_profile

# The role matrix: its personas are made once for the module.
pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("shared_personas")]

ROLES = ["viewer", "operator", "approver", "admin"]
ENDPOINTS = [
    "hosts/",
    "hosts/{host}/",
    "deployments/",
    "deployments/{deployment}/",
    "deployments/{deployment}/configs/",
    "profiles/",
    "profiles/{profile}/",
    "prices/",
    "prices/{price}/",
    "audit/",
    "audit/{entry}/",
]
ENDPOINT_IDS = ("host", "deployment", "profile", "price", "entry")


@pytest.fixture
def ids(admin):
    host = make_host(name="perm-host")
    make_gpu(host)
    deployment = make_deployment(host, name="perm-engine")
    deployment.active_config = make_config(deployment)
    deployment.save()
    price = Price.objects.create(name="perm-type", hourly_price=Decimal("1"))
    entry = audit(admin, "host.update", host)
    return {
        "host": host.pk,
        "deployment": deployment.pk,
        "profile": make_profile("perm-profile").pk,
        "price": price.pk,
        "entry": entry.pk,
    }


def url(template: str, ids: dict) -> str:
    return "/api/v1/" + template.format(**ids)


@pytest.mark.parametrize("endpoint", ENDPOINTS)
@pytest.mark.parametrize("role", ROLES)
def test_every_role_reads(request, token_for, ids, role, endpoint):
    client = token_for(request.getfixturevalue(role))
    answer = client.get(url(endpoint, ids))
    assert answer.status_code == 200, answer.content


@pytest.mark.parametrize("endpoint", ENDPOINTS)
@pytest.mark.parametrize("role", ROLES)
def test_the_page_session_reads_too(request, ids, role, endpoint):
    """The pages' own scripts call the API with the session, under the same permissions."""
    client = APIClient()
    client.force_login(request.getfixturevalue(role))
    assert client.get(url(endpoint, ids)).status_code == 200


@pytest.mark.parametrize("endpoint", ENDPOINTS)
def test_no_role_is_403(nobody, token_for, ids, endpoint):
    answer = token_for(nobody).get(url(endpoint, ids))
    assert answer.status_code == 403
    assert answer["Content-Type"] == "application/problem+json"
    assert answer.json()["title"] == "Not allowed"


@pytest.mark.parametrize("endpoint", ENDPOINTS)
def test_no_role_is_403_even_for_unknown_ids(nobody, token_for, endpoint):
    """The refusal comes before the lookup: an id's existence is not revealed."""
    answer = token_for(nobody).get(url(endpoint, dict.fromkeys(ENDPOINT_IDS, 999999)))
    assert answer.status_code == 403


@pytest.mark.parametrize("endpoint", ENDPOINTS)
def test_anonymous_is_401(ids, endpoint):
    answer = APIClient().get(url(endpoint, ids))
    assert answer.status_code == 401
    assert answer["Content-Type"] == "application/problem+json"
    assert answer["WWW-Authenticate"].startswith("Bearer")


WRITES = [
    (method, endpoint)
    for method in ("post", "put", "patch", "delete")
    for endpoint in ENDPOINTS
    # A new load profile, below; a new deployment: tests/api/test_deployments_create.py.
    if (method, endpoint) not in {("post", "profiles/"), ("post", "deployments/")}
] + [("get", "profiles/{profile}/versions/"), ("delete", "profiles/{profile}/versions/")]


@pytest.mark.parametrize("method, endpoint", WRITES)
@pytest.mark.parametrize("role", ["viewer", "admin", "nobody"])
def test_read_only_resources_refuse_writes(request, token_for, ids, role, endpoint, method):
    """No such action: 405 for anyone signed in, and nothing changes."""
    client = token_for(request.getfixturevalue(role))
    answer = getattr(client, method)(url(endpoint, ids), {}, format="json")
    assert answer.status_code == 405, answer.content
    assert answer["Content-Type"] == "application/problem+json"


SPEC = {
    "stages": [{"name": "main", "concurrency": 4, "num_requests": 10}],
    "input_len": {"kind": "fixed", "mean": 128},
    "output_len": {"kind": "fixed", "mean": 32},
}


@pytest.mark.parametrize(
    "role, expected",
    [("viewer", 403), ("operator", 201), ("approver", 201), ("admin", 201), ("nobody", 403)],
)
@pytest.mark.parametrize("endpoint", ["profiles/", "profiles/{profile}/versions/"])
def test_saving_a_profile_needs_the_pages_permission(
    request, token_for, ids, role, expected, endpoint
):
    """benchmarks.add_loadprofile, like the profile editor: Operator and up."""
    client = token_for(request.getfixturevalue(role))
    body = {"spec": SPEC} if "versions" in endpoint else {"name": f"new-{role}", "spec": SPEC}
    answer = client.post(url(endpoint, ids), body, format="json")
    assert answer.status_code == expected, answer.content


@pytest.mark.parametrize("method", ["post", "delete"])
@pytest.mark.parametrize("endpoint", ["hosts/", "deployments/{deployment}/"])
def test_anonymous_writes_are_401(ids, endpoint, method):
    answer = getattr(APIClient(), method)(url(endpoint, ids), {}, format="json")
    assert answer.status_code == 401
