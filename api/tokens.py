"""Making, using and revoking API tokens (``api.models.ApiToken``)."""

from __future__ import annotations

from datetime import timedelta

from django.db import IntegrityError, transaction
from django.utils import timezone

from api.models import SHOWN_CHARS, TOKEN_PREFIX, ApiToken, digest, new_raw_token
from controlpanel.services import audit

# last_used_at is written at most this often per token: a CI job polling every second must
# not turn every API read into a database write.
LAST_USED_RESOLUTION = timedelta(seconds=60)
MAX_EXPIRY_DAYS = 3650


class TokenRefused(Exception):
    """A token that cannot be made as asked (name taken, bad expiry)."""


def issue(user, name: str, expires_days: int | None, *, actor) -> tuple[ApiToken, str]:
    """A new token for ``user``: (its row, the token itself — shown once, never stored).
    ``actor`` None is the command line (the system), audited as such."""
    name = (name or "").strip()
    if not name:
        raise TokenRefused("A token needs a name.")
    if len(name) > 100:
        raise TokenRefused("A token's name has at most 100 characters.")
    if expires_days is not None and not 1 <= expires_days <= MAX_EXPIRY_DAYS:
        raise TokenRefused(f"Expiry must be between 1 and {MAX_EXPIRY_DAYS} days.")
    raw = new_raw_token()
    expires_at = timezone.now() + timedelta(days=expires_days) if expires_days else None
    try:
        with transaction.atomic():
            token = ApiToken.objects.create(
                user=user,
                name=name,
                key_digest=digest(raw),
                shown=raw[:SHOWN_CHARS],
                expires_at=expires_at,
            )
    except IntegrityError:
        raise TokenRefused(f"{user} already has a token named {name!r}.") from None
    audit(
        actor,
        "api_token.create",
        token,
        after={"name": name, "user": user.get_username(), "expires_at": expires_at},
    )
    return token, raw


def revoke(actor, token: ApiToken) -> ApiToken:
    if token.revoked_at is None:
        token.revoked_at = timezone.now()
        token.save(update_fields=["revoked_at"])
        audit(actor, "api_token.revoke", token, after={"name": token.name})
    return token


def resolve(raw: str) -> ApiToken | None:
    """The active token ``raw`` is, or None (unknown, revoked, expired, inactive user)."""
    if not raw.startswith(TOKEN_PREFIX) or len(raw) > 200:
        return None
    token = ApiToken.objects.select_related("user").filter(key_digest=digest(raw)).first()
    if token is None or not token.is_active or not token.user.is_active:
        return None
    now = timezone.now()
    if token.last_used_at is None or now - token.last_used_at >= LAST_USED_RESOLUTION:
        ApiToken.objects.filter(pk=token.pk).update(last_used_at=now)
        token.last_used_at = now
    return token
