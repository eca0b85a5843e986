#!/usr/bin/env python3
"""`make test`: the unit tests on SQLite, then the whole suite on PostgreSQL (+ Redis, Celery,
Chromium). With CI=true a missing service fails the run; otherwise the PostgreSQL pass falls
back to SQLite and the tests that need a missing service are skipped with the reason.

Extra arguments go to pytest in both passes (e.g. `scripts/run_tests.py -k roles`).
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_PG = "postgres://postgres@127.0.0.1:5432/controlpanel"


def postgres_reachable(url: str) -> str | None:
    """None when PostgreSQL answers, else the reason."""
    try:
        import psycopg

        with psycopg.connect(url.replace("/controlpanel", "/postgres", 1), connect_timeout=3):
            return None
    except Exception as exc:  # noqa: BLE001 - reported to the user
        return str(exc).strip().splitlines()[0]


def pytest(label: str, env: dict, args: list[str]) -> int:
    print(f"\n=== {label} ===", flush=True)
    return subprocess.call([sys.executable, "-m", "pytest", *args], cwd=ROOT, env=env)


def main(extra: list[str]) -> int:
    ci = os.environ.get("CI", "").lower() in ("1", "true", "yes")
    base = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL")}
    base["VAR_DIR"] = tempfile.mkdtemp(prefix="controlpanel-test-")
    base.setdefault("SECRET_KEY", "test-only-" + "x" * 50)

    code = pytest("unit tests on SQLite", base, ["-m", "not integration and not e2e", *extra])
    if code != 0:
        return code

    pg_url = os.environ.get("TEST_DATABASE_URL", DEFAULT_PG)
    problem = postgres_reachable(pg_url)
    whole = dict(base)
    if problem is None:
        whole["DATABASE_URL"] = pg_url
        label = f"whole suite on PostgreSQL ({pg_url.rsplit('@', 1)[-1]})"
    elif ci:
        print(f"PostgreSQL is required under CI=true but not reachable at {pg_url}: {problem}")
        return 1
    else:
        label = f"whole suite on SQLite (PostgreSQL not reachable: {problem})"
    return pytest(label, whole, extra)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
