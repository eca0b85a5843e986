"""API tokens: made once, stored hashed, revocable, expiring, throttled, audited."""

from __future__ import annotations

from datetime import timedelta
from io import StringIO

import pytest
from django.core.management import CommandError, call_command
from django.utils import timezone

from api.models import TOKEN_PREFIX, ApiToken, digest
from controlpanel.models import AuditEntry
from tests.api.conftest import bearer

pytestmark = [pytest.mark.django_db, pytest.mark.sqlite]


def test_a_token_is_stored_hashed_and_acts_as_its_user(viewer, token_for):
    client = token_for(viewer, "ci")
    token = ApiToken.objects.get(user=viewer, name="ci")
    assert client.raw_token.startswith(TOKEN_PREFIX)
    assert token.key_digest == digest(client.raw_token)
    assert client.raw_token not in {token.key_digest, token.shown}
    assert token.last_used_at is None
    answer = client.get("/api/v1/me/")
    assert answer.status_code == 200
    assert answer.json() == {
        "username": viewer.username,
        "roles": ["Viewer"],
        "via": "token ci",
        "token_expires_at": None,
    }
    token.refresh_from_db()
    assert token.last_used_at is not None


@pytest.mark.parametrize(
    "header",
    ["", "Bearer", "Bearer llmp_nope", "Bearer " + "x" * 50, "Token abc", "Basic dXNlcjpwdw=="],
)
def test_no_or_a_bad_token_is_401_problem_details(client, header, db):
    from rest_framework.test import APIClient

    api = APIClient()
    if header:
        api.credentials(HTTP_AUTHORIZATION=header)
    answer = api.get("/api/v1/me/")
    assert answer.status_code == 401
    assert answer["Content-Type"] == "application/problem+json"
    body = answer.json()
    assert body["status"] == 401 and body["title"] == "Not authenticated"
    assert body["type"].endswith("/not-authenticated") and body["detail"]
    assert answer["WWW-Authenticate"].startswith("Bearer")


def test_revoked_and_expired_tokens_authenticate_nothing(operator, token_for):
    revoked = token_for(operator, "old")
    expired = token_for(operator, "short", expires_days=1)
    from api import tokens

    tokens.revoke(operator, ApiToken.objects.get(name="old"))
    ApiToken.objects.filter(name="short").update(expires_at=timezone.now() - timedelta(seconds=1))
    assert revoked.get("/api/v1/me/").status_code == 401
    assert expired.get("/api/v1/me/").status_code == 401
    assert AuditEntry.objects.filter(action="api_token.revoke", actor=operator).count() == 1


def test_an_inactive_users_token_is_refused(operator, token_for):
    client = token_for(operator)
    operator.is_active = False
    operator.save()
    assert client.get("/api/v1/me/").status_code == 401


def test_bad_tokens_from_one_address_are_throttled(viewer, token_for, settings):
    settings.API_TOKEN_FAILURE_LIMIT = 3
    good = token_for(viewer)
    for _ in range(3):
        assert bearer("llmp_guess").get("/api/v1/me/").status_code == 401
    throttled = bearer("llmp_guess").get("/api/v1/me/")
    assert throttled.status_code == 429
    assert throttled.json()["title"] == "Too many requests"
    assert int(throttled["Retry-After"]) > 0
    # The flood stops the bad tokens from that address until the window ends, not the good
    # ones of the other clients behind the same address (a NAT, a shared proxy).
    assert good.get("/api/v1/me/").status_code == 200
    assert bearer("llmp_other_guess").get("/api/v1/me/").status_code == 429


def test_names_are_unique_per_user_and_expiry_bounded(operator, viewer):
    from api import tokens

    tokens.issue(operator, "ci", None, actor=operator)
    with pytest.raises(tokens.TokenRefused, match="already has a token named"):
        tokens.issue(operator, "ci", None, actor=operator)
    tokens.issue(viewer, "ci", None, actor=viewer)  # another user's "ci" is theirs
    for days in (0, -1, 100000):
        with pytest.raises(tokens.TokenRefused, match="Expiry"):
            tokens.issue(operator, f"x{days}", days, actor=operator)
    with pytest.raises(tokens.TokenRefused, match="name"):
        tokens.issue(operator, "  ", None, actor=operator)


def test_command_prints_the_token_once(operator):
    out = StringIO()
    call_command(
        "create_api_token",
        operator.username,
        "--name",
        "nightly",
        "--expires-days",
        "30",
        stdout=out,
    )
    raw = out.getvalue().strip()
    token = ApiToken.objects.get(name="nightly")
    assert token.key_digest == digest(raw) and token.user == operator
    assert timedelta(days=29) < token.expires_at - timezone.now() <= timedelta(days=30)
    entry = AuditEntry.objects.get(action="api_token.create")
    assert entry.actor is None and raw not in str(entry.after)
    assert bearer(raw).get("/api/v1/me/").json()["roles"] == ["Operator"]
    with pytest.raises(CommandError, match="No user"):
        call_command("create_api_token", "ghost", "--name", "x")
    with pytest.raises(CommandError, match="already has"):
        call_command("create_api_token", operator.username, "--name", "nightly")


def test_tokens_page_shows_a_new_token_once_and_revokes(client, operator):
    client.force_login(operator)
    page = client.post("/api/tokens/", {"name": "laptop", "expires_days": ""})
    assert page.status_code == 200
    raw = page.context["created"]["raw"]
    assert raw in page.content.decode()
    listing = client.get("/api/tokens/").content.decode()
    assert "laptop" in listing and raw not in listing
    token = ApiToken.objects.get(name="laptop")
    assert client.post(f"/api/tokens/{token.pk}/revoke/").status_code == 302
    token.refresh_from_db()
    assert token.state == "revoked"


def test_a_user_cannot_revoke_someone_elses_token(client, operator, viewer):
    from api import tokens

    token, _ = tokens.issue(viewer, "mine", None, actor=viewer)
    client.force_login(operator)
    assert client.post(f"/api/tokens/{token.pk}/revoke/").status_code == 404
    token.refresh_from_db()
    assert token.state == "active"


def test_session_auth_works_and_needs_csrf_for_writes(client, viewer):
    client.force_login(viewer)
    assert client.get("/api/v1/me/").json()["via"] == "session"


def test_schema_needs_a_sign_in_and_docs_redirect_to_login(client, viewer, token_for):
    assert client.get("/api/v1/schema/").status_code == 401
    docs = client.get("/api/v1/docs/")
    assert docs.status_code == 302 and "/accounts/login/" in docs["Location"]
    schema = token_for(viewer).get(
        "/api/v1/schema/", HTTP_ACCEPT="application/vnd.oai.openapi+json"
    )
    assert schema.status_code == 200 and "/api/v1/me/" in schema.json()["paths"]
    client.force_login(viewer)
    page = client.get("/api/v1/docs/").content.decode()
    assert "swagger-ui" in page and "cdn" not in page.lower()


def test_strict_serializers_name_unknown_fields():
    from rest_framework import serializers

    from api.base import StrictSerializerMixin

    class Body(StrictSerializerMixin, serializers.Serializer):
        label = serializers.CharField()

    body = Body(data={"label": "x", "lable": "typo"})
    assert not body.is_valid()
    assert body.errors == {"lable": ["Unknown field."]}
    assert Body(data={"label": "x"}).is_valid()
