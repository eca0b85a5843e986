"""The test harness itself: two xdist workers never share a database, VAR_DIR, Redis database
or port (tests/workers.py), and the time report names a slow test (tests/conftest.py).

A pytest run of its own on two workers, one file each (tests/harness/): both write the same
named resources, wait for each other, and read back their own."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest
from django.db import connection

from tests.integration.processes import ROOT

# It starts a pytest run with two worker processes.
pytestmark = pytest.mark.integration


def inner_env(tmp_path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_XDIST")}
    env.pop("PYTEST_ADDOPTS", None)
    env["VAR_DIR"] = str(tmp_path / "var")
    env["HARNESS_DIR"] = str(tmp_path / "shared")
    (tmp_path / "shared").mkdir()
    # Slots 11 and 12: databases, Redis databases and ports none of this run's workers use.
    env["TEST_SLOT_BASE"] = "10"
    if connection.vendor == "postgresql":
        # Its own database names too (pytest-django adds _gw0/_gw1), never this run's.
        db = connection.settings_dict
        inner = f"{db['NAME'].removeprefix('test_')}_harness"
        env["DATABASE_URL"] = (
            f"postgres://{db['USER']}@{db['HOST'] or '127.0.0.1'}:{db['PORT'] or 5432}/{inner}"
        )
        if db["PASSWORD"]:
            env["DATABASE_URL"] = env["DATABASE_URL"].replace("@", f":{db['PASSWORD']}@", 1)
    return env


def test_two_workers_never_share_a_resource_and_a_slow_test_is_reported(tmp_path, redis_url):
    env = inner_env(tmp_path)
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-p",
            "no:cacheprovider",
            "-o",
            "python_files=case_*.py",
            "-n",
            "2",
            "--dist",
            "loadfile",
            "--no-migrations",
            "--durations=0",
            "--durations-min=1",
            "--budget-unit",
            "1",
            "tests/harness/case_isolation_a.py",
            "tests/harness/case_isolation_b.py",
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    out = run.stdout + run.stderr
    assert run.returncode == 0, out
    assert re.search(r"\b4 passed\b", out), out

    used = [json.loads(p.read_text()) for p in sorted((tmp_path / "shared").glob("used-*.json"))]
    assert len(used) == 2, out
    for key in ("var_dir", "redis"):
        assert used[0][key] != used[1][key], key
    if connection.vendor == "postgresql":
        assert used[0]["database"] != used[1]["database"]
    else:  # SQLite's test database lives in each worker process's own memory
        assert all("mode=memory" in u["database"] for u in used)
    (a_start, a_stop), (b_start, b_stop) = used[0]["ports"], used[1]["ports"]
    assert a_stop <= b_start or b_stop <= a_start

    # The slow test, and only it of the quick two, in the durations report and over budget.
    durations = re.search(r"slowest durations =+\n(.*?)\n=", out, re.S).group(1)
    assert re.search(r"\d\.\d+s call +\S+::test_deliberately_slow", durations), durations
    # (test_quick may show with "teardown": the last test on a worker tears the session down.)
    assert not re.search(r"s (setup|call) +\S+::test_quick", durations), durations
    # Its own section only: pytest's durations table follows it.
    budget = re.search(r"tests over their time budget.*?\n(.*?)(?:\n=|\Z)", out, re.S).group(1)
    assert "case_isolation_a.py::test_deliberately_slow" in budget
    assert "test_quick" not in budget
