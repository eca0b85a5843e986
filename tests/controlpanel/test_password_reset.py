"""Password reset (issue 14, item 5): only when mail goes out through a mail server; a reset
link never reaches the log."""

from __future__ import annotations

import io
import logging
import re

import pytest
from django.core import mail

from controlpanel.logfilters import RedactSecrets

pytestmark = pytest.mark.django_db

RESET_PAGES = [
    "/accounts/password_reset/",
    "/accounts/password_reset/done/",
    "/accounts/reset/MQ/set-password/",
    "/accounts/reset/MQ/abc-0123456789abcdef/",
    "/accounts/reset/done/",
]


@pytest.fixture
def no_mail_server(settings):
    """The embedded default: no EMAIL_HOST, mail printed by the console backend."""
    settings.EMAIL_HOST = ""
    settings.EMAIL_BACKEND = "django.core.mail.backends.console.EmailBackend"


@pytest.fixture
def mail_server(settings):
    settings.EMAIL_HOST = "smtp.example.com"
    # What leaves through SMTP in production; kept in memory here.
    settings.EMAIL_BACKEND = "django.core.mail.backends.locmem.EmailBackend"


@pytest.mark.parametrize("path", RESET_PAGES)
def test_reset_pages_are_not_found_without_a_mail_server(client, no_mail_server, path):
    response = client.get(path)
    assert response.status_code == 404
    assert "Ask an Admin to set a new password" in response.text


def test_asking_for_a_reset_without_a_mail_server_sends_and_prints_nothing(
    client, operator, no_mail_server, capsys
):
    operator.email = "otto@example.com"
    operator.save()
    response = client.post("/accounts/password_reset/", {"email": "otto@example.com"})
    assert response.status_code == 404
    out = capsys.readouterr()
    assert "/reset/" not in out.out + out.err
    assert mail.outbox == []


def test_login_page_hides_the_reset_link_without_a_mail_server(client, no_mail_server):
    response = client.get("/accounts/login/")
    assert response.status_code == 200
    assert "/accounts/password_reset/" not in response.text


def test_login_page_offers_the_reset_link_with_a_mail_server(client, mail_server):
    assert "/accounts/password_reset/" in client.get("/accounts/login/").text


def test_reset_works_end_to_end_with_a_mail_server(client, operator, mail_server):
    operator.email = "otto@example.com"
    operator.save()
    response = client.post("/accounts/password_reset/", {"email": "otto@example.com"})
    assert response.status_code == 302
    (message,) = mail.outbox
    link = re.search(r"/accounts/reset/[^/\s]+/[^/\s]+/", message.body).group(0)
    response = client.get(link, follow=True)
    assert response.status_code == 200 and "Set a new password" in response.text
    response = client.post(
        response.redirect_chain[-1][0],
        {"new_password1": "a-long-new-passphrase", "new_password2": "a-long-new-passphrase"},
    )
    assert response.status_code == 302
    operator.refresh_from_db()
    assert operator.check_password("a-long-new-passphrase")


def test_a_reset_link_printed_by_an_earlier_configuration_is_refused(client, operator, settings):
    settings.EMAIL_HOST = "smtp.example.com"
    settings.EMAIL_BACKEND = "django.core.mail.backends.locmem.EmailBackend"
    operator.email = "otto@example.com"
    operator.save()
    client.post("/accounts/password_reset/", {"email": "otto@example.com"})
    link = re.search(r"/accounts/reset/[^/\s]+/[^/\s]+/", mail.outbox[0].body).group(0)
    settings.EMAIL_HOST = ""
    settings.EMAIL_BACKEND = "django.core.mail.backends.console.EmailBackend"
    assert client.get(link).status_code == 404


def test_reset_tokens_and_url_passwords_never_reach_the_log():
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.addFilter(RedactSecrets())
    log = logging.getLogger("tests.redaction")
    log.addHandler(handler)
    log.propagate = False
    try:
        log.warning(
            '%s - "GET %s HTTP/1.1" 302', "10.0.0.1", "/accounts/reset/MQ/cz7k-1f2e3d4c5b6a/"
        )
        log.warning("broker at redis://:hunter2-secret@redis:6379/0 is down")
        log.warning("GET /accounts/reset/MQ/set-password/")
        try:
            raise ConnectionError("redis://:hunter2-secret@redis:6379/0 refused")
        except ConnectionError:
            log.exception("could not publish")
    finally:
        log.removeHandler(handler)
    text = stream.getvalue()
    assert "cz7k-1f2e3d4c5b6a" not in text and "/accounts/reset/MQ/" in text
    assert "hunter2-secret" not in text and "redis://:" in text
    assert "ConnectionError" in text  # the traceback is kept, without the password
    assert "/accounts/reset/MQ/set-password/" in text  # no token in it: kept for debugging


def test_the_console_log_handler_redacts():
    from django.conf import settings

    assert "redact" in settings.LOGGING["handlers"]["console"]["filters"]
    assert settings.LOGGING["loggers"]["uvicorn.access"]["handlers"] == ["console"]
