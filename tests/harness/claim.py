"""What each of two workers does in tests/test_workers.py: write the same named resources (a
database row, a file in VAR_DIR, a Redis key, ports), wait until the other worker has written
too, and read back its own."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import redis
from django.conf import settings
from django.contrib.auth.models import User
from django.db import connection

from tests.workers import PORTS, free_port

NAME = "same-name"


def arrive(stage: str) -> None:
    """Wait until both workers have reached ``stage`` (files in the run's HARNESS_DIR)."""
    shared = Path(os.environ["HARNESS_DIR"])
    (shared / f"{stage}-{os.environ['PYTEST_XDIST_WORKER']}").touch()
    deadline = time.monotonic() + 120
    while len(list(shared.glob(f"{stage}-*"))) < 2:
        assert time.monotonic() < deadline, f"the other worker never reached {stage!r}"
        time.sleep(0.05)


def claim(redis_url: str) -> None:
    me = os.environ["PYTEST_XDIST_WORKER"]
    shared = Path(os.environ["HARNESS_DIR"])
    assert str(settings.VAR_DIR) == os.environ["VAR_DIR"]  # what processes a test starts see
    User.objects.create(username=NAME, first_name=me)  # committed: transaction=True
    (Path(settings.VAR_DIR) / NAME).write_text(me)
    client = redis.Redis.from_url(redis_url)
    client.set(NAME, me)
    ports = [free_port() for _ in range(50)]
    (shared / f"ports-{me}.json").write_text(json.dumps(ports))

    arrive("written")

    assert [u.first_name for u in User.objects.filter(username=NAME)] == [me]
    assert (Path(settings.VAR_DIR) / NAME).read_text() == me
    assert client.get(NAME) == me.encode()
    (other,) = [p for p in shared.glob("ports-*.json") if p.name != f"ports-{me}.json"]
    assert not set(ports) & set(json.loads(other.read_text()))
    assert all(port in PORTS for port in ports)
    # Report what was used, for the outer test to compare across the two workers.
    (shared / f"used-{me}.json").write_text(
        json.dumps(
            {
                "database": connection.settings_dict["NAME"],
                "var_dir": str(settings.VAR_DIR),
                "redis": redis_url,
                "ports": [PORTS.start, PORTS.stop],
            }
        )
    )
    client.delete(NAME)
