"""DEBUG=true error pages (issue 14, item 8): no webhook URL, Redis password or other secret."""

from __future__ import annotations

import sys

import pytest
from django.test import RequestFactory
from django.views.debug import technical_500_response

WEBHOOK = "https://hooks.slack.com/services/T0PANEL/B0PANEL/webhookSecretPath123"
REDIS = "redis://:redisPassw0rd-xyz@redis.internal:6379/0"
SECRETS = {
    "webhook": "webhookSecretPath123",
    "redis": "redisPassw0rd-xyz",
    "database": "dbPassw0rd-xyz",
    "mail": "mailPassw0rd-xyz",
    "encryption": "encKey0123456789abcdef",
    "form": "typed-in-Passw0rd",
}


@pytest.fixture
def production_like(settings):
    settings.DEBUG = True
    settings.CHANGE_WEBHOOK_URL = WEBHOOK
    settings.REDIS_URL = REDIS
    settings.CELERY_BROKER_URL = REDIS
    settings.CHANNEL_LAYERS = {
        "default": {
            "BACKEND": "channels_redis.core.RedisChannelLayer",
            "CONFIG": {"hosts": [REDIS]},
        }
    }
    settings.DATABASE_URL_SEEN = "postgres://panel:dbPassw0rd-xyz@db:5432/panel"
    settings.EMAIL_HOST_PASSWORD = SECRETS["mail"]
    settings.PANEL_ENCRYPTION_KEYS = [SECRETS["encryption"]]


def error_page(request) -> str:
    # Locals that carry secrets under harmless names, as a failing worker call would.
    url = WEBHOOK  # noqa: F841 - shown by the debug page's frame variables
    target = {"broker": REDIS}  # noqa: F841
    try:
        raise RuntimeError(f"the webhook did not answer: POST {url}")
    except RuntimeError:
        return technical_500_response(request, *sys.exc_info()).content.decode()


def test_debug_page_hides_webhook_redis_and_other_secrets(production_like):
    request = RequestFactory().post(
        "/accounts/login/",
        {"username": "otto", "password": SECRETS["form"]},
        HTTP_X_FORWARDED_FOR="10.0.0.1",
    )
    request.sensitive_post_parameters = ["password"]  # what Django's LoginView marks
    request.META["REDIS_URL"] = REDIS  # runserver copies the environment into META
    page = error_page(request)
    assert "the webhook did not answer" in page  # it is still a debug page
    for name, secret in SECRETS.items():
        assert secret not in page, name
    assert "redis.internal:6379" in page  # what is not secret stays, for debugging
    assert "CHANGE_WEBHOOK_URL" in page


def test_the_filter_is_the_default_one():
    from django.conf import settings

    assert settings.DEFAULT_EXCEPTION_REPORTER_FILTER == (
        "controlpanel.redaction.SecretsExceptionReporterFilter"
    )
    assert settings.DEFAULT_EXCEPTION_REPORTER == "controlpanel.redaction.SecretsExceptionReporter"
