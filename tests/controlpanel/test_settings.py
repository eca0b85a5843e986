"""Settings come from the environment; a bad value stops the start with the variable's name."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from controlpanel.env import EnvError, env_bool, env_int, env_list, env_secret, env_url

ROOT = Path(__file__).resolve().parents[2]


def test_bool_words():
    assert env_bool("X", environ={"X": "Yes"}) is True
    assert env_bool("X", environ={"X": "off"}) is False
    assert env_bool("X", True, environ={}) is True
    with pytest.raises(EnvError, match="X='maybe'"):
        env_bool("X", environ={"X": "maybe"})


def test_int_bounds():
    assert env_int("N", 3, environ={"N": "7"}, minimum=1) == 7
    with pytest.raises(EnvError, match="N='0'.*>= 1"):
        env_int("N", 3, environ={"N": "0"}, minimum=1)
    with pytest.raises(EnvError, match="an integer"):
        env_int("N", 3, environ={"N": "seven"})


def test_list_and_url():
    assert env_list("H", [], environ={"H": "a.example, b.example,,"}) == ["a.example", "b.example"]
    assert env_url("U", None, ("redis",), environ={"U": "redis://r:6379/0"}) == "redis://r:6379/0"
    with pytest.raises(EnvError, match="redis://"):
        env_url("U", None, ("redis",), environ={"U": "localhost:6379"})


def test_secret_from_file(tmp_path):
    secret = tmp_path / "key"
    secret.write_text("s3cret\n")
    assert env_secret("K", environ={"K_FILE": str(secret)}) == "s3cret"
    with pytest.raises(EnvError, match="only one of K and K_FILE"):
        env_secret("K", environ={"K": "a", "K_FILE": str(secret)})
    with pytest.raises(EnvError, match="readable file"):
        env_secret("K", environ={"K_FILE": str(tmp_path / "missing")})


def start(env: dict, tmp_path) -> subprocess.CompletedProcess:
    """Load the settings in a fresh process, as `manage.py` would at start."""
    return start_with(env, tmp_path)


def start_with(env: dict, tmp_path, shell: str = "") -> subprocess.CompletedProcess:
    """`manage.py check`, or ``shell`` run by `manage.py shell -c`, in a fresh process."""
    clean = {
        k: v
        for k, v in os.environ.items()
        if k not in ("DATABASE_URL", "REDIS_URL", "SECRET_KEY", "DEBUG", "DATABASE_POOL_SIZE")
        and not k.startswith("WEB_")
    }
    clean.update({"VAR_DIR": str(tmp_path), **env})
    command = ["shell", "-c", shell] if shell else ["check"]
    return subprocess.run(
        [sys.executable, "manage.py", *command],
        cwd=ROOT,
        env=clean,
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.parametrize(
    ("env", "named"),
    [
        ({"DEBUG": "maybe"}, "DEBUG"),
        ({"DATABASE_URL": "mysql://x@y/z"}, "DATABASE_URL"),
        ({"REDIS_URL": "localhost:6379"}, "REDIS_URL"),
        ({"REDIS_URL": "redis://r:6379/0"}, "SECRET_KEY"),  # production needs a real key
        ({"CELERY_TASK_TIME_LIMIT": "-5"}, "CELERY_TASK_TIME_LIMIT"),
        ({"LOG_LEVEL": "LOUD"}, "LOG_LEVEL"),
        ({"SECRET_KEY_FILE": "/nonexistent/key"}, "SECRET_KEY_FILE"),
        ({"WEB_MAX_IN_FLIGHT": "0"}, "WEB_MAX_IN_FLIGHT"),
        ({"WEB_QUEUE_SECONDS": "soon"}, "WEB_QUEUE_SECONDS"),
    ],
)
def test_bad_value_fails_at_start_naming_the_variable(tmp_path, env, named):
    result = start(env, tmp_path)
    assert result.returncode != 0
    assert "ImproperlyConfigured" in result.stderr
    assert f"Environment variable {named}=" in result.stderr


def test_embedded_defaults_start_and_keep_their_secret_key(tmp_path):
    assert start({}, tmp_path).returncode == 0
    key = (tmp_path / "secret_key").read_text()
    assert len(key) >= 50
    assert oct((tmp_path / "secret_key").stat().st_mode)[-3:] == "600"
    assert start({}, tmp_path).returncode == 0
    assert (tmp_path / "secret_key").read_text() == key


PRODUCTION = {
    "DATABASE_URL": "postgres://panel@127.0.0.1:5432/panel",
    "SECRET_KEY": "test-only-" + "x" * 50,
}


def shown(env: dict, tmp_path, show: str) -> str:
    """The last line ``show`` prints with the panel's settings under ``env``."""
    result = start_with(env, tmp_path, show)
    assert result.returncode == 0, result.stderr
    return result.stdout.strip().splitlines()[-1]


def test_database_pool_size_pools_postgresql_connections_instead_of_keeping_them(tmp_path):
    show = (
        "import json; from django.conf import settings as s; d = s.DATABASES['default'];"
        " print(json.dumps([d['CONN_MAX_AGE'], d.get('OPTIONS', {}).get('pool'),"
        " d['CONN_HEALTH_CHECKS']]))"
    )
    production = {**PRODUCTION, "DATABASE_CONN_MAX_AGE": "60"}

    def read(env):
        return json.loads(shown(env, tmp_path, show))

    age, pool, _checked = read({**production, "DATABASE_POOL_SIZE": "6"})
    # Django refuses a pool together with persistent connections: the pool wins.
    assert age == 0 and pool["max_size"] == 6 and pool["timeout"] > 0
    # No pool asked: the workers keep connections, each checked before a task reuses it (a
    # PostgreSQL restart must not fail the next apply).
    assert read(production) == [60, None, True]
    # SQLite has no pool: the setting is ignored there (the embedded panel).
    assert read({"DATABASE_POOL_SIZE": "6"})[1] is None
    bad = start_with({**production, "DATABASE_POOL_SIZE": "-1"}, tmp_path, show)
    assert bad.returncode != 0 and "DATABASE_POOL_SIZE" in bad.stderr


def test_web_admission_follows_the_pool_unless_set(tmp_path):
    show = "from django.conf import settings as s; print(s.WEB_MAX_IN_FLIGHT, s.WEB_QUEUE_SECONDS)"
    production = PRODUCTION

    def read(env):
        return shown(env, tmp_path, show)

    # One request per pooled connection: none of them waits on the pool.
    assert read({**production, "DATABASE_POOL_SIZE": "6"}) == "6 5.0"
    assert read(production) == "10 5.0"
    assert read({**production, "WEB_MAX_IN_FLIGHT": "3", "WEB_QUEUE_SECONDS": "1.5"}) == "3 1.5"


def test_production_shares_page_parts_and_reads_sessions_from_redis(tmp_path):
    show = (
        "from django.conf import settings as s; "
        "print(s.PAGE_CACHE_SECONDS, s.SESSION_ENGINE.rsplit('.', 1)[-1])"
    )
    production = {**PRODUCTION, "REDIS_URL": "redis://127.0.0.1:6379/3"}

    def read(env):
        return shown(env, tmp_path, show)

    assert read({}) == "0 db"  # embedded (no Redis): one process, nothing to share
    assert read(production) == "1 cached_db"
    assert read({**production, "PAGE_CACHE_SECONDS": "0"}) == "0 cached_db"
