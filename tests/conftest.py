"""Shared fixtures: persona users, service availability, free ports.

How a test says what it needs (the only way; `--strict-markers` rejects unknown marks):

- Nothing: a unit test. It runs in both passes of `make test` (scripts/run_tests.py): on
  SQLite, then again on PostgreSQL.
- ``pytestmark = pytest.mark.integration`` at the top of the module: it starts real services
  or processes (PostgreSQL, Redis, Celery, OpenSSH, host agents, simulators) and runs only in
  the second pass. Every module of tests/integration/, tests/hosts/agent/ and
  tests/hosts/transport/ carries it, and so does any other module that needs them.
- ``pytestmark = pytest.mark.e2e`` at the top of the module (tests/e2e/): it drives a real
  headless Chromium against a real server; second pass only.

Whole modules, never single tests, and no collection hooks: what a module needs is read at its
top. A test that needs a missing service skips with the reason (fails under CI=true): `need`.
"""

from __future__ import annotations

import os
import shutil
import socket

import pytest
from django.contrib.auth.models import Group

CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")
TEST_REDIS_URL = os.environ.get("TEST_REDIS_URL", "redis://127.0.0.1:6379/14")
CHROMIUM = os.environ.get("CHROMIUM_PATH") or shutil.which("chromium") or "/usr/bin/chromium"


def pytest_configure(config):
    from django.conf import settings

    # Personas are created for many tests; a fast hasher keeps that from dominating the run.
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
    # Tests write rows inside transactions that never commit, so the shared page parts'
    # generation would not move: off here, on in the tests of controlpanel.pagecache.
    settings.PAGE_CACHE_SECONDS = 0


def need(available: bool, what: str) -> None:
    """Skip when a real service is missing, except under CI where that is a failure."""
    if available:
        return
    if CI:
        pytest.fail(f"{what} is required under CI=true but is not available", pytrace=False)
    pytest.skip(f"{what} is not available")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture
def listener():
    """A port on 127.0.0.1 that accepts TCP connections (a host that answers)."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(16)
    yield sock.getsockname()[1]
    sock.close()


@pytest.fixture(autouse=True)
def _no_state_from_other_tests():
    """Each test starts with an empty cache (the tests' cache is always local memory: the
    test settings never name Redis for it) and with no run facts the advisor kept from
    another test's rows, whose ids the next test's rows reuse."""
    from django.conf import settings
    from django.core.cache import cache

    from changes.services import diagnosis_facts
    from controlpanel import pagecache

    if settings.CACHES["default"]["BACKEND"].endswith("LocMemCache"):
        cache.clear()
    pagecache.clear_local()
    diagnosis_facts.clear_caches()
    yield


@pytest.fixture(autouse=True)
def _plain_static_storage(settings):
    """Pages render without a collectstatic run (the manifest storage needs one)."""
    settings.STORAGES = {
        **settings.STORAGES,
        "staticfiles": {"BACKEND": "django.contrib.staticfiles.storage.StaticFilesStorage"},
    }


@pytest.fixture
def redis_url() -> str:
    import redis

    try:
        redis.Redis.from_url(TEST_REDIS_URL, socket_connect_timeout=2).ping()
        ok = True
    except redis.RedisError:
        ok = False
    need(ok, f"Redis at {TEST_REDIS_URL}")
    return TEST_REDIS_URL


@pytest.fixture
def postgres(request, db):
    from django.db import connection

    # The unit pass runs on SQLite, where this would always skip (and fail under CI): a test
    # that needs PostgreSQL belongs in an integration module, which only the second pass runs.
    if request.node.get_closest_marker("integration") is None:
        pytest.fail("a test that needs PostgreSQL must be in a module marked integration")
    need(connection.vendor == "postgresql", "PostgreSQL (make test sets DATABASE_URL)")
    return connection


@pytest.fixture
def chromium_path() -> str:
    need(os.path.exists(CHROMIUM), f"Chromium at {CHROMIUM}")
    return CHROMIUM


def _persona(django_user_model, username: str, role: str | None):
    user = django_user_model.objects.create_user(username=username, password="pw-" + username)
    if role:
        user.groups.add(Group.objects.get(name=role))
    return user


@pytest.fixture
def viewer(db, django_user_model):
    return _persona(django_user_model, "vera-viewer", "Viewer")


@pytest.fixture
def operator(db, django_user_model):
    return _persona(django_user_model, "otto-operator", "Operator")


@pytest.fixture
def approver(db, django_user_model):
    return _persona(django_user_model, "anna-approver", "Approver")


@pytest.fixture
def admin(db, django_user_model):
    return _persona(django_user_model, "adam-admin", "Admin")


@pytest.fixture
def nobody(db, django_user_model):
    """Logged in, but holding no role."""
    return _persona(django_user_model, "nora-norole", None)


@pytest.fixture
def personas(viewer, operator, approver, admin, nobody):
    return {
        "viewer": viewer,
        "operator": operator,
        "approver": approver,
        "admin": admin,
        "nobody": nobody,
    }
