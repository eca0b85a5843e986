"""The embedded runtime: a real Celery worker and beat as threads of the web process.

Used when ``REDIS_URL`` is unset. The broker is Celery's in-memory transport, which only works
inside one process, so the worker (``WorkController`` with the thread pool) and the beat
scheduler (``EmbeddedService(thread=True)``) run in the same process as uvicorn. Tasks are sent,
queued, acknowledged and executed exactly as with Redis, just without the network hop; this is
not ``task_always_eager``.
"""

from __future__ import annotations

import logging
import threading

from celery import Celery
from celery.beat import EmbeddedService

log = logging.getLogger(__name__)


class EmbeddedRuntime:
    """Starts and stops the in-process worker and beat."""

    def __init__(self, app: Celery, *, concurrency: int = 4, beat: bool = True):
        if not app.conf.broker_url.startswith("memory://"):
            raise RuntimeError("The embedded runtime needs the in-memory broker (unset REDIS_URL).")
        self.app = app
        self.concurrency = concurrency
        self.with_beat = beat
        self.worker = None
        self.beat = None
        self._ready = threading.Event()

    def start(self, timeout: float = 30) -> None:
        # The default 1 s poll of the in-memory queue would add up to a second to every task.
        self.app.conf.broker_transport_options = {
            **(self.app.conf.broker_transport_options or {}),
            "polling_interval": 0.05,
        }
        self.app.conf.broker_connection_retry_on_startup = True
        self.worker = self.app.WorkController(
            pool="threads",
            concurrency=self.concurrency,
            hostname="embedded@localhost",
            without_heartbeat=True,
            without_mingle=True,
            without_gossip=True,
            ready_callback=lambda consumer: self._ready.set(),
        )
        thread = threading.Thread(target=self.worker.start, name="celery-worker", daemon=True)
        thread.start()
        if not self._ready.wait(timeout):
            raise RuntimeError("The embedded Celery worker did not start.")
        if self.with_beat and self.app.conf.beat_schedule:
            self.beat = EmbeddedService(self.app, thread=True)
            self.beat.start()
        log.info(
            "embedded worker started (%d threads)%s",
            self.concurrency,
            ", beat started" if self.beat else "",
        )

    def stop(self) -> None:
        if self.beat is not None:
            self.beat.stop()
        if self.worker is not None:
            self.worker.stop(in_sighandler=False)
