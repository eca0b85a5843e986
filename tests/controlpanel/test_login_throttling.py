"""Login throttling (issue 14, item 6): django-axes locks an account after failures from any
address and an address after failures for any accounts; audited; an Admin can unlock."""

from __future__ import annotations

import asyncio
from datetime import timedelta

import pytest
from axes.models import AccessAttempt
from django.core.management import call_command
from django.utils import timezone

from controlpanel.models import AuditEntry

pytestmark = pytest.mark.django_db

LOGIN = "/accounts/login/"


@pytest.fixture(autouse=True)
def limits(settings):
    settings.AXES_FAILURE_LIMIT = 3
    settings.LOGIN_ADDRESS_FAILURE_LIMIT = 5
    settings.AXES_COOLOFF_TIME = timedelta(minutes=15)


def attempt(client, username, password="wrong-password", address="203.0.113.1", path=LOGIN):
    return client.post(path, {"username": username, "password": password}, REMOTE_ADDR=address)


def password(user) -> str:
    return "pw-" + user.username  # the persona fixtures' password


def logged_in(client) -> bool:
    return "_auth_user_id" in client.session


def actions(action):
    return list(AuditEntry.objects.filter(action=action).order_by("pk"))


def test_defaults_lock_accounts_and_addresses_with_a_cool_off():
    from django.conf import settings

    from controlpanel import settings as panel_settings

    assert panel_settings.AXES_LOCKOUT_PARAMETERS == ["username", "ip_address"]
    assert panel_settings.AXES_FAILURE_LIMIT == 5
    assert panel_settings.LOGIN_ADDRESS_FAILURE_LIMIT == 20
    assert panel_settings.AXES_COOLOFF_TIME == timedelta(minutes=15)
    # Last but the pass-through that keeps the chain in one thread (controlpanel.onethread).
    assert settings.MIDDLEWARE[-2:] == [
        "axes.middleware.AxesMiddleware",
        "controlpanel.onethread.OneThreadMiddleware",
    ]


def test_account_is_locked_after_failures_from_any_address(client, operator):
    for n in range(3):
        response = attempt(client, operator.username, address=f"198.51.100.{n + 1}")
    assert response.status_code == 429
    # The right password, from an address that never failed, is refused too.
    response = attempt(client, operator.username, password(operator), address="192.0.2.77")
    assert response.status_code == 429
    assert "Too many failed logins" in response.text and "15 minutes" in response.text
    assert not logged_in(client)


def test_address_is_locked_after_failures_for_any_accounts(client, operator, viewer):
    for n in range(5):
        response = attempt(client, f"guess-{n}", address="203.0.113.9")
    assert response.status_code == 429
    # Another account from that address: refused; that account from elsewhere: fine.
    assert attempt(client, viewer.username, password(viewer), "203.0.113.9").status_code == 429
    assert not logged_in(client)
    response = attempt(client, viewer.username, password(viewer), "192.0.2.10")
    assert response.status_code == 302 and logged_in(client)


def test_failures_below_the_limits_still_allow_the_right_password(client, operator):
    attempt(client, operator.username)
    attempt(client, operator.username)
    response = attempt(client, operator.username, password(operator))
    assert response.status_code == 302 and logged_in(client)


def test_failures_and_the_lockout_are_audited_once_each(client, operator):
    for _ in range(3 + 4):  # three to lock, four refused while locked
        attempt(client, operator.username, address="198.51.100.4")
    failed = actions("login.failed")
    assert len(failed) == 3
    assert failed[0].after == {"username": operator.username}
    assert failed[0].remote_addr == "198.51.100.4" and failed[0].actor is None
    (locked,) = actions("login.locked_out")
    assert locked.after == {"username": operator.username, "minutes": 15}
    assert locked.remote_addr == "198.51.100.4"


def test_lockout_lifts_after_the_cool_off(client, operator):
    for _ in range(3):
        attempt(client, operator.username)
    # As if the cool-off had passed since the last failure (no waiting in tests).
    AccessAttempt.objects.update(attempt_time=timezone.now() - timedelta(minutes=16))
    response = attempt(client, operator.username, password(operator))
    assert response.status_code == 302 and logged_in(client)


def test_an_admin_unlocks_with_the_management_command(client, operator):
    for _ in range(3):
        attempt(client, operator.username)
    call_command("axes_reset_username", operator.username)
    response = attempt(client, operator.username, password(operator))
    assert response.status_code == 302 and logged_in(client)


def test_an_admin_unlocks_in_the_admin_and_it_is_audited(client, operator, django_user_model):
    for _ in range(3):
        attempt(client, operator.username, address="198.51.100.8")
    root = django_user_model.objects.create_superuser("root", password="root-pw-123")
    admin_client = type(client)()
    admin_client.force_login(root)
    (row,) = AccessAttempt.objects.all()
    response = admin_client.post(f"/admin/axes/accessattempt/{row.pk}/delete/", {"post": "yes"})
    assert response.status_code == 302
    assert not AccessAttempt.objects.exists()
    (unlocked,) = actions("login.unlocked")
    assert unlocked.actor == root
    assert unlocked.after == {
        "username": operator.username,
        "address": "198.51.100.8",
        "failures": 3,
    }
    assert attempt(client, operator.username, password(operator)).status_code == 302


def test_admin_role_may_see_and_lift_lockouts():
    from django.contrib.auth.models import Group

    perms = set(
        Group.objects.get(name="Admin").permissions.values_list(
            "content_type__app_label", "codename"
        )
    )
    assert {("axes", "view_accessattempt"), ("axes", "delete_accessattempt")} <= perms


def test_the_admin_login_is_throttled_too(client, admin):
    for _ in range(3):
        attempt(client, admin.username, path="/admin/login/")
    assert attempt(client, admin.username, password(admin), path="/admin/login/").status_code == 429


def test_a_login_without_a_request_is_not_throttled(client, operator):
    """Server-side code (tests, management commands) authenticates without a request."""
    from django.contrib.auth import authenticate

    for _ in range(3):
        attempt(client, operator.username)
    assert authenticate(username=operator.username, password=password(operator)) == operator


@pytest.mark.django_db(transaction=True)
def test_the_lockout_page_comes_through_the_asgi_handler(async_client, operator):
    """The panel runs under ASGI, where axes' middleware takes its async path."""

    async def scenario():
        for _ in range(3):
            await async_client.post(LOGIN, {"username": operator.username, "password": "x"})
        return await async_client.post(
            LOGIN, {"username": operator.username, "password": password(operator)}
        )

    response = asyncio.run(scenario())
    assert response.status_code == 429
    assert "Too many failed logins" in response.content.decode()
