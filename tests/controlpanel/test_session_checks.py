"""controlpanel.session_checks: a batch of login checks gets the verdicts a page request would
give each one (``auth.get_user`` + ``has_perm``), in the same few queries for 3 logins as for 30,
and changes nothing in the sessions it reads."""

from __future__ import annotations

from datetime import timedelta
from importlib import import_module
from types import SimpleNamespace

import pytest
from django.conf import settings
from django.contrib import auth
from django.contrib.auth.models import Permission
from django.contrib.sessions.models import Session
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from controlpanel import session_checks

pytestmark = pytest.mark.django_db

PERMS = ("hosts.view_host", "benchmarks.view_benchmarkrun", "hosts.change_host")


def login(user) -> str:
    client = Client()
    client.force_login(user)
    return client.cookies["sessionid"].value


def page_verdict(key: str, pk, perm: str) -> bool:
    """What a page request concludes (on a copy: get_user flushes a session it rejects)."""
    store = import_module(settings.SESSION_ENGINE).SessionStore(session_key=key)
    data = store.load()
    copy = import_module(settings.SESSION_ENGINE).SessionStore()
    copy._session_cache = dict(data)
    copy.flush = lambda: copy._session_cache.clear()
    copy.cycle_key = lambda: None
    user = auth.get_user(SimpleNamespace(session=copy))
    return user.is_authenticated and user.pk == pk and user.has_perm(perm)


@pytest.fixture
def logins(viewer, operator, admin, nobody, django_user_model):
    """(session key, user pk) for logins in every state a socket can meet."""
    out = {
        "viewer": (login(viewer), viewer.pk),
        "operator": (login(operator), operator.pk),
        "admin": (login(admin), admin.pk),
        "nobody": (login(nobody), nobody.pk),
    }
    superuser = django_user_model.objects.create_superuser("root", password="x")
    out["superuser"] = (login(superuser), superuser.pk)
    own = django_user_model.objects.create_user("own-perm", password="x")
    own.user_permissions.add(Permission.objects.get(codename="change_host"))
    out["own permission"] = (login(own), own.pk)

    inactive = django_user_model.objects.create_user("inactive", password="x")
    out["inactive"] = (login(inactive), inactive.pk)
    inactive.is_active = False
    inactive.save()

    moved = django_user_model.objects.create_user("password-changed", password="x")
    moved.groups.set(viewer.groups.all())
    out["password changed"] = (login(moved), moved.pk)
    moved.set_password("elsewhere")
    moved.save()

    expired_key = login(viewer)
    Session.objects.filter(pk=expired_key).update(expire_date=timezone.now() - timedelta(1))
    out["expired"] = (expired_key, viewer.pk)
    out["deleted"] = ("no-such-session-key", viewer.pk)
    out["someone else's session"] = (login(operator), viewer.pk)
    return out


def test_each_verdict_is_what_a_page_request_concludes(logins):
    checks = [(key, pk, perm) for key, pk in logins.values() for perm in PERMS]
    before = {s.pk: s.session_data for s in Session.objects.all()}
    got = session_checks.verdicts(checks)
    want = {check: page_verdict(*check) for check in checks}
    assert got == want
    # Not all the same answer: the cases above do differ.
    by_name = {name: got[(key, pk, "hosts.view_host")] for name, (key, pk) in logins.items()}
    assert by_name == {
        "viewer": True,
        "operator": True,
        "admin": True,
        "nobody": False,
        "superuser": True,
        "own permission": False,
        "inactive": False,
        "password changed": False,
        "expired": False,
        "deleted": False,
        "someone else's session": False,
    }
    assert got[(*logins["own permission"], "hosts.change_host")] is True
    assert got[(*logins["viewer"], "hosts.change_host")] is False
    # Nothing flushed or cycled (get_user would flush the password-changed one).
    assert {s.pk: s.session_data for s in Session.objects.all()} == before


def test_a_session_signed_with_a_fallback_secret_still_logs_in(viewer, settings):
    key = login(viewer)
    settings.SECRET_KEY_FALLBACKS = [settings.SECRET_KEY]
    settings.SECRET_KEY = "a-new-secret-" + "y" * 50
    check = (key, viewer.pk, "hosts.view_host")
    assert session_checks.verdicts([check]) == {check: True}


def test_the_same_queries_for_3_logins_as_for_30(viewer, django_user_model):
    def batch(n):
        checks = []
        for i in range(n):
            user = django_user_model.objects.create_user(f"u{n}-{i}", password="x")
            user.groups.set(viewer.groups.all())
            checks.append((login(user), user.pk, "hosts.view_host"))
        with CaptureQueriesContext(connection) as captured:
            answers = session_checks.verdicts(checks)
        assert all(answers.values())
        return len(captured.captured_queries)

    small, large = batch(3), batch(30)
    assert small == large <= 4
