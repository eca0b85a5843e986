"""What the integration tests share: the production processes' environment (compose's, on
the test database and Redis), a starter that stops what it started, and the encryption key
the panel and its worker must agree on."""

from __future__ import annotations

import os
import socket
import time

import pytest
import redis
from cryptography.fernet import Fernet
from django.db import connection

from tests.integration.demo import manage
from tests.integration.processes import Process

APP_NAME = "integration-process"


@pytest.fixture(scope="session")
def collected_static(tmp_path_factory):
    """What the Dockerfile does at build time (`collectstatic`: hashed and compressed files),
    once per test process: the processes only read it."""
    root = tmp_path_factory.mktemp("static")
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL")}
    env.update({"SECRET_KEY": "integration-" + "k" * 50, "STATIC_ROOT": str(root)})
    manage(env, "collectstatic", "--noinput", "-v0")
    return root


@pytest.fixture
def production_env(postgres, redis_url, tmp_path, collected_static):
    """The environment compose gives the panel, pointed at the test database and Redis."""
    redis.Redis.from_url(redis_url).flushdb()
    db = connection.settings_dict
    password = f":{db['PASSWORD']}" if db["PASSWORD"] else ""
    database_url = (
        f"postgres://{db['USER']}{password}@{db['HOST'] or '127.0.0.1'}:"
        f"{db['PORT'] or 5432}/{db['NAME']}"
    )
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL")}
    env.update(
        {
            "DATABASE_URL": database_url,
            "REDIS_URL": redis_url,
            "SECRET_KEY": "integration-" + "k" * 50,
            "ALLOWED_HOSTS": "127.0.0.1,localhost",
            "HTTPS": "false",
            "VAR_DIR": str(tmp_path / "var"),
            "HOST_CHECK_INTERVAL_SECONDS": "0",
            "HOSTNAME": socket.gethostname(),
            "STATIC_ROOT": str(collected_static),
            # libpq names the processes' sessions: the end of a test waits for them to close.
            "PGAPPNAME": APP_NAME,
        }
    )
    return env


@pytest.fixture
def start(request, tmp_path):
    """``start(name, cmd, env)`` runs a process (its log in tmp_path); all are stopped at the
    end of the test, the last started first."""
    started: list[Process] = []

    def _start(name, cmd, env):
        process = Process(name, cmd, env, tmp_path)
        started.append(process)
        return process

    yield _start
    for process in reversed(started):
        process.stop()
    if started and "production_env" in request.fixturenames:
        # PostgreSQL may not have closed the stopped processes' sessions yet, and a test
        # database still in use cannot be dropped at the end of the run.
        deadline = time.monotonic() + 30
        while _process_sessions() and time.monotonic() < deadline:
            time.sleep(0.1)


def _process_sessions() -> int:
    """Sessions the started processes hold on the test database."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity"
            " WHERE datname = current_database() AND application_name = %s",
            [APP_NAME],
        )
        return cursor.fetchone()[0]


@pytest.fixture
def shared_key(settings, production_env):
    """The worker must read the token this process stored: one encryption key for both."""
    key = Fernet.generate_key().decode()
    settings.PANEL_ENCRYPTION_KEYS = [key]
    production_env["PANEL_ENCRYPTION_KEY"] = key
    production_env["TELEMETRY_INTERVAL_SECONDS"] = "1"
    production_env["ENGINE_READY_TIMEOUT_SECONDS"] = "60"
    return key
