"""Logging filters, and ``scrub``: the one rule for taking secrets out of text."""

import logging
import re

MASK = "********************"
# scheme://user:password@host -> scheme://user:****@host (also scheme://:password@host).
URL_PASSWORD = re.compile(r"(?P<head>[a-zA-Z][a-zA-Z0-9+.-]*://[^/\s:@]*:)(?P<pw>[^@\s/]+)@")
# A password reset link (/reset/<uid>/<token>/): the token logs its holder in. Django's own
# redirect to /reset/<uid>/set-password/ carries no token.
RESET_TOKEN = re.compile(r"(/reset/[^/\s]+/)(?!set-password/)[^/\s]+/")


def scrub(text: str, secrets=frozenset()) -> str:
    """``text`` without URL passwords, reset tokens or any of the strings in ``secrets``."""
    text = URL_PASSWORD.sub(lambda m: m.group("head") + MASK + "@", text)
    text = RESET_TOKEN.sub(r"\1" + MASK + "/", text)
    for secret in sorted(secrets, key=len, reverse=True):
        text = text.replace(secret, MASK)
    return text


class QuietFrequentTasks(logging.Filter):
    """Drops the INFO lines of the once-a-second polls (GPU telemetry, engine signals): sent,
    received, succeeded, sixty a minute each, would bury everything else. Their warnings and
    errors still pass."""

    NAMES = ("poll_telemetry", "poll-telemetry", "poll_engine_signals", "poll-engine-signals")

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno > logging.INFO:
            return True
        message = record.getMessage()
        return not any(name in message for name in self.NAMES)


class RedactSecrets(logging.Filter):
    """Takes URL passwords and password reset tokens out of every line before it is written.

    A reset link (``/accounts/reset/<uid>/<token>/``) logs its holder in, and uvicorn's access
    log records the path of each request; a URL with a password ends up in a log through an
    error message. The record is rewritten, never dropped.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except Exception:  # noqa: BLE001 - a bad format string is logging's to report
            return True
        safe = scrub(message)
        if safe != message:
            record.msg, record.args = safe, None
        if record.exc_info and not record.exc_text:
            # The formatter reuses exc_text: the traceback's messages are scrubbed once, here.
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = scrub(record.exc_text)
        return True
