"""``Authorization: Bearer <token>`` for the API, with failed guesses throttled per address."""

from __future__ import annotations

from django.conf import settings
from django.core.cache import cache
from rest_framework import authentication, exceptions

from api import tokens

KEYWORD = "Bearer"


def client_address(request) -> str:
    """The address a request came from, as the panel's other throttles see it."""
    return request.META.get("REMOTE_ADDR") or "unknown"


def _failures_key(address: str) -> str:
    return f"api-token-failures:{address}"


class BearerTokenAuthentication(authentication.BaseAuthentication):
    """A user's API token (``api.models.ApiToken``). ``request.auth`` is the token's row.

    An address that sent ``API_TOKEN_FAILURE_LIMIT`` unknown, revoked or expired tokens within
    ``API_TOKEN_FAILURE_WINDOW`` seconds gets 429 for its bad tokens for the rest of the window:
    a token has 256 random bits, so this only slows a flood, not a lucky guess. A good token
    from that address still works: many clients share one address behind a NAT or a proxy
    (Prometheus scrapers, CI runners), and one of them guessing must not lock out the rest
    (issue 38)."""

    def authenticate(self, request):
        header = authentication.get_authorization_header(request).decode("latin-1")
        scheme, _, raw = header.partition(" ")
        if scheme.lower() != KEYWORD.lower():
            return None  # no token: another authenticator (the session) may answer
        raw = raw.strip()
        address = client_address(request)
        key = _failures_key(address)
        window = settings.API_TOKEN_FAILURE_WINDOW
        token = tokens.resolve(raw) if raw else None
        if token is None and (cache.get(key) or 0) >= settings.API_TOKEN_FAILURE_LIMIT:
            raise exceptions.Throttled(
                wait=window, detail="Too many bad API tokens from this address."
            )
        if token is None:
            if cache.add(key, 1, timeout=window) is False:
                try:
                    cache.incr(key)
                except ValueError:  # expired between add and incr
                    cache.add(key, 1, timeout=window)
            raise exceptions.AuthenticationFailed("Unknown, revoked or expired API token.")
        return token.user, token

    def authenticate_header(self, request):
        return f'{KEYWORD} realm="api"'
