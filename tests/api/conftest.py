"""Fixtures of the API tests: a token per persona and a client that sends it."""

from __future__ import annotations

import pytest
from django.core.cache import cache
from rest_framework.test import APIClient

from api import auth, tokens


@pytest.fixture(autouse=True)
def _no_failed_token_count():
    """Each test starts with no bad tokens counted against the test client's address."""
    cache.delete(auth._failures_key("127.0.0.1"))
    yield
    cache.delete(auth._failures_key("127.0.0.1"))


def bearer(raw: str) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {raw}")
    return client


@pytest.fixture
def token_for(db):
    """``token_for(user, name="ci")`` → an APIClient sending a new token of ``user``."""

    def make(user, name: str = "ci", expires_days: int | None = None) -> APIClient:
        _, raw = tokens.issue(user, name, expires_days, actor=user)
        client = bearer(raw)
        client.raw_token = raw
        return client

    return make
