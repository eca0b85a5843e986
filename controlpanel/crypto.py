"""Secrets at rest: agent tokens and SSH keys are stored encrypted (Fernet: AES-128-CBC with
an HMAC), never in plain text, so a database dump or backup does not hand out the fleet.

The key comes from ``PANEL_ENCRYPTION_KEY`` (or ``PANEL_ENCRYPTION_KEY_FILE``): one or more
Fernet keys separated by commas, the first encrypts, all decrypt (rotation: put the new key
first, re-save, drop the old one). Without it the key is derived from ``SECRET_KEY`` (HKDF),
which ties the stored secrets to that key: production should set its own (``check --deploy``
warns when it is missing).
"""

from __future__ import annotations

import base64
import functools

from cryptography.fernet import Fernet, InvalidToken, MultiFernet
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from django.conf import settings
from django.db import models

PREFIX = "enc:v1:"


class DecryptionError(Exception):
    """A stored secret cannot be read with the configured keys (wrong or rotated-out key)."""


@functools.cache
def _fernet(keys: tuple[str, ...], secret_key: str) -> MultiFernet:
    if keys:
        try:
            return MultiFernet([Fernet(k.encode()) for k in keys])
        except ValueError as exc:
            raise ValueError(
                f"PANEL_ENCRYPTION_KEY must be Fernet keys (urlsafe base64 of 32 bytes): {exc}"
            ) from None
    derived = HKDF(
        algorithm=hashes.SHA256(), length=32, salt=b"llm-control-panel", info=b"secrets-at-rest"
    ).derive(secret_key.encode())
    return MultiFernet([Fernet(base64.urlsafe_b64encode(derived))])


def fernet() -> MultiFernet:
    return _fernet(tuple(settings.PANEL_ENCRYPTION_KEYS), settings.SECRET_KEY)


def encrypt(plain: str) -> str:
    return PREFIX + fernet().encrypt(plain.encode()).decode()


def decrypt(stored: str) -> str:
    if not stored.startswith(PREFIX):
        raise DecryptionError("the stored value is not an encrypted secret")
    try:
        return fernet().decrypt(stored[len(PREFIX) :].encode()).decode()
    except InvalidToken:
        raise DecryptionError(
            "a stored secret cannot be decrypted: PANEL_ENCRYPTION_KEY (or SECRET_KEY) changed"
        ) from None


class EncryptedTextField(models.TextField):
    """A text column holding ``enc:v1:<fernet token>``; Python code sees the plain text.

    Empty stays empty (no secret set). A value that cannot be decrypted reads as
    ``DecryptionError`` raised at access time rather than at load, so one bad row does not
    break every page that lists hosts.
    """

    description = "Text encrypted at rest"

    def get_prep_value(self, value):
        if isinstance(value, UnreadableSecret):
            return value.stored  # saving the row again must not lose what could not be read
        value = super().get_prep_value(value)
        if value in (None, ""):
            return value
        return encrypt(value)

    def from_db_value(self, value, expression, connection):
        if value in (None, ""):
            return value
        try:
            return decrypt(value)
        except DecryptionError:
            return UnreadableSecret(value)

    def value_to_string(self, obj):
        return ""  # never serialised out (dumpdata, admin history)


class UnreadableSecret(str):
    """What a secret reads as when the keys cannot decrypt it: it is set (truthy) but empty,
    keeps the stored ciphertext for re-saving, and ``reveal()`` refuses to hand it out."""

    def __new__(cls, stored: str):
        obj = super().__new__(cls, "")
        obj.stored = stored
        return obj

    def __bool__(self) -> bool:
        return True


def reveal(secret: str) -> str:
    """The plain secret for use as a credential; DecryptionError when it cannot be read."""
    if isinstance(secret, UnreadableSecret):
        raise DecryptionError(
            "a stored secret cannot be decrypted: PANEL_ENCRYPTION_KEY (or SECRET_KEY) changed"
        )
    return secret
