"""What each test process owns, so that pytest-xdist workers never share anything by accident.

Loaded with ``-p tests.workers`` (pyproject's addopts), before pytest-django reads the settings,
so what it sets in the environment is what the settings, and every process a test starts, see:

- ``VAR_DIR``: ``<base>/<worker>`` (base: the run's VAR_DIR, or a new temporary folder).
- ``TEST_REDIS_URL``: a database number of the worker's own (its slot: 1-13; a run without
  workers keeps the URL as given, database 14 by default; 0 is production's default and 15 a
  test's "other" database).
- Ports: ``free_port()`` hands out ports from the worker's own range, below the kernel's
  ephemeral range (32768+), so a port one worker picked and has not bound yet is never another
  worker's pick, nor a client socket's.
- The test database: pytest-django names it per worker (``test_controlpanel_gw0``).

Pure: no Django import (the settings are not configured yet when this is imported).
"""

from __future__ import annotations

import itertools
import os
import socket
import tempfile
import threading
from pathlib import Path

WORKER = os.environ.get("PYTEST_XDIST_WORKER", "")  # "gw3" in a worker, "" otherwise
# 0 outside xdist, n + 1 for worker gwn: the slot that picks each resource below. A run inside
# a test's run (tests/test_workers.py) shifts its workers' slots by TEST_SLOT_BASE.
SLOT = int(WORKER[2:]) + 1 + int(os.environ.get("TEST_SLOT_BASE", "0")) if WORKER else 0
MAX_SLOT = 13

PORT_BASE = 20000
PORT_SPAN = 800  # 14 slots: 20000-31199, below the ephemeral range


def _with_db(url: str, db: int) -> str:
    head, _, tail = url.rpartition("/")
    return f"{head}/{db}" if tail.isdigit() and head.count("/") >= 2 else f"{url.rstrip('/')}/{db}"


def _setup() -> None:
    if SLOT > MAX_SLOT:
        raise RuntimeError(f"worker slot {SLOT} > {MAX_SLOT}: each needs a Redis database")
    base = os.environ.get("VAR_DIR")
    if not base:
        base = tempfile.mkdtemp(prefix="controlpanel-test-")
        os.environ["VAR_DIR"] = base  # the workers inherit it from the controller
    if WORKER and Path(base).name != WORKER:
        own = Path(base) / WORKER
        own.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.environ["VAR_DIR"] = str(own)
    url = os.environ.get("TEST_REDIS_URL", "redis://127.0.0.1:6379/14")
    # Outside xdist the URL as given (database 14 by default); a worker swaps in its own.
    os.environ["TEST_REDIS_URL"] = _with_db(url, SLOT) if WORKER else url


_setup()

PORTS = range(PORT_BASE + SLOT * PORT_SPAN, PORT_BASE + (SLOT + 1) * PORT_SPAN)
# Single ports from the first 600 of the range, bases of port blocks (a demo fleet's) from the
# rest: a block's ports are never handed out singly before its processes bind them.
SINGLE = range(PORTS.start, PORTS.start + 600)
BLOCKS = range(SINGLE.stop, PORTS.stop)
_next = {SINGLE: itertools.cycle(SINGLE), BLOCKS: itertools.cycle(BLOCKS)}
_port_lock = threading.Lock()


def _bindable(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def _take(pool: range, offsets: tuple[int, ...]) -> int:
    with _port_lock:
        for _ in range(len(pool)):
            base = next(_next[pool])
            if base + max(offsets) in PORTS and all(_bindable(base + o) for o in offsets):
                return base
    raise RuntimeError(f"no free ports in {pool.start}-{pool.stop - 1} for offsets {offsets}")


def free_port() -> int:
    """A port on 127.0.0.1 that nothing listens on, from this worker's own range. Ports are
    handed out in turn, so one just handed out (not bound yet) is not handed out again soon."""
    return _take(SINGLE, (0,))


def free_ports(offsets: tuple[int, ...]) -> int:
    """A base port such that base + each offset is free, all in this worker's own range."""
    return _take(BLOCKS, offsets)
