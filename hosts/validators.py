"""Validators of the fleet's fields (hosts.models): user names, host key fingerprints, addresses
and labels — nothing that could smuggle a command or a control character into a host's record.
"""

from __future__ import annotations

import ipaddress
import re

from django.core.exceptions import ValidationError

LABEL_KEY = re.compile(r"^[a-z0-9]([a-z0-9._/-]{0,61}[a-z0-9])?$")
HOSTNAME = re.compile(r"^(?=.{1,253}$)[A-Za-z0-9]([A-Za-z0-9-]{0,62})(\.[A-Za-z0-9-]{1,63})*$")
POSIX_USER = re.compile(r"^[a-z_][a-z0-9_-]{0,31}$")
FINGERPRINT = re.compile(r"^SHA256:[A-Za-z0-9+/]{43}$")


def validate_ssh_username(value: str) -> None:
    if value and not POSIX_USER.match(value):
        raise ValidationError(f"{value!r} is not a POSIX user name.")


def validate_fingerprint(value: str) -> None:
    if value and not FINGERPRINT.match(value):
        raise ValidationError("A host key fingerprint looks like SHA256:<43 base64 characters>.")


def validate_address(value: str) -> None:
    """A DNS name, an IPv4 address or an IPv6 address; nothing that could smuggle a command."""
    try:
        ipaddress.ip_address(value.strip("[]"))
        return
    except ValueError:
        pass
    if not HOSTNAME.match(value):
        raise ValidationError(f"{value!r} is not a host name or IP address.")


def validate_labels(value) -> None:
    if not isinstance(value, dict):
        raise ValidationError("Labels must be a mapping of key to value.")
    for key, item in value.items():
        if not isinstance(key, str) or not LABEL_KEY.match(key):
            raise ValidationError(
                f"Label key {key!r} must be lower-case letters, digits, '.', '_', '-' or '/'."
            )
        if not isinstance(item, str) or len(item) > 63:
            raise ValidationError(f"Label {key!r} must have a text value of at most 63 chars.")
        if any(ord(c) < 32 or ord(c) == 127 for c in item):
            # PostgreSQL's jsonb cannot store NUL, and no label needs a control character.
            raise ValidationError(f"Label {key!r} must not contain control characters.")
