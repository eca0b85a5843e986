"""One lifecycle for every Celery task that works on a row, and queueing tasks by name.

A task takes a primary key only. ``run_job`` loads the row, skips it when it is gone or
already finished (a redelivery after ``acks_late``, a run cancelled while queued), runs the
work, and turns a time limit or an exception into a failure recorded on the row, so no
background operation ever ends without a word (NetBox's ``JobRunner.handle``).

Services queue tasks through ``enqueue``/``enqueue_on_commit`` by the task's registered name:
a service never imports a task module (tasks import services, never the reverse), so no
import has to hide inside a function to dodge a cycle.
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Callable
from typing import TypeVar

from celery.exceptions import SoftTimeLimitExceeded
from django.db import transaction
from django.db.models import Model, QuerySet

from controlpanel import lostwork
from controlpanel.celery import app

log = logging.getLogger(__name__)

Row = TypeVar("Row", bound=Model)


def run_job(
    rows: QuerySet,
    pk: int,
    work: Callable[[Row], object],
    fail: Callable[[Row, str], None],
    *,
    what: str = "the task",
    finished: Callable[[Row], bool] | None = None,
):
    """Run ``work(row)`` for the row ``pk`` of ``rows``, recording any failure with
    ``fail(row, reason)``. ``finished`` says when there is nothing left to do (by default
    the row's ``is_finished``). Returns what ``work`` returned, or None when skipped."""
    row = rows.filter(pk=pk).first()
    if row is None:
        return None  # deleted meanwhile
    if (finished or _is_finished)(row):
        return None  # already handled: a redelivery, or cancelled while queued
    try:
        # Claimed while it runs: a worker lost meanwhile is found by its stopped heartbeat.
        with lostwork.claimed(row):
            return work(row)
    except SoftTimeLimitExceeded:
        fail(row, f"{what} ran out of time")
    except Exception as exc:
        fail(row, f"{type(exc).__name__}: {exc}")
        raise
    return None


def _is_finished(row) -> bool:
    return bool(row.is_finished)


def task(name: str):
    """The registered task called ``name`` (``"<app>.tasks.<function>"``). Its module is
    imported by name on first use so the task is registered in this process (a web process
    never imports task modules otherwise). The panel's own Celery app, not ``current_app``:
    a client app made elsewhere in the process (a test's, a script's) must not take the
    panel's tasks."""
    module = name.rpartition(".")[0]
    importlib.import_module(module)
    return app.tasks[name]


def enqueue(name: str, *args, **options):
    """Queue the task ``name`` with positional ``args`` (primary keys) and ``apply_async``
    options (``soft_time_limit``, ``time_limit``, ``countdown`` …)."""
    return task(name).apply_async(args, **options)


def enqueue_on_commit(name: str, *args, **options) -> None:
    """Queue the task once the current transaction commits, so the worker finds the row."""
    transaction.on_commit(lambda: enqueue(name, *args, **options))
