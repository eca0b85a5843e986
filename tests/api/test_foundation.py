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
