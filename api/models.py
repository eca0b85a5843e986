"""API tokens: how scripts and CI act as a user without a browser session."""

from __future__ import annotations

import hashlib
import secrets

from django.conf import settings
from django.db import models
from django.utils import timezone

# What a token looks like: a fixed prefix (so a leaked one is recognisable in a log or a
# secret scanner) and 32 random bytes. Only its SHA-256 is stored: a token has 256 bits of
# entropy, so a fast hash loses nothing and the lookup is one indexed equality.
TOKEN_PREFIX = "llmp_"  # noqa: S105 - a public marker, not a secret
# The characters of a token shown on the tokens page to tell them apart (prefix included).
SHOWN_CHARS = 12


def digest(raw: str) -> str:
    return hashlib.sha256(raw.encode()).hexdigest()


def new_raw_token() -> str:
    return TOKEN_PREFIX + secrets.token_urlsafe(32)


class ApiToken(models.Model):
    """A named bearer token of one user: it acts with that user's role and nothing more.

    The token itself is shown once, when it is made; the panel keeps its SHA-256. A revoked
    or expired token authenticates nothing; its row stays so the audit log's "via token NAME"
    keeps meaning something."""

    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="api_tokens"
    )
    name = models.CharField(max_length=100)
    key_digest = models.CharField(max_length=64, unique=True, editable=False)
    shown = models.CharField(
        max_length=SHOWN_CHARS, editable=False, help_text="Its first characters."
    )
    created_at = models.DateTimeField(default=timezone.now)
    expires_at = models.DateTimeField(null=True, blank=True)
    last_used_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-pk"]
        constraints = [
            models.UniqueConstraint(fields=["user", "name"], name="api_token_name_per_user")
        ]

    def __str__(self) -> str:
        return f"{self.name} ({self.user})"

    @property
    def is_expired(self) -> bool:
        return self.expires_at is not None and self.expires_at <= timezone.now()

    @property
    def is_active(self) -> bool:
        return self.revoked_at is None and not self.is_expired

    @property
    def state(self) -> str:
        if self.revoked_at is not None:
            return "revoked"
        return "expired" if self.is_expired else "active"
