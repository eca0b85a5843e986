"""Keeping secrets out of error pages and logs.

Django's debug page (``DEBUG=true``) and its error mails list every setting, the request's
META and each frame's local variables, hiding only names that look like passwords. The panel's
secrets also hide in URLs (``CHANGE_WEBHOOK_URL``'s path is the credential; ``REDIS_URL``,
``CELERY_BROKER_URL`` and ``CHANNEL_LAYERS`` carry the Redis password) and get copied into
variables with innocent names. So the filter hides more names, strips the password of any URL,
and masks the value of every hidden setting wherever else it turns up.
"""

from __future__ import annotations

import re
import threading
from contextlib import contextmanager

from django.conf import settings
from django.utils.regex_helper import _lazy_re_compile
from django.views.debug import ExceptionReporter, SafeExceptionReporterFilter

from controlpanel.logfilters import URL_PASSWORD, scrub

# Shorter values are not masked elsewhere in the text: too likely to match harmless words.
MIN_SECRET_CHARS = 8


class _Shown:
    """A frame variable already made safe: the debug page prints this text as its value."""

    def __init__(self, text: str):
        self.text = text

    def __repr__(self) -> str:
        return self.text


class SecretsExceptionReporterFilter(SafeExceptionReporterFilter):
    """DEFAULT_EXCEPTION_REPORTER_FILTER: hides secrets in settings, META and frame variables."""

    hidden_settings = _lazy_re_compile(
        "API|AUTH|TOKEN|KEY|SECRET|PASS|SIGNATURE|HTTP_COOKIE|CREDENTIAL|PRIVATE|WEBHOOK|DSN",
        flags=re.I,
    )

    # Settings whose values are masked wherever else they turn up (a frame variable, META).
    # Narrower than hidden_settings: AUTHENTICATION_BACKENDS' class paths are no secret.
    secret_settings = _lazy_re_compile(
        "SECRET|PASSWORD|TOKEN|WEBHOOK|ENCRYPTION|PRIVATE|CREDENTIAL|DSN|API_KEY", flags=re.I
    )
    not_secret_settings = frozenset({"PASSWORD_HASHERS", "AUTH_PASSWORD_VALIDATORS"})

    def secret_values(self) -> set[str]:
        """The values of every secret setting, and every URL password in settings."""
        found: set[str] = set()

        def collect(key, value, hidden):
            hidden = hidden or bool(self.secret_settings.search(str(key)))
            if isinstance(value, dict):
                for k, v in value.items():
                    collect(k, v, hidden)
            elif isinstance(value, list | tuple | set | frozenset):
                for v in value:
                    collect("", v, hidden)
            elif isinstance(value, str):
                text = str(value)  # a lazy string (axes' settings) becomes a real one
                if hidden:
                    found.add(text)
                for match in URL_PASSWORD.finditer(text):
                    found.add(match.group("pw"))

        for name in dir(settings):
            if name.isupper() and name not in self.not_secret_settings:
                try:
                    collect(name, getattr(settings, name, None), False)
                except Exception:  # noqa: BLE001, S112 - an odd setting must not break the page
                    continue
        return {value for value in found if len(value) >= MIN_SECRET_CHARS}

    def is_active(self, request):
        # Django skips sensitive_variables and sensitive_post_parameters (the login form's
        # password) when DEBUG is on; the panel's debug pages honour them too.
        return True

    def cleanse_setting(self, key, value):
        cleansed = super().cleanse_setting(key, value)
        if isinstance(cleansed, str) and cleansed != self.cleansed_substitute:
            text = str(cleansed)
            safe = scrub(text, self._secrets())
            return cleansed if safe == text else safe
        return cleansed

    def get_safe_settings(self):
        with self._secrets_known():
            return super().get_safe_settings()

    def get_safe_request_meta(self, request):
        with self._secrets_known():
            return super().get_safe_request_meta(request)

    def get_traceback_frame_variables(self, request, tb_frame):
        secrets = self.secret_values()
        shown = []
        for name, value in super().get_traceback_frame_variables(request, tb_frame):
            try:
                text = repr(value)
            except Exception:  # noqa: BLE001 - the page shows the reporter's own message
                shown.append((name, value))
                continue
            safe = scrub(text, secrets)
            shown.append((name, value if safe == text else _Shown(safe)))
        return shown

    # One filter instance serves every thread (Django caches it); the secrets found for one
    # pass over the settings or META are kept per thread for that pass.
    _local = threading.local()

    def _secrets(self) -> set[str]:
        known = getattr(self._local, "secrets", None)
        return known if known is not None else self.secret_values()

    @contextmanager
    def _secrets_known(self):
        self._local.secrets = self.secret_values()
        try:
            yield
        finally:
            self._local.secrets = None


class SecretsExceptionReporter(ExceptionReporter):
    """DEFAULT_EXCEPTION_REPORTER: the exception's own message is scrubbed too (an HTTP
    client's error names the webhook URL it could not reach)."""

    def get_traceback_data(self):
        data = super().get_traceback_data()
        secrets = self.filter.secret_values() if hasattr(self.filter, "secret_values") else set()
        for key in ("exception_value", "exception_notes", "request_insecure_uri"):
            if isinstance(data.get(key), str):
                data[key] = scrub(data[key], secrets)
        for frame in data.get("frames", []):
            if frame.get("exc_cause") is not None:
                frame["exc_cause"] = scrub(str(frame["exc_cause"]), secrets)
        return data
