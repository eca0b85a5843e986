"""A Celery worker keeps its database connection between tasks while ``CONN_MAX_AGE``
allows (controlpanel.task_db), and closes it past that age: Celery's Django fixup, left to
itself, closed every connection around every task whatever the setting said. PostgreSQL
pass: an in-memory SQLite connection is never closed, so there would be nothing to see."""

import time

import pytest
from celery import signals
from celery.fixups.django import DjangoWorkerFixup
from django.db import connection

import controlpanel.task_db  # noqa: F401 - what a worker imports at start (CELERY_IMPORTS)
from controlpanel.celery import app
from hosts.tasks import poll_telemetry

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]


def run_signals(task):
    # What a worker sends around each task (and what the fixup listens to).
    fixup = DjangoWorkerFixup(app)
    signals.task_prerun.send(sender=task, task_id="t", task=task, args=(), kwargs={})
    fixup.on_task_prerun(sender=task)
    signals.task_postrun.send(sender=task, task_id="t", task=task, args=(), kwargs={})
    fixup.on_task_postrun(sender=task)


def test_a_connection_is_kept_while_young_and_closed_once_past_its_age(postgres):
    assert "controlpanel.task_db" in app.conf.imports
    connection.ensure_connection()
    raw = connection.connection
    connection.close_at = time.monotonic() + 60  # CONN_MAX_AGE 60, just connected
    run_signals(poll_telemetry)
    assert connection.connection is raw  # the next task reuses it
    connection.close_at = time.monotonic() - 1  # past its age (or CONN_MAX_AGE 0)
    run_signals(poll_telemetry)
    assert connection.connection is None


def test_an_eager_task_leaves_the_callers_connection_alone(postgres):
    connection.ensure_connection()
    raw = connection.connection
    connection.close_at = time.monotonic() - 1
    poll_telemetry.push_request(is_eager=True)
    try:
        run_signals(poll_telemetry)
    finally:
        poll_telemetry.pop_request()
    assert connection.connection is raw
