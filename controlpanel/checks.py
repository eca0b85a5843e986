"""System checks of the panel's own settings (``manage.py check --deploy``)."""

from django.conf import settings
from django.core.checks import Tags, Warning, register


@register(Tags.security, deploy=True)
def encryption_key_check(app_configs, **kwargs):
    if settings.EMBEDDED or settings.PANEL_ENCRYPTION_KEYS:
        return []
    return [
        Warning(
            "PANEL_ENCRYPTION_KEY is not set: agent tokens and SSH keys are encrypted with a "
            "key derived from SECRET_KEY, so rotating SECRET_KEY makes them unreadable.",
            hint="Set PANEL_ENCRYPTION_KEY (or _FILE) to a Fernet key: python -c 'from "
            "cryptography.fernet import Fernet; print(Fernet.generate_key().decode())'",
            id="controlpanel.W001",
        )
    ]
