"""Shared fixtures: persona users, service availability, free ports.

`make test` (scripts/run_tests.py) runs every test once, on PostgreSQL, spread over
pytest-xdist workers that share nothing (tests/workers.py); each test's time is checked
against a budget (tests/budget.py). How a test says what it needs (`--strict-markers` rejects
unknown marks):

- Nothing: a unit test.
- ``pytestmark = pytest.mark.integration`` at the top of the module: it starts real services
  or processes (PostgreSQL, Redis, Celery, OpenSSH, host agents, simulators). Every module of
  tests/integration/, tests/hosts/agent/ and tests/hosts/transport/ carries it, and so does
  any other module that needs them. Such modules are handed to the workers first.
- ``pytestmark = pytest.mark.e2e`` at the top of the module (tests/e2e/): it drives a real
  headless Chromium against a real server.
- ``pytest.mark.sqlite`` on a module: it exercises dialect-sensitive code (raw SQL, JSON
  queries, locking, migrations), so `make test` runs it on SQLite too.
- ``@pytest.mark.timing`` on a test: it asserts how quickly the machine did something; `make
  test` runs these one at a time in a lane of their own that the CPU serves first, a failure
  retried and listed as a flake.

integration, e2e and sqlite mark whole modules: what a module needs is read at its top. A test
that needs a missing service skips with the reason (fails under CI=true): `need`.
"""

from __future__ import annotations

import os
import shutil
import socket
from pathlib import Path

import pytest
from django.contrib.auth.models import Group

from tests.workers import free_port  # noqa: F401 - the one port picker, imported from here

CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")
# This process's own Redis database (tests.workers sets it per xdist worker).
TEST_REDIS_URL = os.environ["TEST_REDIS_URL"]
CHROMIUM = os.environ.get("CHROMIUM_PATH") or shutil.which("chromium") or "/usr/bin/chromium"


def pytest_configure(config):
    from django.conf import settings

    # Personas are created for many tests; a fast hasher keeps that from dominating the run.
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
    # Tests write rows inside transactions that never commit, so the shared page parts'
    # generation would not move: off here, on in the tests of controlpanel.pagecache.
    settings.PAGE_CACHE_SECONDS = 0


@pytest.hookimpl(trylast=True)  # after pytest-django's own order (by database use), kept within
def pytest_collection_modifyitems(config, items):
    """Browser tests first, then the other modules that start real processes, then the rest (a
    stable sort keeps each module together): xdist hands out files in this order, so the long
    ones start early and the short ones fill in around them instead of running alone at the
    end. (A transactional test's flush does not strand the tests after it: the roles come back
    with the post_migrate signal it sends.)"""

    # The timing lane beside the bulk (scripts/run_tests.py) runs its browser tests last: the
    # bulk runs its own first at a low CPU weight, and two panels with browsers at the lane's
    # priority starved them into time-outs.
    browser = 3 if os.environ.get("TEST_BROWSER_LAST") else 0

    def order(item) -> int:
        if item.get_closest_marker("e2e"):
            return browser
        return 1 if item.get_closest_marker("integration") else 2

    items.sort(key=order)


def need(available: bool, what: str) -> None:
    """Skip when a real service is missing, except under CI where that is a failure."""
    if available:
        return
    if CI:
        pytest.fail(f"{what} is required under CI=true but is not available", pytrace=False)
    pytest.skip(f"{what} is not available")


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
def _flows_take_their_runs_as_evidence(request, monkeypatch):
    """Integration and browser tests drive whole flows (a sweep, a change's pipeline, the CI
    gate, the advisor) against simulators running 5x faster than real time, on a CI machine
    shared by two workers: the load generator there cannot resolve their ~1 ms token gaps
    and lags, so by ``benchmarks.evidence`` their runs are client-limited and refused, and the
    flow under test stops ("cannot judge", a trial "not a valid point"). Those tests test the
    flow, not the client's health: they run with BENCHMARK_CLIENT_LIMITED=report (judged and
    shown, not refused). The rule itself and each consumer's refusal are tested without it
    (tests not marked integration or e2e, and the CPU-burner timing test). The variable
    reaches the panels and workers those tests start as processes too."""
    node = request.node
    if node.get_closest_marker("integration") or node.get_closest_marker("e2e"):
        from benchmarks.evidence import MODE_ENV

        monkeypatch.setenv(MODE_ENV, "report")


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


@pytest.fixture(scope="session")
def migrated_sqlite(tmp_path_factory):
    """A SQLite database with every migration applied (and the static files collected beside
    it) for demo panels to start from (tests/integration/demo.py): made once for the whole run
    by scripts/run_tests.py (``TEST_DEMO_VAR``), else once per test process."""
    from tests.integration.demo import migrated_database

    shared = os.environ.get("TEST_DEMO_VAR")
    if shared:
        return Path(shared) / "db.sqlite3"
    return migrated_database(tmp_path_factory.mktemp("migrated") / "var")


@pytest.fixture
def chromium_path() -> str:
    need(os.path.exists(CHROMIUM), f"Chromium at {CHROMIUM}")
    return CHROMIUM


ROLE_OF = {
    "viewer": ("vera-viewer", "Viewer"),
    "operator": ("otto-operator", "Operator"),
    "approver": ("anna-approver", "Approver"),
    "admin": ("adam-admin", "Admin"),
    "nobody": ("nora-norole", None),  # logged in, but holding no role
}


def _persona(django_user_model, username: str, role: str | None):
    user = django_user_model.objects.create_user(username=username, password="pw-" + username)
    if role:
        user.groups.add(Group.objects.get(name=role))
    return user


@pytest.fixture(scope="module")
def shared_personas(django_db_setup, django_db_blocker):
    """Personas made once for a module that uses this fixture (the permission matrices:
    hundreds of tests that only log them in, with ``pytest.mark.usefixtures``): committed
    before its first test's transaction begins, deleted after its last test. Each test's own
    writes still roll back around them, and the persona fixtures hand these out."""
    from django.contrib.auth import get_user_model

    model = get_user_model()
    with django_db_blocker.unblock():
        # A run killed mid-module leaves them committed in a database kept with --reuse-db.
        model.objects.filter(username__in=[name for name, _ in ROLE_OF.values()]).delete()
        users = {key: _persona(model, *ROLE_OF[key]) for key in ROLE_OF}
    yield users
    with django_db_blocker.unblock():
        model.objects.filter(pk__in=[user.pk for user in users.values()]).delete()


def _persona_for(request, key: str):
    if "shared_personas" in request.fixturenames:
        user = request.getfixturevalue("shared_personas")[key]
        user.refresh_from_db()  # a previous test's changes to the object were rolled back
        return user
    return _persona(request.getfixturevalue("django_user_model"), *ROLE_OF[key])


@pytest.fixture
def viewer(db, request):
    return _persona_for(request, "viewer")


@pytest.fixture
def operator(db, request):
    return _persona_for(request, "operator")


@pytest.fixture
def approver(db, request):
    return _persona_for(request, "approver")


@pytest.fixture
def admin(db, request):
    return _persona_for(request, "admin")


@pytest.fixture
def nobody(db, request):
    """Logged in, but holding no role."""
    return _persona_for(request, "nobody")


@pytest.fixture
def personas(viewer, operator, approver, admin, nobody):
    return {
        "viewer": viewer,
        "operator": operator,
        "approver": approver,
        "admin": admin,
        "nobody": nobody,
    }
