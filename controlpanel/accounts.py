"""Logging in: throttling (django-axes) and password reset only where mail really leaves.

Throttling counts failed logins two ways and locks out on whichever comes first: an *account*
after ``AXES_FAILURE_LIMIT`` failures from any address (someone guessing one password), and an
*address* after ``LOGIN_ADDRESS_FAILURE_LIMIT`` failures for any accounts (someone trying one
password on many accounts). Both last ``AXES_COOLOFF_TIME`` after the last failure; an Admin
can lift them earlier (admin: Access attempts, or ``manage.py axes_reset``).

Password reset mails a link that logs in as the user: it is offered only when the panel sends
mail through a mail server (``EMAIL_HOST``). Without one, Django would hand the mail to the
console backend, which prints the link where anyone reading the log could use it.
"""

from __future__ import annotations

from axes.backends import AxesStandaloneBackend
from axes.handlers.database import AxesDatabaseHandler
from django.conf import settings
from django.contrib.auth import views as auth_views
from django.contrib.auth.decorators import login_not_required
from django.db.models import Sum
from django.shortcuts import render
from django.views.decorators.cache import never_cache

# Backends that keep the mail on this machine (printed, written to a file, dropped): a reset
# link sent through them reaches whoever reads the log or the file, or nobody.
LOCAL_MAIL_BACKENDS = {
    "django.core.mail.backends.console.EmailBackend",
    "django.core.mail.backends.filebased.EmailBackend",
    "django.core.mail.backends.dummy.EmailBackend",
}


class LoginThrottleBackend(AxesStandaloneBackend):
    """Refuses a login from a locked-out account or address before its password is checked.

    Logins through a page (the panel's, the admin's) always carry the request. A call without
    one comes from code on the server (a management command, a test's ``client.login``), where
    there is no address to count and nobody to throttle: it is left to the next backend.
    """

    def authenticate(self, request, username=None, password=None, **kwargs):
        if request is None:
            return None
        return super().authenticate(request, username=username, password=password, **kwargs)


class LoginThrottleHandler(AxesDatabaseHandler):
    """axes' database handler with a limit of its own for each lockout parameter.

    axes compares one number, ``get_failures()``, with one limit, ``AXES_FAILURE_LIMIT`` (the
    account limit). To lock an address at a different limit this returns the failures of
    whichever parameter is closest to its own limit, shifted onto the account limit's scale:
    ``AXES_FAILURE_LIMIT - (own limit - failures)``. It reaches ``AXES_FAILURE_LIMIT`` exactly
    when the first parameter reaches its own limit, and goes above it for each refused attempt.
    """

    def get_failures(self, request, credentials=None) -> int:
        limits = parameter_limits()
        account_limit = limits["username"]
        worst = 0
        for parameter, attempts in zip(
            settings.AXES_LOCKOUT_PARAMETERS,
            self.get_user_attempts(request, credentials),
            strict=True,
        ):
            failures = attempts.aggregate(n=Sum("failures_since_start"))["n"] or 0
            if failures:
                # A combined parameter (["username", "ip_address"]) counts against the account's.
                own_limit = (
                    limits.get(parameter, account_limit)
                    if isinstance(parameter, str)
                    else account_limit
                )
                worst = max(worst, account_limit - (own_limit - failures))
        return worst


def parameter_limits() -> dict[str, int]:
    """The failure limit of each lockout parameter."""
    return {
        "username": settings.AXES_FAILURE_LIMIT,
        "ip_address": settings.LOGIN_ADDRESS_FAILURE_LIMIT,
    }


def password_reset_available() -> bool:
    """Whether a reset link would reach only the user: mail goes out through a mail server."""
    return bool(settings.EMAIL_HOST) and settings.EMAIL_BACKEND not in LOCAL_MAIL_BACKENDS


def _needs_mail(view):
    """The reset page ``view`` when mail goes out; otherwise a 404 that says to ask an Admin.

    Checked at each request, so a panel started without EMAIL_HOST never shows, sends or
    accepts a reset link (a link printed by an earlier configuration is refused too).
    """

    @login_not_required
    @never_cache
    def wrapper(request, *args, **kwargs):
        if not password_reset_available():
            return render(request, "registration/password_reset_unavailable.html", status=404)
        return view(request, *args, **kwargs)

    return wrapper


password_reset = _needs_mail(auth_views.PasswordResetView.as_view())
password_reset_done = _needs_mail(auth_views.PasswordResetDoneView.as_view())
password_reset_confirm = _needs_mail(auth_views.PasswordResetConfirmView.as_view())
password_reset_complete = _needs_mail(auth_views.PasswordResetCompleteView.as_view())


def lockout_response(request, original_response=None, credentials=None):
    """The page a locked-out login gets (AXES_LOCKOUT_CALLABLE): 429, and how long to wait."""
    minutes = max(1, round(settings.AXES_COOLOFF_TIME.total_seconds() / 60))
    return render(request, "registration/locked_out.html", {"minutes": minutes}, status=429)


class LoginView(auth_views.LoginView):
    """Django's login view; the page offers a reset link only when reset is available."""

    def get_context_data(self, **kwargs):
        context = super().get_context_data(**kwargs)
        context["password_reset_available"] = password_reset_available()
        return context
