"""A heartbeat for long work on a worker: a thread stamps the work's row every few seconds, so
that a resume can tell a live worker (busy in a long benchmark) from a lost one, whose stamp
has stopped. Used by a change's pipeline and a sweep's lanes."""

from __future__ import annotations

import logging
import threading

from django.db import close_old_connections
from django.db.models import QuerySet
from django.utils import timezone

log = logging.getLogger(__name__)


class Heartbeat:
    """``with Heartbeat(rows, "heartbeat_at", every_s, "lane-7"):`` stamps ``rows`` (the
    work's row, filtered by its owner so that a worker that lost its claim stops stamping)
    with the time every ``every_s`` seconds until the block ends."""

    def __init__(self, rows: QuerySet, field: str, every_s: float, name: str):
        self.rows, self.field, self.every_s, self.name = rows, field, every_s, name
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join(timeout=10)

    def _run(self):
        try:
            while not self._stop.wait(self.every_s):
                self.rows.update(**{self.field: timezone.now()})
        except Exception:  # noqa: BLE001 - a missed beat only makes a takeover possible sooner
            log.warning("heartbeat %s stopped", self.name, exc_info=True)
        finally:
            close_old_connections()
