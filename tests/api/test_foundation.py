"""What every endpoint of the API shares: bodies read safely, OPTIONS for readers, one error
shape."""

from __future__ import annotations

import pytest

from tests.factories import make_deployment, make_profile

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize(
    ("body", "words"),
    [
        ("[" * 100_000, "nest"),
        ('{"deployment": 1, "profile": 1, "label": "a\\u0000b"}', "NUL"),
        ('{"deployment": NaN}', "NaN"),
        ('{"deployment": 1,', "not valid JSON"),
        (b"\xff\xfe", "UTF-8"),
    ],
)
def test_a_body_the_panel_cannot_store_is_a_400_never_a_500(operator, token_for, body, words):
    api = token_for(operator)
    answer = api.generic("POST", "/api/v1/runs/", body, content_type="application/json")
    assert answer.status_code == 400, answer.content[:200]
    problem = answer.json()
    assert problem["status"] == 400 and words.lower() in problem["detail"].lower()


def test_options_answers_whoever_may_read(viewer, nobody, token_for):
    reader = token_for(viewer)
    assert reader.options("/api/v1/runs/").status_code == 200
    assert reader.options("/api/v1/hosts/").status_code == 200
    assert token_for(nobody, "n").options("/api/v1/runs/").status_code == 403


def test_a_nonexistent_route_under_the_api_is_a_404(viewer, token_for):
    assert token_for(viewer).get("/api/v1/nothing-here/").status_code == 404


def test_problem_details_for_a_refused_write(viewer, token_for):
    deployment = make_deployment()
    profile = make_profile("p")
    answer = token_for(viewer).post(
        "/api/v1/runs/", {"deployment": deployment.pk, "profile": profile.pk}, format="json"
    )
    assert answer.status_code == 403
    assert answer["Content-Type"] == "application/problem+json"
    assert answer.json() == {
        "type": "/api/v1/problems/forbidden",
        "title": "Not allowed",
        "status": 403,
        "detail": "Your role does not allow this.",
        "errors": {},
    }


@pytest.mark.parametrize(
    "url",
    [
        "/api/v1/runs/abc/",
        "/api/v1/runs/1.5/",
        "/api/v1/runs/99999999999999999999999/",
        "/api/v1/runs/abc/verdict/?baseline=x",
        "/api/v1/runs/1/verdict/?baseline=99999999999999999999999",
        "/api/v1/runs/?deployment=99999999999999999999999",
        "/api/v1/runs/?page=abc",
        "/api/v1/runs/?page_size=-1",
        "/api/v1/hosts/abc/",
        "/api/v1/hosts/?page=999",
        "/api/v1/deployments/abc/configs/",
        "/api/v1/changes/abc/",
        "/api/v1/changes/99999999999999999999999/approve/",
        "/api/v1/audit/abc/",
        "/api/v1/profiles/x/",
        "/api/v1/prices/-1/",
    ],
)
def test_malformed_ids_and_pages_are_4xx_never_500(admin, token_for, url):
    api = token_for(admin)
    answer = api.post(url, {}, format="json") if url.endswith("approve/") else api.get(url)
    assert 400 <= answer.status_code < 500, (url, answer.status_code)
    assert answer["Content-Type"] == "application/problem+json"
