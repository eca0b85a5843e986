"""The embedded runtime runs real Celery tasks on a worker thread: sent, queued, consumed."""

import socket
import time

import pytest
from celery import current_app
from celery.worker import state as worker_state

from controlpanel.celery import app
from controlpanel.choices import OperationStatus
from controlpanel.embedded import EmbeddedRuntime
from hosts.services import checks
from tests.factories import make_host


@pytest.fixture
def runtime():
    assert app.conf.task_always_eager is False  # the point: not eager
    # Earlier tests' commits queued tasks on the in-memory broker with no worker to take them;
    # run against them, they would share SQLite's in-memory test database with this test's
    # own task on another thread (shared-cache table locks fail at once, with no busy wait).
    app.control.purge()
    rt = EmbeddedRuntime(app, concurrency=2, beat=False)
    rt.start()
    yield rt
    rt.stop()


@pytest.mark.django_db(transaction=True)
def test_service_call_is_executed_by_the_worker_thread(runtime, operator):
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(4)
        host = make_host(port=sock.getsockname()[1])
        before = worker_state.total_count["hosts.tasks.check_host"]
        check = checks.request_host_check(operator, host)
        # Wait on the worker's own counters, not by reading the row: SQLite's shared-cache
        # in-memory test database has no busy wait, so a read here while the worker thread
        # writes the check fails its write at once ("database table is locked").
        deadline = time.monotonic() + 120  # generous: a loaded machine starts threads late
        while time.monotonic() < deadline:
            taken = worker_state.total_count["hosts.tasks.check_host"] > before
            if taken and not worker_state.active_requests:
                break
            time.sleep(0.05)
        check.refresh_from_db()
    assert check.status == OperationStatus.SUCCEEDED, check.error
    assert check.reachable is True
    # It went through the worker: its consumer received the message and ran the request.
    assert worker_state.total_count["hosts.tasks.check_host"] == before + 1


def test_refuses_a_network_broker(monkeypatch):
    monkeypatch.setattr(current_app.conf, "broker_url", "redis://127.0.0.1:6379/0")
    with pytest.raises(RuntimeError, match="in-memory broker"):
        EmbeddedRuntime(current_app)
