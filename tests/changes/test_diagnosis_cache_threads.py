"""The diagnosis' per-process run caches are shared by the threads of a process (advisor
passes, pages, API requests): another thread clearing a cache (it was full) between one
caller's store and read must not fail that caller (issue 37 item 2, "other shared state").

The other thread clears exactly as this caller stores what it read — a thread switch at the
worst moment. Where the cache has a lock and this caller holds it, the clearing runs in a
thread of its own (and waits for the lock, as it would); otherwise in between, here."""

from __future__ import annotations

import threading

import pytest

from changes.services import diagnosis_facts
from tests.factories import make_run

pytestmark = pytest.mark.django_db


class ClearedWhileStoring(dict):
    def __init__(self):
        super().__init__()
        self.fired, self.threads = False, []

    def _clear_now(self) -> None:
        if self.fired:
            return
        self.fired = True
        lock = getattr(diagnosis_facts, "_cache_lock", None)
        if lock is not None and lock.locked():
            thread = threading.Thread(target=diagnosis_facts.clear_caches)
            thread.start()
            self.threads.append(thread)
        else:
            diagnosis_facts.clear_caches()

    def __setitem__(self, key, value):
        super().__setitem__(key, value)
        self._clear_now()  # stored, then cleared before it is read back

    def setdefault(self, key, default=None):
        value = super().setdefault(key, default)
        self._clear_now()  # stored, then cleared before it is read back
        return value

    def update(self, *args, **kwargs):
        super().update(*args, **kwargs)
        self._clear_now()


@pytest.mark.parametrize("cache", ["_log_cache", "_gauge_cache"])
def test_a_cache_cleared_by_another_thread_meanwhile(monkeypatch, cache):
    runs = [make_run(), make_run()]
    shared = ClearedWhileStoring()
    monkeypatch.setattr(diagnosis_facts, cache, shared)
    if cache == "_log_cache":
        found = diagnosis_facts._run_logs(runs)
        assert found == {run.pk: (None, {}) for run in runs}  # no request log: nothing known
    else:
        found = diagnosis_facts._run_gauges([run.pk for run in runs])
        assert set(found) == {run.pk for run in runs}
    for thread in shared.threads:
        thread.join(30)
    assert shared.fired
