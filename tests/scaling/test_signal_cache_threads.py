"""The signal poller's per-process snapshot cache is shared by the threads of a process (the
embedded worker runs beat's polls in threads; one that ran long overlapped the next): a poll
that trims the cache while another reads or trims it must not fail (issue 37 item 2:
``poll_engine_signals`` raised KeyError in ``del _snapshots[pk]``).

Another poll runs exactly as this one removes its first stale entry — a thread switch at the
worst moment. Where the cache has a lock and this poll holds it, the other poll runs in a
thread of its own (and waits for the lock, as it would); otherwise in between, in this
thread."""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone

from scaling.models import EngineSample
from scaling.services import signals
from tests.factories import make_deployment, make_host

pytestmark = pytest.mark.django_db(transaction=True)


class OtherPollWhileTrimming(dict):
    """The cache; on the first removal of an entry, ``other()`` runs (see the module's doc)."""

    def __init__(self, entries: dict, other):
        super().__init__(entries)
        self.other, self.fired, self.threads = other, False, []

    def _other_poll_now(self) -> None:
        if self.fired:
            return
        self.fired = True
        lock = getattr(signals, "_lock", None)
        if lock is not None and lock.locked():
            thread = threading.Thread(target=self.other)
            thread.start()
            self.threads.append(thread)
        else:
            self.other()

    def __delitem__(self, key):
        self._other_poll_now()
        super().__delitem__(key)

    def pop(self, key, *default):
        self._other_poll_now()
        return super().pop(key, *default)


def test_two_polls_trimming_the_snapshot_cache_at_once(monkeypatch):
    deployment = make_deployment(make_host())
    now = timezone.now()
    rows = [
        EngineSample.objects.create(
            deployment=deployment, time=now - timedelta(seconds=s), snapshot={"n": s}
        )
        for s in (20, 10)
    ]
    histories = []

    def poll():
        try:
            histories.append(signals._history([deployment.pk]))
        finally:
            if threading.current_thread() is not threading.main_thread():
                connection.close()

    # A row another poll saw that has gone since (deleted): every poll trims it.
    gone = (deployment.pk, (now - timedelta(seconds=30)).timestamp(), {"n": 30})
    cache = OtherPollWhileTrimming({rows[-1].pk + 1000: gone}, poll)
    monkeypatch.setattr(signals, "_snapshots", cache)
    poll()
    for thread in cache.threads:
        thread.join(30)
    assert cache.fired and len(histories) == 2
    expected = [(row.time.timestamp(), row.snapshot) for row in rows]
    assert histories[0] == histories[1] == {deployment.pk: expected}
    assert sorted(cache) == [row.pk for row in rows]
