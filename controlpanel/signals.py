"""Receivers for login events: failed logins and lockouts go to the audit log, and a logout
closes the live sockets the session had open. Connected in ``ControlPanelConfig.ready``.
"""

from __future__ import annotations

from axes.signals import user_locked_out
from django.conf import settings
from django.contrib.auth.signals import user_logged_out, user_login_failed
from django.dispatch import receiver

from controlpanel import realtime
from controlpanel.services import audit

USERNAME_CHARS = 150


def _username(value) -> str:
    # What was typed, as typed, but never a NUL (PostgreSQL's JSON refuses it) nor a novel.
    return str(value or "").replace("\x00", "")[:USERNAME_CHARS]


def _failures(request) -> int | None:
    # Set by axes' own receiver, which runs first ("axes" comes before "controlpanel" in
    # INSTALLED_APPS); None when axes did not count the attempt (a whitelisted client).
    return getattr(request, "axes_failures_since_start", None)


@receiver(user_login_failed, dispatch_uid="controlpanel.audit_login_failed")
def audit_login_failed(sender, credentials, request=None, **kwargs):
    """Each failed login up to the lockout; the attempts refused while locked are not repeated
    here one by one (axes counts them, and each one extends the lockout)."""
    if request is None:
        return  # not a login through a page: nobody to throttle or trace
    failures = _failures(request)
    if failures is not None and failures > settings.AXES_FAILURE_LIMIT:
        return
    audit(
        None,
        "login.failed",
        after={"username": _username(credentials.get("username"))},
        remote_addr=getattr(request, "axes_ip_address", None),
    )


@receiver(user_locked_out, dispatch_uid="controlpanel.audit_locked_out")
def audit_locked_out(sender, request, username=None, ip_address=None, **kwargs):
    """The failure that locked an account or an address, once per lockout."""
    if _failures(request) != settings.AXES_FAILURE_LIMIT:
        return
    audit(
        None,
        "login.locked_out",
        after={
            "username": _username(username),
            "minutes": round(settings.AXES_COOLOFF_TIME.total_seconds() / 60),
        },
        remote_addr=ip_address,
    )


@receiver(user_logged_out, dispatch_uid="controlpanel.close_session_sockets")
def close_session_sockets(sender, request=None, **kwargs):
    """Every live socket opened with this session stops streaming when it logs out."""
    session = getattr(request, "session", None)
    key = getattr(session, "session_key", None)
    if key:
        realtime.publish(realtime.session_group(key), "session.ended", {})
